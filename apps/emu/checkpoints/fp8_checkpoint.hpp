// The FP8 form of a checkpoint on disk, as FP8 model releases ship it: the fp8 weights (safetensors
// F8_E4M3) with their float32 `<name>_scale_inv` block scales, and a config.json beside the file whose
// `quantization_config` says how (quant_method fp8, fmt e4m3, weight_block_size, modules_to_not_convert,
// ignored_layers; scale_fmt ue8m0 for power-of-two scales, as DeepSeek-V3.1 writes it, and the rule by
// name under "weightbridge_scale_rule", since the other two rules share one format).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "layout/fp8_form.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

nlohmann::ordered_json quantization_config_json(const layout::QuantizationConfig& config);
/// Throws kInvalidArgument naming `where` and the key on a config that is not an e4m3 block-FP8 one.
layout::QuantizationConfig parse_quantization_config(const nlohmann::json& json, const std::string& where);

/// config.json beside a checkpoint file (or in the directory `checkpoint_path` names).
std::string config_path_beside(const std::string& checkpoint_path);

/// Writes every tensor of `source` to `path`, one at a time (`between_tensors` as in
/// write_synthetic_checkpoint).
void write_checkpoint_of(const CheckpointReader& source, const std::string& path, CheckpointFormat format,
                         const CheckpointWriterOptions& options = {}, const std::function<void()>& between_tensors = {});

/// Writes `form`'s tensors, read from `bf16` through open_fp8_form, to `path`, then config.json beside it
/// holding `model_config` with `quantization_config` added. `between_tensors` as in
/// write_synthetic_checkpoint.
void write_fp8_checkpoint(const std::string& path, CheckpointFormat format, const layout::Fp8Form& form,
                          const CheckpointReader& bf16, nlohmann::ordered_json model_config,
                          const CheckpointWriterOptions& options = {}, const std::function<void()>& between_tensors = {});

/// The quantization_config of the config.json beside `checkpoint_path`; throws kNotFound when there is
/// none, kInvalidArgument when it is not FP8.
layout::QuantizationConfig read_quantization_config(const std::string& checkpoint_path);

}  // namespace wb::emu
