// The CPU copy program's blocked transpose (cpu_copy_kernels.hpp) for 1/2/4/8-byte elements: SSE2
// micro-kernels (8x8 for 1 and 2 bytes, 4x4 for 4, 2x2 for 8); for 2 bytes an AVX2 8x16 kernel and 32-byte
// streaming stores where the CPU has AVX2; 64 x 64-byte tiles through an L1 scratch tile, 256 x 256-byte
// super-tiles, L2 prefetch.
//
// Measured on one core (bench/bench_pack.cpp): transposes of [4096, 4096] bf16 ~0.5-0.6x of memcpy. A
// transpose is bound mostly by its access pattern (every row of a tile in the same cache set, a new DRAM
// page per 256 bytes): an AVX-512 32x32 register tile, wider or narrower super-tiles, other prefetch hints
// and distances, a gather into a contiguous staging tile, and visiting the boxes of one matrix band by
// band all measured slower or no faster. Fewer instructions per tile did help: the AVX2 8x16 kernel with
// 32-byte streaming stores took bf16 pack from 0.48 to 0.52 and assemble from 0.53 to 0.59 of memcpy
// (medians of six interleaved runs); an AVX-512 8x32 kernel added only ~2% more, so 2-byte elements stop
// at AVX2 and the other sizes keep the SSE2 kernels (the baseline of x86-64).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "exec/cpu_copy_kernels.hpp"

