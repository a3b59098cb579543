// What the round executor's MPI tests (parameters in host memory, tests/mpi; on the GPU, tests/gpu) start
// from: this rank's emulated worker of a layout, its parameters in host memory, and its round schedule from
// emulated_connect, planned with small pieces so that the tiny models still take several rounds.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <utility>

#include "emu/frameworks/backend.hpp"
#include "emu/setup/emulated_connect.hpp"
#include "emu/setup/emulated_rank.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/plan.hpp"

namespace wb::testing_support {

struct ExecutorRank {
  emu::EmulatedRank setup;
  emu::HostParameters host;  // as probed; the tests fill them before the first update
  RoundSchedule schedule;
  bool trainer = false;
};

/// Collective over `comm`. Throws (emulated_rank) when the layout needs another number of ranks.
inline ExecutorRank executor_rank(const emu::EmulatedLayout& layout, std::int64_t buffer_bytes, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  emu::EmulatedRank setup = emu::emulated_rank(layout, rank, size);
  emu::HostParameters host(setup.worker->parameter_infos());
  PlanOptions options;
  options.buffer_bytes_per_worker = buffer_bytes;
  options.piece_bytes = 2048;
  RoundSchedule schedule =
      emu::emulated_connect(*setup.worker, host.parameters(), setup.tensors, setup.deployment, options, comm).schedule;
  const bool trainer = setup.deployment.is_trainer(rank);
  return {std::move(setup), std::move(host), std::move(schedule), trainer};
}

}  // namespace wb::testing_support
