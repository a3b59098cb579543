// The job's common clock: world rank 0's steady clock, read on any rank. The adapters put stall intervals
// on it; programs that time other transfers beside them (wb-bench's baselines) use the same clock.
#pragma once

#include <mpi.h>

namespace wb {

class JobClock {
 public:
  /// Collective over `world`: measures this rank's offset to rank 0 (the ping-pong with the shortest round
  /// trip of a few). Throws wb::Error when rank 0 does not answer within `timeout_seconds` (0 or infinite:
  /// no deadline), or within the adapters' timeout (WB_TIMEOUT_SECONDS) when none is given.
  explicit JobClock(MPI_Comm world);
  JobClock(MPI_Comm world, double timeout_seconds);
  /// Seconds on world rank 0's steady clock.
  double now() const;
  double offset() const { return offset_; }

 private:
  double offset_ = 0;
};

}  // namespace wb
