#include "plan/relay_forest.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::plan_detail {
namespace {

int tree_root(int tree, int k, int trees) { return static_cast<int>(static_cast<long long>(tree) * k / trees); }

// Hubs per tree: the fewest children of the root that reach all k positions in the fewest levels, each
// position below the root giving at most `trees` children; and those levels below the root.
struct Hubs {
  int count = 1;
  int levels = 1;
};
Hubs hub_count(int k, int trees) {
  long long below = 1;  // positions one hub reaches in `levels` levels, itself included
  for (int levels = 1; levels < 64; ++levels) {
    if (1 + static_cast<long long>(trees) * below >= k) return {static_cast<int>((k - 2) / below + 1), levels};
    below = 1 + static_cast<long long>(trees) * below;
  }
  return {trees, 64};
}

// Adds `position` under `parent` in `tree`; false when that would be deeper than a depth byte holds.
bool attach(RelayTree& tree, int position, int parent) {
  const auto p = static_cast<std::size_t>(parent);
  if (tree.depth[p] == UINT8_MAX) return false;
  tree.parent[static_cast<std::size_t>(position)] = static_cast<std::uint16_t>(parent);
  tree.depth[static_cast<std::size_t>(position)] = static_cast<std::uint8_t>(tree.depth[p] + 1);
  tree.height = std::max<int>(tree.height, tree.depth[static_cast<std::size_t>(position)]);
  return true;
}

// Hubs first, roots kept for their own trees, columns respected (relay_forest). Nothing when the child
// slots run out, which the breadth-first forest below never does.
std::optional<RelayForest> hub_forest(int k, int trees, std::span<const ColumnSpan> spans) {
  RelayForest forest;
  forest.positions = k;
  forest.all_to_all = false;
  const Hubs plan = hub_count(k, trees);
  const int hubs = std::min(plan.count, k - 1);
  std::vector<int> slots(static_cast<std::size_t>(k), trees), reserved(static_cast<std::size_t>(k), 0);
  std::vector<int> rooted(static_cast<std::size_t>(k), -1);  // the tree a position is the root of
  for (int t = 0; t < trees; ++t) {
    const auto root = static_cast<std::size_t>(tree_root(t, k, trees));
    reserved[root] += hubs;
    rooted[root] = t;
  }
  const auto avail = [&](int p) { return slots[static_cast<std::size_t>(p)] - reserved[static_cast<std::size_t>(p)]; };
  std::vector<int> order, parents;
  std::vector<char> placed(static_cast<std::size_t>(k));
  for (int t = 0; t < trees; ++t) {
    const int root = tree_root(t, k, trees);
    reserved[static_cast<std::size_t>(root)] -= hubs;
    // May `p` give children in tree t? Not when it is the root of a tree that shares a worker with t.
    const auto may_relay = [&](int p) {
      const int r = rooted[static_cast<std::size_t>(p)];
      if (r < 0) return true;
      if (spans.empty()) return false;
      return !spans[static_cast<std::size_t>(r)].overlaps(spans[static_cast<std::size_t>(t)]);
    };
    RelayTree tree;
    tree.parent.assign(static_cast<std::size_t>(k), RelayTree::kRoot);
    tree.depth.assign(static_cast<std::size_t>(k), 0);
    std::fill(placed.begin(), placed.end(), 0);
    placed[static_cast<std::size_t>(root)] = 1;
    // The hubs: positions that may relay here, the ones with the most slots left first. In two levels, as many
    // as it takes, the last one the one whose slots fit what is left best, so that slots are used up rather
    // than scattered over many positions (which would make later trees deeper, or their roots give more
    // children); deeper, `hubs` of them.
    order.clear();
    for (int i = 1; i < k; ++i) {
      const int p = (root + i) % k;
      if (may_relay(p) && avail(p) > 0) order.push_back(p);
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return avail(a) > avail(b); });
    parents.clear();
    int reach = 0;  // children the hubs can take
    for (std::size_t next = 0; next < order.size();) {
      const int gap = k - 1 - static_cast<int>(parents.size()) - reach;  // positions no hub can take yet
      if (gap <= 0 || avail(root) <= 0 || (plan.levels > 2 && static_cast<int>(parents.size()) == hubs)) break;
      // A hub with gap - 1 slots closes the gap (it is itself one position less to reach).
      std::size_t pick = next;
      for (std::size_t i = order.size(); i-- > next;)
        if (avail(order[i]) >= gap - 1) {
          pick = i;
          break;
        }
      const int hub = order[pick];
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(pick));
      attach(tree, hub, root);
      --slots[static_cast<std::size_t>(root)];
      placed[static_cast<std::size_t>(hub)] = 1;
      parents.push_back(hub);
      reach += avail(hub);
    }
    if (parents.empty()) return std::nullopt;
    // The rest, each under the first parent with a slot left; a placed position becomes a parent in its turn
    // (breadth first) where it may relay. The positions with the most slots left come first, so that those are
    // the ones that relay where more levels are needed, and those that may not relay here last.
    order.clear();
    for (int i = 1; i < k; ++i) {
      const int p = (root + i) % k;
      if (!placed[static_cast<std::size_t>(p)]) order.push_back(p);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return (may_relay(a) ? avail(a) : -1) > (may_relay(b) ? avail(b) : -1); });
    std::size_t next = 0;
    for (const int p : order) {
      while (next < parents.size() && avail(parents[next]) <= 0) ++next;
      if (next == parents.size()) return std::nullopt;
      const int parent = parents[next];
      if (!attach(tree, p, parent)) return std::nullopt;
      --slots[static_cast<std::size_t>(parent)];
      if (may_relay(p)) parents.push_back(p);
    }
    forest.height = std::max(forest.height, tree.height);
    forest.trees.push_back(std::move(tree));
  }
  for (int slots_left : slots) forest.fan_out = std::max(forest.fan_out, trees - slots_left);
  return forest;
}

