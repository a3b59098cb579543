// Pieces: every atom cut into slices of about equal size along its route's axis, the unit that every
// assignment of the planner works on.
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

PieceTable cut_pieces(const Correspondence& correspondence, const AtomRoutes& routes, std::int64_t piece_bytes) {
  PieceTable pieces;
  const auto& atoms = correspondence.atoms;
  pieces.first.resize(atoms.size() + 1);
  for (std::size_t a = 0; a < atoms.size(); ++a) {
    const AtomRoute& route = routes.atoms[a];
    const std::int64_t units = atoms[a].box.ndim() == 0 ? 1 : atoms[a].box.extent[static_cast<std::size_t>(route.axis)];
    const std::int64_t count = std::clamp<std::int64_t>((route.bytes + piece_bytes - 1) / piece_bytes, 1, std::max<std::int64_t>(units, 1));
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
