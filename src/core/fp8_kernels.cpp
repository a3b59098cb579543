// The bulk FP8 kernels (core/fp8.hpp): amax of bf16 runs and their quantization, 16 elements at a time with
// SSE2 (the x86-64 baseline), the tail element by element. The vector cast is e4m3_from_float's arithmetic
// lane by lane: the same integer rounding of normal values, cvtps (round to nearest even in the default
// mode) for the subnormal ones where the scalar path uses nearbyint, and the same saturation and NaN codes.
#include <algorithm>
#include <bit>
#include <limits>

#include "core/fp8.hpp"

#if defined(__SSE2__) && defined(__GNUC__)
#include <immintrin.h>
#define WB_FP8_SIMD 1
#endif

namespace wb::fp8 {
namespace {

float amax_from_magnitude_bits(std::uint32_t bits) {
  return bits > 0x7F80u ? std::numeric_limits<float>::quiet_NaN() : bf16_to_float(static_cast<std::uint16_t>(bits));
}

#if defined(WB_FP8_SIMD)
// Four float32 lanes to their e4m3 codes (one per 32-bit lane).
inline __m128i e4m3_lanes(__m128 y) {
  const __m128i bits = _mm_castps_si128(y);
  const __m128i sign = _mm_and_si128(_mm_srli_epi32(bits, 24), _mm_set1_epi32(0x80));
  const __m128i a = _mm_and_si128(bits, _mm_set1_epi32(0x7FFFFFFF));
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(a, 20), _mm_set1_epi32(1));
  const __m128i rounded = _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(0x7FFFF)), odd);
  const __m128i normal = _mm_sub_epi32(_mm_srli_epi32(rounded, 20), _mm_set1_epi32((127 - 7) << 3));
  const __m128i subnormal = _mm_cvtps_epi32(_mm_mul_ps(_mm_castsi128_ps(a), _mm_set1_ps(512.0f)));
  const __m128i is_normal = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x3C7FFFFF));
  const __m128i saturated = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x43DFFFFF));
  const __m128i nan = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7F800000));
  const auto select = [](__m128i mask, __m128i yes, __m128i no) {
    return _mm_or_si128(_mm_and_si128(mask, yes), _mm_andnot_si128(mask, no));
  };
  __m128i code = select(is_normal, normal, subnormal);
  code = select(saturated, _mm_set1_epi32(0x7E), code);
  code = select(nan, _mm_set1_epi32(0x7F), code);
  return _mm_or_si128(code, sign);
}

// The same with AVX2, 8 lanes, where the CPU has it (chosen at run time, as the copy kernels are).
__attribute__((target("avx2"))) inline __m256i e4m3_lanes_avx2(__m256 y) {
  const __m256i bits = _mm256_castps_si256(y);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7FFFF)), odd);
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32((127 - 7) << 3));
  const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)));
  __m256i code = _mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x3C7FFFFF)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7E), _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x43DFFFFF)));
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)));
  return _mm256_or_si256(code, sign);
}

// 32 elements a step; returns how many it quantized. `Divide` a template argument: no test in the loop.
template <bool Divide>
__attribute__((target("avx2"))) std::int64_t quantize_bf16_avx2_loop(float scale_factor, const std::uint16_t* values,
                                                                     std::int64_t count, std::uint8_t* codes) {
  const __m256 factor = _mm256_set1_ps(scale_factor);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const auto lanes_of = [&](const std::uint16_t* at) __attribute__((target("avx2"))) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    return e4m3_lanes_avx2(Divide ? _mm256_div_ps(x, factor) : _mm256_mul_ps(x, factor));
  };
  std::int64_t k = 0;
  for (; k + 32 <= count; k += 32) {
    const __m256i l0 = lanes_of(values + k), l1 = lanes_of(values + k + 8);
    const __m256i l2 = lanes_of(values + k + 16), l3 = lanes_of(values + k + 24);
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(l0, l1), _mm256_packs_epi32(l2, l3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k), _mm256_permutevar8x32_epi32(bytes, order));
  }
  return k;
}

__attribute__((target("avx2"))) std::int64_t quantize_bf16_avx2(const BlockScale& scale, const std::uint16_t* values,
                                                                std::int64_t count, std::uint8_t* codes) {
  return scale.divide ? quantize_bf16_avx2_loop<true>(scale.factor, values, count, codes)
                      : quantize_bf16_avx2_loop<false>(scale.factor, values, count, codes);
}

