// FP8 (e4m3fn) block quantization arithmetic: the cast, the scale rules, amax. Everything here is float32,
// as the engines' own quantizers compute, so that a block quantized here equals theirs bit for bit.
//
// A block of elements x (edge blocks padded with zeros, which never change an amax) gets one f32 scale s,
// stored as `<name>_scale_inv` (dequantized value = q * s), and every element q = e4m3(x / s) or
// e4m3(x * f), by the rule:
//   kPlain        s = amax / 448, q = e4m3(x / s)                           (DeepSeek's act_quant). An all-zero
//                 block would divide 0 by 0 there (NaN): we give it s = 1 and zeros.
//   kPerBlockCast a = max(amax, 1e-4), s = a / 448, q = e4m3(x * (448 / a))  (SGLang's and DeepGEMM's
//                 per_block_cast_to_fp8)
//   kUe8m0        s = 2^ceil(log2(max(amax, 1e-4) / 448)), q = e4m3(x * (1 / s)) (power-of-two scales for
//                 UE8M0 kernels; the exact smallest power of two >= the quotient, as DeepGEMM's
//                 fast_log2_ceil computes it from the float's bits, not a rounded log2)
// The cast rounds to nearest even and saturates at +-448 (e4m3fn has no infinity); NaN stays NaN (0x7F
// with the sign). A NaN element makes the block's amax NaN (as torch's amax does), hence its scale and
// every element NaN; an infinite element makes the scale infinite. Subnormal inputs and outputs are exact
// (no flush to zero).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "weightbridge/dtype.hpp"

namespace wb::fp8 {

inline constexpr float kE4m3Max = 448.0f;
/// The clamp below which kPerBlockCast and kUe8m0 do not let an amax fall.
inline constexpr float kAmaxFloor = 1e-4f;

enum class ScaleRule : std::uint8_t { kPlain, kPerBlockCast, kUe8m0 };
inline constexpr int kNumScaleRules = 3;

/// "plain", "per-block-cast", "ue8m0".
std::string_view scale_rule_name(ScaleRule rule);
/// Also accepts "per_block_cast_to_fp8", "sglang", "deepgemm", "amax", "pow2"; nullopt when unknown.
std::optional<ScaleRule> parse_scale_rule(std::string_view text);

/// float32 -> e4m3fn bits: round to nearest even, saturate at +-448, NaN -> 0x7F | sign.
inline std::uint8_t e4m3_from_float(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);  // NaN
  if (a >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);  // >= 448 (inf included): saturate
  if (a >= 0x3C800000u) {  // >= 2^-6: normal in e4m3; round the 23-bit mantissa to 3 bits, ties to even
    const std::uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
    return static_cast<std::uint8_t>(sign | ((rounded >> 20) - ((127u - 7u) << 3)));
  }
  // Subnormal in e4m3: multiples of 2^-9. The product is exact; nearbyint rounds to nearest even in the
  // default rounding mode. A result of 8 is the smallest normal, whose code is 0x08 as well.
  const float units = std::nearbyint(std::bit_cast<float>(a) * 512.0f);
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(units));
}

/// e4m3fn bits -> float32 (exact).
float e4m3_to_float(std::uint8_t code);

/// The larger of two amaxes; NaN when either is NaN (a NaN element poisons its block, as in torch).
inline float amax_combine(float a, float b) {
  if (a != a || b != b) return std::numeric_limits<float>::quiet_NaN();
  return a > b ? a : b;
}

/// One block's scale and how its elements are scaled.
struct BlockScale {
  float scale_inv = 1.0f;  // stored in `<name>_scale_inv`
  float factor = 1.0f;     // q = x / factor when divide, else x * factor
  bool divide = false;
};

BlockScale block_scale(ScaleRule rule, float amax);

inline std::uint8_t quantize(const BlockScale& scale, float x) {
  return e4m3_from_float(scale.divide ? x / scale.factor : x * scale.factor);
}

