// The external exchange: atoms grouped by the nodes that need them; per group a relay forest (or
// all-to-all); per piece one tree of it, the least loaded, whose root is the piece's origin.
#include <algorithm>
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
    const auto [it, added] = index.emplace(key, static_cast<std::uint32_t>(sets.size.size()));
    if (added) sets.size.push_back(route.node_count);
    sets.of_atom[a] = it->second;
  }
  return sets;
}

Exchange assign_trees(const AtomRoutes& routes, const PieceTable& pieces, const NodeSets& sets, int fan_out) {
  Exchange exchange;
  exchange.fan_out = fan_out;
  exchange.forests.reserve(sets.size.size());
  std::vector<std::size_t> first_tree;  // per set, into `load`
  std::size_t trees = 0;
  for (int size : sets.size) {
    const int f = fan_out == kRelayAllToAll ? std::max(1, size - 1) : fan_out;
    exchange.forests.push_back(relay_forest(std::max(1, size), f));
    first_tree.push_back(trees);
    trees += static_cast<std::size_t>(exchange.forests.back().tree_count());
  }
  std::vector<bool> used(sets.size.size(), false);
  std::vector<std::int64_t> load(trees, 0);
  exchange.tree.assign(pieces.size(), 0);

  // Largest atoms first; a piece goes to the least loaded tree of its set, or stays on its predecessor's
  // while that costs at most one piece of balance (neighbours on one route merge into one segment).
  std::vector<std::uint32_t> order(routes.atoms.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t x, std::uint32_t y) { return routes.atoms[x].bytes > routes.atoms[y].bytes; });
  for (std::uint32_t a : order) {
    const std::uint32_t set = sets.of_atom[a];
    const RelayForest& forest = exchange.forests[set];
    if (routes.atoms[a].node_count > 1) used[set] = true;
    std::int64_t* tree_load = load.data() + first_tree[set];
    const int count = forest.tree_count();
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
      int best = static_cast<int>(std::min_element(tree_load, tree_load + count) - tree_load);
      if (p > pieces.first[a] && tree_load[exchange.tree[p - 1]] <= tree_load[best] + pieces.bytes[p]) best = exchange.tree[p - 1];
      exchange.tree[p] = static_cast<std::uint16_t>(best);
      tree_load[best] += pieces.bytes[p];
    }
  }
  exchange.largest_fan_out = 0;
  exchange.height = 1;
  for (std::size_t s = 0; s < sets.size.size(); ++s)
    if (used[s]) {
      exchange.largest_fan_out = std::max(exchange.largest_fan_out, exchange.forests[s].fan_out);
      exchange.height = std::max(exchange.height, exchange.forests[s].height);
    }
  return exchange;
}

}  // namespace wb::plan_detail