// Two levels, laid out on a tape of child slots. Tree after tree, from `first_tree` on, takes the next slots
// it needs for its leaves, so that every position's slots go to one tree or two neighbouring ones and nothing
// is scattered: the hubs of a tree are the positions its stretch of tape covers (the root's children), and
// each takes as many leaves as it gave slots. The tapes: the positions in order (the roots, with what their
// own hubs leave, spread among them, so that every tree's stretch holds about one), from half a tree's
// stretch on; the other positions first and the roots last; or no roots at all (every root then gives
// trees - 1 children, some of them without leaves, so that the slots just suffice and no root relays),
// positions partly given first or those with the most slots left first (the last one the best fit).
// Nothing when the slots run out or a root would have too many children.
enum class Tape { kRootsSpread, kRootsLast, kNoRoots, kNoRootsWholeFirst };
std::optional<RelayForest> tape_forest(int k, int trees, std::span<const ColumnSpan> spans, Tape order, int first_tree) {
  const Hubs plan = hub_count(k, trees);
  if (plan.levels != 2) return std::nullopt;
  RelayForest forest;
  forest.positions = k;
  forest.all_to_all = false;
  std::vector<int> rooted(static_cast<std::size_t>(k), -1);
  for (int t = 0; t < trees; ++t) rooted[static_cast<std::size_t>(tree_root(t, k, trees))] = t;
  std::vector<int> tape;
  if (order == Tape::kRootsSpread) {
    for (int i = 0; i < k; ++i) tape.push_back((i + k / (2 * trees)) % k);
  } else {
    for (int pass = 0; pass < (order == Tape::kRootsLast ? 2 : 1); ++pass)
      for (int p = 0; p < k; ++p)
        if ((rooted[static_cast<std::size_t>(p)] >= 0) == (pass == 1)) tape.push_back(p);
  }
  // Children a position has so far, over all trees, and what a root keeps for its own hubs until its tree is
  // laid out (one more than the fewest, as a stretch of tape may begin and end inside a position).
  std::vector<int> used(static_cast<std::size_t>(k), 0), kept(static_cast<std::size_t>(k), 0);
  for (int t = 0; t < trees; ++t) kept[static_cast<std::size_t>(tree_root(t, k, trees))] = plan.count + 1;
  const auto may_relay = [&](int p, int t) {
    const int r = rooted[static_cast<std::size_t>(p)];
    if (r < 0) return true;
    if (r == t || spans.empty()) return false;
    return !spans[static_cast<std::size_t>(r)].overlaps(spans[static_cast<std::size_t>(t)]);
  };
  std::vector<std::pair<int, int>> hubs;  // (position, leaves)
  std::vector<char> placed(static_cast<std::size_t>(k));
  forest.trees.resize(static_cast<std::size_t>(trees));
  for (int i = 0; i < trees; ++i) {
    const int t = (first_tree + i) % trees;
    const int root = tree_root(t, k, trees);
    kept[static_cast<std::size_t>(root)] = 0;
    hubs.clear();
    // Take slots until the hubs and their leaves are everyone else (k - 1 positions). Without the roots'
    // slots there are just enough when every root has trees - 1 children: the hubs, and as many more that
    // take no leaves (the other trees' roots first), so that the hubs need that many fewer slots.
    const bool no_roots = order == Tape::kNoRoots || order == Tape::kNoRootsWholeFirst;
    const int direct_children = no_roots ? trees - 1 : 0;
    int reached = 0;
    // Without roots: positions partly given first (so that few are ever left partly given), or those with
    // the most slots left first (so that a tree needs few hubs).
    if (no_roots)
      std::stable_sort(tape.begin(), tape.end(), [&](int a, int b) {
        const int la = trees - used[static_cast<std::size_t>(a)], lb = trees - used[static_cast<std::size_t>(b)];
        if (order == Tape::kNoRootsWholeFirst) return la > lb;
        return (la > 0 && la < trees) > (lb > 0 && lb < trees);
      });
    for (std::size_t i = 0; i < tape.size() && reached + std::max(0, direct_children - static_cast<int>(hubs.size())) < k - 1; ++i) {
      if (order == Tape::kNoRootsWholeFirst) {
        // The one whose slots close the tree best (the fewest that suffice), else the one with the most.
        const int need = k - 1 - reached - 1 - std::max(0, direct_children - static_cast<int>(hubs.size()) - 1);
        std::size_t pick = tape.size();
        for (std::size_t j = i; j < tape.size(); ++j) {
          const int left = trees - used[static_cast<std::size_t>(tape[j])];
          if (left >= need && (pick == tape.size() || left < trees - used[static_cast<std::size_t>(tape[pick])])) pick = j;
        }
        if (pick < tape.size()) std::swap(tape[i], tape[pick]);
      }
      const int p = tape[i];
      const int left = trees - used[static_cast<std::size_t>(p)] - kept[static_cast<std::size_t>(p)];
      if (left <= 0 || !may_relay(p, t)) continue;
      const int others = std::max(0, direct_children - static_cast<int>(hubs.size()) - 1);  // still to come after it
      const int take = std::min(left, k - 1 - reached - 1 - others);  // it reaches itself too
      if (take <= 0 && others > 0) break;
      hubs.emplace_back(p, take);
      reached += 1 + take;
    }
    std::fill(placed.begin(), placed.end(), 0);
    placed[static_cast<std::size_t>(root)] = 1;
    for (const auto& entry : hubs) placed[static_cast<std::size_t>(entry.first)] = 1;
    for (int pass = 0; pass < 2 && static_cast<int>(hubs.size()) < direct_children; ++pass)
      for (int i = 1; i < k && static_cast<int>(hubs.size()) < direct_children; ++i) {
        const int p = (root + i) % k;
        if (placed[static_cast<std::size_t>(p)] || (rooted[static_cast<std::size_t>(p)] >= 0) != (pass == 0)) continue;
        hubs.emplace_back(p, 0);
        placed[static_cast<std::size_t>(p)] = 1;
        ++reached;
      }
    if (reached < k - 1 || hubs.empty() || static_cast<int>(hubs.size()) > trees - used[static_cast<std::size_t>(root)] ||
        (no_roots && static_cast<int>(hubs.size()) > direct_children))
      return std::nullopt;
    RelayTree tree;
    tree.parent.assign(static_cast<std::size_t>(k), RelayTree::kRoot);
    tree.depth.assign(static_cast<std::size_t>(k), 0);
    used[static_cast<std::size_t>(root)] += static_cast<int>(hubs.size());
    for (const auto& [hub, leaves] : hubs) {
      attach(tree, hub, root);
      used[static_cast<std::size_t>(hub)] += leaves;
    }
    std::size_t hub = 0;
    int room = hubs.front().second;  // hubs that take no leaves come after those that do
    for (int i = 1; i < k; ++i) {
      const int p = (root + i) % k;
      if (placed[static_cast<std::size_t>(p)]) continue;
      while (room == 0) room = hubs[++hub].second;
      attach(tree, p, hubs[hub].first);
      --room;
    }
    forest.height = std::max(forest.height, tree.height);
    forest.trees[static_cast<std::size_t>(t)] = std::move(tree);
  }
  // A position's children over all trees: its leaves, and a root's hubs.
  std::vector<int> children(static_cast<std::size_t>(k), 0);
  for (const RelayTree& tree : forest.trees)
    for (std::uint16_t parent : tree.parent)
      if (parent != RelayTree::kRoot) ++children[parent];
  for (int c : children) {
    if (c > trees) return std::nullopt;
    forest.fan_out = std::max(forest.fan_out, c);
  }
  return forest;
}

