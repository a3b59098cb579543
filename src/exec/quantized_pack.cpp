// The update half of the trainers' FP8 pack (exec/quantized_pack.hpp): amaxes, their exchange, scales
// and codes, once per update before its rounds.
#include <algorithm>
#include <bit>
#include <cmath>

#include "core/checks.hpp"
#include "exec/device_quantizer.hpp"
#include "exec/quantized_pack.hpp"

namespace wb::exec {
namespace {

// Calls visit(parameter element, flat block index) for every element of a 2-D copy.
template <typename Visit>
void for_each_element(const SliceCopy& copy, const layout::QuantizationConfig& config, std::int64_t scale_cols,
                      Visit&& visit) {
  const std::int64_t rows = copy.box.extent[0], cols = copy.box.extent[1];
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t block_row = (copy.box.offset[0] + i) / config.block_rows * scale_cols;
    std::int64_t position = copy.offset + i * copy.strides[0];
    for (std::int64_t j = 0; j < cols; ++j, position += copy.strides[1])
      visit(position, block_row + (copy.box.offset[1] + j) / config.block_cols);
  }
}

// Whether a copy reads rows of contiguous bf16 elements: the bulk kernels' case (core/fp8.hpp).
bool bf16_rows(const SliceCopy& copy, DType dtype) { return dtype == DType::kBF16 && copy.strides[1] == 1; }

// Calls visit(first parameter element, count, flat block index) for every run of a row of a 2-D copy that
// lies in one block (its columns in one block column).
template <typename Visit>
void for_each_block_run(const SliceCopy& copy, const layout::QuantizationConfig& config, std::int64_t scale_cols,
                        Visit&& visit) {
  const std::int64_t rows = copy.box.extent[0], cols = copy.box.extent[1];
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t block_row = (copy.box.offset[0] + i) / config.block_rows * scale_cols;
    const std::int64_t row_start = copy.offset + i * copy.strides[0];
    for (std::int64_t j = 0; j < cols;) {
      const std::int64_t column = copy.box.offset[1] + j;
      const std::int64_t run = std::min(cols - j, config.block_cols - column % config.block_cols);
      visit(row_start + j, run, block_row + column / config.block_cols);
      j += run;
    }
  }
}

}  // namespace

Status QuantizedPack::quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange, void* cuda_stream) {
  if (device_) return device_->quantize(parameters, exchange, cuda_stream);
  return quantize(parameters, exchange);
}

