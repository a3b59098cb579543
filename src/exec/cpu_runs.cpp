// The CPU copy program's runs (cpu_copy_kernels.hpp): memcpy of each run, a fixed-size copy for 1..64-byte
// power-of-two runs, streaming stores (SSE2, or 32-byte AVX2 where the CPU has it) for runs of 1 KiB and
// more when the program is large, and source prefetch for strided runs. Contiguous runs go at memcpy
// speed, strided column boxes at ~0.8-1x of it (bench/bench_pack.cpp). Verifying, the same with the digest
// of what they copy (copy_digest).
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

// Verifying: runs copied and digested in one pass over memory. A separate digest pass before or after the
// copy would read every byte twice from memory (the copy's streaming stores bypass the caches), and even a
// digest of a chunk still in cache costs the copy its overlap of loads with stores: ~1.3-1.6x the copy
// alone, against ~1.0x for the loops here (bench_pack's *Digesting).
//
// The whole blocks of a segment are summed as an open stream (OpenBlocks: DigestSums::add_blocks's `a`
// and `b`) that runs one after the other continue, so a strided op's many short runs pay one fold, not
// one each; the unaligned ends of a run go to DigestSums::add, which takes bytes in any order.
struct OpenBlocks {
  std::int32_t segment = -1;
  std::uint64_t first = 0, blocks = 0;  // the blocks summed so far: [first, first + blocks) of the segment
  std::uint64_t a[4] = {}, b[4] = {};

  // Makes the stream the one whose next block is `block` of `segment` (folding the one open before).
  void continue_at(DigestSums* sums, std::int32_t s, std::uint64_t block) {
    if (segment == s && first + blocks == block) return;
    close(sums);
    segment = s, first = block, blocks = 0;
    std::fill(a, a + 4, 0), std::fill(b, b + 4, 0);
  }
  void close(DigestSums* sums) {
    if (segment >= 0 && blocks > 0) sums[segment].add_blocks(first, blocks, a, b);
    segment = -1;
  }
};

#if WB_PACK_SSE2
// The copy goes in steps from where the destination is 64-byte aligned (streaming stores need it), the
// digest in 32-byte blocks from where the run's place in its segment is a multiple of 32: when the two
// starts differ, the digest loads the same lines a few bytes off the copy's, from L1. `a`, `b` continue.
template <bool kStream, bool kShared>
void copy_digest_loop_sse2(std::byte* d, const std::byte* s, const std::byte* q, std::size_t steps, std::uint64_t a[4],
                           std::uint64_t b[4]) {
  __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)), a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2));
  __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
  for (std::size_t i = 0; i < steps; ++i, d += 64, s += 64, q += 64) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), x0);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), x1);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), x2);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), x3);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d), x0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16), x1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 32), x2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 48), x3);
    }
    // Two blocks: lanes 0-1 and 2-3 of each.
    const __m128i y0 = kShared ? x0 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i y1 = kShared ? x1 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
    const __m128i y2 = kShared ? x2 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32));
    const __m128i y3 = kShared ? x3 : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 48));
    a0 = _mm_add_epi64(a0, y0), a1 = _mm_add_epi64(a1, y1);
    b0 = _mm_add_epi64(b0, a0), b1 = _mm_add_epi64(b1, a1);
    a0 = _mm_add_epi64(a0, y2), a1 = _mm_add_epi64(a1, y3);
    b0 = _mm_add_epi64(b0, a0), b1 = _mm_add_epi64(b1, a1);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(a), a0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 2), a1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b), b0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b + 2), b1);
}

// 32-byte loads and stores where the CPU has AVX2: one register is one block, four per step. (Spelled out:
// written as loops over arrays of registers, GCC spills them to the stack.)
template <bool kStream>
__attribute__((target("avx2"))) inline void store4_avx2(std::byte* d, __m256i x0, __m256i x1, __m256i x2, __m256i x3) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), x0);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), x1);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), x2);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), x3);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), x0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 32), x1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 64), x2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 96), x3);
  }
}

template <bool kStream, bool kShared>
__attribute__((target("avx2"))) void copy_digest_loop_avx2(std::byte* d, const std::byte* s, const std::byte* q,
                                                           std::size_t steps, std::uint64_t a[4], std::uint64_t b[4]) {
  __m256i sum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  for (std::size_t i = 0; i < steps; ++i, d += 128, s += 128, q += 128) {
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i x3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    store4_avx2<kStream>(d, x0, x1, x2, x3);
    const __m256i y0 = kShared ? x0 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m256i y1 = kShared ? x1 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
    const __m256i y2 = kShared ? x2 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64));
    const __m256i y3 = kShared ? x3 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 96));
    sum = _mm256_add_epi64(sum, y0), sums = _mm256_add_epi64(sums, sum);
    sum = _mm256_add_epi64(sum, y1), sums = _mm256_add_epi64(sums, sum);
    sum = _mm256_add_epi64(sum, y2), sums = _mm256_add_epi64(sums, sum);
    sum = _mm256_add_epi64(sum, y3), sums = _mm256_add_epi64(sums, sum);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a), sum);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b), sums);
}

