// Before the adapters duplicate their group communicators (a collective over each group, which would wait for
// ever on a rank that passed another one): every world rank's group, compared over the world communicator.
#pragma once

#include <mpi.h>

#include "comm/operation.hpp"

namespace wb::coord {

/// Collective over `world`: each rank gives the members of `group` (its trainer_comm or engine_comm) and its
/// role. Throws the same kInvalidArgument on every rank when two ranks of one group disagree about its members
/// (MPI_COMM_SELF on one worker of an engine), when a group mixes trainers and rollout workers (the world
/// communicator passed as trainer_comm), or when a group holds ranks outside the world; kTimeout when a rank
/// does not take part within the waiter's deadline. The adapters' first exchange over the world: `caller` is
/// what the caller's own checks found (a language binding's, coord/binding_checks.hpp); when it is a failure,
/// `group` may be MPI_COMM_NULL, the rank still takes part, and every rank throws the lowest failing rank's.
void check_groups(MPI_Comm world, MPI_Comm group, bool trainer, const comm::Waiter& waiter,
                  const Status& caller = Status::ok());

}  // namespace wb::coord