// Where two levels would make some root forward to all T in the round it receives (a few sizes just below
// the most that T - 1 hubs reach in two levels, where the positions' slots cannot be cut so that every
// tree has at most T - 1 hubs), a third level for a few positions instead, laid out by design. Every root
// gives T - 1 hubs and relays nowhere, so the other k - T positions' slots are exactly what the trees need;
// there are fewer of them than the T (T - 1) hubs, so `shared` positions are hubs in two trees, their
// slots split between the two. A tree whose hubs then take fewer leaves than it has positions below them
// hangs the rest off sub-hubs: leaves that forward to one leaf of their own a round after the hubs, each
// the one spare slot of a hub of another tree (its provider). In the last round that hop is all that is
// left, so it is kept to one slot's worth on every link: a provider spares one slot, and no position is a
// sub-hub's leaf in two trees. With 2 shared <= T, each shared position is split evenly between two trees
// and the other trees' hubs spare `shared` slots; else each gives T - shared leaves to a tree of its own
// and the rest to one of the others in turn. Nothing where the sizes are not such.
std::optional<RelayForest> sub_hub_forest(int k, int trees) {
  const int hubs = trees - 1;
  const int others = k - trees;              // positions that are no tree's root
  const int shared = trees * hubs - others;  // hubs more than there are such positions
  const Hubs plan = hub_count(k, trees);
  if (plan.levels != 2 || plan.count > hubs || shared < 1 || shared >= trees) return std::nullopt;
  // Per tree, its parts of shared positions: which one, and the leaves it takes there.
  struct Part {
    int shared = 0;
    int leaves = 0;
  };
  const auto tsize = static_cast<std::size_t>(trees);
  std::vector<std::vector<Part>> parts(tsize);
  if (2 * shared <= trees) {
    for (int i = 0; i < shared; ++i) {
      parts[static_cast<std::size_t>(2 * i)].push_back({i, trees - trees / 2});
      parts[static_cast<std::size_t>(2 * i + 1)].push_back({i, trees / 2});
    }
  } else {
    for (int i = 0; i < shared; ++i) {
      parts[static_cast<std::size_t>(i)].push_back({i, trees - shared});
      parts[static_cast<std::size_t>(shared + i % (trees - shared))].push_back({i, shared});
    }
  }
  // A tree's hubs leave T - leaves of their slots each, and must leave `shared` in all (T - 1 hubs of T slots
  // for k - T positions below them): what its parts leave beyond that it fills with sub-hubs (room), what
  // they leave short of it, hubs of T - 1 leaves spare (spare), one slot each for another tree's sub-hub.
  std::vector<int> spare(tsize, 0), room(tsize, 0);
  std::vector<std::vector<int>> hosted(tsize);  // per tree, the trees whose spare slots its sub-hubs are
  for (std::size_t t = 0; t < tsize; ++t) {
    int left = 0;
    for (const Part& part : parts[t]) left += trees - part.leaves;
    spare[t] = std::max(0, shared - left);
    room[t] = std::max(0, left - shared);
    if (static_cast<int>(parts[t].size()) + spare[t] > hubs) return std::nullopt;
  }
  std::size_t next = 0;
  for (std::size_t u = 0; u < tsize; ++u)
    for (int n = 0; n < spare[u]; ++n) {
      std::size_t tried = 0;
      for (; tried < tsize && (next == u || room[next] == 0); ++tried) next = (next + 1) % tsize;
      if (tried == tsize) return std::nullopt;
      hosted[next].push_back(static_cast<int>(u));
      --room[next];
    }
  // Positions: the shared ones, the sparing hubs, then every tree's whole hubs, from the non-roots in order.
  std::vector<char> is_root(static_cast<std::size_t>(k), 0);
  for (int t = 0; t < trees; ++t) is_root[static_cast<std::size_t>(tree_root(t, k, trees))] = 1;
  int cursor = 0;
  const auto next_position = [&]() {
    while (cursor < k && is_root[static_cast<std::size_t>(cursor)]) ++cursor;
    return cursor < k ? cursor++ : -1;
  };
  std::vector<int> shared_at(static_cast<std::size_t>(shared));
  std::vector<std::vector<int>> sparing(tsize);  // per tree, its hubs that spare a slot
  for (int& p : shared_at) p = next_position();
  for (std::size_t t = 0; t < tsize; ++t)
    for (int n = 0; n < spare[t]; ++n) sparing[t].push_back(next_position());
  RelayForest forest;
  forest.positions = k;
  forest.all_to_all = false;
  forest.trees.resize(tsize);
  std::vector<std::pair<int, int>> parents;  // (position, children it takes)
  std::vector<char> placed(static_cast<std::size_t>(k)), deep(static_cast<std::size_t>(k), 0);
  std::vector<int> children(static_cast<std::size_t>(k), 0), leaves_deep;
  std::vector<std::size_t> used_of(tsize, 0);  // per tree, how many of its sparing hubs are sub-hubs so far
  for (std::size_t t = 0; t < tsize; ++t) {
    const int root = tree_root(static_cast<int>(t), k, trees);
    parents.clear();
    for (const Part& part : parts[t]) parents.emplace_back(shared_at[static_cast<std::size_t>(part.shared)], part.leaves);
    for (int p : sparing[t]) parents.emplace_back(p, trees - 1);
    while (static_cast<int>(parents.size()) < hubs) parents.emplace_back(next_position(), trees);
    const std::size_t hub_count = parents.size();
    std::fill(placed.begin(), placed.end(), 0);
    placed[static_cast<std::size_t>(root)] = 1;
    for (const auto& [hub, leaves] : parents) {
      if (hub < 0) return std::nullopt;
      placed[static_cast<std::size_t>(hub)] = 1;
    }
    // Its sub-hubs (a sparing hub of each tree that spares it a slot) and their leaves, the last positions
    // from the root on that are a sub-hub's leaf in no tree before.
    for (int u : hosted[t]) {
      const auto uu = static_cast<std::size_t>(u);
      const int sub = sparing[uu][used_of[uu]++];
      if (placed[static_cast<std::size_t>(sub)]) return std::nullopt;
      parents.emplace_back(sub, 1);
      placed[static_cast<std::size_t>(sub)] = 1;
    }
    leaves_deep.clear();
    for (int j = k - 1; j >= 1 && leaves_deep.size() < hosted[t].size(); --j) {
      const auto p = static_cast<std::size_t>((root + j) % k);
      if (placed[p] || deep[p]) continue;
      leaves_deep.push_back(static_cast<int>(p));
      deep[p] = 1;
      placed[p] = 1;
    }
    if (leaves_deep.size() < hosted[t].size()) return std::nullopt;
    RelayTree tree;
    tree.parent.assign(static_cast<std::size_t>(k), RelayTree::kRoot);
    tree.depth.assign(static_cast<std::size_t>(k), 0);
    for (std::size_t h = 0; h < hub_count; ++h) attach(tree, parents[h].first, root);
    children[static_cast<std::size_t>(root)] += static_cast<int>(hub_count);
    // The hubs' leaves (the sub-hubs first), then the sub-hubs'.
    std::size_t parent = 0;
    const auto attach_next = [&](int p) {
      while (parent < parents.size() && parents[parent].second == 0) ++parent;
      if (parent == parents.size()) return false;
      attach(tree, p, parents[parent].first);
      --parents[parent].second;
      ++children[static_cast<std::size_t>(parents[parent].first)];
      return true;
    };
    for (std::size_t h = hub_count; h < parents.size(); ++h)
      if (!attach_next(parents[h].first)) return std::nullopt;
    for (int j = 1; j < k; ++j) {
      const int p = (root + j) % k;
      if (!placed[static_cast<std::size_t>(p)] && !attach_next(p)) return std::nullopt;
    }
    for (int p : leaves_deep)
      if (!attach_next(p)) return std::nullopt;
    forest.height = std::max(forest.height, tree.height);
    forest.trees[t] = std::move(tree);
  }
  if (next_position() >= 0) return std::nullopt;  // every non-root is some tree's hub
  for (int c : children) {
    if (c > trees) return std::nullopt;
    forest.fan_out = std::max(forest.fan_out, c);
  }
  return forest;
}

