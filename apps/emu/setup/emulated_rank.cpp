#include "emu/setup/emulated_rank.hpp"

#include "weightbridge/status.hpp"

namespace wb::emu {

EmulatedRank emulated_rank(const EmulatedLayout& layout, int rank, int world_size) {
  EmulatedRank out;
  ScaleOptions scale;
  scale.num_layers = layout.layers;
  out.model = scale_model(load_named_model_config(layout.model), scale);
  out.deployment.trainer = TrainerSpec::parse(layout.trainer);
  out.deployment.rollout = RolloutSpec::parse(layout.rollout);
  out.deployment.gpus_per_node = layout.gpus_per_node;
  if (out.deployment.world_size() != world_size)
    throw Error(ErrorCode::kInvalidArgument, "trainer " + layout.trainer + " and rollout " + layout.rollout + " need " +
                                                 std::to_string(out.deployment.world_size()) + " ranks: run with " +
                                                 std::to_string(out.deployment.world_size()) + " ranks, not " +
                                                 std::to_string(world_size));
  out.tensors = model_tensors(out.model);
  out.worker = make_worker(out.model, out.deployment, rank);
  return out;
}

}  // namespace wb::emu
