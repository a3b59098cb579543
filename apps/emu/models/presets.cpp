#include "emu/models/presets.hpp"

#include "weightbridge/status.hpp"

namespace wb::emu {

const std::vector<Preset>& presets() {
  // Table 2 of the paper (layouts as in the public launch scripts it compares against), plus the dense
  // Qwen3-32B deployment. Trainer DP is what is left of the trainer nodes' GPUs.
  static const std::vector<Preset> table = {
      {"moonlight-16b-a3b", "moonlight-16b-a3b", "tp=2,ep=8,dp=4", "engines=1,tp=8,ep=8", 8, 4, 0},
      {"qwen3-30b-a3b", "qwen3-30b-a3b", "tp=4,ep=8,dp=4", "engines=2,tp=8,ep=8", 8, 4, 0},
      {"qwen3-235b-a22b", "qwen3-235b-a22b", "tp=4,pp=4,cp=2,dp=4,ep=16,pp_last=22", "engines=2,tp=32,ep=32", 8, 7, 1},
      {"kimi-k2", "kimi-k2-instruct", "tp=8,pp=8,cp=4,dp=1,ep=32,pp_last=5", "engines=8,tp=32,ep=32,dp_attn=8", 8, 15, 1,
       32 /* the shared expert is split over rollout TP 32 */,
       // The FP8 release's deployment guide runs 16-GPU engines (TP 16, or DP+EP 16): TP 16 cuts the dense
       // MLP's 18,432 rows into 1,152 (9 blocks of 128) where TP 32 cuts 576, which vLLM refuses.
       "engines=16,tp=16,ep=16,dp_attn=4",
       "TP 16 as in Kimi-K2's FP8 deployment guide (16-GPU engines), on the same 256 GPUs with the same attention TP 4"},
      {"qwen3-32b", "qwen3-32b", "tp=8,pp=2", "engines=2,tp=8", 8, 4, 0},
  };
  return table;
}

const Preset& find_preset(std::string_view name) {
  std::string known;
  for (const Preset& preset : presets()) {
    if (preset.name == name) return preset;
    known += (known.empty() ? "" : ", ") + preset.name;
  }
  throw Error(ErrorCode::kNotFound, "unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

ModelScale parse_model_scale(std::string_view text) {
  if (text == "full") return ModelScale::kFull;
  if (text == "tiny") return ModelScale::kTiny;
  throw Error(ErrorCode::kInvalidArgument, "scale '" + std::string(text) + "' is not full or tiny");
}

PresetInstance instantiate_preset(const Preset& preset, ModelScale scale) {
  PresetInstance instance;
  instance.model = load_named_model_config(preset.model_config);
  instance.deployment.trainer = TrainerSpec::parse(preset.trainer);
  instance.deployment.rollout = RolloutSpec::parse(preset.rollout);
  instance.deployment.gpus_per_node = preset.gpus_per_node;
  if (scale == ModelScale::kTiny) {
    ScaleOptions options;
    options.num_layers = preset.tiny_layers;
    if (preset.tiny_moe_intermediate_size > 0) options.moe_intermediate_size = preset.tiny_moe_intermediate_size;
    instance.model = scale_model(instance.model, options);
    instance.deployment.trainer.pp_last = preset.tiny_pp_last;
  }
  // Fail here, not deep inside a worker, when the stages do not split.
  (void)instance.deployment.trainer.stage_layers(instance.model.num_hidden_layers);
  return instance;
}

}  // namespace wb::emu