namespace wb::exec::cpu {
namespace {

using i64 = std::int64_t;
using Axis = CopyProgram::Axis;
using Op = CopyProgram::Op;

// Micro-kernels: an M x M block, dst[c][r] = src[r][c]; strides in bytes.
template <std::size_t E>
struct Micro;

#if WB_PACK_SSE2
inline __m128i load(const std::byte* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void store(std::byte* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
inline __m128i load8(const std::byte* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
inline void store8(std::byte* p, __m128i v) { _mm_storel_epi64(reinterpret_cast<__m128i*>(p), v); }

template <>
struct Micro<1> {
  static constexpr i64 M = 8;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i b0 = _mm_unpacklo_epi8(load8(s), load8(s + ss));
    const __m128i b1 = _mm_unpacklo_epi8(load8(s + 2 * ss), load8(s + 3 * ss));
    const __m128i b2 = _mm_unpacklo_epi8(load8(s + 4 * ss), load8(s + 5 * ss));
    const __m128i b3 = _mm_unpacklo_epi8(load8(s + 6 * ss), load8(s + 7 * ss));
    const __m128i c0 = _mm_unpacklo_epi16(b0, b1), c1 = _mm_unpackhi_epi16(b0, b1);
    const __m128i c2 = _mm_unpacklo_epi16(b2, b3), c3 = _mm_unpackhi_epi16(b2, b3);
    const __m128i d0 = _mm_unpacklo_epi32(c0, c2), d1 = _mm_unpackhi_epi32(c0, c2);
    const __m128i d2 = _mm_unpacklo_epi32(c1, c3), d3 = _mm_unpackhi_epi32(c1, c3);
    store8(d, d0), store8(d + ds, _mm_unpackhi_epi64(d0, d0));
    store8(d + 2 * ds, d1), store8(d + 3 * ds, _mm_unpackhi_epi64(d1, d1));
    store8(d + 4 * ds, d2), store8(d + 5 * ds, _mm_unpackhi_epi64(d2, d2));
    store8(d + 6 * ds, d3), store8(d + 7 * ds, _mm_unpackhi_epi64(d3, d3));
  }
};

template <>
struct Micro<2> {
  static constexpr i64 M = 8;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i a0 = load(s), a1 = load(s + ss), a2 = load(s + 2 * ss), a3 = load(s + 3 * ss);
    const __m128i a4 = load(s + 4 * ss), a5 = load(s + 5 * ss), a6 = load(s + 6 * ss), a7 = load(s + 7 * ss);
    const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    const __m128i b4 = _mm_unpacklo_epi16(a4, a5), b5 = _mm_unpackhi_epi16(a4, a5);
    const __m128i b6 = _mm_unpacklo_epi16(a6, a7), b7 = _mm_unpackhi_epi16(a6, a7);
    const __m128i c0 = _mm_unpacklo_epi32(b0, b2), c1 = _mm_unpackhi_epi32(b0, b2);
    const __m128i c2 = _mm_unpacklo_epi32(b1, b3), c3 = _mm_unpackhi_epi32(b1, b3);
    const __m128i c4 = _mm_unpacklo_epi32(b4, b6), c5 = _mm_unpackhi_epi32(b4, b6);
    const __m128i c6 = _mm_unpacklo_epi32(b5, b7), c7 = _mm_unpackhi_epi32(b5, b7);
    store(d, _mm_unpacklo_epi64(c0, c4));
    store(d + ds, _mm_unpackhi_epi64(c0, c4));
    store(d + 2 * ds, _mm_unpacklo_epi64(c1, c5));
    store(d + 3 * ds, _mm_unpackhi_epi64(c1, c5));
    store(d + 4 * ds, _mm_unpacklo_epi64(c2, c6));
    store(d + 5 * ds, _mm_unpackhi_epi64(c2, c6));
    store(d + 6 * ds, _mm_unpacklo_epi64(c3, c7));
    store(d + 7 * ds, _mm_unpackhi_epi64(c3, c7));
  }
};

template <>
struct Micro<4> {
  static constexpr i64 M = 4;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i a0 = load(s), a1 = load(s + ss), a2 = load(s + 2 * ss), a3 = load(s + 3 * ss);
    const __m128i b0 = _mm_unpacklo_epi32(a0, a1), b1 = _mm_unpackhi_epi32(a0, a1);
    const __m128i b2 = _mm_unpacklo_epi32(a2, a3), b3 = _mm_unpackhi_epi32(a2, a3);
    store(d, _mm_unpacklo_epi64(b0, b2));
    store(d + ds, _mm_unpackhi_epi64(b0, b2));
    store(d + 2 * ds, _mm_unpacklo_epi64(b1, b3));
    store(d + 3 * ds, _mm_unpackhi_epi64(b1, b3));
  }
};

template <>
struct Micro<8> {
  static constexpr i64 M = 2;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i a0 = load(s), a1 = load(s + ss);
    store(d, _mm_unpacklo_epi64(a0, a1));
    store(d + ds, _mm_unpackhi_epi64(a0, a1));
  }
};
#else
template <std::size_t E>
struct Micro {
  static constexpr i64 M = 4;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    for (i64 r = 0; r < M; ++r)
      for (i64 c = 0; c < M; ++c) std::memcpy(d + c * ds + r * static_cast<i64>(E), s + r * ss + c * static_cast<i64>(E), E);
  }
};
#endif

/// Tiles are 64 bytes of a row on each side (one cache line), super-tiles 256 bytes.
template <std::size_t E>
constexpr i64 kTile = 64 / static_cast<i64>(E);
template <std::size_t E>
constexpr i64 kSuperTile = 256 / static_cast<i64>(E);

/// Writes one 64-byte tile row from the scratch tile (streaming stores when asked).
template <bool kStream>
inline void write_tile_row(std::byte* dst, const std::byte* row) {
#if WB_PACK_SSE2
  if constexpr (kStream) {
    for (int i = 0; i < 64; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_load_si128(reinterpret_cast<const __m128i*>(row + i)));
    return;
  }
#endif
  std::memcpy(dst, row, 64);
}

