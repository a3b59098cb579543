// The round executor (DESIGN.md, component 3): replays a rank's round schedule every update over the
// transports. Per round: one pack, one batch of one-sided writes per peer and stage, forwarding straight
// from the receive buffer, one assemble; rounds pipelined over `pipeline_depth` buffer slots, a slot reused
// only after its receiver released it (credits over MPI, the control plane). Everything is allocated,
// registered and connected at construction; an update allocates nothing and registers nothing.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "weightbridge/round_schedule.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/transport.hpp"

namespace wb {

/// A rank's parameters as its source map lists them: base address and size in bytes of each, all in
/// host memory (device memory arrives with the CUDA pack kernels).
struct ParameterMemory {
  std::vector<std::byte*> data;
  std::vector<std::size_t> bytes;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
};

struct ExecutorOptions {
  double timeout_seconds = 120;  // an update that makes no progress for this long fails, naming what it waits for
};

struct ExecutorStats {
  std::int64_t updates = 0;
  std::int64_t registrations = 0;      // memory registrations, all made at construction
  std::int64_t bytes_written = 0;      // by this rank's one-sided writes, all updates
  std::int64_t bytes_assembled = 0;    // into this rank's parameters, all updates
  double last_update_seconds = 0;
  double pack_seconds = 0, assemble_seconds = 0;  // all updates
};

class RoundExecutor {
 public:
  /// Collective over `comm`, whose ranks are the plan's workers. Throws wb::Error on a bad schedule, a
  /// transport that cannot run, or a peer that does not answer within the timeout.
  RoundExecutor(RoundSchedule schedule, ParameterMemory parameters, MPI_Comm comm, ExecutorOptions options = {});
  ~RoundExecutor();
  RoundExecutor(const RoundExecutor&) = delete;
  RoundExecutor& operator=(const RoundExecutor&) = delete;

  /// One update: every round of the schedule. Returns when this rank's writes have completed and all it
  /// receives is assembled into its parameters. Every rank of the plan runs the same number of updates.
  Status run_update();

  const ExecutorStats& stats() const;
  const RoundSchedule& schedule() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace wb
