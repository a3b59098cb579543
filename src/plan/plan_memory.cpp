// What planning will take in memory, estimated before anything large is allocated, so that a deployment
// that cannot be planned here is refused with numbers instead of ending in std::bad_alloc. It counts, from
// the correspondence alone, the pieces and hops the plan will have and the rounds it will at most try,
// and charges each the bytes the planner's structures, the simulation and the schedules spend on it.
#include <algorithm>

#include "plan/planning.hpp"

namespace wb {

std::int64_t estimate_plan_memory(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options) {
  return plan_detail::estimate_plan_memory(correspondence, topology, options, lower_bound(correspondence, topology));
}

std::int64_t plan_detail::estimate_plan_memory(const Correspondence& correspondence, const Topology& topology,
                                               const PlanOptions& options, const LowerBound& bound) {
  const std::int64_t slot_budget = std::max<std::int64_t>(1, options.buffer_bytes_per_worker / std::max(1, options.pipeline_depth));
  const std::int64_t piece_bytes =
      std::max<std::int64_t>(1, std::min(plan_detail::choose_piece_bytes(correspondence, bound, options), slot_budget / 16));
  const std::size_t workers = correspondence.sides.size();
  std::vector<std::int64_t> traffic(workers, 0);
  // Distinct needers per atom (the same workers need an atom at several places only rarely), and their
  // average by bytes, which the piece size follows (cut_pieces).
  const auto bytes_of = [&](const Atom& atom) {
    return atom.box.numel() * static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
  };
  const auto distinct_needers = [](const Atom& atom) {
    int distinct = 0;
    for (std::size_t i = 0; i < atom.needers.size(); ++i) distinct += i == 0 || atom.needers[i - 1].worker != atom.needers[i].worker;
    return distinct;
  };
  double total_bytes = 0, weighted = 0;
  for (const Atom& atom : correspondence.atoms) {
    total_bytes += static_cast<double>(bytes_of(atom));
    weighted += static_cast<double>(bytes_of(atom)) * distinct_needers(atom);
  }
  const double average_needers = total_bytes > 0 ? weighted / total_bytes : 1;
  // Pieces, lander entries (one per node and piece) and hops (every worker a piece reaches, and its sender).
  double pieces = 0, landers = 0, hops = 0, needers = 0;
  std::vector<int> nodes;
  for (const Atom& atom : correspondence.atoms) {
    const std::int64_t element = static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
    const std::int64_t bytes = atom.box.numel() * element;
    int axis = 0;
    while (axis + 1 < atom.box.ndim() && atom.box.extent[static_cast<std::size_t>(axis)] == 1) ++axis;
    const std::int64_t units = atom.box.ndim() == 0 ? 1 : atom.box.extent[static_cast<std::size_t>(axis)];
    const auto count = static_cast<double>(plan_detail::atom_piece_count(bytes, units, piece_bytes, distinct_needers(atom), average_needers));
    nodes.clear();
    int distinct = 0;
    for (std::size_t i = 0; i < atom.needers.size(); ++i) {
      const int worker = atom.needers[i].worker;
      if (i > 0 && atom.needers[i - 1].worker == worker) continue;
      ++distinct;
      traffic[static_cast<std::size_t>(worker)] += bytes;
      nodes.push_back(topology.node_of_worker[static_cast<std::size_t>(worker)]);
    }
    std::sort(nodes.begin(), nodes.end());
    const auto node_count = static_cast<double>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
    if (!atom.holders.empty()) traffic[static_cast<std::size_t>(atom.holders.front().worker)] += bytes / static_cast<std::int64_t>(atom.holders.size());
    pieces += count;
    landers += count * node_count;
    hops += count * (1 + distinct);
    needers += static_cast<double>(atom.needers.size() + atom.holders.size());
  }
  const std::int64_t busiest = traffic.empty() ? 0 : *std::max_element(traffic.begin(), traffic.end());
  // The most rounds the planner tries: four times the fewest, and a few for relays.
  const double rounds = 4.0 * static_cast<double>(std::max<std::int64_t>(options.min_rounds, (busiest + slot_budget - 1) / slot_budget)) + 8;
  const double per_piece = 40      // piece table, sender, tree, round
                           + 2 * 180;  // segments (boxes on the heap), twice while sorting
  const double per_lander = 3 * 4;     // landing, plan and sorted copies
  const double per_hop = 24            // traffic tallies before they are summed per worker pair
                         + 32 + 64     // the schedule builder's regions, and its per-worker parts and targets
                         + 12;         // serialized schedules, all kept until they are scattered
  const double per_round = static_cast<double>(workers) * 2 * 8 * 2 + static_cast<double>(topology.num_nodes()) * 4 * 64;
  const double per_atom_endpoint = 2 * 16;  // atom routes
  const double total = pieces * per_piece + landers * per_lander + hops * per_hop + rounds * per_round +
                       needers * per_atom_endpoint;
  return static_cast<std::int64_t>(std::min(total, 9e18));
}

}  // namespace wb
