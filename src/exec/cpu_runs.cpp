// The CPU copy program's runs (cpu_copy_kernels.hpp): memcpy of each run, a fixed-size copy for 1..64-byte
// power-of-two runs, streaming stores (SSE2, or 32-byte AVX2 where the CPU has it) for runs of 1 KiB and
// more when the program is large, and source prefetch for strided runs. Contiguous runs go at memcpy
// speed, strided column boxes at ~0.8-1x of it (bench/bench_pack.cpp).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "exec/cpu_copy_kernels.hpp"

namespace wb::exec::cpu {
namespace {

using i64 = std::int64_t;
using Axis = CopyProgram::Axis;
using Op = CopyProgram::Op;

/// memcpy with streaming stores (whole 64-byte lines), ordinary stores for the unaligned head and tail.
#if WB_PACK_SSE2
void stream_copy_sse2(std::byte* dst, const std::byte* src, std::size_t n) {
  std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 64; n -= 64, dst += 64, src += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, n);
}

// 32-byte streaming stores where the CPU has AVX2 (chosen at run time; the build targets baseline x86-64).
__attribute__((target("avx2"))) void stream_copy_avx2(std::byte* dst, const std::byte* src, std::size_t n) {
  std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 128; n -= 128, dst += 128, src += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
  }
  if (n >= 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    dst += 64, src += 64, n -= 64;
  }
  std::memcpy(dst, src, n);
}

using StreamCopy = void (*)(std::byte*, const std::byte*, std::size_t);
const StreamCopy stream_copy = [] {
  __builtin_cpu_init();  // static initialization may run before libgcc's own
  return __builtin_cpu_supports("avx2") ? stream_copy_avx2 : stream_copy_sse2;
}();
#else
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); }
#endif

template <std::size_t N>
void runs_fixed(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
  for_each_point(axes, op.axis_count, src, dst, [](const std::byte* s, std::byte* d) { std::memcpy(d, s, N); });
}

}  // namespace

void execute_runs(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
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
        stream_copy(d, s, run);
      });
    else
      for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
        prefetch(s);
        std::memcpy(d, s, run);
      });
    return;
  }
  if (op.streaming)
    for_each_point(axes, op.axis_count, src, dst, [run](const std::byte* s, std::byte* d) { stream_copy(d, s, run); });
  else
    for_each_point(axes, op.axis_count, src, dst, [run](const std::byte* s, std::byte* d) { std::memcpy(d, s, run); });
}

}  // namespace wb::exec::cpu
