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

bool QuantizedPack::any_block(const SliceCopy& copy, const std::function<bool(std::int64_t)>& in) const {
  const std::int64_t scale_cols = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])].scale_cols;
  for (std::int64_t br = copy.box.offset[0] / config_.block_rows; br * config_.block_rows < copy.box.offset[0] + copy.box.extent[0]; ++br)
    for (std::int64_t bc = copy.box.offset[1] / config_.block_cols; bc * config_.block_cols < copy.box.offset[1] + copy.box.extent[1]; ++bc)
      if (in(br * scale_cols + bc)) return true;
  return false;
}

template <typename Wanted>
void QuantizedPack::take_amaxes(std::span<std::byte* const> parameters, const SliceCopy& copy, const Wanted& wanted) {
  TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
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
    return;
  }
  for_each_element(copy, config_, blocks.scale_cols, [&](std::int64_t position, std::int64_t block) {
    if (!wanted(blocks, block)) return;
    float& amax = blocks.amax[static_cast<std::size_t>(block)];
    amax = fp8::amax_combine(amax, std::fabs(fp8::load_float(dtype, base + position * static_cast<std::int64_t>(size))));
  });
}

template <typename Wanted>
void QuantizedPack::write_codes(std::span<std::byte* const> parameters, const SliceCopy& copy, std::uint32_t shadow,
                                const Wanted& wanted) {
  const TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
  const DType dtype = trainer_map_.parameters[copy.parameter].dtype;
  const auto size = static_cast<std::int64_t>(dtype_size(dtype));
  const std::byte* base = parameters[copy.parameter];
  std::uint8_t* codes = shadows_[shadow].data();
  if (bf16_rows(copy, dtype)) {
    const auto* values = reinterpret_cast<const std::uint16_t*>(base);
    for_each_block_run(copy, config_, blocks.scale_cols, [&](std::int64_t first, std::int64_t count, std::int64_t block) {
      if (wanted(blocks, block)) fp8::quantize_bf16(blocks.scale[static_cast<std::size_t>(block)], values + first, count, codes + first);
    });
    return;
  }
  for_each_element(copy, config_, blocks.scale_cols, [&](std::int64_t position, std::int64_t block) {
    if (wanted(blocks, block))
      codes[position] = fp8::quantize(blocks.scale[static_cast<std::size_t>(block)], fp8::load_float(dtype, base + position * size));
  });
}

Status QuantizedPack::exchange_amaxes(const AmaxExchange& exchange) {
  if (shared_.empty()) return Status::ok();
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
  return Status::ok();
}

void QuantizedPack::take_scale(TensorBlocks& blocks, std::size_t block) {
  blocks.scale[block] = fp8::block_scale(config_.rule, blocks.amax[block]);
  scales_[blocks.scale_buffer][block] = blocks.scale[block].scale_inv;
}

Status QuantizedPack::quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange) {
  allocate();
  for (TensorBlocks& blocks : blocks_) std::fill(blocks.amax.begin(), blocks.amax.end(), 0.0f);
  // Casting in the pack: only the blocks whose amax the casts cannot take as they read them (amax_first).
  const auto wanted = [this](const TensorBlocks& blocks, std::int64_t block) {
    return !cast_in_pack_ || blocks.amax_first[static_cast<std::size_t>(block)] != 0;
  };
  for (const Quantized& q : quantized_) {
    if (q.fused && !cast_in_pack_) continue;  // below, after the others
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    const TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    // Casting in the pack, most copies have no wanted block.
    if (cast_in_pack_ && !any_block(copy, [&](std::int64_t block) { return wanted(blocks, block); })) continue;
    take_amaxes(parameters, copy, wanted);
  }
  WB_RETURN_IF_ERROR(exchange_amaxes(exchange));
  for (TensorBlocks& blocks : blocks_)
    for (std::size_t b = 0; b < blocks.amax.size(); ++b)
      if (blocks.touched[b] && wanted(blocks, static_cast<std::int64_t>(b))) take_scale(blocks, b);
  if (cast_in_pack_) return Status::ok();  // the rounds' packs cast the codes (exec/fp8_cast_program.hpp)
  const auto every = [](const TensorBlocks&, std::int64_t) { return true; };
  for (const Quantized& q : quantized_)
    if (!q.fused) write_codes(parameters, trainer_map_.copies[q.copy], q.shadow, every);
  // The copies that alone hold their blocks: one block row at a time, its amaxes, scales and codes.
  for (const Quantized& q : quantized_) {
    if (!q.fused) continue;
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
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
      for (std::int64_t c = first_col; c <= last_col; ++c) take_scale(blocks, static_cast<std::size_t>(block_row * blocks.scale_cols + c));
      for_each_block_run(band, config_, blocks.scale_cols, [&](std::int64_t first, std::int64_t count, std::int64_t block) {
        fp8::quantize_bf16(blocks.scale[static_cast<std::size_t>(block)], values + first, count, codes + first);
      });
      i = end;
    }
  }
  return Status::ok();
}

Status QuantizedPack::quantize_shared(std::span<std::byte* const> parameters, const AmaxExchange& exchange) {
  allocate();
  for (TensorBlocks& blocks : blocks_) std::fill(blocks.amax.begin(), blocks.amax.end(), 0.0f);
  if (shared_.empty()) return Status::ok();
  const auto shared = [](const TensorBlocks& blocks, std::int64_t block) { return blocks.shared[static_cast<std::size_t>(block)] != 0; };
  for (const Quantized& q : quantized_) {
    const TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[trainer_map_.copies[q.copy].tensor])];
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    if (any_block(copy, [&](std::int64_t block) { return shared(blocks, block); })) take_amaxes(parameters, copy, shared);
  }
  WB_RETURN_IF_ERROR(exchange_amaxes(exchange));
  for (TensorBlocks& blocks : blocks_)
    for (std::size_t b = 0; b < blocks.amax.size(); ++b)
      if (blocks.touched[b] && blocks.shared[b] != 0) take_scale(blocks, b);
  return Status::ok();
}

void QuantizedPack::quantize_round(std::span<std::byte* const> parameters, std::size_t round) {
  if (round >= round_blocks_.size()) return;
  const auto r = static_cast<std::int32_t>(round);
  const auto mine = [r](const TensorBlocks& blocks, std::int64_t block) {
    const auto b = static_cast<std::size_t>(block);
    return blocks.first_round[b] == r && blocks.shared[b] == 0;  // a shared block's amax came from the exchange
  };
  // Each copy only along the rows of its block rows that hold some of the round's blocks.
  const auto band = [this](const RoundCopy& c) {
    SliceCopy copy = trainer_map_.copies[quantized_[c.quantized].copy];
    const std::int64_t begin = std::max(copy.box.offset[0], c.first_block_row * config_.block_rows);
    const std::int64_t end = std::min(copy.box.offset[0] + copy.box.extent[0], (c.last_block_row + 1) * config_.block_rows);
    copy.offset += (begin - copy.box.offset[0]) * copy.strides[0];
    copy.box.offset[0] = begin;
    copy.box.extent[0] = end - begin;
    return copy;
  };
  for (const RoundCopy& c : round_copies_[round]) take_amaxes(parameters, band(c), mine);
  for (const auto& [at, block] : round_blocks_[round]) take_scale(blocks_[at], static_cast<std::size_t>(block));
  const auto in_round = [r](const TensorBlocks& blocks, std::int64_t block) { return blocks.first_round[static_cast<std::size_t>(block)] == r; };
  for (const RoundCopy& c : round_copies_[round]) write_codes(parameters, band(c), quantized_[c.quantized].shadow, in_round);
}

}  // namespace wb::exec
