#include "weightbridge/job_clock.hpp"

#include <string>

#include "coord/control.hpp"

namespace wb {

JobClock::JobClock(MPI_Comm world, double timeout_seconds) : offset_(coord::measure_clock_offset(world, timeout_seconds, [](int rank) { return "world rank " + std::to_string(rank); })) {}

double JobClock::now() const { return coord::local_seconds() + offset_; }

}  // namespace wb
