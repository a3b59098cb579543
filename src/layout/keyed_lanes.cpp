#include "layout/keyed_lanes.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace wb::layout {
namespace {

using i64 = std::int64_t;
using u16 = std::uint16_t;

// The definition, one low at a time (also every vector loop's tail).
void keyed_scalar(u16* out, i64 n, u16 first, u16 key, const KeyedRun16& r) {
  for (i64 k = 0; k < n; ++k) {
    unsigned h = hash16(static_cast<u16>(static_cast<u16>(first + k) ^ key));
    if (h >= r.base) h -= r.base;
    unsigned d = h + r.top;
    if (d >= r.base) d -= r.base;
    out[k] = static_cast<u16>(r.lo + d + (d >= r.half ? r.hole : 0));
  }
}

// Eight lanes in GCC's vector extension (SSE2 at the baseline). Every sum is < 2 D < 2^17, taken modulo
// 2^16 where it wraps (the result is < D): (h + top) mod D subtracts D where h >= D - top.
void keyed_sse2(u16* out, i64 n, u16 first, u16 key, const KeyedRun16& r) {
  typedef u16 Lanes __attribute__((vector_size(16)));
  const auto lane = [](unsigned v) {
    const auto x = static_cast<u16>(v);
    return Lanes{x, x, x, x, x, x, x, x};
  };
  const Lanes b = lane(r.base), t = lane(r.top), wrap = lane(r.base - r.top), lo = lane(r.lo), half = lane(r.half),
              hole = lane(r.hole), eight = lane(8), k = lane(key);
  Lanes x;
  for (int e = 0; e < 8; ++e) x[e] = static_cast<u16>(first + e);
  i64 i = 0;
  for (; i + 8 <= n; i += 8, x += eight) {
    Lanes h = hash16(x ^ k);
    h -= (Lanes)(h >= b) & b;
    Lanes d = h + t;
    d -= (Lanes)(h >= wrap) & b;
    const Lanes bits = lo + d + ((Lanes)(d >= half) & hole);
    std::memcpy(out + i, &bits, sizeof(bits));
  }
  keyed_scalar(out + i, n - i, static_cast<u16>(first + i), key, r);
}

// 16 lanes. AVX2 has no unsigned 16-bit compare: a >= b where max(a, b) == a.
__attribute__((target("avx2"))) inline __m256i hash16_avx2(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi16(x, 8));
  x = _mm256_mullo_epi16(x, _mm256_set1_epi16(static_cast<short>(0x88b5)));
  x = _mm256_xor_si256(x, _mm256_srli_epi16(x, 7));
  x = _mm256_mullo_epi16(x, _mm256_set1_epi16(static_cast<short>(0xdb2d)));
  return _mm256_xor_si256(x, _mm256_srli_epi16(x, 9));
}

__attribute__((target("avx2"))) inline __m256i at_least_avx2(__m256i a, __m256i b) {
  return _mm256_cmpeq_epi16(_mm256_max_epu16(a, b), a);
}

__attribute__((target("avx2"))) inline __m256i lane_avx2(unsigned v) { return _mm256_set1_epi16(static_cast<short>(v)); }

__attribute__((target("avx2"))) void keyed_avx2(u16* out, i64 n, u16 first, u16 key, const KeyedRun16& r) {
  const __m256i b = lane_avx2(r.base), t = lane_avx2(r.top), wrap = lane_avx2(r.base - r.top), lo = lane_avx2(r.lo), half = lane_avx2(r.half),
                hole = lane_avx2(r.hole), step = lane_avx2(16), k = lane_avx2(key);
  __m256i x = _mm256_add_epi16(lane_avx2(first), _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  i64 i = 0;
  for (; i + 16 <= n; i += 16, x = _mm256_add_epi16(x, step)) {
    __m256i h = hash16_avx2(_mm256_xor_si256(x, k));
    h = _mm256_sub_epi16(h, _mm256_and_si256(at_least_avx2(h, b), b));
    __m256i d = _mm256_sub_epi16(_mm256_add_epi16(h, t), _mm256_and_si256(at_least_avx2(h, wrap), b));
    d = _mm256_add_epi16(_mm256_add_epi16(d, lo), _mm256_and_si256(at_least_avx2(d, half), hole));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), d);
  }
  keyed_scalar(out + i, n - i, static_cast<u16>(first + i), key, r);
}

// 32 lanes; the compares give masks, and the tail is one masked store.
#define WB_KEYED_AVX512 __attribute__((target("avx512f,avx512bw")))
WB_KEYED_AVX512 inline __m512i lane_avx512(unsigned v) { return _mm512_set1_epi16(static_cast<short>(v)); }

struct KeyedConstants512 {
  __m512i base, lo, half, hole, key;
};