// The same with AVX-512 (F, BW, VL), 16 lanes, where the CPU has it: compare masks instead of blends, and
// the codes narrowed to bytes by one vpmovdb; the tail under a mask, so the whole run. (GCC 12 warns that
// its own headers' _mm512_undefined_epi32 may be used uninitialized: a known false positive.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Saturation as a clamp of |y| below 448's rounding boundary (whose code is 0x7E, as infinity's), the sign
// merged by one ternary-logic op; subnormal and NaN lanes, rare, only where a lane has one.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i e4m3_lanes_avx512(__m512 y) {
  const __m512i bits = _mm512_castps_si512(y);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i a = _mm512_min_epu32(magnitude, _mm512_set1_epi32(0x43DFFFFF));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)), odd);
  __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(rounded, 20), _mm512_set1_epi32((127 - 7) << 3));
  const __mmask16 subnormal = _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x3C800000));
  if (subnormal != 0)
    code = _mm512_mask_mov_epi32(code, subnormal,
                                 _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f))));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
  if (nan != 0) code = _mm512_mask_mov_epi32(code, nan, _mm512_set1_epi32(0x7F));
  // code | ((bits >> 24) & 0x80): ternary logic A | (B & C), 0xF8.
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80), 0xF8);
}

template <bool Divide>
__attribute__((target("avx512f,avx512bw,avx512vl"))) std::int64_t quantize_bf16_avx512_loop(
    float scale_factor, const std::uint16_t* values, std::int64_t count, std::uint8_t* codes) {
  const __m512 factor = _mm512_set1_ps(scale_factor);
  const auto codes_of = [&](__m256i v) __attribute__((target("avx512f,avx512bw,avx512vl"))) {
    const __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    return _mm512_cvtepi32_epi8(e4m3_lanes_avx512(Divide ? _mm512_div_ps(x, factor) : _mm512_mul_ps(x, factor)));
  };
  std::int64_t k = 0;
  for (; k + 32 <= count; k += 32) {
    const __m128i c0 = codes_of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + k)));
    const __m128i c1 = codes_of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + k + 16)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), c0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k + 16), c1);
  }
  for (; k < count; k += 16) {
    const auto mask = static_cast<__mmask16>(count - k >= 16 ? 0xFFFFu : (1u << (count - k)) - 1u);
    _mm_mask_storeu_epi8(codes + k, mask, codes_of(_mm256_maskz_loadu_epi16(mask, values + k)));
  }
  return count;
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) std::int64_t quantize_bf16_avx512(
    const BlockScale& scale, const std::uint16_t* values, std::int64_t count, std::uint8_t* codes) {
  return scale.divide ? quantize_bf16_avx512_loop<true>(scale.factor, values, count, codes)
                      : quantize_bf16_avx512_loop<false>(scale.factor, values, count, codes);
}

// A run's |x| bits folded into kMagnitudeLanes lanes (the speculative cast's runs without a table).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void magnitude_max_avx512_folded(const std::uint16_t* values,
                                                                                      std::int64_t count,
                                                                                      std::uint16_t* lanes) {
  static_assert(kMagnitudeLanes == 32);
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  __m512i m = _mm512_loadu_si512(lanes);
  for (std::int64_t k = 0; k < count; k += 32) {
    const auto mask = static_cast<__mmask32>(count - k >= 32 ? ~0u : (1u << (count - k)) - 1u);
    m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_maskz_loadu_epi16(mask, values + k), magnitude));
  }
  _mm512_storeu_si512(lanes, m);
}

#pragma GCC diagnostic pop
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's own _mm256_undefined_si256, as above
#pragma GCC diagnostic ignored "-Wuninitialized"        // and its _mm512_undefined_epi32 in the shifts
#define WB_FP8_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))
// One block's table in registers, and the extremes of the codes it gave (core/fp8.hpp, CastTable).
struct TableLanes {
  __m512i low, high, base;
  __m512i least, most;  // of the codes before saturation, over the lanes cast
  __m512i magnitude;    // Track: the inputs' |x| bits, lane-wise maxima
};

