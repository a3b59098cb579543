#include "plan/relay_forest.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::plan_detail {

int RelayForest::root(int tree) const {
  if (all_to_all) return tree;
  const RelayTree& t = trees[static_cast<std::size_t>(tree)];
  for (std::size_t p = 0; p < t.parent.size(); ++p)
    if (t.parent[p] == RelayTree::kRoot) return static_cast<int>(p);
  return 0;
}

RelayForest relay_forest(int k, int fan_out) {
  if (k < 1 || k > RelayTree::kRoot || fan_out < 1)
    throw Error(ErrorCode::kInvalidArgument, "relay forest of " + std::to_string(k) + " nodes and fan-out " +
                                                 std::to_string(fan_out) + " (need 1..65535 nodes, fan-out >= 1)");
  RelayForest forest;
  forest.positions = k;
  if (k - 1 <= fan_out) {
    forest.fan_out = k - 1;
    forest.height = k > 1 ? 1 : 0;
    return forest;
  }
  forest.all_to_all = false;
  const int trees = fan_out;
  // Child slots per position over all trees: with every tree carrying 1/T of the pieces, T slots is what a
  // position receives, so it never sends more than that.
  std::vector<int> slots(static_cast<std::size_t>(k), trees);
  std::vector<bool> is_root(static_cast<std::size_t>(k), false);
  for (int t = 0; t < trees; ++t) is_root[static_cast<std::size_t>(static_cast<long long>(t) * k / trees)] = true;
  std::deque<int> parents;
  std::vector<int> order;
  for (int t = 0; t < trees; ++t) {
    RelayTree tree;
    tree.parent.assign(static_cast<std::size_t>(k), RelayTree::kRoot);
    tree.depth.assign(static_cast<std::size_t>(k), 0);
    const int start = static_cast<int>(static_cast<long long>(t) * k / trees);
    // The other trees' roots come last, as leaves: a root that also relayed would forward out of the slot
    // the trainer writes its next rounds into, and hold that up.
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
      if (tree.depth[static_cast<std::size_t>(parent)] == UINT8_MAX)
        throw Error(ErrorCode::kInvalidArgument, "relay fan-out " + std::to_string(fan_out) + " over " + std::to_string(k) +
                                                     " nodes makes trees deeper than 255 hops (raise the fan-out)");
      --slots[static_cast<std::size_t>(parent)];
      tree.parent[static_cast<std::size_t>(position)] = static_cast<std::uint16_t>(parent);
      tree.depth[static_cast<std::size_t>(position)] = static_cast<std::uint8_t>(tree.depth[static_cast<std::size_t>(parent)] + 1);
      tree.height = std::max<int>(tree.height, tree.depth[static_cast<std::size_t>(position)]);
      parents.push_back(position);
    }
    forest.height = std::max(forest.height, tree.height);
    forest.trees.push_back(std::move(tree));
  }
  // A position's children over all trees: whom it may write to in one round.
  for (int slots_left : slots) forest.fan_out = std::max(forest.fan_out, trees - slots_left);
  return forest;
}

}  // namespace wb::plan_detail