/// Verifying: continues a row's open block stream (DigestSums::add_blocks's a[4] then b[4], at `ab`) over
/// the 64 bytes, two blocks, at `p`.
inline void stream_two_blocks(const std::byte* p, std::uint64_t* ab) {
#if WB_PACK_SSE2
  auto* state = reinterpret_cast<__m128i*>(ab);
  __m128i a0 = _mm_loadu_si128(state), a1 = _mm_loadu_si128(state + 1);
  __m128i b0 = _mm_loadu_si128(state + 2), b1 = _mm_loadu_si128(state + 3);
  a0 = _mm_add_epi64(a0, load(p)), a1 = _mm_add_epi64(a1, load(p + 16));
  b0 = _mm_add_epi64(b0, a0), b1 = _mm_add_epi64(b1, a1);
  a0 = _mm_add_epi64(a0, load(p + 32)), a1 = _mm_add_epi64(a1, load(p + 48));
  b0 = _mm_add_epi64(b0, a0), b1 = _mm_add_epi64(b1, a1);
  _mm_storeu_si128(state, a0), _mm_storeu_si128(state + 1, a1);
  _mm_storeu_si128(state + 2, b0), _mm_storeu_si128(state + 3, b1);
#else
  digest_blocks(p, 2, ab, ab + 4);
#endif
}

/// Rows [first, first + count) of a tile into their streams (`streams`: 8 words per tile row), at `rows`
/// with `stride`: a pack's destination rows from the scratch tile (its streaming stores leave nothing in
/// cache to read back), once it is complete; an assemble's source rows right after the micro-kernels read
/// them (a tile's source rows often share one cache set: later, most would be out of L1).
inline void stream_tile_rows(const std::byte* rows, i64 stride, i64 first, i64 count, std::uint64_t* streams) {
  for (i64 i = first; i < first + count; ++i) stream_two_blocks(rows + i * stride, streams + 8 * i);
}

/// One whole tile (64 bytes of a row on each side) through a contiguous scratch tile: the source read 8
/// rows (one micro-kernel) at a time, one line per row, the destination written a full line per row
/// (streaming stores when `stream`: the destination and its row stride are 16-byte aligned). With
/// `streams`, the buffer-side rows are digested too (stream_tile_rows).
template <std::size_t E>
void whole_tile(const std::byte* s, i64 ss, std::byte* d, i64 ds, bool stream, std::uint64_t* streams, bool pack) {
  constexpr i64 es = static_cast<i64>(E);
  constexpr i64 M = Micro<E>::M;
  constexpr i64 T = kTile<E>;
  static_assert(T % M == 0);
  alignas(64) std::byte scratch[T * 64];  // T rows of 64 bytes: the tile, transposed
  for (i64 r = 0; r < T; r += M) {
    for (i64 c = 0; c < T; c += M) Micro<E>::run(s + r * ss + c * es, ss, scratch + c * 64 + r * es, 64);
    if (streams != nullptr && !pack) stream_tile_rows(s, ss, r, M, streams);
  }
  if (streams != nullptr && pack) stream_tile_rows(scratch, 64, 0, T, streams);
  if (stream)
    for (i64 c = 0; c < T; ++c) write_tile_row<true>(d + c * ds, scratch + c * 64);
  else
    for (i64 c = 0; c < T; ++c) write_tile_row<false>(d + c * ds, scratch + c * 64);
}

using WholeTile = void (*)(const std::byte*, i64, std::byte*, i64, bool, std::uint64_t*, bool);