using CopyDigestLoop = void (*)(std::byte*, const std::byte*, const std::byte*, std::size_t, std::uint64_t*, std::uint64_t*);
struct CopyDigestLoops {
  CopyDigestLoop loop[2][2];  // [stream][shared]
  std::size_t step;
};
const CopyDigestLoops copy_digest_loops = [] {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    return CopyDigestLoops{{{copy_digest_loop_avx2<false, false>, copy_digest_loop_avx2<false, true>},
                            {copy_digest_loop_avx2<true, false>, copy_digest_loop_avx2<true, true>}},
                           128};
  return CopyDigestLoops{{{copy_digest_loop_sse2<false, false>, copy_digest_loop_sse2<false, true>},
                          {copy_digest_loop_sse2<true, false>, copy_digest_loop_sse2<true, true>}},
                         64};
}();
#endif

/// Copies `n` bytes (streaming stores when `stream`) that sit at `place` of `segment`, digesting them.
void copy_digest(std::byte* dst, const std::byte* src, std::size_t n, bool stream, DigestSums* sums, std::int32_t segment,
                 i64 place, OpenBlocks& open) {
  const auto at = static_cast<std::uint64_t>(place);
  const std::size_t digest_head = std::min<std::size_t>(n, (32 - (at & 31)) & 31);
  const std::size_t blocks = (n - digest_head) / 32;
  std::size_t body = 0;  // bytes of whole blocks the copy loop digests
#if WB_PACK_SSE2
  const std::size_t step = copy_digest_loops.step;
  const std::size_t copy_head = stream ? (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63 : 0;
  const std::size_t head = std::max(copy_head, digest_head);
  if (blocks > 0) open.continue_at(sums, segment, (at + digest_head) / 32);
  if (n >= head + 2 * step) {
    const std::size_t steps = (n - head) / step;
    body = steps * step;
    if (copy_head > 0) std::memcpy(dst, src, copy_head);
    copy_digest_loops.loop[stream][copy_head == digest_head](dst + copy_head, src + copy_head, src + digest_head, steps,
                                                             open.a, open.b);
    if (n > copy_head + body) std::memcpy(dst + copy_head + body, src + copy_head + body, n - copy_head - body);
  } else if (stream) {
    copy_streaming(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
#else
  if (blocks > 0) open.continue_at(sums, segment, (at + digest_head) / 32);
  (void)stream;
  std::memcpy(dst, src, n);
#endif
  // The blocks the loop did not take, then the ends (from the source: the same bytes, still in L1).
  if (blocks * 32 > body) digest_blocks(src + digest_head + body, blocks - body / 32, open.a, open.b);
  open.blocks += blocks;
  if (digest_head > 0) sums[segment].add(place, src, digest_head);
  const std::size_t tail = digest_head + blocks * 32;
  if (n > tail) sums[segment].add(place + static_cast<i64>(tail), src + tail, n - tail);
}

// Runs shorter than this whose buffer side is cached (an assemble's source, a pack's destination without
// streaming stores) are copied as without digests and digested every kTrailBytes of the buffer, from L1:
// fewer, longer digest calls than one per run. Longer runs, and packs with streaming stores, go through
// copy_digest.
constexpr i64 kTrailRunBytes = 256;
constexpr i64 kTrailBytes = 4096;

void runs_digest_fused(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst, const DigestTarget& t) {
  const i64 run = op.run;
  const i64 ahead = op.prefetch_runs * (op.axis_count > 0 ? axes[op.axis_count - 1].src_stride : 0);
  const i64 lines = (run + 63) / 64 + 1;
  OpenBlocks open;
  for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
    if (op.prefetch_runs > 0)
      for (i64 i = 0; i < lines; ++i) __builtin_prefetch(s + ahead + i * 64, 0, 3);
    const i64 at = (t.pack ? d : s) - t.buffer;
    for (i64 done = 0; done < run;) {  // a run may cross from one segment into the next
      const CopyProgram::DigestSpan& span = t.span_at(at + done);
      const i64 part = std::min(run - done, span.end - (at + done));
      const auto bytes = static_cast<std::size_t>(part);
      if (span.segment >= 0)
        copy_digest(d + done, s + done, bytes, op.streaming, t.sums, span.segment, at + done - span.segment_offset, open);
      else if (op.streaming)
        copy_streaming(d + done, s + done, bytes);
      else
        std::memcpy(d + done, s + done, bytes);
      done += part;
    }
  });
  open.close(t.sums);
}

// N: the run's bytes when fixed (0: op.run).
template <std::size_t N, bool kStream>
void runs_digest_trailing(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst, const DigestTarget& t) {
  const auto run = N > 0 ? N : static_cast<std::size_t>(op.run);
  const i64 ahead = op.prefetch_runs * (op.axis_count > 0 ? axes[op.axis_count - 1].src_stride : 0);
  const i64 lines = (op.run + 63) / 64 + 1;
  i64 begin = 0, end = 0;  // buffer bytes copied, not yet digested
  for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
    if (op.prefetch_runs > 0)
      for (i64 i = 0; i < lines; ++i) __builtin_prefetch(s + ahead + i * 64, 0, 3);
    if constexpr (kStream)
      copy_streaming(d, s, run);
    else
      std::memcpy(d, s, run);
    const i64 at = (t.pack ? d : s) - t.buffer;
    if (at != end || end - begin >= kTrailBytes) {
      t.add(begin, t.buffer + begin, end - begin);
      begin = at;
    }
    end = at + static_cast<i64>(run);
  });
  t.add(begin, t.buffer + begin, end - begin);
}