// 32 elements in 16-bit lanes: the step looked up by the mantissa's 7 bits (vpermi2b, the high bytes
// zeroed by the mask), plus 8 x the exponent bits and the base; saturated at 448 (0x7E), the sign of x (the
// product's: the factor is positive) merged. Returns the codes in the words' low bytes.
//
// Track (the speculative cast, quantize_bf16_blocks_tracking): also the lanes' |x| maxima, and neither the
// largest code nor the saturation: a run whose scale is right has every |x| within the amax that made it,
// so its codes stay at most 448 (0x7E) and finite; a run whose scale is not is cast again by the caller.
template <bool Track>
WB_FP8_VBMI __attribute__((always_inline)) inline __m512i table_codes(__m512i x, TableLanes& t, __mmask32 lanes) {
  const __m512i step = _mm512_maskz_permutex2var_epi8(0x5555555555555555ull, t.low, x, t.high);
  const __m512i code =
      _mm512_add_epi16(_mm512_add_epi16(_mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi16(0x07F8)), t.base), step);
  t.least = _mm512_mask_min_epi16(t.least, lanes, t.least, code);
  if constexpr (Track) {
    t.magnitude = _mm512_mask_max_epu16(t.magnitude, lanes, t.magnitude, _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF)));
    return _mm512_ternarylogic_epi32(code, _mm512_srli_epi16(x, 8), _mm512_set1_epi16(0x80), 0xF8);
  }
  t.most = _mm512_mask_max_epi16(t.most, lanes, t.most, code);
  // min(code, 0x7E) | ((x >> 8) & 0x80): ternary logic A | (B & C), 0xF8.
  return _mm512_ternarylogic_epi32(_mm512_min_epi16(code, _mm512_set1_epi16(0x7E)), _mm512_srli_epi16(x, 8),
                                   _mm512_set1_epi16(0x80), 0xF8);
}

