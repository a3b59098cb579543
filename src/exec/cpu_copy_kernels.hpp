// The CPU copy program's execution kernels (pack.hpp's ops): runs of bytes (exec/cpu_runs.cpp) and the
// blocked transpose (exec/cpu_transpose.cpp). Private to exec/pack.cpp and the two kernel files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exec/copy_compiler.hpp"
#include "exec/pack.hpp"

#if defined(__SSE2__) && defined(__GNUC__)
#include <immintrin.h>
#define WB_PACK_SSE2 1
#endif

namespace wb::exec::cpu {

/// Copies a kRuns op from `src` to `dst` (its parameter or buffer side already added).
void execute_runs(const CopyProgram::Op& op, const CopyProgram::Axis* axes, const std::byte* src, std::byte* dst);
/// Copies a kTranspose op likewise.
void execute_transpose(const CopyProgram::Op& op, const CopyProgram::Axis* axes, const std::byte* src, std::byte* dst);

/// Orders the streaming stores of the ops before what follows (a post of the buffer, a peer's read).
inline void fence_streaming_stores() {
#if WB_PACK_SSE2
  _mm_sfence();
#endif
}

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