void execute_runs_digest(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst, const DigestTarget& t) {
  // A pack's streaming stores send its buffer side to memory: those must digest as they copy.
  if (op.run >= kTrailRunBytes || (t.pack && op.streaming)) return runs_digest_fused(op, axes, src, dst, t);
  if (op.streaming) return runs_digest_trailing<0, true>(op, axes, src, dst, t);  // an assemble's
  switch (op.run) {
    case 1: return runs_digest_trailing<1, false>(op, axes, src, dst, t);
    case 2: return runs_digest_trailing<2, false>(op, axes, src, dst, t);
    case 4: return runs_digest_trailing<4, false>(op, axes, src, dst, t);
    case 8: return runs_digest_trailing<8, false>(op, axes, src, dst, t);
    case 16: return runs_digest_trailing<16, false>(op, axes, src, dst, t);
    case 32: return runs_digest_trailing<32, false>(op, axes, src, dst, t);
    case 64: return runs_digest_trailing<64, false>(op, axes, src, dst, t);
    default: return runs_digest_trailing<0, false>(op, axes, src, dst, t);
  }
}

template <std::size_t N>
void runs_fixed(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
  for_each_point(axes, op.axis_count, src, dst, [](const std::byte* s, std::byte* d) { std::memcpy(d, s, N); });
}

}  // namespace

void execute_runs(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst, const DigestTarget* digest) {
  if (digest != nullptr) return execute_runs_digest(op, axes, src, dst, *digest);
  switch (op.run) {
    case 1: return runs_fixed<1>(op, axes, src, dst);
    case 2: return runs_fixed<2>(op, axes, src, dst);
    case 4: return runs_fixed<4>(op, axes, src, dst);
    case 8: return runs_fixed<8>(op, axes, src, dst);
    case 16: return runs_fixed<16>(op, axes, src, dst);
    case 32: return runs_fixed<32>(op, axes, src, dst);
    case 64: return runs_fixed<64>(op, axes, src, dst);
    default: break;
  }
  const auto run = static_cast<std::size_t>(op.run);
  // Runs that start a new source page or row each time (a column box): the hardware prefetchers ramp up
  // too late for a run of a few hundred bytes, so prefetch the source `op.prefetch_runs` runs ahead.
  if (op.prefetch_runs > 0) {
    const i64 ahead = op.prefetch_runs * axes[op.axis_count - 1].src_stride;
    const i64 lines = (op.run + 63) / 64 + 1;
    auto prefetch = [ahead, lines](const std::byte* s) {
      for (i64 i = 0; i < lines; ++i) __builtin_prefetch(s + ahead + i * 64, 0, 3);
    };
    if (op.streaming)
      for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
        prefetch(s);
        copy_streaming(d, s, run);
      });
    else
      for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
        prefetch(s);
        std::memcpy(d, s, run);
      });
    return;
  }
  if (op.streaming)
    for_each_point(axes, op.axis_count, src, dst, [run](const std::byte* s, std::byte* d) { copy_streaming(d, s, run); });
  else
    for_each_point(axes, op.axis_count, src, dst, [run](const std::byte* s, std::byte* d) { std::memcpy(d, s, run); });
}


}  // namespace wb::exec::cpu
