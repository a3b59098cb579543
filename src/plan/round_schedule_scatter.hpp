// The delivery of round schedules over MPI (plan/round_schedule_scatter.cpp): kept out of round_schedule.hpp,
// so that the data types need no MPI. The one delivery connect, the emulators and the tests use.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "comm/collectives.hpp"
#include "plan/round_schedule.hpp"

namespace wb {

/// Collective over `comm`: `root` passes one serialized schedule per rank of comm (others pass an empty
/// vector); every rank returns its own, delivered with comm::scatter (a scatter of the sizes, then one
/// MPI_Iscatterv) within the call's deadline. When the root cannot deliver (it passes `root_failure`: its
/// planning failed; or its input is wrong: not one schedule per rank, kInvalidArgument; a schedule or all
/// of them together past an int count, kUnsupported) every rank throws the root's error, at once. A
/// schedule that does not decode throws kCorruptData on every rank ("round schedule received by <rank>:
/// ..."): the ranks agree on their decoding before any returns, so that none goes on alone.
RoundSchedule scatter_round_schedules(const std::vector<std::vector<std::byte>>& serialized, int root, MPI_Comm comm,
                                      const comm::Call& call = {}, const Status& root_failure = Status::ok());

}  // namespace wb
