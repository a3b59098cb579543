// What the planner and the schedule builder both need to know about an atom: its size, the axis it is
// cut along, and its needers grouped by node (distinct workers; a worker may need an atom at two places).
#pragma once

#include <cstdint>
#include <vector>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"

namespace wb::plan_detail {

struct AtomRoute {
  std::int64_t bytes = 0;
  std::int64_t element_bytes = 0;
  int axis = 0;                 // the axis pieces and rounds cut along: the first one longer than 1
  std::int64_t unit_bytes = 0;  // bytes of one slice along `axis`
  std::uint32_t first_node = 0; // into AtomRoutes::nodes
  std::uint16_t node_count = 0;
  std::uint16_t holder_count = 0;  // distinct holder workers
  std::uint32_t first_holder = 0;  // into AtomRoutes::holders: index into atom.holders, one per distinct worker
};

struct NodeNeeders {
  int node = 0;
  std::uint32_t first = 0;  // into AtomRoutes::needers: index into atom.needers, one per distinct worker
  std::uint32_t count = 0;
};

struct AtomRoutes {
  std::vector<AtomRoute> atoms;
  std::vector<NodeNeeders> nodes;
  std::vector<std::uint32_t> needers;
  std::vector<std::uint32_t> holders;

  const NodeNeeders* nodes_of(const AtomRoute& route) const { return nodes.data() + route.first_node; }
  const std::uint32_t* needers_of(const NodeNeeders& node) const { return needers.data() + node.first; }
  const std::uint32_t* holders_of(const AtomRoute& route) const { return holders.data() + route.first_holder; }
};

AtomRoutes atom_routes(const Correspondence& correspondence, const Topology& topology);

/// Box of `atom_box` restricted to slices [begin, end) along `axis` (box-relative).
Box slice_box(const Box& atom_box, int axis, std::int64_t begin, std::int64_t end);

}  // namespace wb::plan_detail

namespace wb::plan_detail {

/// Calls fn(stage, from_worker, to_worker) for every hop of `segment`: receive (sender -> origin lander),
/// external exchange (origin lander -> every other lander), internal exchange (each lander -> every other
/// distinct worker of its node that needs the atom).
template <class Fn>
void for_each_hop(const Correspondence& correspondence, const AtomRoutes& routes, const TransferPlan& plan,
                  const Segment& segment, Fn&& fn) {
  const Atom& atom = correspondence.atoms[segment.atom];
  const AtomRoute& route = routes.atoms[segment.atom];
  const auto landers = plan.landers_of(segment);
  const int sender = atom.holders[segment.sender].worker;
  const int origin = atom.needers[landers[segment.origin]].worker;
  fn(Stage::kReceive, sender, origin);
  for (std::size_t k = 0; k < landers.size(); ++k)
    if (k != segment.origin) fn(Stage::kExternalExchange, origin, atom.needers[landers[k]].worker);
  const NodeNeeders* nodes = routes.nodes_of(route);
  for (std::size_t k = 0; k < landers.size(); ++k) {
    const int lander = atom.needers[landers[k]].worker;
    const std::uint32_t* needers = routes.needers_of(nodes[k]);
    for (std::uint32_t i = 0; i < nodes[k].count; ++i) {
      const int worker = atom.needers[needers[i]].worker;
      if (worker != lander) fn(Stage::kInternalExchange, lander, worker);
    }
  }
}

inline std::int64_t segment_bytes(const AtomRoutes& routes, const Segment& segment) {
  return segment.box.numel() * routes.atoms[segment.atom].element_bytes;
}

}  // namespace wb::plan_detail