// A row through its blocks by their tables, 64 elements a step (the low bytes of two vectors of words
// permuted into one store), the tail of a run under a mask. A run with an element the table does not
// cover is cast again by the float path after its loop (no test inside it), as is a block without a
// table. Such an element gives a code below 8 (an output below e4m3's normals, a zero or subnormal input,
// whose codes make_cast_table keeps below 8) or from 8 x 255 + base up (an infinite or NaN input, and the
// finite ones of exponent 253 or 254, which the float path then casts as well).
template <bool Track>
WB_FP8_VBMI std::int64_t quantize_bf16_blocks_vbmi(const CastTable* tables, std::int64_t block_cols, std::int64_t lead,
                                                   const std::uint16_t* values, std::int64_t count, std::uint8_t* codes,
                                                   std::uint16_t* magnitudes) {
  const __m512i low_bytes = _mm512_set_epi8(126, 124, 122, 120, 118, 116, 114, 112, 110, 108, 106, 104, 102, 100, 98, 96, 94, 92,
                                            90, 88, 86, 84, 82, 80, 78, 76, 74, 72, 70, 68, 66, 64, 62, 60, 58, 56, 54, 52, 50,
                                            48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6,
                                            4, 2, 0);
  std::int64_t by_table = 0;
  for (std::int64_t j = 0, g = 0; j < count; ++g) {
    const std::int64_t run = std::min(count - j, block_cols - (g == 0 ? lead : 0));
    const CastTable& table = tables[g];
    const std::uint16_t* x = values + j;
    std::uint8_t* code = codes + j;
    std::uint16_t* magnitude = magnitudes + kMagnitudeLanes * g;
    j += run;
    if (table.table) {
      TableLanes t{_mm512_load_si512(table.step), _mm512_load_si512(table.step + 64), _mm512_set1_epi16(table.base),
                   _mm512_set1_epi16(0x7FFF), _mm512_set1_epi16(-0x8000), _mm512_setzero_si512()};
      std::int64_t k = 0;
      for (; k + 64 <= run; k += 64) {
        const __m512i c0 = table_codes<Track>(_mm512_loadu_si512(x + k), t, ~__mmask32{0});
        const __m512i c1 = table_codes<Track>(_mm512_loadu_si512(x + k + 32), t, ~__mmask32{0});
        _mm512_storeu_si512(code + k, _mm512_permutex2var_epi8(c0, low_bytes, c1));
      }
      for (; k < run; k += 32) {
        const auto lanes = static_cast<__mmask32>(run - k >= 32 ? ~0u : (1u << (run - k)) - 1u);
        _mm256_mask_storeu_epi8(code + k, lanes, _mm512_cvtepi16_epi8(table_codes<Track>(_mm512_maskz_loadu_epi16(lanes, x + k), t, lanes)));
      }
      __mmask32 other = _mm512_cmplt_epi16_mask(t.least, _mm512_set1_epi16(8));
      if constexpr (Track)
        _mm512_storeu_si512(magnitude, _mm512_max_epu16(_mm512_loadu_si512(magnitude), t.magnitude));
      else
        other |= _mm512_cmpge_epi16_mask(t.most, _mm512_set1_epi16(static_cast<std::int16_t>(table.base + 8 * 255)));
      if (other == 0) {
        by_table += run;
        continue;
      }
    }
    if (Track && !table.table) magnitude_max_avx512_folded(x, run, magnitude);
    (void)quantize_bf16_avx512(table.scale, x, run, code);
  }
  return by_table;
}
// A table's steps, 16 mantissas a vector: 1.m times (or over) the factor, then e4m3_from_float's normal
// rounding without its exponent's bias (for x = 1.m * 2^(e - 127) the code is that + 8 * (e - 127) - 960 =
// 8 * e + (that - 1976)), less the first's. False where a product leaves the normal floats or the steps
// span more than a byte: no table.
WB_FP8_VBMI bool cast_steps_vbmi(const BlockScale& scale, std::uint8_t* step, std::int32_t& first) {
  const __m512 factor = _mm512_set1_ps(scale.factor);
  const __m512i mantissa = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i rounded[8];
  __mmask16 outside = 0;
  for (int v = 0; v < 8; ++v) {
    const __m512i bits = _mm512_or_si512(_mm512_set1_epi32(127 << 23), _mm512_slli_epi32(_mm512_add_epi32(mantissa, _mm512_set1_epi32(16 * v)), 16));
    const __m512 x = _mm512_castsi512_ps(bits);
    const __m512i a = _mm512_castps_si512(scale.divide ? _mm512_div_ps(x, factor) : _mm512_mul_ps(x, factor));
    const __m512i exponent = _mm512_and_si512(_mm512_srli_epi32(a, 23), _mm512_set1_epi32(0xFF));
    outside |= _mm512_cmpeq_epi32_mask(exponent, _mm512_setzero_si512()) | _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(0xFF));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1));
    rounded[v] = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)), odd), 20);
  }
  if (outside != 0) return false;
  first = _mm_cvtsi128_si32(_mm512_castsi512_si128(rounded[0]));
  for (int v = 0; v < 8; ++v) {
    const __m512i s = _mm512_sub_epi32(rounded[v], _mm512_set1_epi32(first));
    if (_mm512_cmpgt_epu32_mask(s, _mm512_set1_epi32(255)) != 0) return false;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(step + 16 * v), _mm512_cvtepi32_epi8(s));
  }
  return true;
}
#undef WB_FP8_VBMI
#pragma GCC diagnostic pop

__attribute__((target("avx512f,avx512bw,avx512vl"))) void magnitude_max_avx512(const std::uint16_t* values,
                                                                               std::int64_t count,
                                                                               std::uint16_t* running) {
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  std::int64_t k = 0;
  for (; k + 32 <= count; k += 32) {
    const __m512i x = _mm512_and_si512(_mm512_loadu_si512(values + k), magnitude);
    _mm512_storeu_si512(running + k, _mm512_max_epu16(_mm512_loadu_si512(running + k), x));
  }
  if (k < count) {
    const auto mask = static_cast<__mmask32>((1u << (count - k)) - 1u);
    const __m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi16(mask, values + k), magnitude);
    _mm512_mask_storeu_epi16(running + k, mask, _mm512_max_epu16(_mm512_maskz_loadu_epi16(mask, running + k), x));
  }
}

