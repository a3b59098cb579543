// What the executor's tests and benchmark do in place of an adapter's connect: probe this rank's emulated
// worker, all-gather the source maps, plan on rank 0 with the function connect plans with
// (plan_round_schedules), and scatter the round schedules. Blocking collectives over `comm` without
// deadlines (connect's own waits have them), on a uniform topology of the deployment's nodes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/plan.hpp"

namespace wb::emu {

struct EmulatedConnection {
  RoundSchedule schedule;        // this rank's
  std::int64_t model_bytes = 0;  // M of the plan; rank 0 only
};

/// Collective over `comm` (a rank per worker of `deployment`, in world-rank order). `params` are the
/// worker's parameters, probed through its load_weights. Bandwidths only weight the plan's balance: on one
/// machine every link is shared memory.
EmulatedConnection emulated_connect(const EmulatedWorker& worker, const ParameterSet& params,
                                    const std::vector<TensorInfo>& tensors, const Deployment& deployment,
                                    const PlanOptions& options, MPI_Comm comm);

}  // namespace wb::emu