// Breadth first from each root, roots never relaying: always has a slot for every position.
RelayForest breadth_first_forest(int k, int fan_out) {
  RelayForest forest;
  forest.positions = k;
  forest.all_to_all = false;
  const int trees = fan_out;
  // Child slots per position over all trees: with every tree carrying 1/T of the pieces, T slots is what a
  // position receives, so it never sends more than that.
  std::vector<int> slots(static_cast<std::size_t>(k), trees);
  std::vector<bool> is_root(static_cast<std::size_t>(k), false);
  for (int t = 0; t < trees; ++t) is_root[static_cast<std::size_t>(tree_root(t, k, trees))] = true;
  std::deque<int> parents;
  std::vector<int> order;
  for (int t = 0; t < trees; ++t) {
    RelayTree tree;
    tree.parent.assign(static_cast<std::size_t>(k), RelayTree::kRoot);
    tree.depth.assign(static_cast<std::size_t>(k), 0);
    const int start = tree_root(t, k, trees);
    order.clear();
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 1; i < k; ++i) {
        const int position = (start + i) % k;
        if (is_root[static_cast<std::size_t>(position)] == (pass == 1)) order.push_back(position);
      }
    parents.assign(1, start);
    for (const int position : order) {
      while (!parents.empty() && slots[static_cast<std::size_t>(parents.front())] == 0) parents.pop_front();
      // Every tree needs k - 1 slots and k T are there: the positions after a tree's start, not yet used by
      // the trees before, always have enough.
      if (parents.empty()) throw Error(ErrorCode::kInternal, "relay forest: no child slot left for tree " + std::to_string(t));
      const int parent = parents.front();
      if (!attach(tree, position, parent))
        throw Error(ErrorCode::kInvalidArgument, "relay fan-out " + std::to_string(fan_out) + " over " + std::to_string(k) +
                                                     " nodes makes trees deeper than 255 hops (raise the fan-out)");
      --slots[static_cast<std::size_t>(parent)];
      parents.push_back(position);
    }
    forest.height = std::max(forest.height, tree.height);
    forest.trees.push_back(std::move(tree));
  }
  // A position's children over all trees: whom it may write to in one round.
  for (int slots_left : slots) forest.fan_out = std::max(forest.fan_out, trees - slots_left);
  return forest;
}

}  // namespace

