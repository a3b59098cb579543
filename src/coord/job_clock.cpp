#include "weightbridge/job_clock.hpp"

#include <string>

#include "comm/deadline.hpp"
#include "coord/clock_offset.hpp"

namespace wb {

JobClock::JobClock(MPI_Comm world) : JobClock(world, comm::timeout_setting()) {}

JobClock::JobClock(MPI_Comm world, double timeout_seconds)
    : offset_(coord::measure_clock_offset(world, comm::normalize_timeout(timeout_seconds),
                                          [](int rank) { return "world rank " + std::to_string(rank); })) {}

double JobClock::now() const { return comm::local_seconds() + offset_; }

}  // namespace wb
