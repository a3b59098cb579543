#include "core/transpose16.hpp"

#include <immintrin.h>

namespace wb::transpose16 {
namespace {

using i64 = std::int64_t;
using u16 = std::uint16_t;

#define WB_TRANSPOSE_AVX512 __attribute__((target("avx512f,avx512bw")))
// (GCC 12 warns that its own headers' _mm512_undefined_epi32 in the unpacks and lane shuffles is used
// uninitialized: a known false positive.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Three rounds of interleaving (16-, 32- and 64-bit units) transpose 8 x 8 blocks inside each 128-bit lane
// of line pairs i, i + 16, and two rounds of 128-bit lane shuffles finish the 32 x 32 block. Done on lines in
// natural order, that leaves line k of the result at column kOut[k] and its elements in bit-reversed line
// order, so the lines are loaded in bit-reversed order (kIn: that undoes the second) and stored to kOut.
constexpr int kIn[32] = {0, 16, 8, 24, 4, 20, 12, 28, 2, 18, 10, 26, 6, 22, 14, 30,
                         1, 17, 9, 25, 5, 21, 13, 29, 3, 19, 11, 27, 7, 23, 15, 31};
constexpr int kOut[32] = {0, 16, 8, 24, 1, 17, 9, 25, 2, 18, 10, 26, 3, 19, 11, 27,
                          4, 20, 12, 28, 5, 21, 13, 29, 6, 22, 14, 30, 7, 23, 15, 31};

// Line k of `out` gets column kOut[k] of the block at b (fully unrolled: the 64 vectors stay in registers).
WB_TRANSPOSE_AVX512 __attribute__((always_inline)) inline void transpose_block(const u16* b, i64 b_line, __m512i* out) {
  __m512i v[32], w[32];
#pragma GCC unroll 32
  for (int k = 0; k < 32; ++k) v[k] = _mm512_loadu_si512(b + kIn[k] * b_line);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    w[2 * i] = _mm512_unpacklo_epi16(v[i], v[i + 16]);
    w[2 * i + 1] = _mm512_unpackhi_epi16(v[i], v[i + 16]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    v[2 * i] = _mm512_unpacklo_epi32(w[i], w[i + 16]);
    v[2 * i + 1] = _mm512_unpackhi_epi32(w[i], w[i + 16]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    w[2 * i] = _mm512_unpacklo_epi64(v[i], v[i + 16]);
    w[2 * i + 1] = _mm512_unpackhi_epi64(v[i], v[i + 16]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    v[2 * i] = _mm512_shuffle_i32x4(w[i], w[i + 16], 0x88);
    v[2 * i + 1] = _mm512_shuffle_i32x4(w[i], w[i + 16], 0xdd);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = _mm512_shuffle_i32x4(v[i], v[i + 16], 0x88);
    out[2 * i + 1] = _mm512_shuffle_i32x4(v[i], v[i + 16], 0xdd);
  }
}

WB_TRANSPOSE_AVX512 void copy_avx512(u16* a, i64 a_line, const u16* b, i64 b_line, i64 rows, i64 columns, bool stream) {
  __m512i v[32];
  for (i64 r = 0; r < rows; r += 32)
    for (i64 c = 0; c < columns; c += 32) {
      transpose_block(b + r * b_line + c, b_line, v);
      u16* at = a + c * a_line + r;
      if (stream && ((reinterpret_cast<std::uintptr_t>(at) | static_cast<std::uintptr_t>(a_line * 2)) & 63) == 0) {
#pragma GCC unroll 32
        for (int k = 0; k < 32; ++k) _mm512_stream_si512(reinterpret_cast<__m512i*>(at + kOut[k] * a_line), v[k]);
      } else {
#pragma GCC unroll 32
        for (int k = 0; k < 32; ++k) _mm512_storeu_si512(at + kOut[k] * a_line, v[k]);
      }
    }
  if (stream) _mm_sfence();  // the streamed lines are visible before the caller reads or hands them on
}

WB_TRANSPOSE_AVX512 bool equal_avx512(const u16* a, i64 a_line, const u16* b, i64 b_line, i64 rows, i64 columns) {
  __m512i v[32];
  for (i64 r = 0; r < rows; r += 32)
    for (i64 c = 0; c < columns; c += 32) {
      transpose_block(b + r * b_line + c, b_line, v);
      const u16* at = a + c * a_line + r;
      __m512i diff = _mm512_setzero_si512();
#pragma GCC unroll 32
      for (int k = 0; k < 32; ++k) diff = _mm512_or_si512(diff, _mm512_xor_si512(v[k], _mm512_loadu_si512(at + kOut[k] * a_line)));
      if (_mm512_test_epi64_mask(diff, diff) != 0) return false;
    }
  return true;
}

#pragma GCC diagnostic pop

}  // namespace

bool available() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }();
  return has;
}

void copy(std::uint16_t* a, std::int64_t a_line, const std::uint16_t* b, std::int64_t b_line, std::int64_t rows,
          std::int64_t columns, bool stream) {
  copy_avx512(a, a_line, b, b_line, rows, columns, stream);
}

bool equal(const std::uint16_t* a, std::int64_t a_line, const std::uint16_t* b, std::int64_t b_line, std::int64_t rows,
           std::int64_t columns) {
  return equal_avx512(a, a_line, b, b_line, rows, columns);
}

}  // namespace wb::transpose16