#if WB_PACK_SSE2
// 2-byte elements where the CPU has AVX2: the SSE2 8x8 kernel in each 128-bit lane, so one kernel moves 8
// rows x 16 columns with half the loads and shuffles; destination rows c..c+7 come from the low lanes,
// c+8..c+15 from the high ones.
__attribute__((target("avx2"))) inline void micro_2byte_avx2(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + ss));
  const __m256i a2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * ss));
  const __m256i a3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 3 * ss));
  const __m256i a4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 4 * ss));
  const __m256i a5 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 5 * ss));
  const __m256i a6 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 6 * ss));
  const __m256i a7 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 7 * ss));
  const __m256i b0 = _mm256_unpacklo_epi16(a0, a1), b1 = _mm256_unpackhi_epi16(a0, a1);
  const __m256i b2 = _mm256_unpacklo_epi16(a2, a3), b3 = _mm256_unpackhi_epi16(a2, a3);
  const __m256i b4 = _mm256_unpacklo_epi16(a4, a5), b5 = _mm256_unpackhi_epi16(a4, a5);
  const __m256i b6 = _mm256_unpacklo_epi16(a6, a7), b7 = _mm256_unpackhi_epi16(a6, a7);
  const __m256i c0 = _mm256_unpacklo_epi32(b0, b2), c1 = _mm256_unpackhi_epi32(b0, b2);
  const __m256i c2 = _mm256_unpacklo_epi32(b1, b3), c3 = _mm256_unpackhi_epi32(b1, b3);
  const __m256i c4 = _mm256_unpacklo_epi32(b4, b6), c5 = _mm256_unpackhi_epi32(b4, b6);
  const __m256i c6 = _mm256_unpacklo_epi32(b5, b7), c7 = _mm256_unpackhi_epi32(b5, b7);
  const __m256i out[8] = {_mm256_unpacklo_epi64(c0, c4), _mm256_unpackhi_epi64(c0, c4),
                          _mm256_unpacklo_epi64(c1, c5), _mm256_unpackhi_epi64(c1, c5),
                          _mm256_unpacklo_epi64(c2, c6), _mm256_unpackhi_epi64(c2, c6),
                          _mm256_unpacklo_epi64(c3, c7), _mm256_unpackhi_epi64(c3, c7)};
  for (i64 k = 0; k < 8; ++k)
    _mm256_storeu2_m128i(reinterpret_cast<__m128i*>(d + (k + 8) * ds), reinterpret_cast<__m128i*>(d + k * ds), out[k]);
}

// whole_tile<2> with that kernel; the lines go out with 32-byte streaming stores where the destination and
// its row stride are 32-byte aligned.
__attribute__((target("avx2"))) void whole_tile_2byte_avx2(const std::byte* s, i64 ss, std::byte* d, i64 ds,
                                                           bool stream, std::uint64_t* streams, bool pack) {
  alignas(64) std::byte scratch[32 * 64];
  for (i64 r = 0; r < 32; r += 8) {
    for (i64 c = 0; c < 32; c += 16) micro_2byte_avx2(s + r * ss + c * 2, ss, scratch + c * 64 + r * 2, 64);
    if (streams != nullptr && !pack) stream_tile_rows(s, ss, r, 8, streams);
  }
  if (streams != nullptr && pack) stream_tile_rows(scratch, 64, 0, 32, streams);
  if (stream && ((reinterpret_cast<std::uintptr_t>(d) | static_cast<std::uintptr_t>(ds)) & 31) == 0) {
    for (i64 c = 0; c < 32; ++c) {
      const auto* row = reinterpret_cast<const __m256i*>(scratch + c * 64);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + c * ds), _mm256_load_si256(row));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + c * ds + 32), _mm256_load_si256(row + 1));
    }
  } else if (stream) {
    for (i64 c = 0; c < 32; ++c) write_tile_row<true>(d + c * ds, scratch + c * 64);
  } else {
    for (i64 c = 0; c < 32; ++c) write_tile_row<false>(d + c * ds, scratch + c * 64);
  }
}

const WholeTile whole_tile_2byte = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? whole_tile_2byte_avx2 : whole_tile<2>;
}();
#else
const WholeTile whole_tile_2byte = whole_tile<2>;
#endif

/// dst[c * ds + r * E] = src[r * ss + c * E] for r < rows, c < cols.
///
/// Power-of-two row strides (a [4096, 4096] bf16 matrix: 8 KiB) map every row of a tile to the same cache
/// set, so the order of the accesses decides the speed more than the shuffles do:
///   - tiles of 64 x 64 bytes go through a contiguous scratch tile: the source is read 8 rows (one
///     micro-kernel) at a time, one line per row, and the destination written a full line per row
///     (streaming stores when asked and aligned), so neither side keeps many same-set lines in L1;
///   - tiles are visited column of tiles first inside super-tiles of 256 x 256 bytes, themselves visited
///     column first, so each destination row is written 256 bytes in a row and each source row read
///     256 bytes per super-tile (it stays in L2 meanwhile);
///   - the next super-tile's source block is prefetched into L2, a slice per tile.
/// Edge tiles (partial) are copied directly: micro-kernels, then element by element.
///
/// Verifying (`digest`), the buffer-side rows (a pack's destination rows, an assemble's source rows) are
/// digested as the tiles pass: each row's whole tiles continue an open block stream of that row (`rows`),
/// folded into the row's segment once its tiles in the band (pack) or super-tile (assemble) are done, so the
/// digest reads only what the tile has in L1 and adds one fold per row and band; edge tiles, written with
/// ordinary stores, are digested from the buffer right after them.
template <std::size_t E>
struct RowStreams {
  std::uint64_t ab[kSuperTile<E> * 8];  // per row of a super-tile: a[4], b[4]
  i64 blocks[kSuperTile<E>];
};

