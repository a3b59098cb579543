// World rank 0's part of connect: from every worker's source map to every rank's serialized round schedule
// (correspondence, plan, schedules), as one function, so that the executor's tests and benchmark plan
// exactly as connect does (apps/emu/setup/emulated_connect.hpp) instead of restating the steps.
#pragma once

#include <cstddef>
#include <vector>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/source_map.hpp"

namespace wb {

struct PlannedSchedules {
  Correspondence correspondence;
  TransferPlan plan;
  std::vector<std::vector<std::byte>> schedules;  // per world rank: what MPI_Scatterv delivers
};

/// build_correspondence, plan_transfer and serialize_round_schedules on this node's cores. Throws as they do.
PlannedSchedules plan_round_schedules(const std::vector<TensorInfo>& tensors, std::vector<SourceMap> maps,
                                      std::vector<Side> sides, const Topology& topology, const PlanOptions& options);

}  // namespace wb
