// What the planner, the schedule builder and the traffic model all need to know about an atom: its size,
// the axis it is cut along, and its needers grouped by node (distinct workers; a worker may need an atom
// at two places); and the hops a segment makes through the three stages.
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

/// One hop of a segment: `from` writes it to `to` in `round` (a relay write, lag 1, reads the slot of the
/// round before).
struct Hop {
  Stage stage = Stage::kReceive;
  int from = 0;
  int to = 0;
  std::uint32_t round = 0;
  std::uint8_t lag = 0;
};

/// Calls fn(const Hop&) for every hop of `segment`: receive (sender -> origin lander, in the segment's
/// round), external exchange (each other lander from its parent: the origin for all-to-all, its relay tree
/// parent otherwise, in the round it lands), internal exchange (each lander -> every other distinct worker
/// of its node that needs the atom, in the round the lander has it).
template <class Fn>
void for_each_hop(const Correspondence& correspondence, const AtomRoutes& routes, const TransferPlan& plan,
                  const Segment& segment, Fn&& fn) {
  const Atom& atom = correspondence.atoms[segment.atom];
  const AtomRoute& route = routes.atoms[segment.atom];
  const auto landers = plan.landers_of(segment);
  const auto lander = [&](std::size_t k) { return atom.needers[landers[k]].worker; };
  fn(Hop{Stage::kReceive, atom.holders[segment.sender].worker, lander(segment.origin), segment.round, 0});
  for (std::size_t k = 0; k < landers.size(); ++k)
    if (k != segment.origin) {
      const int depth = plan.lander_depth(segment, k);
      fn(Hop{Stage::kExternalExchange, lander(plan.lander_parent(segment, k)), lander(k), plan.landing_round(segment, k),
             static_cast<std::uint8_t>(depth > 1 ? 1 : 0)});
    }
  const NodeNeeders* nodes = routes.nodes_of(route);
  for (std::size_t k = 0; k < landers.size(); ++k) {
    const int from = lander(k);
    const std::uint32_t round = plan.landing_round(segment, k);
    const std::uint32_t* needers = routes.needers_of(nodes[k]);
    for (std::uint32_t i = 0; i < nodes[k].count; ++i) {
      const int worker = atom.needers[needers[i]].worker;
      if (worker != from) fn(Hop{Stage::kInternalExchange, from, worker, round, 0});
    }
  }
}

inline std::int64_t segment_bytes(const AtomRoutes& routes, const Segment& segment) {
  return segment.box.numel() * routes.atoms[segment.atom].element_bytes;
}

}  // namespace wb::plan_detail
