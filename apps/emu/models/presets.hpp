// The paper's deployments (Table 2 and the dense Qwen3-32B case) as named presets, at full scale or
// on the tiny variant of the same model.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "emu/frameworks/layout_spec.hpp"
#include "emu/models/model.hpp"

namespace wb::emu {

struct Preset {
  std::string name;          // "qwen3-30b-a3b"
  std::string model_config;  // shipped config stem
  std::string trainer;       // trainer spec at full scale
  std::string rollout;       // rollout spec
  int gpus_per_node = 8;
  // The tiny variant keeps every parallel degree; only the layer count (and with it the uneven last
  // pipeline stage) changes so that the stages still split.
  std::int64_t tiny_layers = 4;
  int tiny_pp_last = 0;
  std::int64_t tiny_moe_intermediate_size = 0;  // 0: the tiny default
  // FP8 engines: the layout an FP8 deployment of the model runs where `rollout`'s shards do not tile the
  // engines' blocks (empty: none), and why it is that one, in a few words.
  std::string fp8_rollout = {};
  std::string fp8_rollout_why = {};
};

const std::vector<Preset>& presets();
/// Throws naming the known presets when `name` is not one.
const Preset& find_preset(std::string_view name);

enum class ModelScale { kFull, kTiny };
ModelScale parse_model_scale(std::string_view text);  // "full" | "tiny"

struct PresetInstance {
  ModelConfig model;
  Deployment deployment;
};

PresetInstance instantiate_preset(const Preset& preset, ModelScale scale);

}  // namespace wb::emu