// Four rows into `running` at once: their magnitudes max'ed in registers, one load and store of `running`.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void magnitude_max4_avx512(const std::uint16_t* const rows[4],
                                                                                std::int64_t count, std::uint16_t* running) {
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  const auto of = [&](__mmask32 lanes, std::int64_t k) __attribute__((target("avx512f,avx512bw,avx512vl"))) {
    __m512i m[4];
    for (int r = 0; r < 4; ++r) m[r] = _mm512_and_si512(_mm512_maskz_loadu_epi16(lanes, rows[r] + k), magnitude);
    return _mm512_max_epu16(_mm512_max_epu16(m[0], m[1]), _mm512_max_epu16(m[2], m[3]));
  };
  std::int64_t k = 0;
  for (; k + 32 <= count; k += 32)
    _mm512_storeu_si512(running + k, _mm512_max_epu16(_mm512_loadu_si512(running + k), of(~__mmask32{0}, k)));
  if (k < count) {
    const auto lanes = static_cast<__mmask32>((1u << (count - k)) - 1u);
    _mm512_mask_storeu_epi16(running + k, lanes, _mm512_max_epu16(_mm512_maskz_loadu_epi16(lanes, running + k), of(lanes, k)));
  }
}

bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

using BulkQuantize = std::int64_t (*)(const BlockScale&, const std::uint16_t*, std::int64_t, std::uint8_t*);
const BulkQuantize kQuantizeWide = has_avx512()                  ? quantize_bf16_avx512
                                   : __builtin_cpu_supports("avx2") ? quantize_bf16_avx2
                                                                    : nullptr;
const bool kAvx512 = has_avx512();
const bool kVbmi = kAvx512 && __builtin_cpu_supports("avx512vbmi");
#endif

#if defined(WB_FP8_SIMD)
// SSE2 (the x86-64 baseline): signed 16-bit max, right for magnitudes (at most 0x7FFF).
void magnitude_max_sse2(const std::uint16_t* values, std::int64_t count, std::uint16_t* running) {
  const __m128i magnitude = _mm_set1_epi16(0x7FFF);
  std::int64_t k = 0;
  for (; k + 8 <= count; k += 8) {
    const __m128i x = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + k)), magnitude);
    auto* at = reinterpret_cast<__m128i*>(running + k);
    _mm_storeu_si128(at, _mm_max_epi16(_mm_loadu_si128(at), x));
  }
  for (; k < count; ++k) {
    const auto bits = static_cast<std::uint16_t>(values[k] & 0x7FFFu);
    running[k] = bits > running[k] ? bits : running[k];
  }
}
#endif

}  // namespace

float bf16_amax(const std::uint16_t* values, std::int64_t count) {
  std::int64_t k = 0;
  std::uint32_t largest = 0;
#if defined(WB_FP8_SIMD)
  // |x| of a bf16 orders as its bits without the sign (NaNs above infinity), as signed 16-bit integers too.
  const __m128i magnitude = _mm_set1_epi16(0x7FFF);
  __m128i m0 = _mm_setzero_si128(), m1 = _mm_setzero_si128();
  for (; k + 16 <= count; k += 16) {
    m0 = _mm_max_epi16(m0, _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + k)), magnitude));
    m1 = _mm_max_epi16(m1, _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + k + 8)), magnitude));
  }
  alignas(16) std::uint16_t lanes[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), _mm_max_epi16(m0, m1));
  for (const std::uint16_t lane : lanes) largest = lane > largest ? lane : largest;
#endif
  for (; k < count; ++k) {
    const std::uint32_t bits = values[k] & 0x7FFFu;
    largest = bits > largest ? bits : largest;
  }
  return amax_from_magnitude_bits(largest);
}

void quantize_bf16(const BlockScale& scale, const std::uint16_t* values, std::int64_t count, std::uint8_t* codes) {
  std::int64_t k = 0;
#if defined(WB_FP8_SIMD)
  if (kQuantizeWide != nullptr) k = kQuantizeWide(scale, values, count, codes);
  const __m128 factor = _mm_set1_ps(scale.factor);
  const __m128i zero = _mm_setzero_si128();
  for (; k + 16 <= count; k += 16) {
    __m128i lanes[4];
    for (int half = 0; half < 2; ++half) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + k + 8 * half));
      const __m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, v)), hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, v));
      lanes[2 * half] = e4m3_lanes(scale.divide ? _mm_div_ps(lo, factor) : _mm_mul_ps(lo, factor));
      lanes[2 * half + 1] = e4m3_lanes(scale.divide ? _mm_div_ps(hi, factor) : _mm_mul_ps(hi, factor));
    }
    const __m128i words = _mm_packs_epi32(lanes[0], lanes[1]), words2 = _mm_packs_epi32(lanes[2], lanes[3]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm_packus_epi16(words, words2));
  }