Status QuantizedPack::quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange) {
  allocate();
  for (TensorBlocks& blocks : blocks_) std::fill(blocks.amax.begin(), blocks.amax.end(), 0.0f);
  // Casting in the pack: only the blocks whose amax the casts cannot take as they read them (amax_first).
  const auto wanted = [this](const TensorBlocks& blocks, std::int64_t block) {
    return !cast_in_pack_ || blocks.amax_first[static_cast<std::size_t>(block)] != 0;
  };
  // Whether some block of a copy's box is wanted (casting in the pack, most copies have none).
  const auto any_wanted = [&](const SliceCopy& copy, const TensorBlocks& blocks) {
    for (std::int64_t br = copy.box.offset[0] / config_.block_rows; br * config_.block_rows < copy.box.offset[0] + copy.box.extent[0]; ++br)
      for (std::int64_t bc = copy.box.offset[1] / config_.block_cols; bc * config_.block_cols < copy.box.offset[1] + copy.box.extent[1]; ++bc)
        if (wanted(blocks, br * blocks.scale_cols + bc)) return true;
    return false;
  };
  for (const Quantized& q : quantized_) {
    if (q.fused && !cast_in_pack_) continue;  // below, after the others
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    if (cast_in_pack_ && !any_wanted(copy, blocks)) continue;
    const DType dtype = trainer_map_.parameters[copy.parameter].dtype;
    const std::size_t size = dtype_size(dtype);
    const std::byte* base = parameters[copy.parameter];
    if (bf16_rows(copy, dtype)) {
      const auto* values = reinterpret_cast<const std::uint16_t*>(base);
      for_each_block_run(copy, config_, blocks.scale_cols, [&](std::int64_t first, std::int64_t count, std::int64_t block) {
        if (!wanted(blocks, block)) return;
        float& amax = blocks.amax[static_cast<std::size_t>(block)];
        amax = fp8::amax_combine(amax, fp8::bf16_amax(values + first, count));
      });
      continue;
    }
    for_each_element(copy, config_, blocks.scale_cols, [&](std::int64_t position, std::int64_t block) {
      if (!wanted(blocks, block)) return;
      float& amax = blocks.amax[static_cast<std::size_t>(block)];
      amax = fp8::amax_combine(amax, std::fabs(fp8::load_float(dtype, base + position * static_cast<std::int64_t>(size))));
    });
  }
  if (!shared_.empty()) {
    for (std::size_t i = 0; i < shared_.size(); ++i) {
      const std::int32_t at = blocks_of_[shared_[i].tensor];
      exchanged_[i] = at < 0 ? 0u
                             : std::bit_cast<std::uint32_t>(blocks_[static_cast<std::size_t>(at)].amax[static_cast<std::size_t>(shared_[i].block)]);
    }
    WB_RETURN_IF_ERROR(exchange(exchanged_));
    for (std::size_t i = 0; i < shared_.size(); ++i) {
      const std::int32_t at = blocks_of_[shared_[i].tensor];
      if (at >= 0)
        blocks_[static_cast<std::size_t>(at)].amax[static_cast<std::size_t>(shared_[i].block)] = std::bit_cast<float>(exchanged_[i]);
    }
  }
  for (TensorBlocks& blocks : blocks_) {
    std::vector<float>& scales = scales_[blocks.scale_buffer];
    for (std::size_t b = 0; b < blocks.amax.size(); ++b) {
      if (!blocks.touched[b] || !wanted(blocks, static_cast<std::int64_t>(b))) continue;
      blocks.scale[b] = fp8::block_scale(config_.rule, blocks.amax[b]);
      scales[b] = blocks.scale[b].scale_inv;
    }
  }
  if (cast_in_pack_) return Status::ok();  // the rounds' packs cast the codes (exec/fp8_cast_program.hpp)
  for (const Quantized& q : quantized_) {
    if (q.fused) continue;
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    const TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    const DType dtype = trainer_map_.parameters[copy.parameter].dtype;
    const auto size = static_cast<std::int64_t>(dtype_size(dtype));
    const std::byte* base = parameters[copy.parameter];
    std::uint8_t* codes = shadows_[q.shadow].data();
    if (bf16_rows(copy, dtype)) {
      const auto* values = reinterpret_cast<const std::uint16_t*>(base);
      for_each_block_run(copy, config_, blocks.scale_cols, [&](std::int64_t first, std::int64_t count, std::int64_t block) {
        fp8::quantize_bf16(blocks.scale[static_cast<std::size_t>(block)], values + first, count, codes + first);
      });
      continue;
    }
    for_each_element(copy, config_, blocks.scale_cols, [&](std::int64_t position, std::int64_t block) {
      codes[position] = fp8::quantize(blocks.scale[static_cast<std::size_t>(block)], fp8::load_float(dtype, base + position * size));
    });
  }
  // The copies that alone hold their blocks: one block row at a time, its amaxes, scales and codes.
  for (const Quantized& q : quantized_) {
    if (!q.fused) continue;
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    std::vector<float>& scales = scales_[blocks.scale_buffer];
    const auto* values = reinterpret_cast<const std::uint16_t*>(parameters[copy.parameter]);
    std::uint8_t* codes = shadows_[q.shadow].data();
    const std::int64_t first_col = copy.box.offset[1] / config_.block_cols;
    const std::int64_t last_col = (copy.box.offset[1] + copy.box.extent[1] - 1) / config_.block_cols;
    for (std::int64_t i = 0; i < copy.box.extent[0];) {
      const std::int64_t block_row = (copy.box.offset[0] + i) / config_.block_rows;
      const std::int64_t end = std::min(copy.box.extent[0], (block_row + 1) * config_.block_rows - copy.box.offset[0]);
      SliceCopy band = copy;
      band.box.offset[0] += i;
      band.box.extent[0] = end - i;
      band.offset += i * copy.strides[0];
      for_each_block_run(band, config_, blocks.scale_cols, [&](std::int64_t first, std::int64_t count, std::int64_t block) {
        float& amax = blocks.amax[static_cast<std::size_t>(block)];
        amax = fp8::amax_combine(amax, fp8::bf16_amax(values + first, count));
      });
      for (std::int64_t c = first_col; c <= last_col; ++c) {
        const auto b = static_cast<std::size_t>(block_row * blocks.scale_cols + c);
        blocks.scale[b] = fp8::block_scale(config_.rule, blocks.amax[b]);
        scales[b] = blocks.scale[b].scale_inv;
      }
      for_each_block_run(band, config_, blocks.scale_cols, [&](std::int64_t first, std::int64_t count, std::int64_t block) {
        fp8::quantize_bf16(blocks.scale[static_cast<std::size_t>(block)], values + first, count, codes + first);
      });
      i = end;
    }
  }
  return Status::ok();
}

}  // namespace wb::exec
