#include "layout/second_difference_lanes.hpp"

#include <immintrin.h>

namespace wb::layout {
namespace {

using i64 = std::int64_t;
using u16 = std::uint16_t;

bool zero_scalar(const u16* a, const u16* b, const u16* c, i64 n) {
  unsigned acc = 0;
  for (i64 k = 0; k < n; ++k) acc |= (unsigned{a[k]} + c[k]) ^ (2u * b[k]);
  return acc == 0;
}

// Each lane: (avg(a, c) xor b) or ((a xor c) and 1), zero exactly when a + c = 2 b.
__m128i residue_sse2(__m128i a, __m128i b, __m128i c) {
  const __m128i odd = _mm_and_si128(_mm_xor_si128(a, c), _mm_set1_epi16(1));
  return _mm_or_si128(_mm_xor_si128(_mm_avg_epu16(a, c), b), odd);
}

bool zero_sse2(const u16* a, const u16* b, const u16* c, i64 n) {
  const auto load = [](const u16* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  __m128i acc = _mm_setzero_si128();
  i64 k = 0;
  for (; k + 8 <= n; k += 8) acc = _mm_or_si128(acc, residue_sse2(load(a + k), load(b + k), load(c + k)));
  return _mm_movemask_epi8(_mm_cmpeq_epi16(acc, _mm_setzero_si128())) == 0xffff && zero_scalar(a + k, b + k, c + k, n - k);
}

__attribute__((target("avx2"))) inline __m256i residue_avx2(__m256i a, __m256i b, __m256i c) {
  const __m256i odd = _mm256_and_si256(_mm256_xor_si256(a, c), _mm256_set1_epi16(1));
  return _mm256_or_si256(_mm256_xor_si256(_mm256_avg_epu16(a, c), b), odd);
}

__attribute__((target("avx2"))) inline __m256i load_avx2(const u16* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

__attribute__((target("avx2"))) bool zero_avx2(const u16* a, const u16* b, const u16* c, i64 n) {
  __m256i acc = _mm256_setzero_si256();
  i64 k = 0;
  for (; k + 16 <= n; k += 16) acc = _mm256_or_si256(acc, residue_avx2(load_avx2(a + k), load_avx2(b + k), load_avx2(c + k)));
  return _mm256_testz_si256(acc, acc) != 0 && zero_scalar(a + k, b + k, c + k, n - k);
}

// Two vectors a step, one OR tree, and the tail in one masked step.
#define WB_DIFFERENCE_AVX512 __attribute__((target("avx512f,avx512bw")))
WB_DIFFERENCE_AVX512 inline __m512i residue_avx512(__m512i a, __m512i b, __m512i c) {
  const __m512i odd = _mm512_and_si512(_mm512_xor_si512(a, c), _mm512_set1_epi16(1));
  return _mm512_or_si512(_mm512_xor_si512(_mm512_avg_epu16(a, c), b), odd);
}

WB_DIFFERENCE_AVX512 bool zero_avx512(const u16* a, const u16* b, const u16* c, i64 n) {
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  i64 k = 0;
  for (; k + 64 <= n; k += 64) {
    acc0 = _mm512_or_si512(acc0, residue_avx512(_mm512_loadu_si512(a + k), _mm512_loadu_si512(b + k), _mm512_loadu_si512(c + k)));
    acc1 = _mm512_or_si512(acc1, residue_avx512(_mm512_loadu_si512(a + k + 32), _mm512_loadu_si512(b + k + 32),
                                                _mm512_loadu_si512(c + k + 32)));
  }
  for (; k < n; k += 32) {
    const __mmask32 m = n - k >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ULL << (n - k)) - 1);
    acc0 = _mm512_or_si512(acc0, residue_avx512(_mm512_maskz_loadu_epi16(m, a + k), _mm512_maskz_loadu_epi16(m, b + k),
                                                _mm512_maskz_loadu_epi16(m, c + k)));
  }
  return _mm512_test_epi16_mask(_mm512_or_si512(acc0, acc1), _mm512_or_si512(acc0, acc1)) == 0;
}

using Kernel = bool (*)(const u16*, const u16*, const u16*, i64);

bool cpu_has(DifferenceLanes lanes) {
  __builtin_cpu_init();  // static initialization may run before libgcc's own
  switch (lanes) {
    case DifferenceLanes::kAvx2: return __builtin_cpu_supports("avx2");
    case DifferenceLanes::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    default: return true;
  }
}

const Kernel kBest = cpu_has(DifferenceLanes::kAvx512) ? zero_avx512
                     : cpu_has(DifferenceLanes::kAvx2) ? zero_avx2
                                                       : zero_sse2;

}  // namespace

bool zero_second_differences16(const std::uint16_t* a, const std::uint16_t* b, const std::uint16_t* c, std::int64_t n,
                               DifferenceLanes lanes) {
  Kernel kernel = kBest;
  if (lanes == DifferenceLanes::kScalar) kernel = zero_scalar;
  if (lanes == DifferenceLanes::kSse2) kernel = zero_sse2;
  if (lanes == DifferenceLanes::kAvx2 && cpu_has(lanes)) kernel = zero_avx2;
  return kernel(a, b, c, n);
}

bool difference_lanes_supported(DifferenceLanes lanes) { return cpu_has(lanes); }

}  // namespace wb::layout