#endif
  for (; k < count; ++k) codes[k] = quantize(scale, bf16_to_float(values[k]));
}

void make_cast_table(const BlockScale& scale, CastTable& out) {
  out.scale = scale;
  out.table = false;
#if defined(WB_FP8_SIMD)
  const std::uint32_t factor = std::bit_cast<std::uint32_t>(scale.factor);
  const std::uint32_t factor_exponent = (factor >> 23) & 0xFFu;
  if (!kVbmi || (factor >> 31) != 0 || factor_exponent == 0 || factor_exponent == 0xFF) return;
  std::int32_t first = 0;
  if (!cast_steps_vbmi(scale, out.step, first)) return;
  // A zero or subnormal input (exponent bits 0) must give a code below 8, which sends its run to the float
  // path: so must the largest mantissa's, base + step[127]. That holds where 2 x the factor stays below
  // 2^121: in every rule but the plain one's of amaxes below about 1e-33.
  const std::int32_t base = first - 1976;
  if (base + out.step[127] >= 8) return;
  out.base = static_cast<std::int16_t>(base);
  out.table = true;
#endif
}

std::int64_t quantize_bf16_blocks(const CastTable* tables, std::int64_t block_cols, std::int64_t lead,
                                  const std::uint16_t* values, std::int64_t count, std::uint8_t* codes) {
#if defined(WB_FP8_SIMD)
  if (kVbmi) return quantize_bf16_blocks_vbmi<false>(tables, block_cols, lead, values, count, codes, nullptr);
#endif
  for (std::int64_t j = 0, g = 0; j < count; ++g) {
    const std::int64_t run = std::min(count - j, block_cols - (g == 0 ? lead : 0));
    quantize_bf16(tables[g].scale, values + j, run, codes + j);
    j += run;
  }
  return 0;
}

std::int64_t quantize_bf16_blocks_tracking(const CastTable* tables, std::int64_t block_cols, std::int64_t lead,
                                           const std::uint16_t* values, std::int64_t count, std::uint8_t* codes,
                                           std::uint16_t* magnitudes) {
#if defined(WB_FP8_SIMD)
  if (kVbmi) return quantize_bf16_blocks_vbmi<true>(tables, block_cols, lead, values, count, codes, magnitudes);
#endif
  for (std::int64_t j = 0, g = 0; j < count; ++g) {
    const std::int64_t run = std::min(count - j, block_cols - (g == 0 ? lead : 0));
    std::uint16_t& folded = magnitudes[kMagnitudeLanes * g];
    for (std::int64_t k = j; k < j + run; ++k) folded = std::max(folded, static_cast<std::uint16_t>(values[k] & 0x7FFFu));
    quantize_bf16(tables[g].scale, values + j, run, codes + j);
    j += run;
  }
  return 0;
}

void bf16_magnitude_max_rows(const std::uint16_t* values, std::int64_t stride, std::int64_t rows, std::int64_t count,
                             std::uint16_t* running) {
  std::int64_t r = 0;
#if defined(WB_FP8_SIMD)
  if (kAvx512) {
    // Rows i, q + i, 2q + i and 3q + i together: four sequential streams through the band.
    const std::int64_t q = rows / 4;
    for (; r < q; ++r) {
      const std::uint16_t* const four[4] = {values + r * stride, values + (q + r) * stride, values + (2 * q + r) * stride,
                                            values + (3 * q + r) * stride};
      magnitude_max4_avx512(four, count, running);
    }
    r = 4 * q;
  }
#endif
  for (; r < rows; ++r) bf16_magnitude_max(values + r * stride, count, running);
}

void bf16_magnitude_max(const std::uint16_t* values, std::int64_t count, std::uint16_t* running) {
#if defined(WB_FP8_SIMD)
  if (kAvx512) return magnitude_max_avx512(values, count, running);
  return magnitude_max_sse2(values, count, running);
#else
  for (std::int64_t k = 0; k < count; ++k) {
    const auto bits = static_cast<std::uint16_t>(values[k] & 0x7FFFu);
    running[k] = bits > running[k] ? bits : running[k];
  }
#endif
}

}  // namespace wb::fp8
