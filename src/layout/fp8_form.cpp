#include "layout/fp8_form.hpp"

#include <charconv>
#include <cmath>
#include <unordered_set>

#include "core/settings.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

Setting<std::string> block_setting("fp8_block", "128x128",
                                   "Block shape (rows x columns) of an FP8 engine's scales, where its quantization "
                                   "config does not say (weight_block_size).");
Setting<std::string> rule_setting("fp8_scale_rule", "per-block-cast",
                                  "Scale rule of an FP8 engine where its config does not say: plain (s = amax/448, "
                                  "q = x/s), per-block-cast (SGLang/DeepGEMM: amax clamped at 1e-4, q = x*(448/amax)) "
                                  "or ue8m0 (power-of-two scales).");

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::int64_t parse_extent(std::string_view text, std::string_view what, std::string_view whole) {
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value <= 0)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": block shape \"" + std::string(whole) +
                                                 "\" is not two positive extents such as 128x128");
  return value;
}

}  // namespace

void parse_block_shape(std::string_view text, std::int64_t& rows, std::int64_t& cols, std::string_view what) {
  const std::size_t cut = text.find_first_of("x,");
  if (cut == std::string_view::npos)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": block shape \"" + std::string(text) +
                                                 "\" is not two positive extents such as 128x128");
  rows = parse_extent(text.substr(0, cut), what, text);
  cols = parse_extent(text.substr(cut + 1), what, text);
}

fp8::ScaleRule parse_scale_rule_or_throw(std::string_view text, std::string_view what) {
  const auto rule = fp8::parse_scale_rule(text);
  if (!rule)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": unknown scale rule \"" + std::string(text) +
                                                 "\" (plain, per-block-cast, ue8m0)");
  return *rule;
}

QuantizationConfig QuantizationConfig::from_settings() {
  QuantizationConfig config;
  parse_block_shape(*block_setting, config.block_rows, config.block_cols, "WB_FP8_BLOCK");
  config.rule = parse_scale_rule_or_throw(*rule_setting, "WB_FP8_SCALE_RULE");
  return config;
}

std::string QuantizationConfig::to_string() const {
  return std::to_string(block_rows) + "x" + std::to_string(block_cols) + ", " +
         std::string(fp8::scale_rule_name(rule));
}

std::string encode_quantization_config(const QuantizationConfig& config) {
  std::string text = std::to_string(config.block_rows) + "x" + std::to_string(config.block_cols) + "\n" +
                     std::string(fp8::scale_rule_name(config.rule)) + "\n" + config.weight_suffix + "\n" +
                     config.scale_suffix + "\n" + std::to_string(config.modules_to_not_convert.size()) + "\n";
  for (const std::string& m : config.modules_to_not_convert) text += m + "\n";
  for (const std::string& l : config.ignored_layers) text += l + "\n";
  return text;
}

QuantizationConfig decode_quantization_config(std::string_view text) {
  std::vector<std::string> lines;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) throw Error(ErrorCode::kCorruptData, "FP8 quantization config: unterminated line");
    lines.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (lines.size() < 5) throw Error(ErrorCode::kCorruptData, "FP8 quantization config: too few fields");
  QuantizationConfig config;
  parse_block_shape(lines[0], config.block_rows, config.block_cols, "FP8 quantization config");
  config.rule = parse_scale_rule_or_throw(lines[1], "FP8 quantization config");
  config.weight_suffix = lines[2];
  config.scale_suffix = lines[3];
  std::size_t modules = 0;
  const auto [end, ec] = std::from_chars(lines[4].data(), lines[4].data() + lines[4].size(), modules);
  if (ec != std::errc() || end != lines[4].data() + lines[4].size() || modules > lines.size() - 5)
    throw Error(ErrorCode::kCorruptData, "FP8 quantization config: bad module count");
  config.modules_to_not_convert.assign(lines.begin() + 5, lines.begin() + 5 + static_cast<std::ptrdiff_t>(modules));
  config.ignored_layers.assign(lines.begin() + 5 + static_cast<std::ptrdiff_t>(modules), lines.end());
  return config;
}

std::size_t Fp8Form::total_bytes() const {
  std::size_t bytes = 0;
  for (const TensorInfo& t : tensors) bytes += t.nbytes();
  return bytes;
}

bool converted_by(const TensorInfo& tensor, const QuantizationConfig& config) {
  if (!fp8::quantizable(tensor.dtype) || tensor.shape.size() != 2 || !ends_with(tensor.name, config.weight_suffix))
    return false;
  for (const std::string& module : config.modules_to_not_convert)
    if (!module.empty() && tensor.name.find(module) != std::string::npos) return false;
  for (const std::string& layer : config.ignored_layers)
    if (!layer.empty() && tensor.name.size() > layer.size() && tensor.name.compare(0, layer.size(), layer) == 0 &&
        tensor.name[layer.size()] == '.')
      return false;
  return true;
}

Shape scale_shape(const Shape& shape, const QuantizationConfig& config) {
  return {(shape.at(0) + config.block_rows - 1) / config.block_rows,
          (shape.at(1) + config.block_cols - 1) / config.block_cols};
}

Fp8Form derive_fp8_form(std::vector<TensorInfo> source_tensors, QuantizationConfig config) {
  if (config.block_rows <= 0 || config.block_cols <= 0)
    throw Error(ErrorCode::kInvalidArgument, "FP8 form: block shape " + config.to_string() + " is not positive");
  Fp8Form form;
  form.config = std::move(config);
  std::unordered_set<std::string_view> taken;
  for (const TensorInfo& t : source_tensors) taken.insert(t.name);
  for (std::uint32_t i = 0; i < source_tensors.size(); ++i) {
    const TensorInfo& t = source_tensors[i];
    if (!converted_by(t, form.config)) {
      form.tensors.push_back(t);
      form.sources.push_back({FormRole::kCopied, i});
      continue;
    }
    const std::string scale_name = t.name + form.config.scale_suffix;
    if (taken.contains(scale_name))
      throw Error(ErrorCode::kInvalidArgument,
                  "FP8 form: the scales of tensor " + t.name + " would be named " + scale_name +
                      ", which the source checkpoint already holds (is it already in FP8 form?)");
    form.tensors.push_back({t.name, DType::kF8E4M3, t.shape});
    form.sources.push_back({FormRole::kQuantized, i});
    form.tensors.push_back({scale_name, DType::kF32, scale_shape(t.shape, form.config)});
    form.sources.push_back({FormRole::kScale, i});
  }
  form.source_tensors = std::move(source_tensors);
  return form;
}

void quantize_band(const QuantizationConfig& config, DType dtype, const void* source, std::int64_t rows,
                   std::int64_t cols, std::uint8_t* codes, float* scales) {
  const auto* bytes = static_cast<const std::byte*>(source);
  const std::size_t size = dtype_size(dtype);
  for (std::int64_t c0 = 0, block = 0; c0 < cols; c0 += config.block_cols, ++block) {
    const std::int64_t c1 = std::min(cols, c0 + config.block_cols);
    float amax = 0.0f;  // the zero padding of an edge block changes no amax
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = c0; c < c1; ++c)
        amax = fp8::amax_combine(amax, std::fabs(fp8::load_float(dtype, bytes + (r * cols + c) * size)));
    const fp8::BlockScale scale = fp8::block_scale(config.rule, amax);
    scales[block] = scale.scale_inv;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = c0; c < c1; ++c)
        codes[r * cols + c] = fp8::quantize(scale, fp8::load_float(dtype, bytes + (r * cols + c) * size));
  }
}

}  // namespace wb::layout
