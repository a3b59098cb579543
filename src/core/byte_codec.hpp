// Private: the byte writer and reader behind WeightBridge's compact binary forms (source maps, round
// schedules). Unsigned integers are LEB128 varints (7 bits a byte, low group first, high bit = more);
// signed integers are zig-zag mapped first (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...), so small magnitudes
// of either sign take one byte. Every read is bounds-checked: a truncated or malformed buffer throws
// wb::Error(kCorruptData, "<what>: <why> at byte <n>"), never reads past the end and never allocates
// from an unchecked count.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::codec {

inline std::uint64_t zigzag_encode(std::int64_t v) {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
inline std::int64_t zigzag_decode(std::uint64_t v) {
  return static_cast<std::int64_t>((v >> 1) ^ (~(v & 1) + 1));
}

/// a + b modulo 2^64: decoding adds untrusted deltas, which must not overflow (undefined behaviour).
inline std::int64_t wrapping_add(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
inline std::int64_t wrapping_sub(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
}
inline std::int64_t wrapping_mul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}

class ByteWriter {
 public:
  void varint(std::uint64_t v) {
    std::byte* at = room(10);  // 64 bits in 7-bit groups
    while (v >= 0x80) {
      *at++ = static_cast<std::byte>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    *at++ = static_cast<std::byte>(v);
    used_ = static_cast<std::size_t>(at - bytes_.data());
  }
  void signed_varint(std::int64_t v) { varint(zigzag_encode(v)); }
  void byte(std::uint8_t b) {
    *room(1) = static_cast<std::byte>(b);
    ++used_;
  }
  /// A double's bit pattern, 8 bytes, low byte first.
  void float64(double v) {
    const auto bits = std::bit_cast<std::uint64_t>(v);
    for (int shift = 0; shift < 64; shift += 8) byte(static_cast<std::uint8_t>(bits >> shift));
  }
  void bytes(std::span<const std::byte> data) {
    if (data.empty()) return;
    std::memcpy(room(data.size()), data.data(), data.size());
    used_ += data.size();
  }
  /// Length (varint), then the characters.
  void text(const std::string& s) {
    varint(s.size());
    bytes(std::as_bytes(std::span(s.data(), s.size())));
  }
  std::size_t size() const { return used_; }
  std::vector<std::byte> take() {
    bytes_.resize(used_);
    used_ = 0;
    return std::move(bytes_);
  }

 private:
  // At least `n` writable bytes at the end of what is written (the buffer grows by doubling, so that a
  // varint is a few stores, not a push_back per byte: serializing every rank's round schedule spent a
  // third of its time in push_back).
  std::byte* room(std::size_t n) {
    if (bytes_.size() - used_ < n) bytes_.resize(std::max<std::size_t>({2 * bytes_.size(), used_ + n, 64}));
    return bytes_.data() + used_;
  }

  std::vector<std::byte> bytes_;  // written: the first used_ bytes
  std::size_t used_ = 0;
};

class ByteReader {
 public:
  /// `what` names the form in error messages ("source map", "round schedule").
  ByteReader(std::span<const std::byte> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= bytes_.size()) fail("truncated");
      const auto b = static_cast<std::uint8_t>(bytes_[at_++]);
      // The tenth byte holds bit 63 only.
      if (shift == 63 && (b & 0x7e) != 0) fail("integer longer than 64 bits");
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("integer longer than 64 bits");
  }
  std::int64_t signed_varint() { return zigzag_decode(varint()); }

  /// An unsigned varint no larger than `limit`; `what` names it in the error.
  std::uint64_t bounded(std::uint64_t limit, const char* what) {
    const std::uint64_t v = varint();
    if (v > limit) fail(std::string(what) + " " + std::to_string(v) + " out of range (at most " + std::to_string(limit) + ")");
    return v;
  }
  /// A signed varint in [low, high].
  std::int64_t bounded_signed(std::int64_t low, std::int64_t high, const char* what) {
    const std::int64_t v = signed_varint();
    if (v < low || v > high)
      fail(std::string(what) + " " + std::to_string(v) + " out of range [" + std::to_string(low) + ", " +
           std::to_string(high) + "]");
    return v;
  }
  /// A count of entries that take at least `min_entry_bytes` each: larger counts than the bytes left
  /// could hold are corrupt, so a vector sized from the result is bounded by the input's size.
  std::size_t count(std::size_t min_entry_bytes, const char* what) {
    const std::uint64_t v = varint();
    const std::uint64_t limit = remaining() / (min_entry_bytes == 0 ? 1 : min_entry_bytes);
    if (v > limit)
      fail(std::string(what) + " " + std::to_string(v) + " out of range (" + std::to_string(remaining()) +
           " bytes left hold at most " + std::to_string(limit) + ")");
    return static_cast<std::size_t>(v);
  }

  std::uint8_t byte() {
    if (at_ >= bytes_.size()) fail("truncated");
    return static_cast<std::uint8_t>(bytes_[at_++]);
  }
  double float64() {
    std::uint64_t bits = 0;
    for (int shift = 0; shift < 64; shift += 8) bits |= static_cast<std::uint64_t>(byte()) << shift;
    return std::bit_cast<double>(bits);
  }
  /// The next `n` bytes (a view into the input).
  std::span<const std::byte> bytes(std::size_t n) {
    if (n > remaining()) fail("truncated: " + std::to_string(n) + " bytes expected, " + std::to_string(remaining()) + " left");
    const auto out = bytes_.subspan(at_, n);
    at_ += n;
    return out;
  }
  std::string text() {
    const std::uint64_t n = bounded(remaining(), "string length");
    const auto data = bytes(static_cast<std::size_t>(n));
    return {reinterpret_cast<const char*>(data.data()), data.size()};
  }

  std::size_t position() const { return at_; }
  std::size_t remaining() const { return bytes_.size() - at_; }
  bool done() const { return at_ == bytes_.size(); }
  void expect_done() const {
    if (!done()) fail(std::to_string(remaining()) + " trailing bytes");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::kCorruptData, what_ + ": " + why + " at byte " + std::to_string(at_));
  }

 private:
  std::span<const std::byte> bytes_;
  std::string what_;
  std::size_t at_ = 0;
};

}  // namespace wb::codec
