// Pieces: every atom cut into slices of about equal size along its route's axis, the unit that every
// assignment of the planner works on (smaller for atoms many more workers need than the average).
#include <algorithm>

#include "plan/planning.hpp"

namespace wb::plan_detail {

std::int64_t choose_piece_bytes(const Correspondence& correspondence, const LowerBound& bound, const PlanOptions& options) {
  if (options.piece_bytes > 0) return options.piece_bytes;
  // Balance needs a few hundred pieces per distinct role: per trainer worker, and per rollout worker of
  // one copy of the model. Replicas add no roles (they receive the same pieces), so they must not shrink
  // the pieces: that would make the planner's work and the schedules grow with their square.
  std::int64_t trainers = 0, rollouts = 0, needed = 0;
  for (Side side : correspondence.sides) (side == Side::kTrainer ? trainers : rollouts) += 1;
  for (const LowerBound::RolloutNode& node : bound.rollout_nodes) needed += node.need_bytes;
  const double replication = bound.model_bytes > 0 ? std::max(1.0, static_cast<double>(needed) / static_cast<double>(bound.model_bytes)) : 1.0;
  const auto roles = std::max<std::int64_t>(1, trainers + static_cast<std::int64_t>(static_cast<double>(rollouts) / replication));
  return std::clamp<std::int64_t>(bound.model_bytes / (roles * 256), 512, std::int64_t{16} << 20);
}

std::int64_t atom_piece_count(std::int64_t bytes, std::int64_t units, std::int64_t piece_bytes, double needers, double average_needers) {
  // An atom many more workers need than the average one weighs on every link of a round as much as that
  // many times its bytes: its pieces are smaller by as much (to a 64th), so that rounds can share it evenly.
  const double scale = needers > average_needers ? std::max(1.0 / 64, average_needers / needers) : 1.0;
  const auto size = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(piece_bytes) * scale));
  return std::clamp<std::int64_t>((bytes + size - 1) / size, 1, std::max<std::int64_t>(units, 1));
}

PieceTable cut_pieces(const Correspondence& correspondence, const AtomRoutes& routes, std::int64_t piece_bytes) {
  PieceTable pieces;
  const auto& atoms = correspondence.atoms;
  pieces.first.resize(atoms.size() + 1);
  const auto needers_of = [&](const AtomRoute& route) {
    double needers = 0;
    for (std::uint16_t k = 0; k < route.node_count; ++k) needers += routes.nodes_of(route)[k].count;
    return needers;
  };
  double bytes = 0, weighted = 0;
  for (const AtomRoute& route : routes.atoms) {
    bytes += static_cast<double>(route.bytes);
    weighted += static_cast<double>(route.bytes) * needers_of(route);
  }
  const double average_needers = bytes > 0 ? weighted / bytes : 1;
  for (std::size_t a = 0; a < atoms.size(); ++a) {
    const AtomRoute& route = routes.atoms[a];
    const std::int64_t units = atoms[a].box.ndim() == 0 ? 1 : atoms[a].box.extent[static_cast<std::size_t>(route.axis)];
    const std::int64_t count = atom_piece_count(route.bytes, units, piece_bytes, needers_of(route), average_needers);
    pieces.first[a] = static_cast<std::uint32_t>(pieces.atom.size());
    for (std::int64_t p = 0; p < count; ++p) {
      pieces.atom.push_back(static_cast<std::uint32_t>(a));
      pieces.begin.push_back(units * p / count);
      pieces.end.push_back(units * (p + 1) / count);
      pieces.bytes.push_back((pieces.end.back() - pieces.begin.back()) * route.unit_bytes);
    }
  }
  pieces.first[atoms.size()] = static_cast<std::uint32_t>(pieces.atom.size());
  return pieces;
}

}  // namespace wb::plan_detail
