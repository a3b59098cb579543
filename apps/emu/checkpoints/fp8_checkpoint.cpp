#include "emu/checkpoints/fp8_checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::emu {

namespace fs = std::filesystem;

nlohmann::ordered_json quantization_config_json(const layout::QuantizationConfig& config) {
  nlohmann::ordered_json q;
  q["quant_method"] = "fp8";
  q["fmt"] = "e4m3";
  q["activation_scheme"] = "dynamic";
  q["weight_block_size"] = {config.block_rows, config.block_cols};
  if (config.rule == fp8::ScaleRule::kUe8m0) q["scale_fmt"] = "ue8m0";
  q["weightbridge_scale_rule"] = std::string(fp8::scale_rule_name(config.rule));
  q["modules_to_not_convert"] = config.modules_to_not_convert;
  q["ignored_layers"] = config.ignored_layers;
  return q;
}

layout::QuantizationConfig parse_quantization_config(const nlohmann::json& json, const std::string& where) {
  const auto bad = [&](const std::string& cause) {
    throw Error(ErrorCode::kInvalidArgument, where + ": quantization_config: " + cause);
  };
  if (!json.is_object()) bad("not an object");
  if (json.value("quant_method", std::string()) != "fp8") bad("quant_method is not \"fp8\"");
  if (json.value("fmt", std::string("e4m3")) != "e4m3") bad("fmt \"" + json.value("fmt", std::string()) + "\" is not e4m3");
  layout::QuantizationConfig config;
  const auto block = json.find("weight_block_size");
  if (block == json.end() || !block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<std::int64_t>() <= 0 || (*block)[1].get<std::int64_t>() <= 0)
    bad("weight_block_size is not two positive integers (per-tensor FP8 is not block FP8)");
  config.block_rows = (*block)[0].get<std::int64_t>();
  config.block_cols = (*block)[1].get<std::int64_t>();
  const std::string fallback = json.value("scale_fmt", std::string()) == "ue8m0" ? "ue8m0" : "per-block-cast";
  config.rule = layout::parse_scale_rule_or_throw(json.value("weightbridge_scale_rule", fallback),
                                                  where + ": quantization_config.weightbridge_scale_rule");
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    const auto list = json.find(key);
    if (list == json.end() || list->is_null()) continue;
    if (!list->is_array()) bad(std::string(key) + " is not a list of names");
    for (const auto& item : *list) {
      if (!item.is_string()) bad(std::string(key) + " is not a list of names");
      (std::string(key) == "ignored_layers" ? config.ignored_layers : config.modules_to_not_convert).push_back(item.get<std::string>());
    }
  }
  return config;
}

std::string config_path_beside(const std::string& checkpoint_path) {
  std::error_code ec;
  const fs::path path(checkpoint_path);
  return ((fs::is_directory(path, ec) ? path : path.parent_path()) / "config.json").string();
}

void write_checkpoint_of(const CheckpointReader& source, const std::string& path, CheckpointFormat format,
                         const CheckpointWriterOptions& options, const std::function<void()>& between_tensors) {
  std::size_t largest = 1;
  for (const TensorInfo& t : source.tensors()) largest = std::max(largest, t.nbytes());
  auto writer = create_checkpoint(path, format, source.tensors(), options);
  std::vector<std::byte> buffer(largest);
  for (const TensorInfo& t : source.tensors()) {
    if (between_tensors) between_tensors();
    source.read_box(t.name, Box::whole(t.shape), buffer.data());
    writer->write(t.name, buffer.data());
  }
  if (between_tensors) between_tensors();
  writer->finish();
}

void write_fp8_checkpoint(const std::string& path, CheckpointFormat format, const layout::Fp8Form& form,
                          const CheckpointReader& bf16, nlohmann::ordered_json model_config,
                          const CheckpointWriterOptions& options, const std::function<void()>& between_tensors) {
  write_checkpoint_of(*layout::open_fp8_form(bf16, form), path, format, options, between_tensors);
  model_config["quantization_config"] = quantization_config_json(form.config);
  const std::string config_path = config_path_beside(path);
  std::ofstream out(config_path);
  out << model_config.dump(2) << '\n';
  if (!out) throw Error(ErrorCode::kSystem, "cannot write " + config_path);
}

layout::QuantizationConfig read_quantization_config(const std::string& checkpoint_path) {
  const std::string config_path = config_path_beside(checkpoint_path);
  std::ifstream in(config_path);
  if (!in) throw Error(ErrorCode::kNotFound, config_path + ": no config.json beside the FP8 checkpoint " + checkpoint_path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, config_path + ": not JSON (" + e.what() + ")");
  }
  const auto q = json.find("quantization_config");
  if (q == json.end()) throw Error(ErrorCode::kInvalidArgument, config_path + ": no quantization_config");
  return parse_quantization_config(*q, config_path);
}

}  // namespace wb::emu
