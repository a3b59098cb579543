// The roles of every world rank, learnt once at the adapters' construction: which ranks train, which
// engines there are and who leads each, and how a rank is named in messages.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace wb::coord {

/// The roles of every world rank, learnt at construction (collective over world).
struct Roles {
  int world_rank = 0, world_size = 0;
  bool trainer = false;
  int trainer_leader = -1;                  // world rank of trainer rank 0
  std::vector<int> trainers;                // world ranks by trainer rank
  std::vector<int> engine_leaders;          // world rank of each engine's rank 0, ascending
  std::vector<std::vector<int>> engines;    // per engine: world ranks by engine rank
  std::vector<int> engine_of_rank;          // per world rank: engine index, -1 for trainers
  std::vector<int> group_rank_of;           // per world rank: its rank in its trainer group or engine
  int engine = -1;                          // this rank's engine
  int group_rank = 0, group_size = 1;       // in its own group
  bool leader = false;                      // rank 0 of its group
  /// The world ranks of this rank's own group, by group rank.
  const std::vector<int>& group() const { return trainer ? trainers : engines[static_cast<std::size_t>(engine)]; }
};

/// "trainer 3 (world rank 3)" or "engine 1 worker 0 (world rank 12)".
std::string describe_worker(const Roles& roles, int world_rank);

/// Collective over `world`: each rank says whether it trains and gives its group. Throws when the groups do
/// not make exactly one trainer group (no engine is allowed: a trainer job started before its engines), or
/// when a rank does not take part within `timeout`.
Roles exchange_roles(MPI_Comm world, MPI_Comm group, bool trainer, double timeout);

}  // namespace wb::coord
