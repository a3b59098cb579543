#include "emu/frameworks/fp8_engine.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using i64 = std::int64_t;

i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

/// The multi-index of `piece`'s first element inside `whole` (which `piece` points into).
Shape origin_in(const TensorView& whole, const TensorView& piece) {
  const auto element = static_cast<i64>(whole.element_size());
  i64 offset = (static_cast<const std::byte*>(piece.data) - static_cast<const std::byte*>(whole.data)) / element;
  std::vector<int> axes(static_cast<std::size_t>(whole.ndim()));
  std::iota(axes.begin(), axes.end(), 0);
  std::sort(axes.begin(), axes.end(), [&](int a, int b) { return whole.strides[a] > whole.strides[b]; });
  Shape index(axes.size(), 0);
  for (int axis : axes) {
    if (whole.shape[axis] <= 1 || whole.strides[axis] == 0) continue;
    index[axis] = offset / whole.strides[axis];
    offset %= whole.strides[axis];
  }
  return index;
}

}  // namespace

layout::QuantizationConfig engine_quantization(const ModelConfig& model, const RolloutSpec& spec) {
  if (!spec.fp8()) throw Error(ErrorCode::kInternal, "engine_quantization of a BF16 engine");
  layout::QuantizationConfig config;
  config.block_rows = spec.fp8_block_rows;
  config.block_cols = spec.fp8_block_cols;
  config.rule = layout::parse_scale_rule_or_throw(spec.fp8_rule, "fp8_rule");
  // As the FP8 checkpoints of Qwen3 and DeepSeek keep them: token embeddings and the head in BF16 (the
  // embedding is no linear layer; the head is listed), and the router gates (module paths, so that
  // "mlp.gate" does not also catch gate_proj and gate_up_proj).
  config.modules_to_not_convert = {"embed_tokens", "lm_head"};
  for (i64 layer = 0; layer < model.num_hidden_layers; ++layer)
    if (model.is_moe_layer(layer)) config.ignored_layers.push_back("model.layers." + std::to_string(layer) + ".mlp.gate");
  return config;
}

Fp8Engine fp8_engine_option(const layout::QuantizationConfig& config) {
  Fp8Engine option;
  option.block_rows = config.block_rows;
  option.block_cols = config.block_cols;
  option.scale_rule = std::string(fp8::scale_rule_name(config.rule));
  option.modules_to_not_convert = config.modules_to_not_convert;
  option.ignored_layers = config.ignored_layers;
  return option;
}

layout::Fp8Form engine_form(const ModelConfig& model, const RolloutSpec& spec) {
  return layout::derive_fp8_form(model_tensors(model), engine_quantization(model, spec));
}

Shape scale_parameter_shape(const Shape& shape, const layout::QuantizationConfig& config) {
  if (shape.size() < 2) throw Error(ErrorCode::kInternal, "scale_parameter_shape of a tensor with fewer than 2 axes");
  Shape out = shape;
  out[out.size() - 2] = ceil_div(shape[shape.size() - 2], config.block_rows);
  out[out.size() - 1] = ceil_div(shape[shape.size() - 1], config.block_cols);
  return out;
}

ScalePiece locate_scales(const std::string& who, const std::string& tensor, const Shape& tensor_shape, const Box& box,
                         const TensorView& weight, const TensorView& scales, const TensorView& piece,
                         const layout::QuantizationConfig& config) {
  const int nd = weight.ndim();
  if (tensor_shape.size() != 2 || box.ndim() != 2 || piece.ndim() != 2 || nd < 2 || scales.ndim() != nd)
    throw Error(ErrorCode::kInternal, who + ": block scales of " + tensor + " need a 2-D piece of a weight");
  const int row_axis = nd - 2;  // then the columns
  // The piece's rows and columns must run along the weight's last two axes (a row or column shard).
  for (int k = 0; k < 2; ++k)
    if (piece.shape[k] > 1 && piece.strides[k] != weight.strides[row_axis + k])
      throw Error(ErrorCode::kInternal, who + ": the piece of " + tensor + " does not run along the weight's last axes");
  const Shape origin = origin_in(weight, piece);
  const i64 block[2] = {config.block_rows, config.block_cols};
  const char* axis_name[2] = {"rows", "columns"};
  ScalePiece out;
  out.box.offset.resize(2);
  out.box.extent.resize(2);
  TensorView view = scales;
  for (int lead = 0; lead < nd - 2; ++lead) view = view.select(0, origin[static_cast<std::size_t>(lead)]);
  for (int k = 0; k < 2; ++k) {
    const i64 b = block[k], first = box.offset[k], count = box.extent[k];
    const i64 at = origin[static_cast<std::size_t>(row_axis + k)], size = weight.shape[row_axis + k];
    const std::string range = std::string(axis_name[k]) + " [" + std::to_string(first) + ", " +
                              std::to_string(first + count) + ") of " + tensor;
    const auto refuse = [&](const std::string& cause) {
      throw Error(ErrorCode::kInvalidArgument, who + ": block shape " + std::to_string(config.block_rows) + "x" +
                                                   std::to_string(config.block_cols) + " does not tile " + range +
                                                   ": " + cause);
    };
    if (first % b != 0) refuse("the shard starts inside a block of " + std::to_string(b));
    const bool edge = count % b != 0;
    if (edge && first + count != tensor_shape[static_cast<std::size_t>(k)])
      refuse("the shard ends inside a block of " + std::to_string(b) + " before the tensor's end");
    if (at % b != 0)
      refuse("it lands at parameter " + std::string(axis_name[k]) + " " + std::to_string(at) +
             ", inside a block of the parameter's scales");
    if (edge && at + count != size)
      refuse("its partial edge block would share a scale with what follows it in the parameter");
    out.box.offset[static_cast<std::size_t>(k)] = first / b;
    out.box.extent[static_cast<std::size_t>(k)] = ceil_div(count, b);
    view = view.narrow(k, at / b, ceil_div(count, b));
  }
  out.view = view;
  return out;
}

}  // namespace wb::emu