template <std::size_t E, bool kStream>
void transpose(const std::byte* src, i64 ss, std::byte* dst, i64 ds, i64 rows, i64 cols, const DigestTarget* digest,
               RowStreams<E>* streams) {
  constexpr i64 es = static_cast<i64>(E);
  constexpr i64 M = Micro<E>::M;
  constexpr i64 T = kTile<E>;
  constexpr i64 S = kSuperTile<E>;
  static_assert(T % M == 0 && S % T == 0);
  const bool stream = kStream && ((reinterpret_cast<std::uintptr_t>(dst) | static_cast<std::uintptr_t>(ds)) & 15) == 0;
  const bool pack = digest != nullptr && digest->pack;
  auto scalar = [&](i64 r0, i64 r1, i64 c0, i64 c1) {
    for (i64 r = r0; r < r1; ++r)
      for (i64 c = c0; c < c1; ++c) std::memcpy(dst + c * ds + r * es, src + r * ss + c * es, E);
  };
  auto open = [&](i64 count) {
    std::fill(streams->ab, streams->ab + count * 8, std::uint64_t{0});
    std::fill(streams->blocks, streams->blocks + count, i64{0});
  };
  // Row `i`'s stream, which began at `begin`, into its segment: whole blocks of one segment by their
  // place; otherwise (a row that starts off a block boundary of its segment, or crosses into the next) the
  // bytes again, from the buffer.
  auto fold = [&](i64 i, const std::byte* begin) {
    const i64 blocks = streams->blocks[i];
    if (blocks == 0) return;
    const std::uint64_t* ab = streams->ab + 8 * i;
    const i64 at = begin - digest->buffer;
    const CopyProgram::DigestSpan& span = digest->span_at(at);
    const i64 place = at - span.segment_offset;
    if (span.segment >= 0 && place % 32 == 0 && at + blocks * 32 <= span.end)
      digest->sums[span.segment].add_blocks(static_cast<std::uint64_t>(place / 32), static_cast<std::uint64_t>(blocks), ab, ab + 4);
    else
      digest->add(at, begin, blocks * 32);
  };
  // An assemble's source rows keep their streams across the bands too when they all fit one super-tile.
  const bool one_band = rows <= S;
  if (digest != nullptr && !pack && one_band) open(rows);
  for (i64 C0 = 0; C0 < cols; C0 += S) {
    const i64 C1 = std::min(cols, C0 + S);
    if (pack) open(C1 - C0);  // destination rows C0..C1, across the band
    for (i64 R0 = 0; R0 < rows; R0 += S) {
      const i64 R1 = std::min(rows, R0 + S);
      if (digest != nullptr && !pack && !one_band) open(R1 - R0);  // source rows R0..R1, this super-tile
      // The next super-tile (same order) to prefetch: pf_rows rows of pf_lines lines from pf_base.
      i64 nr = R0 + S, nc = C0;
      if (nr >= rows) nr = 0, nc = C0 + S;
      i64 pf_rows = 0, pf_lines = 0, pf_per_tile = 0, pf_row = 0, pf_line = 0;
      const std::byte* pf_base = src + nr * ss + nc * es;
      if (nc < cols) {
        pf_rows = std::min(rows, nr + S) - nr;
        pf_lines = ((std::min(cols, nc + S) - nc) * es + 63) / 64 + 1;  // + 1: the row may start mid-line
        const i64 tiles = ((R1 - R0 + T - 1) / T) * ((C1 - C0 + T - 1) / T);
        pf_per_tile = (pf_rows * pf_lines + tiles - 1) / tiles;
      }
      for (i64 c0 = C0; c0 < C1; c0 += T) {
        const i64 c1 = std::min(C1, c0 + T);
        for (i64 r0 = R0; r0 < R1; r0 += T) {
          const i64 r1 = std::min(R1, r0 + T);
          for (i64 k = 0; k < pf_per_tile && pf_row < pf_rows; ++k) {
            __builtin_prefetch(pf_base + pf_row * ss + pf_line * 64, 0, 2);
            if (++pf_line == pf_lines) pf_line = 0, ++pf_row;
          }
          if (r1 - r0 == T && c1 - c0 == T) {
            const std::byte* s = src + r0 * ss + c0 * es;
            std::byte* d = dst + c0 * ds + r0 * es;
            const i64 first = digest == nullptr ? 0 : pack ? c0 - C0 : r0 - R0;  // the tile's first stream
            std::uint64_t* tile_streams = digest == nullptr ? nullptr : streams->ab + 8 * first;
            if constexpr (E == 2)
              whole_tile_2byte(s, ss, d, ds, stream, tile_streams, pack);
            else
              whole_tile<E>(s, ss, d, ds, stream, tile_streams, pack);
            if (digest != nullptr)
              for (i64 i = first; i < first + T; ++i) streams->blocks[i] += 2;
            continue;
          }
          const i64 rm = r0 + (r1 - r0) / M * M, cm = c0 + (c1 - c0) / M * M;
          for (i64 r = r0; r < rm; r += M) {
            for (i64 c = c0; c < cm; c += M) Micro<E>::run(src + r * ss + c * es, ss, dst + c * ds + r * es, ds);
            scalar(r, r + M, cm, c1);
          }
          scalar(rm, r1, c0, c1);
          if (digest == nullptr) continue;
          // An edge tile: its buffer-side pieces, in cache (ordinary stores), by place.
          if (pack)
            for (i64 c = c0; c < c1; ++c) {
              const std::byte* row = dst + c * ds + r0 * es;
              digest->add(row - digest->buffer, row, (r1 - r0) * es);
            }
          else
            for (i64 r = r0; r < r1; ++r) {
              const std::byte* row = src + r * ss + c0 * es;
              digest->add(row - digest->buffer, row, (c1 - c0) * es);
            }
        }
      }
      if (digest != nullptr && !pack && !one_band)
        for (i64 r = R0; r < R1; ++r) fold(r - R0, src + r * ss + C0 * es);
    }
    if (pack)
      for (i64 c = C0; c < C1; ++c) fold(c - C0, dst + c * ds);
  }
  if (digest != nullptr && !pack && one_band)
    for (i64 r = 0; r < rows; ++r) fold(r, src + r * ss);
}

template <std::size_t E>
void transpose_op(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst, const DigestTarget* digest) {
  RowStreams<E> streams_storage;  // on the stack: the update path allocates nothing
  RowStreams<E>* streams = digest != nullptr ? &streams_storage : nullptr;
  if (op.streaming)
    for_each_point(axes, op.axis_count, src, dst, [&op, digest, streams](const std::byte* s, std::byte* d) {
      transpose<E, true>(s, op.src_row_stride, d, op.dst_row_stride, op.rows, op.cols, digest, streams);
    });
  else
    for_each_point(axes, op.axis_count, src, dst, [&op, digest, streams](const std::byte* s, std::byte* d) {
      transpose<E, false>(s, op.src_row_stride, d, op.dst_row_stride, op.rows, op.cols, digest, streams);
    });
}

}  // namespace

void execute_transpose(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst, const DigestTarget* digest) {
  switch (op.run) {
    case 1: return transpose_op<1>(op, axes, src, dst, digest);
    case 2: return transpose_op<2>(op, axes, src, dst, digest);
    case 4: return transpose_op<4>(op, axes, src, dst, digest);
    default: return transpose_op<8>(op, axes, src, dst, digest);
  }
}

}  // namespace wb::exec::cpu
