// Rollout de-duplication (paper §3.2): each piece enters each node that needs it once, at one of the
// node's workers that needs it (its lander), which hands it on inside the node.
#include <algorithm>
#include <numeric>

#include "plan/planning.hpp"

namespace wb::plan_detail {
namespace {

// Per worker, its place among the workers of its node (ascending worker order).
std::vector<int> place_in_node(const Topology& topology) {
  const std::size_t workers = topology.node_of_worker.size();
  std::vector<int> seen(static_cast<std::size_t>(topology.num_nodes()), 0), place(workers, 0);
  for (std::size_t w = 0; w < workers; ++w) place[w] = seen[static_cast<std::size_t>(topology.node_of_worker[w])]++;
  return place;
}

}  // namespace

Landing assign_landers(const Correspondence& correspondence, const AtomRoutes& routes, const PieceTable& pieces,
                       const Topology& topology) {
  const auto& atoms = correspondence.atoms;
  const std::vector<int> place = place_in_node(topology);
  Landing landing;
  landing.first.resize(pieces.size() + 1);
  std::size_t total = 0;
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    landing.first[p] = static_cast<std::uint32_t>(total);
    total += routes.atoms[pieces.atom[p]].node_count;
  }
  landing.first[pieces.size()] = static_cast<std::uint32_t>(total);
  landing.landers.resize(total);
  landing.column.resize(pieces.size());

  // Largest atoms first, so that small ones even out what large ones leave.
  std::vector<std::uint32_t> order(atoms.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t x, std::uint32_t y) { return routes.atoms[x].bytes > routes.atoms[y].bytes; });
  std::vector<std::int64_t> land_load(correspondence.sides.size(), 0);
  const auto load_of = [&](const Atom& atom, std::uint32_t needer) {
    return land_load[static_cast<std::size_t>(atom.needers[needer].worker)];
  };
  for (std::uint32_t a : order) {
    const Atom& atom = atoms[a];
    const AtomRoute& route = routes.atoms[a];
    const NodeNeeders* atom_nodes = routes.nodes_of(route);
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
      const std::int64_t bytes = pieces.bytes[p];
      std::uint32_t* landers = landing.landers.data() + landing.first[p];
      const std::uint32_t* previous = p > pieces.first[a] ? landing.landers.data() + landing.first[p - 1] : nullptr;
      // The place in the node that lands the piece: the least loaded needer's on the first node (or the
      // previous piece's, while that costs at most one piece of balance). Every node then lands it on its
      // worker of that place where one needs it, so that relays between nodes pair workers one to one.
      int wanted = -1;
      for (std::uint16_t k = 0; k < route.node_count; ++k) {
        const std::uint32_t* needers = routes.needers_of(atom_nodes[k]);
        std::uint32_t best = needers[0];
        for (std::uint32_t i = 1; i < atom_nodes[k].count; ++i)
          if (load_of(atom, needers[i]) < load_of(atom, best)) best = needers[i];
        if (wanted < 0 && previous != nullptr && load_of(atom, previous[k]) <= load_of(atom, best) + bytes) best = previous[k];
        if (wanted >= 0) {
          for (std::uint32_t i = 0; i < atom_nodes[k].count; ++i)
            if (place[static_cast<std::size_t>(atom.needers[needers[i]].worker)] == wanted) {
              best = needers[i];
              break;
            }
        } else {
          wanted = place[static_cast<std::size_t>(atom.needers[best].worker)];
        }
        landers[k] = best;
        land_load[static_cast<std::size_t>(atom.needers[best].worker)] += bytes;
      }
      landing.column[p] = static_cast<std::uint16_t>(wanted);
    }
  }
  return landing;
}

}  // namespace wb::plan_detail
