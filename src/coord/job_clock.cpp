#include "weightbridge/job_clock.hpp"

#include <string>

#include "coord/control.hpp"
#include "exec/round_executor.hpp"

namespace wb {

JobClock::JobClock(MPI_Comm world) : JobClock(world, exec::timeout_setting()) {}

JobClock::JobClock(MPI_Comm world, double timeout_seconds)
    : offset_(coord::measure_clock_offset(world, coord::normalize_timeout(timeout_seconds),
                                          [](int rank) { return "world rank " + std::to_string(rank); })) {}

double JobClock::now() const { return coord::local_seconds() + offset_; }

}  // namespace wb
