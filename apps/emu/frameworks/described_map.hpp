// Described source maps: the slice copies an emulated worker's load_weights performs, derived from its
// export_weights without touching any data, so that plans can be made for deployments far larger than
// this machine. The library itself never uses these: it probes (docs/architecture.md); tests compare the two.
#pragma once

#include <vector>

#include "emu/frameworks/backend.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::emu {

/// The worker's source map, in terms of `checkpoint_tensors` (the checkpoint's tensor list), normalized.
/// No parameter memory is allocated: views point into an address range that is never dereferenced.
SourceMap described_source_map(const EmulatedWorker& worker, const std::vector<TensorInfo>& checkpoint_tensors);

/// Every worker of a deployment, in world-rank order: its described map, its side and its rollout engine
/// (-1 for trainers). Rollout engines are identical, so each rank-in-engine's map is built once.
/// FP8 engines (deployment.rollout.fp8()): the maps are in the FP8 form's tensors, the trainers' as their
/// quantizing pack makes them (exec/quantized_pack.hpp: fp8 shadows and scales), as connect plans them; a
/// mixed fleet (rollout bf16_engines) in the union of both forms (layout/form_union.hpp), as connect plans it.
struct DescribedDeployment {
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
  std::vector<int> engine_of_worker;
  std::size_t copies = 0;  // over all maps
  std::vector<TensorInfo> tensors;  // what the maps are in: the checkpoint's tensors, the FP8 form's or their union
  // FP8 engines: the blocks trainers share (their amaxes exchanged every update, 4 bytes per block per trainer).
  std::int64_t fp8_shared_blocks = 0;
};
/// The described maps of one rollout engine's workers (`spec`'s first engine), in the FP8 form's tensors for
/// FP8 engines: what describe_deployment builds for the rollout side, alone. Throws as the engine's loader
/// refuses (kInvalidArgument: a shard that does not tile the FP8 blocks).
std::vector<SourceMap> describe_rollout_engine(const ModelConfig& model, const RolloutSpec& spec,
                                               const std::vector<TensorInfo>& checkpoint_tensors);

DescribedDeployment describe_deployment(const ModelConfig& model, const Deployment& deployment,
                                        const std::vector<TensorInfo>& checkpoint_tensors);

}  // namespace wb::emu
