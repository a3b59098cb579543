// The keyed pass's 2-byte codes (KeyedDigit, probe_checkpoint.hpp) in vector lanes: the probe writes them
// into every 2-byte parameter element once in load_weights and generates them once more to verify, so on a
// bf16 worker they are most of the probe's arithmetic. One code per 16-bit lane: eight per SSE2 vector, 16
// per AVX2 and 32 per AVX-512BW one, the widest the CPU has chosen at run time (the build targets baseline
// x86-64).
#pragma once

#include <cstdint>
#include <string_view>

namespace wb::layout {

/// A bijection of 16-bit words (xorshift-multiply rounds), in scalars or GCC vectors of 16-bit lanes: the
/// hash of the keyed pass and of the 1- and 2-byte verification values.
/// (Unsigned products: a 16-bit scalar is promoted to int, where 0xffff * 0x88b5 would overflow.)
template <typename V>
inline V hash16(V x) {
  x = static_cast<V>(x ^ (x >> 8));
  x = static_cast<V>(x * 0x88b5u);
  x = static_cast<V>(x ^ (x >> 7));
  x = static_cast<V>(x * 0xdb2du);
  return static_cast<V>(x ^ (x >> 9));
}

/// What the codes of one run of lows depend on besides the lows: the top digit of the key, the base D of
/// the digits and the digit space's bits (DigitSpace, all < 2^16).
struct KeyedRun16 {
  std::uint16_t top, base, lo, half, hole;
};

/// The widths there are code for; kBest is the widest this CPU runs.
enum class KeyedLanes { kScalar, kSse2, kAvx2, kAvx512, kBest };

/// out[k] = bits of digit (top + offset) mod D for the low first + k (k < n, first + n <= 2^16: one block of
/// the lower digits), offset = hash16((first + k) xor block_key), less D where it is D or more; the values
/// KeyedDigit::value defines. `lanes` other than kBest is for the tests (kScalar is the definition); a width
/// the CPU lacks runs as kBest.
void keyed_codes16(std::uint16_t* out, std::int64_t n, std::uint16_t first, std::uint16_t block_key,
                   const KeyedRun16& run, KeyedLanes lanes = KeyedLanes::kBest);

/// Whether have[k] equals the code keyed_codes16 writes at k, for every k < n: the verification of a keyed
/// pass compares without writing the codes anywhere.
bool keyed_codes16_equal(const std::uint16_t* have, std::int64_t n, std::uint16_t first, std::uint16_t block_key,
                         const KeyedRun16& run, KeyedLanes lanes = KeyedLanes::kBest);

/// Keys in arithmetic progression K + k s, k < n (a line of a copy that a transpose lays along another axis of
/// the tensor), for plans whose lower digits fit one block (place = D^(P-1) < 2^16, so every low has block 0):
/// low_k = (K + k s) mod place and top_k = (K + k s) / place mod D, advanced by low_step = s mod place and
/// top_step = s / place mod D with the carry.
struct KeyedProgression16 {
  std::uint16_t low, top, low_step, top_step, place;
};

/// Whether have[k] equals the keyed pass's code of key k of `keys` for every k < n (`run`'s top unused:
/// each key has its own). AVX-512BW in 32 lanes; kScalar (the definition) otherwise, where a caller does
/// better with a buffer (keyed_progression16_in_lanes).
bool keyed_progression16_equal(const std::uint16_t* have, std::int64_t n, std::uint16_t block_key,
                               const KeyedProgression16& keys, const KeyedRun16& run,
                               KeyedLanes lanes = KeyedLanes::kBest);

/// Whether kBest compares progressions in vector lanes on this CPU.
bool keyed_progression16_in_lanes();

/// Whether this CPU runs `lanes` (kScalar, kSse2 and kBest always), and its name for messages.
bool keyed_lanes_supported(KeyedLanes lanes);
std::string_view keyed_lanes_name(KeyedLanes lanes);

}  // namespace wb::layout
