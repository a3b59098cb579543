// The planner's settings: declared once, read by connect (coordinator) and by wb-plan alike.
#include "weightbridge/plan.hpp"
#include "weightbridge/settings.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

Setting<std::int64_t> buffer_mib_setting("buffer_mib", 1024,
                                         "Transfer-buffer memory per worker in MiB, all pipeline slots, send and "
                                         "receive; fewer bytes mean more rounds. connect fits the smallest any worker gives.");
Setting<std::int64_t> pipeline_depth_setting("pipeline_depth", 2, "Transfer rounds in flight per worker (2: double buffering).");

}  // namespace

PlanOptions plan_options_from_settings() {
  PlanOptions options;
  options.buffer_bytes_per_worker = *buffer_mib_setting << 20;
  options.pipeline_depth = static_cast<int>(*pipeline_depth_setting);
  if (*buffer_mib_setting <= 0 || *buffer_mib_setting > (std::int64_t{1} << 30))
    throw Error(ErrorCode::kInvalidArgument, "buffer_mib " + std::to_string(*buffer_mib_setting) + " is not in 1..2^30");
  if (options.pipeline_depth < 1 || options.pipeline_depth > 64)
    throw Error(ErrorCode::kInvalidArgument, "pipeline_depth " + std::to_string(options.pipeline_depth) + " is not in 1..64");
  return options;
}

}  // namespace wb
