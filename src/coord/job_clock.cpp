#include "weightbridge/job_clock.hpp"

#include "coord/control.hpp"

namespace wb {

JobClock::JobClock(MPI_Comm world, double timeout_seconds) : offset_(coord::measure_clock_offset(world, timeout_seconds)) {}

double JobClock::now() const { return coord::local_seconds() + offset_; }

}  // namespace wb
