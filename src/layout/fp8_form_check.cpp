// An FP8 engine's loader checked against its form: each element it loads comes with its block's scale
// (layout/fp8_form.hpp, blocks_without_scales), and what a failed probe may have asked FP8 of.
#include <algorithm>

#include "layout/fp8_form.hpp"

namespace wb::layout {

std::string blocks_without_scales(const Fp8Form& form, const SourceMap& engine_map) {
  const QuantizationConfig& config = form.config;
  // Per quantized tensor of the form (by its index there): which of its scales this map loads.
  std::vector<std::vector<std::uint8_t>> has_scale(form.tensors.size());
  for (std::size_t t = 0; t + 1 < form.tensors.size(); ++t)
    if (form.sources[t].role == FormRole::kQuantized) has_scale[t].assign(static_cast<std::size_t>(form.tensors[t + 1].numel()), 0);
  for (const SliceCopy& copy : engine_map.copies) {
    if (copy.tensor == 0 || form.sources[copy.tensor].role != FormRole::kScale) continue;
    std::vector<std::uint8_t>& loaded = has_scale[copy.tensor - 1];
    const std::int64_t scale_cols = form.tensors[copy.tensor].shape[1];
    for (std::int64_t r = copy.box.offset[0]; r < copy.box.offset[0] + copy.box.extent[0]; ++r)
      std::fill_n(loaded.begin() + r * scale_cols + copy.box.offset[1], copy.box.extent[1], std::uint8_t{1});
  }
  for (const SliceCopy& copy : engine_map.copies) {
    if (form.sources[copy.tensor].role != FormRole::kQuantized || copy.box.numel() == 0) continue;
    const TensorInfo& tensor = form.tensors[copy.tensor];
    const std::vector<std::uint8_t>& loaded = has_scale[copy.tensor];
    const std::int64_t scale_cols = form.tensors[copy.tensor + 1].shape[1];
    const std::int64_t r0 = copy.box.offset[0], r1 = r0 + copy.box.extent[0];
    const std::int64_t c0 = copy.box.offset[1], c1 = c0 + copy.box.extent[1];
    for (std::int64_t br = r0 / config.block_rows; br * config.block_rows < r1; ++br)
      for (std::int64_t bc = c0 / config.block_cols; bc * config.block_cols < c1; ++bc) {
        if (loaded[static_cast<std::size_t>(br * scale_cols + bc)]) continue;
        const std::int64_t rows0 = std::max(r0, br * config.block_rows), rows1 = std::min(r1, (br + 1) * config.block_rows);
        const std::int64_t cols0 = std::max(c0, bc * config.block_cols), cols1 = std::min(c1, (bc + 1) * config.block_cols);
        return "it loads " + tensor.name + " rows [" + std::to_string(rows0) + ", " + std::to_string(rows1) + ") columns [" +
               std::to_string(cols0) + ", " + std::to_string(cols1) + ") into parameter " +
               engine_map.parameters[copy.parameter].name + " but not their block's scale " + tensor.name +
               config.scale_suffix + "[" + std::to_string(br) + ", " + std::to_string(bc) + "] (block shape " +
               std::to_string(config.block_rows) + "x" + std::to_string(config.block_cols) +
               "): the block shape does not tile its shards the way its scales are laid out, or its scale "
               "parameter is shaped for another block shape";
      }
  }
  return {};
}

std::vector<std::string> left_unquantized_by_dtype(const Fp8Form& form) {
  std::vector<std::string> out;
  for (const TensorInfo& tensor : form.source_tensors) {
    if (fp8::quantizable(tensor.dtype)) continue;
    TensorInfo as_floating = tensor;
    as_floating.dtype = DType::kBF16;
    if (converted_by(as_floating, form.config)) out.push_back(tensor.name + " (" + std::string(dtype_name(tensor.dtype)) + ")");
  }
  return out;
}

}  // namespace wb::layout
