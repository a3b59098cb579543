// The FP8 quantize kernels' host entry points (kernels/fp8_quantize_kernel.cu, builds with CUDA only): the
// trainers' quantizing pack (exec/quantized_pack.hpp) for bf16 parameters in device memory, in three
// launches on one stream: every block's amax (a max over the |x| bit patterns, as the host's), the scales
// by the rule (core/fp8.hpp: float32, the same arithmetic, NaN as the host's canonical quiet NaN), then the
// codes. Between the first two the caller may exchange the amaxes of blocks it shares with other trainers
// (the bit patterns in `amax_bits`, a max all-reduce). Every code and scale equals the host's bit for bit.
#pragma once

#include <cstdint>

#include "core/fp8.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

/// One copy of a converted tensor's box out of a bf16 device parameter: element (i, j) of the box (tensor
/// rows row0 + i, columns col0 + j) is parameter element offset + i * stride0 + j * stride1, its code goes
/// to the same element of `codes` (the parameter's fp8 shadow), and its block's amax, scale and factor are
/// entry ((row0 + i) / block_rows) * scale_cols + (col0 + j) / block_cols of the tensor's arrays.
struct Fp8CopyItem {
  const std::uint16_t* source = nullptr;
  std::uint8_t* codes = nullptr;
  std::uint32_t* amax_bits = nullptr;  // per block of the tensor, zeroed before the amax launch
  const float* factors = nullptr;      // per block, written by the scale launch
  std::int64_t offset = 0, stride0 = 0, stride1 = 1;
  std::int64_t row0 = 0, col0 = 0, rows = 0, cols = 0;
  std::int64_t block_rows = 128, block_cols = 128, scale_cols = 1;
};

/// Enqueues the amax of every item's elements into its blocks' `amax_bits` (atomic max of |x| bit patterns;
/// a NaN is larger than every number) on `stream` (a cudaStream_t; null: the legacy default stream).
/// `items` is device memory. Returns the launch's own result.
Status launch_fp8_amax(const Fp8CopyItem* items, std::uint32_t count, void* stream) noexcept;

/// Enqueues the scales of `blocks` blocks from their amax bits by `rule`: `scales` (the `_scale_inv` values)
/// and `factors` (what the cast multiplies by, or divides by under the plain rule), device memory.
Status launch_fp8_scales(const std::uint32_t* amax_bits, float* scales, float* factors, std::int64_t blocks,
                         fp8::ScaleRule rule, void* stream) noexcept;

/// Enqueues the codes of every item's elements by its blocks' factors.
Status launch_fp8_cast(const Fp8CopyItem* items, std::uint32_t count, fp8::ScaleRule rule, void* stream) noexcept;

}  // namespace wb::exec
