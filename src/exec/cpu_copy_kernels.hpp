// The CPU copy program's execution kernels (pack.hpp's ops): runs of bytes (exec/cpu_runs.cpp) and the
// blocked transpose (exec/cpu_transpose.cpp), each also digesting what it copies when verifying. Private to
// exec/pack.cpp and the two kernel files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "exec/copy_compiler.hpp"
#include "exec/digest.hpp"
#include "core/stream_copy.hpp"
#include "exec/pack.hpp"

#if defined(__SSE2__) && defined(__GNUC__)
#include <immintrin.h>
#define WB_PACK_SSE2 1
#endif

namespace wb::exec::cpu {

/// Digesting while copying (CopyProgram's digest spans): where the bytes of one op go.
struct DigestTarget {
  const std::byte* buffer = nullptr;                // the buffer's base: the bytes' places are offsets from it
  const CopyProgram::DigestSpan* spans = nullptr;   // the op's, covering its buffer range in order
  std::uint32_t count = 0;
  DigestSums* sums = nullptr;                       // per segment
  bool pack = false;                                // the buffer is the destination (else the source)
  mutable std::uint32_t hint = 0;                   // the span found last: runs walk them in order

  /// The span holding buffer offset `at` (inside the op's range).
  const CopyProgram::DigestSpan& span_at(std::int64_t at) const {
    if (at >= spans[hint].begin && at < spans[hint].end) return spans[hint];
    if (hint + 1 < count && at >= spans[hint + 1].begin && at < spans[hint + 1].end) return spans[++hint];
    const auto* it = std::upper_bound(spans, spans + count, at, [](std::int64_t x, const CopyProgram::DigestSpan& s) {
      return x < s.end;
    });
    hint = static_cast<std::uint32_t>(it - spans);
    return *it;
  }
  /// Adds the buffer's bytes [at, at + bytes), held at `data`, to their segments' digests.
  void add(std::int64_t at, const std::byte* data, std::int64_t bytes) const {
    while (bytes > 0) {
      const CopyProgram::DigestSpan& span = span_at(at);
      const std::int64_t part = std::min(bytes, span.end - at);
      if (span.segment >= 0) sums[span.segment].add(at - span.segment_offset, data, static_cast<std::size_t>(part));
      at += part, data += part, bytes -= part;
    }
  }
};

/// Copies a kRuns op from `src` to `dst` (its parameter or buffer side already added); with `digest`, digests
/// what it copies in the same pass.
void execute_runs(const CopyProgram::Op& op, const CopyProgram::Axis* axes, const std::byte* src, std::byte* dst,
                  const DigestTarget* digest = nullptr);
/// Copies a kTranspose op likewise.
void execute_transpose(const CopyProgram::Op& op, const CopyProgram::Axis* axes, const std::byte* src, std::byte* dst,
                       const DigestTarget* digest = nullptr);

// Streaming copies (copy_streaming, fence_streaming_stores) are core's: the probe saves parameters with them.
using wb::copy_streaming;
using wb::fence_streaming_stores;

/// Calls inner(src, dst) at every point of the axes (outermost first).
template <class Inner>
inline void for_each_point(const CopyProgram::Axis* axes, std::size_t count, const std::byte* src, std::byte* dst,
                           Inner&& inner) {
  if (count == 0) {
    inner(src, dst);
    return;
  }
  const CopyProgram::Axis last = axes[count - 1];
  if (count == 1) {
    for (std::int64_t i = 0; i < last.extent; ++i, src += last.src_stride, dst += last.dst_stride) inner(src, dst);
    return;
  }
  std::int64_t index[kMaxCompiledAxes] = {};
  for (;;) {
    const std::byte* s = src;
    std::byte* d = dst;
    for (std::int64_t i = 0; i < last.extent; ++i, s += last.src_stride, d += last.dst_stride) inner(s, d);
    std::size_t a = count - 1;
    while (a-- > 0) {
      src += axes[a].src_stride;
      dst += axes[a].dst_stride;
      if (++index[a] < axes[a].extent) break;
      src -= axes[a].extent * axes[a].src_stride;
      dst -= axes[a].extent * axes[a].dst_stride;
      index[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) return;
  }
}

}  // namespace wb::exec::cpu
