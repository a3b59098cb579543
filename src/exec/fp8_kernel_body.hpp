// The FP8 quantize kernels' per-thread work (kernels/fp8_quantize_kernel.cu), written once for the device and
// the host: nvcc compiles it into the kernels, and a host build runs the same source over a grid of plain
// loops (tests/unit/test_fp8_kernel_body.cpp), so that what every thread computes (the element and block it
// reaches, the amax it folds, the scale and the code) is checked on every machine, not only where a GPU is.
// Only the few intrinsics differ, each a correctly rounded float operation on both sides.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp8.hpp"
#include "exec/fp8_kernel_launch.hpp"

#if defined(__CUDACC__)
#define WB_FP8_BODY __host__ __device__ __forceinline__
#else
#define WB_FP8_BODY inline
#endif

namespace wb::exec::fp8_body {

using i64 = std::int64_t;

inline constexpr std::uint32_t kCanonicalNan = 0x7FC00000u;  // what the host's NaN arithmetic gives

WB_FP8_BODY std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

WB_FP8_BODY float float_of(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

// Division and product rounded to nearest even, never contracted into an FMA (host SSE arithmetic is).
WB_FP8_BODY float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

WB_FP8_BODY float multiply_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

WB_FP8_BODY int nearest_even_int(float x) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x);
#else
  return static_cast<int>(std::nearbyint(x));  // the default rounding mode: to nearest even
#endif
}

WB_FP8_BODY float bf16_to_float(std::uint16_t bits) { return float_of(std::uint32_t{bits} << 16); }

// core/fp8.hpp e4m3_from_float: the same integer rounding.
WB_FP8_BODY std::uint8_t e4m3_from_float(float x) {
  const std::uint32_t bits = bits_of(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  if (a >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);
  if (a >= 0x3C800000u) {
    const std::uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
    return static_cast<std::uint8_t>(sign | ((rounded >> 20) - ((127u - 7u) << 3)));
  }
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(nearest_even_int(float_of(a) * 512.0f)));
}

// Element k of an item (row-major over its box): its parameter element and its block.
WB_FP8_BODY void locate(const Fp8CopyItem& item, i64 k, i64& element, i64& block) {
  const i64 i = k / item.cols, j = k % item.cols;
  element = item.offset + i * item.stride0 + j * item.stride1;
  block = (item.row0 + i) / item.block_rows * item.scale_cols + (item.col0 + j) / item.block_cols;
}

// Thread `thread` of `threads` folds the amax of a contiguous share of the item's elements, so that its run
// mostly stays in one block, and hands each block's running max to `fold(block, bits)` (an atomic max on the
// device). Magnitudes as bit patterns: a NaN is larger than every number.
template <typename Fold>
WB_FP8_BODY void amax_thread(const Fp8CopyItem& item, i64 thread, i64 threads, Fold&& fold) {
  const i64 n = item.rows * item.cols;
  const i64 share = (n + threads - 1) / threads;
  const i64 first = thread * share;
  const i64 last = first + share < n ? first + share : n;
  i64 current = -1;
  std::uint32_t running = 0;
  for (i64 k = first; k < last; ++k) {
    i64 element = 0, block = 0;
    locate(item, k, element, block);
    const std::uint32_t magnitude = bits_of(bf16_to_float(item.source[element])) & 0x7FFFFFFFu;
    if (block != current) {
      if (current >= 0) fold(current, running);
      current = block;
      running = 0;
    }
    running = magnitude > running ? magnitude : running;
  }
  if (current >= 0) fold(current, running);
}

// core/fp8.cpp ceil_power_of_two: the smallest power of two >= m, from the bits.
WB_FP8_BODY float ceil_power_of_two(float m) {
  const std::uint32_t bits = bits_of(m);
  std::uint32_t exponent = (bits >> 23) & 0xFFu;
  if (exponent == 0) return ldexpf(1.0f, static_cast<int>(ceil(log2(static_cast<double>(m)))));
  if ((bits & 0x7FFFFFu) != 0) ++exponent;
  return float_of(exponent << 23);
}

// A block's scale (its `_scale_inv`) and the factor the cast multiplies by (divides by under the plain rule).
WB_FP8_BODY void block_scale(std::uint32_t amax_bits, fp8::ScaleRule rule, float& scale, float& factor) {
  if (amax_bits > 0x7F800000u) {  // a NaN element: the host's scale and factor are its canonical NaN
    scale = factor = float_of(kCanonicalNan);
    return;
  }
  const float amax = float_of(amax_bits);
  const float a = amax > fp8::kAmaxFloor ? amax : fp8::kAmaxFloor;
  switch (rule) {
    case fp8::ScaleRule::kPlain:
      scale = factor = amax == 0.0f ? 1.0f : divide_rn(amax, fp8::kE4m3Max);
      return;
    case fp8::ScaleRule::kPerBlockCast:
      scale = divide_rn(a, fp8::kE4m3Max);
      factor = divide_rn(fp8::kE4m3Max, a);
      return;
    case fp8::ScaleRule::kUe8m0:
      scale = ceil_power_of_two(divide_rn(a, fp8::kE4m3Max));
      factor = divide_rn(1.0f, scale);
      return;
  }
}

// Thread `thread` of `threads` writes the codes of the item's elements k = thread, thread + threads, ...
WB_FP8_BODY void cast_thread(const Fp8CopyItem& item, i64 thread, i64 threads, fp8::ScaleRule rule) {
  const i64 n = item.rows * item.cols;
  const bool divide = rule == fp8::ScaleRule::kPlain;
  for (i64 k = thread; k < n; k += threads) {
    i64 element = 0, block = 0;
    locate(item, k, element, block);
    const float x = bf16_to_float(item.source[element]);
    const float f = item.factors[block];
    // A NaN element keeps its own sign, as on the host (x86 returns a NaN first operand); the device's
    // canonical NaN otherwise, positive like the host's.
    const bool nan = (bits_of(x) & 0x7FFFFFFFu) > 0x7F800000u;
    item.codes[element] = e4m3_from_float(nan ? x : divide ? divide_rn(x, f) : multiply_rn(x, f));
  }
}

}  // namespace wb::exec::fp8_body
