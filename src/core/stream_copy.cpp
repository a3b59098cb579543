#include "core/stream_copy.hpp"

#include <cstdint>
#include <cstring>

namespace wb {
namespace {

/// memcpy with streaming stores (whole 64-byte lines), ordinary stores for the unaligned head and tail.
#if WB_STREAM_SSE2
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

// 32-byte streaming stores of one byte value; the ends with memset.
__attribute__((target("avx2"))) void stream_set_avx2(std::byte* dst, unsigned char value, std::size_t n) {
  std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
  if (head > n) head = n;
  std::memset(dst, value, head);
  dst += head, n -= head;
  const __m256i v = _mm256_set1_epi8(static_cast<char>(value));
  for (; n >= 64; n -= 64, dst += 64) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), v);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), v);
  }
  std::memset(dst, value, n);
}

void stream_set_plain(std::byte* dst, unsigned char value, std::size_t n) { std::memset(dst, value, n); }

using StreamSet = void (*)(std::byte*, unsigned char, std::size_t);
const StreamSet stream_set = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? stream_set_avx2 : stream_set_plain;
}();

using StreamCopy = void (*)(std::byte*, const std::byte*, std::size_t);
const StreamCopy stream_copy = [] {
  __builtin_cpu_init();  // static initialization may run before libgcc's own
  return __builtin_cpu_supports("avx2") ? stream_copy_avx2 : stream_copy_sse2;
}();
#else
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); }
void stream_set(std::byte* dst, unsigned char value, std::size_t n) { std::memset(dst, value, n); }
#endif

}  // namespace

void copy_streaming(std::byte* dst, const std::byte* src, std::size_t n) { stream_copy(dst, src, n); }

void set_streaming(std::byte* dst, unsigned char value, std::size_t n) { stream_set(dst, value, n); }

}  // namespace wb
