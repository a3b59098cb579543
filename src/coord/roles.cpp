#include "coord/roles.hpp"

#include <algorithm>
#include <cstring>

#include "comm/collectives.hpp"
#include "core/checks.hpp"

namespace wb::coord {

std::string describe_worker(const Roles& roles, int world_rank) {
  const auto r = static_cast<std::size_t>(world_rank);
  const std::string world = " (world rank " + std::to_string(world_rank) + ")";
  if (r >= roles.engine_of_rank.size()) return "world rank " + std::to_string(world_rank);
  const int engine = roles.engine_of_rank[r];
  const int rank = r < roles.group_rank_of.size() ? roles.group_rank_of[r] : 0;
  if (engine < 0) return "trainer " + std::to_string(rank) + world;
  return "engine " + std::to_string(engine) + " worker " + std::to_string(rank) + world;
}

Roles exchange_roles(MPI_Comm world, MPI_Comm group, bool trainer, double timeout) {
  Roles roles;
  WB_CHECK_MPI(MPI_Comm_rank(world, &roles.world_rank));
  WB_CHECK_MPI(MPI_Comm_size(world, &roles.world_size));
  roles.trainer = trainer;
  WB_CHECK_MPI(MPI_Comm_rank(group, &roles.group_rank));
  WB_CHECK_MPI(MPI_Comm_size(group, &roles.group_size));
  roles.leader = roles.group_rank == 0;
  const comm::Waiter waiter{timeout, {}};
  // The group's leader names the group: its world rank, broadcast inside the group.
  int leader = roles.world_rank;
  comm::broadcast_fixed(std::as_writable_bytes(std::span(&leader, 1)), 0, group, waiter,
                        "constructing the adapter: the group's leader");
  const int mine[3] = {trainer ? 1 : 0, leader, roles.group_rank};
  const std::size_t n = static_cast<std::size_t>(roles.world_size);
  std::vector<int> all(3 * n);
  const std::vector<std::byte> gathered =
      comm::allgather_fixed(std::as_bytes(std::span(mine)), world, waiter,
                            "constructing the adapter: every world rank's role (some rank did not construct its adapter)");
  std::memcpy(all.data(), gathered.data(), gathered.size());
  for (std::size_t r = 0; r < n; ++r) {
    const bool is_trainer = all[3 * r] != 0;
    const int its_leader = all[3 * r + 1];
    if (is_trainer) {
      if (roles.trainer_leader >= 0 && roles.trainer_leader != its_leader)
        throw Error(ErrorCode::kInvalidArgument, "world ranks " + std::to_string(roles.trainer_leader) + " and " +
                                                     std::to_string(its_leader) +
                                                     " both lead a trainer group: all trainers must share one trainer_comm");
      roles.trainer_leader = its_leader;
    } else if (std::find(roles.engine_leaders.begin(), roles.engine_leaders.end(), its_leader) == roles.engine_leaders.end()) {
      roles.engine_leaders.push_back(its_leader);
    }
  }
  if (roles.trainer_leader < 0) throw Error(ErrorCode::kInvalidArgument, "no SenderAdapter in the world communicator");
  // No engine at all is a trainer job whose engines are still to come: its updates go to nobody.
  std::sort(roles.engine_leaders.begin(), roles.engine_leaders.end());
  roles.engine_of_rank.assign(n, -1);
  roles.group_rank_of.assign(n, 0);
  roles.engines.assign(roles.engine_leaders.size(), {});
  std::vector<std::pair<int, int>> trainers;  // (trainer rank, world rank)
  std::vector<std::vector<std::pair<int, int>>> engines(roles.engine_leaders.size());
  for (std::size_t r = 0; r < n; ++r) {
    roles.group_rank_of[r] = all[3 * r + 2];
    if (all[3 * r] != 0) {
      trainers.emplace_back(all[3 * r + 2], static_cast<int>(r));
      continue;
    }
    const auto e = static_cast<std::size_t>(
        std::lower_bound(roles.engine_leaders.begin(), roles.engine_leaders.end(), all[3 * r + 1]) - roles.engine_leaders.begin());
    roles.engine_of_rank[r] = static_cast<int>(e);
    engines[e].emplace_back(all[3 * r + 2], static_cast<int>(r));
  }
  std::sort(trainers.begin(), trainers.end());
  for (const auto& [rank, world_rank] : trainers) roles.trainers.push_back(world_rank);
  for (std::size_t e = 0; e < engines.size(); ++e) {
    std::sort(engines[e].begin(), engines[e].end());
    for (const auto& [rank, world_rank] : engines[e]) roles.engines[e].push_back(world_rank);
  }
  roles.engine = roles.engine_of_rank[static_cast<std::size_t>(roles.world_rank)];
  return roles;
}

}  // namespace wb::coord