// keyed_scalar's code of every lane's low `v` with its top `t` (wrap = D - t: where h + t passes D).
WB_KEYED_AVX512 inline __m512i keyed_code_avx512(__m512i v, __m512i t, __m512i wrap, const KeyedConstants512& c) {
  __m512i h = _mm512_xor_si512(v, c.key);
  h = _mm512_xor_si512(h, _mm512_srli_epi16(h, 8));
  h = _mm512_mullo_epi16(h, lane_avx512(0x88b5));
  h = _mm512_xor_si512(h, _mm512_srli_epi16(h, 7));
  h = _mm512_mullo_epi16(h, lane_avx512(0xdb2d));
  h = _mm512_xor_si512(h, _mm512_srli_epi16(h, 9));
  h = _mm512_mask_sub_epi16(h, _mm512_cmpge_epu16_mask(h, c.base), h, c.base);
  __m512i d = _mm512_add_epi16(h, t);
  d = _mm512_mask_sub_epi16(d, _mm512_cmpge_epu16_mask(h, wrap), d, c.base);
  const __m512i bits = _mm512_add_epi16(d, c.lo);
  return _mm512_mask_add_epi16(bits, _mm512_cmpge_epu16_mask(d, c.half), bits, c.hole);
}

// Writes the codes to `out`, or (`have` not null) compares them with have[0, n).
WB_KEYED_AVX512 bool keyed_avx512(u16* out, const u16* have, i64 n, u16 first, u16 key, const KeyedRun16& r) {
  const __m512i b = lane_avx512(r.base), t = lane_avx512(r.top), wrap = lane_avx512(r.base - r.top), lo = lane_avx512(r.lo), half = lane_avx512(r.half),
                hole = lane_avx512(r.hole), step = lane_avx512(32), k = lane_avx512(key);
  const __m512i ramp = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                        12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512i x = _mm512_add_epi16(lane_avx512(first), ramp);
  const KeyedConstants512 c{b, lo, half, hole, k};
  const auto codes = [&](__m512i v) WB_KEYED_AVX512 { return keyed_code_avx512(v, t, wrap, c); };
  i64 i = 0;
  if (have == nullptr) {
    for (; i + 32 <= n; i += 32, x = _mm512_add_epi16(x, step)) _mm512_storeu_si512(out + i, codes(x));
    if (i < n) _mm512_mask_storeu_epi16(out + i, static_cast<__mmask32>((1ULL << (n - i)) - 1), codes(x));
    return true;
  }
  for (; i + 32 <= n; i += 32, x = _mm512_add_epi16(x, step))
    if (_mm512_cmpneq_epi16_mask(codes(x), _mm512_loadu_si512(have + i)) != 0) return false;
  const auto tail = static_cast<__mmask32>((1ULL << (n - i)) - 1);
  return i == n || _mm512_mask_cmpneq_epi16_mask(tail, codes(x), _mm512_maskz_loadu_epi16(tail, have + i)) == 0;
}

// The definition of a progression's comparison, key by key (also the vector loop's tail).
bool progression_scalar(const u16* have, i64 n, u16 key, KeyedProgression16 p, const KeyedRun16& r) {
  unsigned low = p.low, top = p.top;
  for (i64 k = 0; k < n; ++k) {
    u16 code;
    keyed_scalar(&code, 1, static_cast<u16>(low), key, KeyedRun16{static_cast<u16>(top), r.base, r.lo, r.half, r.hole});
    if (code != have[k]) return false;
    low += p.low_step;
    const unsigned carry = low >= p.place ? 1 : 0;
    low -= carry * p.place;
    top += p.top_step + carry;  // < 2 D: one subtraction
    if (top >= r.base) top -= r.base;
  }
  return true;
}

