// The external exchange: atoms grouped by the nodes that need them; per group a relay forest (or
// all-to-all); per piece one tree of it, by column, whose root is the piece's origin.
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>

#include "plan/planning.hpp"

namespace wb::plan_detail {

NodeSets group_node_sets(const AtomRoutes& routes) {
  NodeSets sets;
  sets.of_atom.resize(routes.atoms.size());
  std::map<std::vector<int>, std::uint32_t> index;
  std::vector<int> key;
  for (std::size_t a = 0; a < routes.atoms.size(); ++a) {
    const AtomRoute& route = routes.atoms[a];
    const NodeNeeders* nodes = routes.nodes_of(route);
    key.clear();
    for (std::uint16_t k = 0; k < route.node_count; ++k) key.push_back(nodes[k].node);
    const auto [it, added] = index.try_emplace(key, static_cast<std::uint32_t>(sets.size.size()));
    if (added) sets.size.push_back(route.node_count);
    sets.of_atom[a] = it->second;
  }
  return sets;
}

Exchange assign_trees(const PieceTable& pieces, const Landing& landing, const NodeSets& sets,
                      int fan_out) {
  Exchange exchange;
  exchange.fan_out = fan_out;
  exchange.forests.reserve(sets.size.size());
  exchange.tree.assign(pieces.size(), 0);

  // Per group, its pieces by column (then atom, then position), cut into runs of equal bytes, one per tree.
  std::vector<std::vector<std::uint32_t>> members(sets.size.size());
  std::vector<std::int64_t> total(sets.size.size(), 0);
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    const std::uint32_t set = sets.of_atom[pieces.atom[p]];
    members[set].push_back(p);
    total[set] += pieces.bytes[p];
  }
  exchange.largest_fan_out = 0;
  exchange.height = 1;
  std::vector<ColumnSpan> spans;
  for (std::size_t s = 0; s < members.size(); ++s) {
    const int size = std::max(1, sets.size[s]);
    const int f = fan_out == kRelayAllToAll ? std::max(1, size - 1) : fan_out;
    const std::int64_t trees = size - 1 <= f ? size : f;  // as relay_forest makes them
    auto& list = members[s];
    std::stable_sort(list.begin(), list.end(), [&](std::uint32_t x, std::uint32_t y) { return landing.column[x] < landing.column[y]; });
    spans.assign(static_cast<std::size_t>(trees), ColumnSpan{INT32_MAX, -1});
    std::int64_t before = 0;
    for (std::uint32_t p : list) {
      // The run that holds the piece's middle byte.
      const std::int64_t middle = before + pieces.bytes[p] / 2;
      const std::int64_t tree = total[s] > 0 ? std::min(trees - 1, middle * trees / total[s]) : 0;
      exchange.tree[p] = static_cast<std::uint16_t>(tree);
      ColumnSpan& span = spans[static_cast<std::size_t>(tree)];
      span.first = std::min<int>(span.first, landing.column[p]);
      span.last = std::max<int>(span.last, landing.column[p]);
      before += pieces.bytes[p];
    }
    // The forest, knowing which trees land on the same workers (a tree without pieces on none).
    if (trees == size) {
      exchange.forests.push_back(relay_forest(size, f));
    } else {
      exchange.forests.push_back(relay_forest(size, f, spans));
    }
    const RelayForest& forest = exchange.forests.back();
    if (sets.size[s] > 1 && !list.empty()) {
      exchange.largest_fan_out = std::max(exchange.largest_fan_out, forest.fan_out);
      exchange.height = std::max(exchange.height, forest.height);
    }
  }
  return exchange;
}

}  // namespace wb::plan_detail
