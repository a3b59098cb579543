// The delivery of round schedules over MPI (plan/round_schedule_scatter.cpp): kept out of round_schedule.hpp,
// so that the data types need no MPI.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "plan/round_schedule.hpp"

namespace wb {

/// Collective over `comm`: `root` passes one serialized schedule per rank of comm (others pass an empty
/// vector); every rank returns its own, delivered with MPI_Scatterv (plus MPI_Scatter of the sizes).
/// When the root's input is wrong (not one schedule per rank: kInvalidArgument; a schedule or all of them
/// together past an int count: kUnsupported) the root still takes part in the size scatter, so every rank
/// throws instead of waiting. A schedule that does not decode throws kCorruptData on its rank only
/// ("round schedule received by rank N: ...").
RoundSchedule scatter_round_schedules(const std::vector<std::vector<std::byte>>& serialized, int root, MPI_Comm comm);

}  // namespace wb