// 32 keys a step, each lane with its own low and top. Every sum is taken modulo 2^16 where it wraps, and a
// digit is reduced by comparing before adding (x + a >= m exactly when x >= m - a, for x < m, a <= m), so
// no lane needs widening: low + step wraps to low + step - place, top + step + carry to that less D.
WB_KEYED_AVX512 bool progression_avx512(const u16* have, i64 n, u16 key, const KeyedProgression16& p, const KeyedRun16& r) {
  u16 lows[32], tops[32];
  KeyedProgression16 lane = p;
  for (int k = 0; k < 32; ++k) {
    lows[k] = lane.low, tops[k] = lane.top;
    unsigned low = lane.low + lane.low_step;
    const unsigned carry = low >= p.place ? 1 : 0;
    unsigned top = lane.top + lane.top_step + carry;
    if (top >= r.base) top -= r.base;
    lane.low = static_cast<u16>(low - carry * p.place), lane.top = static_cast<u16>(top);
  }
  // 32 keys on: s' = 32 s, so low_step' = 32 low_step mod place, top_step' = 32 top_step + 32 low_step / place mod D.
  const std::uint64_t lows32 = 32 * std::uint64_t{p.low_step};
  const auto low_step = static_cast<u16>(lows32 % p.place);
  const auto top_step = static_cast<u16>((32 * std::uint64_t{p.top_step} + lows32 / p.place) % r.base);
  __m512i low = _mm512_loadu_si512(lows), top = _mm512_loadu_si512(tops);
  const __m512i b = lane_avx512(r.base), lo = lane_avx512(r.lo), half = lane_avx512(r.half), hole = lane_avx512(r.hole),
                k = lane_avx512(key), place = lane_avx512(p.place),
                ls = lane_avx512(low_step), low_wrap = lane_avx512(p.place - low_step), ts = lane_avx512(top_step),
                one = lane_avx512(1);
  const KeyedConstants512 c{b, lo, half, hole, k};
  const auto codes = [&]() WB_KEYED_AVX512 { return keyed_code_avx512(low, top, _mm512_sub_epi16(b, top), c); };
  const auto advance = [&]() WB_KEYED_AVX512 {
    const __mmask32 carry = _mm512_cmpge_epu16_mask(low, low_wrap);
    low = _mm512_add_epi16(low, ls);
    low = _mm512_mask_sub_epi16(low, carry, low, place);
    const __m512i inc = _mm512_mask_add_epi16(ts, carry, ts, one);  // <= D
    const __mmask32 over = _mm512_cmpge_epu16_mask(top, _mm512_sub_epi16(b, inc));
    top = _mm512_add_epi16(top, inc);
    top = _mm512_mask_sub_epi16(top, over, top, b);
  };
  i64 i = 0;
  for (; i + 32 <= n; i += 32, advance())
    if (_mm512_cmpneq_epi16_mask(codes(), _mm512_loadu_si512(have + i)) != 0) return false;
  const auto tail = static_cast<__mmask32>((1ULL << (n - i)) - 1);
  return i == n || _mm512_mask_cmpneq_epi16_mask(tail, codes(), _mm512_maskz_loadu_epi16(tail, have + i)) == 0;
}

// The narrower widths write the codes; their comparison goes through a small buffer of them.
template <void (*Write)(u16*, i64, u16, u16, const KeyedRun16&)>
bool write_or_compare(u16* out, const u16* have, i64 n, u16 first, u16 key, const KeyedRun16& r) {
  if (have == nullptr) {
    Write(out, n, first, key, r);
    return true;
  }
  u16 codes[256];
  for (i64 i = 0; i < n; i += 256) {
    const i64 m = std::min<i64>(256, n - i);
    Write(codes, m, static_cast<u16>(first + i), key, r);
    if (std::memcmp(codes, have + i, static_cast<std::size_t>(m) * 2) != 0) return false;
  }
  return true;
}

using Kernel = bool (*)(u16*, const u16*, i64, u16, u16, const KeyedRun16&);

bool cpu_has(KeyedLanes lanes) {
  __builtin_cpu_init();  // static initialization may run before libgcc's own
  switch (lanes) {
    case KeyedLanes::kAvx2: return __builtin_cpu_supports("avx2");
    case KeyedLanes::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    default: return true;
  }
}

const Kernel kBest = cpu_has(KeyedLanes::kAvx512) ? keyed_avx512
                     : cpu_has(KeyedLanes::kAvx2) ? write_or_compare<keyed_avx2>
                                                  : write_or_compare<keyed_sse2>;

Kernel kernel_for(KeyedLanes lanes) {
  if (lanes == KeyedLanes::kScalar) return write_or_compare<keyed_scalar>;
  if (lanes == KeyedLanes::kSse2) return write_or_compare<keyed_sse2>;
  if (lanes == KeyedLanes::kAvx2 && cpu_has(lanes)) return write_or_compare<keyed_avx2>;
  return kBest;
}

}  // namespace

void keyed_codes16(std::uint16_t* out, std::int64_t n, std::uint16_t first, std::uint16_t block_key,
                   const KeyedRun16& run, KeyedLanes lanes) {
  kernel_for(lanes)(out, nullptr, n, first, block_key, run);
}

bool keyed_codes16_equal(const std::uint16_t* have, std::int64_t n, std::uint16_t first, std::uint16_t block_key,
                         const KeyedRun16& run, KeyedLanes lanes) {
  return kernel_for(lanes)(nullptr, have, n, first, block_key, run);
}

bool keyed_progression16_equal(const std::uint16_t* have, std::int64_t n, std::uint16_t block_key,
                               const KeyedProgression16& keys, const KeyedRun16& run, KeyedLanes lanes) {
  if (lanes != KeyedLanes::kScalar && keyed_progression16_in_lanes()) return progression_avx512(have, n, block_key, keys, run);
  return progression_scalar(have, n, block_key, keys, run);
}

bool keyed_progression16_in_lanes() {
  static const bool has = cpu_has(KeyedLanes::kAvx512);
  return has;
}

bool keyed_lanes_supported(KeyedLanes lanes) { return cpu_has(lanes); }

std::string_view keyed_lanes_name(KeyedLanes lanes) {
  switch (lanes) {
    case KeyedLanes::kScalar: return "scalar";
    case KeyedLanes::kSse2: return "SSE2";
    case KeyedLanes::kAvx2: return "AVX2";
    case KeyedLanes::kAvx512: return "AVX-512BW";
    case KeyedLanes::kBest: break;
  }
  return "best";
}

}  // namespace wb::layout
