// The digest of a verified update (exec/digest.hpp): the block loop both forms share, the mixing.
#include "exec/digest.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>

namespace wb::exec {
namespace {

constexpr std::uint64_t kPrime1 = 0x9E3779B97F4A7C15ULL, kPrime2 = 0xC2B2AE3D27D4EB4FULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) { return rotl((h ^ v) * kPrime1, 29) * kPrime2; }

std::uint64_t mix_all(std::uint64_t length, const std::uint64_t sum[4], const std::uint64_t sums[4]) {
  std::uint64_t h = mix(kPrime2, length);
  for (int k = 0; k < 4; ++k) h = mix(mix(h, sum[k]), sums[k]);
  return h ^ (h >> 31);
}

}  // namespace

// The hot loop: two adds per 16 bytes on 64-bit lanes of SSE2 registers (every x86-64 has them), four
// chains.
void digest_blocks(const std::byte* data, std::size_t blocks, std::uint64_t sum[4], std::uint64_t sums[4]) {
#if defined(__SSE2__)
  __m128i sum0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sum));
  __m128i sum1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sum + 2));
  __m128i sums0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums));
  __m128i sums1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums + 2));
  for (std::size_t i = 0; i < blocks; ++i, data += 32) {
    sum0 = _mm_add_epi64(sum0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(data)));
    sum1 = _mm_add_epi64(sum1, _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16)));
    sums0 = _mm_add_epi64(sums0, sum0);
    sums1 = _mm_add_epi64(sums1, sum1);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sum), sum0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sum + 2), sum1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sums), sums0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sums + 2), sums1);
#else
  for (std::size_t i = 0; i < blocks; ++i, data += 32) {
    std::uint64_t w[4];
    std::memcpy(w, data, sizeof w);
    for (int k = 0; k < 4; ++k) {
      sum[k] += w[k];
      sums[k] += sum[k];
    }
  }
#endif
}

void Digest::update(const std::byte* data, std::size_t bytes) {
  if (bytes == 0) return;  // data may be null then, which memcpy may not take even for no bytes
  length_ += bytes;
  if (tail_bytes_ > 0) {
    const std::size_t take = std::min(bytes, sizeof tail_ - tail_bytes_);
    std::memcpy(tail_ + tail_bytes_, data, take);
    tail_bytes_ += take;
    data += take;
    bytes -= take;
    if (tail_bytes_ < sizeof tail_) return;
    digest_blocks(tail_, 1, sum_, sums_);
    tail_bytes_ = 0;
  }
  const std::size_t blocks = bytes / 32;
  digest_blocks(data, blocks, sum_, sums_);
  tail_bytes_ = bytes - blocks * 32;
  std::memcpy(tail_, data + blocks * 32, tail_bytes_);
}

std::uint64_t Digest::finish() const {
  Digest last = *this;
  if (last.tail_bytes_ > 0) {
    std::memset(last.tail_ + last.tail_bytes_, 0, sizeof tail_ - last.tail_bytes_);
    digest_blocks(last.tail_, 1, last.sum_, last.sums_);
  }
  return mix_all(length_, last.sum_, last.sums_);
}

std::uint64_t digest_bytes(const std::byte* data, std::size_t bytes) {
  Digest digest;
  digest.update(data, bytes);
  return digest.finish();
}

void DigestSums::add(std::int64_t position, const std::byte* data, std::size_t bytes) {
  auto p = static_cast<std::uint64_t>(position);
  while (bytes > 0) {
    if (p % 32 == 0 && bytes >= 32) {  // whole blocks: the loop, then their place
      const std::size_t blocks = bytes / 32;
      std::uint64_t a[4] = {}, b[4] = {};
      digest_blocks(data, blocks, a, b);
      add_blocks(p / 32, blocks, a, b);
      p += blocks * 32, data += blocks * 32, bytes -= blocks * 32;
      continue;
    }
    // One word, or the part of one that is here (its other bytes count as zero: they are added apart).
    const std::size_t at = p % 8, take = std::min<std::size_t>(8 - at, bytes);
    std::byte word[8] = {};
    std::memcpy(word + at, data, take);
    std::uint64_t w;
    std::memcpy(&w, word, sizeof w);
    sum[(p / 8) % 4] += w;
    weighted[(p / 8) % 4] += (p / 32) * w;
    p += take, data += take, bytes -= take;
  }
}

void DigestSums::add_blocks(std::uint64_t first, std::uint64_t blocks, const std::uint64_t a[4], const std::uint64_t b[4]) {
  // Σ_t (first + t)·w_t = first·a + Σ_t t·w_t, and Σ_t t·w_t = blocks·a - b.
  for (int k = 0; k < 4; ++k) {
    sum[k] += a[k];
    weighted[k] += (first + blocks) * a[k] - b[k];
  }
}

std::uint64_t DigestSums::finish(std::int64_t length) const {
  const std::uint64_t blocks = (static_cast<std::uint64_t>(length) + 31) / 32;
  std::uint64_t sums[4];
  for (int k = 0; k < 4; ++k) sums[k] = blocks * sum[k] - weighted[k];
  return mix_all(static_cast<std::uint64_t>(length), sum, sums);
}

}  // namespace wb::exec