int RelayForest::root(int tree) const {
  if (all_to_all) return tree;
  const RelayTree& t = trees[static_cast<std::size_t>(tree)];
  for (std::size_t p = 0; p < t.parent.size(); ++p)
    if (t.parent[p] == RelayTree::kRoot) return static_cast<int>(p);
  return 0;
}

RelayForest relay_forest(int k, int fan_out, std::span<const ColumnSpan> spans) {
  if (k < 1 || k > RelayTree::kRoot || fan_out < 1)
    throw Error(ErrorCode::kInvalidArgument, "relay forest of " + std::to_string(k) + " nodes and fan-out " +
                                                 std::to_string(fan_out) + " (need 1..65535 nodes, fan-out >= 1)");
  if (!spans.empty() && spans.size() != static_cast<std::size_t>(fan_out))
    throw Error(ErrorCode::kInvalidArgument, "relay forest: " + std::to_string(spans.size()) + " column spans for " +
                                                 std::to_string(fan_out) + " trees");
  if (k - 1 <= fan_out) {
    RelayForest forest;
    forest.positions = k;
    forest.fan_out = k - 1;
    forest.height = k > 1 ? 1 : 0;
    return forest;
  }
  if (fan_out >= 2) {
    // Of the tapes, each with every tree in turn laid out first (the last one takes what is left), the forest
    // whose busiest root forwards least: a root's children in its own tree take their pieces in the round it
    // receives them and so hold up every hop after, and its relays in other trees share its link with them
    // at that time (counted half: they run for only part of it). Failing all, hubs chosen tree by tree.
    std::optional<RelayForest> best;
    const auto root_load = [](const RelayForest& forest) {
      std::vector<int> children(static_cast<std::size_t>(forest.positions), 0);
      for (const RelayTree& tree : forest.trees)
        for (std::uint16_t parent : tree.parent)
          if (parent != RelayTree::kRoot) ++children[parent];
      int most = 0, most_own = 0;
      for (int t = 0; t < forest.tree_count(); ++t) {
        const int root = forest.root(t);
        int own = 0;
        for (std::uint16_t parent : forest.trees[static_cast<std::size_t>(t)].parent) own += parent == root;
        most = std::max(most, 2 * own + (children[static_cast<std::size_t>(root)] - own));
        most_own = std::max(most_own, own);
      }
      return std::make_pair(most, most_own);
    };
    for (Tape order : {Tape::kRootsSpread, Tape::kRootsLast, Tape::kNoRoots, Tape::kNoRootsWholeFirst})
      for (int first = 0; first < fan_out; ++first)
        if (std::optional<RelayForest> forest = tape_forest(k, fan_out, spans, order, first))
          if (!best || root_load(*forest) < root_load(*best)) best = std::move(forest);
    // Where every tape leaves some root forwarding to all T in the round it receives, a third level for a
    // few positions instead.
    if (best && root_load(*best).second >= fan_out)
      if (std::optional<RelayForest> forest = sub_hub_forest(k, fan_out)) best = std::move(forest);
    if (best) return std::move(*best);
    if (std::optional<RelayForest> forest = hub_forest(k, fan_out, spans)) return std::move(*forest);
  }
  return breadth_first_forest(k, fan_out);
}

}  // namespace wb::plan_detail
