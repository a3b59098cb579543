// The digest of a verified update (exec/verify.hpp), in two forms that give the same value for the same
// bytes: Digest takes a stream in order; DigestSums takes pieces in any order, each at its place in the
// stream. The second is what a copy program adds to while it copies (pack.hpp), in whatever order its ops
// run: a segment is then digested in the same pass over memory that packs or assembles it.
//
// The definition: the stream is cut into 32-byte blocks of four 8-byte words (little-endian on x86; the
// last block zero-padded); per lane k, S_k = Σ_i w_ik and F_k = Σ_i (n - i) w_ik over blocks i = 0..n-1
// (Fletcher's sum of running sums: a word's place counts), all modulo 2^64; then S, F and the length are
// mixed into 64 bits. Not cryptographic: it catches corruption (a lost, stale, shifted or flipped range),
// not an attacker.
#pragma once

#include <cstddef>
#include <cstdint>

namespace wb::exec {

/// The digest of a byte stream, given in order, in pieces of any size.
class Digest {
 public:
  void update(const std::byte* data, std::size_t bytes);
  std::uint64_t finish() const;

 private:
  std::uint64_t sum_[4] = {}, sums_[4] = {};
  std::byte tail_[32] = {};
  std::size_t tail_bytes_ = 0;
  std::uint64_t length_ = 0;
};
std::uint64_t digest_bytes(const std::byte* data, std::size_t bytes);

/// Continues the lane sums `sum` and their running sums `sums` over `blocks` whole blocks at `data` (the
/// loop both forms share).
void digest_blocks(const std::byte* data, std::size_t blocks, std::uint64_t sum[4], std::uint64_t sums[4]);

/// The same digest, summed from pieces in any order. Per lane it keeps S_k and W_k = Σ_i i·w_ik: both are
/// linear in the bytes (a byte at place p adds byte << 8·(p mod 8) to lane (p / 8) mod 4 of block p / 32),
/// so every piece adds its share wherever it lies, and F_k = n·S_k - W_k once all n blocks are in.
struct DigestSums {
  std::uint64_t sum[4] = {}, weighted[4] = {};

  /// Adds `bytes` bytes at `data`, which are the stream's bytes from `position` on.
  void add(std::int64_t position, const std::byte* data, std::size_t bytes);
  /// Adds `blocks` whole blocks from block `first` on, given as a loop over them keeps them (the kernels
  /// that copy and digest at once): per lane `a` = Σ_t w_t and `b` = Σ_t (blocks - t)·w_t, t from 0.
  void add_blocks(std::uint64_t first, std::uint64_t blocks, const std::uint64_t a[4], const std::uint64_t b[4]);
  /// The digest of the stream of `length` bytes, once each of its bytes was added exactly once.
  std::uint64_t finish(std::int64_t length) const;
};

}  // namespace wb::exec