/// Whether a trainer tensor of this dtype can be quantized (bf16, f16, f32, f64).
bool quantizable(DType dtype);

/// One element of a quantizable dtype as float32 (bf16 and f16 exactly; f64 rounded to nearest).
float load_float(DType dtype, const void* element);

inline float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

// Bulk forms for the senders' pack (core/fp8_kernels.cpp, SSE2 where the machine has it): each equals the
// element-by-element definition above bit for bit.

/// The amax of `count` bf16 values (amax_combine over their |x|, from 0): NaN when one is NaN.
float bf16_amax(const std::uint16_t* values, std::int64_t count);
/// codes[k] = quantize(scale, bf16 values[k]) for k < count.
void quantize_bf16(const BlockScale& scale, const std::uint16_t* values, std::int64_t count, std::uint8_t* codes);
/// One block's cast of bf16 elements, made once for many rows (the senders' cast, exec/fp8_cast_program.cpp).
/// For a finite normal factor, x * factor (or x / factor) of a normal bf16 x is the product of its mantissa
/// 1.m with the factor, exactly scaled by x's power of two, and the product's rounding to float32 and then to
/// e4m3 depend on m alone: the normal code is 8 * (x's exponent bits) + base + step[m], looked up 32
/// elements at a time (AVX-512 VBMI). A run of a block with a zero, a subnormal input or output, an
/// infinity or a NaN goes through quantize_bf16, as does every element of a scale without a table.
struct CastTable {
  alignas(64) std::uint8_t step[128] = {};
  std::int16_t base = 0;
  bool table = false;  // else quantize_bf16 with `scale`
  BlockScale scale;
};
void make_cast_table(const BlockScale& scale, CastTable& out);
/// A row through consecutive blocks of `block_cols` columns, the first of which has `lead` (< block_cols)
/// columns before values[0]: codes[k] = quantize(tables[(lead + k) / block_cols].scale, bf16 values[k])
/// for k < count, in one call. Returns how many of them the tables cast (the rest: the float path).
std::int64_t quantize_bf16_blocks(const CastTable* tables, std::int64_t block_cols, std::int64_t lead,
                                  const std::uint16_t* values, std::int64_t count, std::uint8_t* codes);
/// The speculative form of quantize_bf16_blocks, for a scale taken before (the last update's): the same codes
/// where tables[g].scale is the scale of every |x| of run g (at most the amax that made it, as is the case
/// when the block's amax, taken over the rows cast, gives that scale again), others where it is not, which
/// the caller then casts again; and each run's |x| bits folded into magnitudes[kMagnitudeLanes * g, + kMagnitudeLanes)
/// (maxima kept there; bf16_amax of those lanes is the amax over every row the block's runs were cast in).
inline constexpr std::int64_t kMagnitudeLanes = 32;
std::int64_t quantize_bf16_blocks_tracking(const CastTable* tables, std::int64_t block_cols, std::int64_t lead,
                                           const std::uint16_t* values, std::int64_t count, std::uint8_t* codes,
                                           std::uint16_t* magnitudes);
/// running[k] = max(running[k], values[k] & 0x7FFF) for k < count: the magnitudes' bits, whose order is
/// |x|'s (NaNs above infinity), gathered over the rows of a band; bf16_amax of a range of `running` is
/// then the amax of those columns over the rows.
void bf16_magnitude_max(const std::uint16_t* values, std::int64_t count, std::uint16_t* running);
/// The same over `rows` rows of `count` values, `stride` values apart (a band of a block row). With AVX-512
/// the rows are read as four sequential streams (rows i, q + i, 2q + i, 3q + i for q = rows / 4), which
/// this CPU's prefetchers serve faster from memory than one (bench_fp8_pack: 0.09 against 0.13 ns an element).
void bf16_magnitude_max_rows(const std::uint16_t* values, std::int64_t stride, std::int64_t rows, std::int64_t count,
                             std::uint16_t* running);

}  // namespace wb::fp8
