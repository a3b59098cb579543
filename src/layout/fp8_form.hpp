// The FP8 form of a checkpoint: the tensor list an FP8 engine loads, derived from the trainers' (BF16)
// tensor list and a quantization config, and the values of that form computed from the BF16 values.
//
// A tensor is converted when it is floating (bf16, f16, f32, f64), two-dimensional, its name ends with
// the config's weight suffix (".weight") and neither list of the config excludes it. A converted tensor
// `W` [rows, cols] becomes `W` in e4m3fn, followed in the list by `W<scale_suffix>` ("W_scale_inv"), f32,
// [ceil(rows / b0), ceil(cols / b1)] for the block shape b0 x b1: one scale per block, dequantized value
// = fp8 value x scale (core/fp8.hpp: the scale rules, the cast). Every other tensor is copied unchanged.
// The library knows no model: which modules stay unconverted comes from the config, which the engine
// gives (config.json's quantization_config).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/fp8.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::layout {

struct QuantizationConfig {
  /// Block shape, rows x columns (128 x 128 by default; any positive shape).
  std::int64_t block_rows = 128;
  std::int64_t block_cols = 128;
  fp8::ScaleRule rule = fp8::ScaleRule::kPerBlockCast;
  /// transformers' modules_to_not_convert: a tensor whose name contains one of these stays unconverted.
  std::vector<std::string> modules_to_not_convert;
  /// vLLM's / SGLang's ignored_layers: a tensor of one of these modules (its name starts with the module
  /// path and a dot) stays unconverted.
  std::vector<std::string> ignored_layers;
  std::string weight_suffix = ".weight";
  std::string scale_suffix = "_scale_inv";

  /// Block shape and rule from the settings fp8_block ("128x128") and fp8_scale_rule, no exclusions.
  static QuantizationConfig from_settings();
  /// "128x128, per-block-cast"
  std::string to_string() const;
  bool operator==(const QuantizationConfig&) const = default;
};

/// The config as text for the control plane (one field a line) and back; decode throws kCorruptData.
std::string encode_quantization_config(const QuantizationConfig& config);
QuantizationConfig decode_quantization_config(std::string_view text);

/// Parses "128x128" (or "128,128"); throws kInvalidArgument naming `what` on anything else or a
/// non-positive extent.
void parse_block_shape(std::string_view text, std::int64_t& rows, std::int64_t& cols, std::string_view what);

/// Throws kInvalidArgument naming `what` for an unknown rule name.
fp8::ScaleRule parse_scale_rule_or_throw(std::string_view text, std::string_view what);

enum class FormRole : std::uint8_t {
  kCopied,     // the source tensor, unchanged
  kQuantized,  // the source tensor's values in e4m3fn
  kScale,      // the block scales of a quantized tensor, f32
};

/// Where a tensor of the form comes from: its role and the index of its tensor in the source list.
struct FormSource {
  FormRole role = FormRole::kCopied;
  std::uint32_t source = 0;
};

struct Fp8Form {
  QuantizationConfig config;
  std::vector<TensorInfo> source_tensors;  // the list it derives from
  std::vector<TensorInfo> tensors;         // the form's tensor list
  std::vector<FormSource> sources;         // one per entry of `tensors`

  /// Bytes of the whole form (fp8 weights, scales, copied tensors).
  std::size_t total_bytes() const;
};

/// Whether `tensor` is converted under `config` (see above).
bool converted_by(const TensorInfo& tensor, const QuantizationConfig& config);

/// The scale tensor's shape for a weight of `shape`: [ceil(rows / b0), ceil(cols / b1)].
Shape scale_shape(const Shape& shape, const QuantizationConfig& config);

/// Throws kInvalidArgument when a form tensor's name is already taken by a source tensor (a
/// checkpoint that is already in FP8 form, or a tensor named like a scale).
Fp8Form derive_fp8_form(std::vector<TensorInfo> source_tensors, QuantizationConfig config);

/// Quantizes one band of block rows of a tensor: `rows` x `cols` source elements (row-major, `dtype`,
/// `rows` <= b0, the band starting at a block row), giving `cols` e4m3 codes per row in `codes` and one
/// scale per block of the band in `scales` (ceil(cols / b1) of them). The reference computation every
/// other path (the senders' pack, the readers of the form) must equal.
void quantize_band(const QuantizationConfig& config, DType dtype, const void* source, std::int64_t rows,
                   std::int64_t cols, std::uint8_t* codes, float* scales);

/// An FP8 engine's source map (probed against `form.tensors`) checked against the block shape: every
/// element of a quantized tensor it loads must come with the scale of its block, or the engine would
/// dequantize it with a stale scale. Returns why not (naming the tensor, the block and the elements, and
/// the likely cause: a block shape that does not tile its shards the way its scales are laid out, or a
/// scale parameter shaped for another block), or an empty string.
std::string blocks_without_scales(const Fp8Form& form, const SourceMap& engine_map);

/// The tensors the form would convert but for their dtype (2-D weights, not excluded, held in a type that
/// is not floating), as "name (dtype)": what an engine that fails its probe may have asked FP8 of.
std::vector<std::string> left_unquantized_by_dtype(const Fp8Form& form);

/// The FP8 form's values, read box by box from the source checkpoint (which must hold form.source_tensors):
/// a box of a quantized tensor or of its scales reads the blocks that it touches, whole. `source` must
/// outlive the reader.
std::unique_ptr<CheckpointReader> open_fp8_form(const CheckpointReader& source, const Fp8Form& form);

}  // namespace wb::layout
