#include "plan/planned_schedules.hpp"

#include <utility>

#include "plan/round_schedule.hpp"

namespace wb {

PlannedSchedules plan_round_schedules(const std::vector<TensorInfo>& tensors, std::vector<SourceMap> maps,
                                      std::vector<Side> sides, const Topology& topology, const PlanOptions& options) {
  PlannedSchedules out;
  const int ranks = static_cast<int>(maps.size());
  out.correspondence = build_correspondence(tensors, std::move(maps), std::move(sides));
  out.plan = plan_transfer(out.correspondence, topology, options);
  const RoundScheduleBuilder builder(out.correspondence, out.plan);
  out.schedules = serialize_round_schedules(builder, ranks);
  return out;
}

}  // namespace wb
