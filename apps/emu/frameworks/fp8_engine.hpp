// What an emulated FP8 engine knows that the library does not: which of a model's tensors its loader keeps
// in BF16 (embeddings, lm_head, router gates; norms and biases are not 2-D weights), and how block scales
// follow their weights into fused and sharded parameters, as vLLM's and SGLang's block-quantized loaders do
// (BlockQuantScaleParameter: a shard of W at rows [r, r + n) lands at parameter rows [p, p + n), and its
// scales, at scale rows [r / b0, ceil((r + n) / b0)), land at scale rows p / b0 on; the same for columns).
#pragma once

#include <string>

#include "emu/frameworks/layout_spec.hpp"
#include "emu/models/model.hpp"
#include "layout/fp8_form.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::emu {

/// The quantization config of `spec`'s FP8 engine for `model` (spec.fp8() must be true): its block shape
/// and scale rule; embeddings and lm_head in modules_to_not_convert, every MoE layer's router gate in
/// ignored_layers (MLA's kv_b_proj included: the engine holds it in fp8, as vLLM does).
layout::QuantizationConfig engine_quantization(const ModelConfig& model, const RolloutSpec& spec);

/// The same config as the adapters' option.
Fp8Engine fp8_engine_option(const layout::QuantizationConfig& config);

/// The FP8 form `spec`'s engines load: derived from the model's checkpoint tensors (spec.fp8()).
layout::Fp8Form engine_form(const ModelConfig& model, const RolloutSpec& spec);

/// The scale parameter's shape for a weight parameter of `shape` (its last two axes the checkpoint
/// tensor's rows and columns): the last two axes in blocks, rounded up.
Shape scale_parameter_shape(const Shape& shape, const layout::QuantizationConfig& config);

/// Where the scales of one weight piece go: `box` of the checkpoint's scale tensor, and the view of the
/// scale parameter it lands in (box.extent in shape).
struct ScalePiece {
  Box box;
  TensorView view;
};

/// For `box` of quantized checkpoint tensor `tensor` (shape `tensor_shape`) landing in `piece`, a view into
/// `weight` (the whole weight parameter, its last two axes the tensor's rows and columns, permuted back if
/// stored transposed): the scales of the blocks it covers and their place in `scales` (the whole scale
/// parameter, viewed the same way). Throws kInvalidArgument naming `who`, the tensor and the rows or
/// columns when the block shape does not tile the piece the way the scales are laid out (a shard that
/// starts inside a block, or an edge block that does not end the parameter).
ScalePiece locate_scales(const std::string& who, const std::string& tensor, const Shape& tensor_shape, const Box& box,
                         const TensorView& weight, const TensorView& scales, const TensorView& piece,
                         const layout::QuantizationConfig& config);

}  // namespace wb::emu
