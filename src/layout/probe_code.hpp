// The probe's value encoding: which bit patterns carry a digit in each dtype, and the pass plan that
// spreads every checkpoint element's (tensor index, coordinates) over one or more load_weights passes.
//
// Codes of a dtype are one contiguous range of unsigned bit patterns [lo, lo + size): digit d is the
// pattern lo + d. Contiguity is what lets the second-difference codec work on raw bits: lo cancels in
// any difference, so the second difference of the bits equals that of the digits. The range is chosen
// so a code survives any bitwise copy and any same-dtype float copy: for floats only positive normal
// numbers (no NaN, infinity, denormal or zero, whose bits a copy through a float register or a
// flush-to-zero mode may change). All-zero bits are never a code: the caller zeroes parameters before a
// pass, so zero left behind means that no checkpoint element reached that parameter element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/dtype.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::layout {

/// The codes of a dtype: bit patterns [lo, lo + size), read as unsigned integers of the dtype's width.
struct CodeSpace {
  std::uint64_t lo;
  std::uint64_t size;  // D, the base of the digits
};

/// The bit pattern no code uses: what an element holds when no checkpoint element reached it.
inline constexpr std::uint64_t kSentinelBits = 0;

constexpr CodeSpace code_space(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return {0x0080, 0x7F80 - 0x0080};  // exponent 1..254, sign 0
    case DType::kF16: return {0x0400, 0x7C00 - 0x0400};   // exponent 1..30
    case DType::kF32: return {0x00800000, 0x7F800000 - 0x00800000};
    // 0x7FE0... positive normal patterns, capped at 2^62 so that D^k and digit sums stay in 64 bits.
    case DType::kF64: return {0x0010000000000000ULL, 1ULL << 62};
    case DType::kF8E4M3: return {0x08, 0x7F - 0x08};  // e4m3fn: exponent >= 1; 0x7F is NaN (no inf)
    case DType::kF8E5M2: return {0x04, 0x7C - 0x04};  // exponent 1..30; 0x7C is inf
    case DType::kI8:
    case DType::kU8: return {1, 255};
    case DType::kI32: return {1, (1ULL << 31) - 1};  // non-negative as int32 too
    case DType::kI64: return {1, 1ULL << 62};
  }
  return {0, 0};
}

/// The bits of `digit` (throws kInvalidArgument when digit >= code_space(dtype).size).
std::uint64_t encode_digit(DType dtype, std::uint64_t digit);

/// The digit that `bits` carries; nullopt for the sentinel or any bits outside the code space.
inline std::optional<std::uint64_t> decode_digit(DType dtype, std::uint64_t bits) {
  const CodeSpace cs = code_space(dtype);
  const std::uint64_t digit = bits - cs.lo;  // wraps below lo, so one compare checks both ends
  if (digit >= cs.size) return std::nullopt;
  return digit;
}

inline bool is_code(DType dtype, std::uint64_t bits) { return decode_digit(dtype, bits).has_value(); }

/// Element i of host memory holding `dtype` values, as unsigned bits (zero-extended).
inline std::uint64_t load_bits(DType dtype, const void* data, std::size_t i) {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (dtype_size(dtype)) {
    case 1: return p[i];
    case 2: { std::uint16_t v; std::memcpy(&v, p + 2 * i, 2); return v; }
    case 4: { std::uint32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    default: { std::uint64_t v; std::memcpy(&v, p + 8 * i, 8); return v; }
  }
}

/// Writes the low dtype_size(dtype) bytes of `bits` as element i.
inline void store_bits(DType dtype, void* data, std::size_t i, std::uint64_t bits) {
  auto* p = static_cast<unsigned char*>(data);
  switch (dtype_size(dtype)) {
    case 1: p[i] = static_cast<unsigned char>(bits); return;
    case 2: { const auto v = static_cast<std::uint16_t>(bits); std::memcpy(p + 2 * i, &v, 2); return; }
    case 4: { const auto v = static_cast<std::uint32_t>(bits); std::memcpy(p + 4 * i, &v, 4); return; }
    default: std::memcpy(p + 8 * i, &bits, 8); return;
  }
}

/// base^k, saturated at UINT64_MAX (any field value divided by a saturated place gives digit 0).
std::uint64_t place_value(std::uint64_t base, int k);

/// Digit k (0 = least significant) of `value` in base `base`.
inline std::uint64_t digit_of(std::uint64_t value, std::uint64_t base, int k) {
  return (value / place_value(base, k)) % base;
}

/// Number of base-`base` digits that every value in [0, max_value] needs (0 when max_value is 0).
int digits_needed(std::uint64_t max_value, std::uint64_t base);

/// Σ digits[k]·base^k, lowest digit first; UINT64_MAX when it overflows (no field value is that large).
std::uint64_t combine_digits(std::span<const std::uint64_t> digits, std::uint64_t base);

// ---------------------------------------------------------------------------------------------------
// The digit passes' codes. A digit space is `half` codes of the code space and, for the float dtypes but
// f64, the same patterns with the sign bit set after them (negative normal numbers, which a copy keeps as
// well as positive ones): bf16 and f16 carry 61,440 digits per pass, about 16 bits. Digit d is lo + d
// below `half`, lo + d + hole from there on; the patterns in between are no code. `half` is a smooth number
// (2^a 3^b 5^c) or a power of two, so that rows of any length can be laid out with their starts on the
// digit's wraps and on the jump over the hole (see ProbePlan). The verification values keep to the code space.

struct DigitSpace {
  std::uint64_t lo;
  std::uint64_t half;  // digits below it are lo + d; the rows' alignment unit
  std::uint64_t hole;  // added to the bits of digits >= half
  std::uint64_t size;  // the base of the digits

  constexpr std::uint64_t bits(std::uint64_t digit) const { return lo + digit + (digit >= half ? hole : 0); }
  /// The digit of bits - lo (as the second differences give it); nullopt for the sentinel or a non-code.
  constexpr std::optional<std::uint64_t> digit(std::uint64_t offset) const {
    if (offset < half) return offset;
    if (offset - half < hole || offset - hole >= size) return std::nullopt;
    return offset - hole;
  }
};

constexpr DigitSpace digit_space(DType dtype) {
  const CodeSpace cs = code_space(dtype);
  const auto signed_halves = [&cs](std::uint64_t half, std::uint64_t sign) {
    return DigitSpace{cs.lo, half, sign - half, 2 * half};
  };
  switch (dtype) {
    case DType::kBF16:  // 32,512 positive normals
    case DType::kF16: return signed_halves(30720, 0x8000);  // 2^11 * 15
    case DType::kF32: return signed_halves(1ULL << 30, 0x80000000);
    case DType::kF8E4M3: return signed_halves(96, 0x80);  // of 119
    case DType::kF8E5M2: return signed_halves(120, 0x80);
    case DType::kI8:
    case DType::kU8: return {cs.lo, 240, 0, 240};  // of 255
    case DType::kI32: return {cs.lo, 1ULL << 30, 0, 1ULL << 30};
    case DType::kF64:
    case DType::kI64: return {cs.lo, 1ULL << 62, 0, 1ULL << 62};
  }
  return {0, 0, 0, 0};
}

// ---------------------------------------------------------------------------------------------------
// The pass plan.
//
// Every checkpoint element has one key: key(t, i) = base(t) + Σ_a i_a·place(t, a), the tensor's own
// row-major index with a gap after every axis, and the tensors of one dtype one after another. Pass p
// writes digit p of the key in base D = digit_space(dtype).size, so a pass tells a parameter element's
// source among D^passes keys: the dtype's key range decides the passes (the most any dtype needs), not the
// count of tensors or the largest extent alone. Inside a slice copy the key is affine in the parameter's
// index; the gaps make every row end, axis wrap and tensor end a jump, so a cell of the second differences
// never spans one, and decoding a cell needs its corner's key and one step per axis.
//
// Rows are aligned to the digits: the last axis' pitch place(t, rank - 2) is the smallest divisor of
// u = digit_space.half that exceeds the row (or a multiple of u for rows as long), and every tensor starts
// at a multiple of min(pitch, u). Every wrap of a digit and every jump over the hole then falls on a row
// start (or on the same columns of every row), so the cut lines of a parameter stay a few per u keys.
// 1-byte codes (u of 96-240) instead give every axis but the outermost whole digits (so a digit wraps along
// any axis only every D steps) and start each tensor on a digit of its outermost axis.

class ProbePlan {
 public:
  ProbePlan() = default;
  /// Throws kInvalidArgument on a negative extent or a key range past 2^64.
  explicit ProbePlan(const std::vector<TensorInfo>& tensors);

  int num_passes() const { return passes_; }
  /// "key digit 1" (digit p of the key, 0 the least significant; throws kInvalidArgument when out of range).
  std::string describe_pass(int p) const;

  std::size_t num_tensors() const { return dtypes_.size(); }
  DType dtype(std::size_t tensor) const { return dtypes_[tensor]; }
  const Shape& shape(std::size_t tensor) const { return shapes_[tensor]; }
  /// Keys of `dtype`: [0, key_range(dtype)).
  std::uint64_t key_range(DType dtype) const { return ranges_[static_cast<std::size_t>(dtype)]; }
  std::uint64_t base(std::size_t tensor) const { return bases_[tensor]; }
  /// place(tensor, a) for each axis of the tensor (the last is 1).
  std::span<const std::uint64_t> places(std::size_t tensor) const;

  /// The key of element `index` (a multi-index into the tensor) of tensor `tensor`.
  std::uint64_t key(std::size_t tensor, std::span<const std::int64_t> index) const;
  /// The digit pass p writes into that element (the element-wise definition the probe checkpoint follows).
  std::uint64_t digit(int p, std::size_t tensor, std::span<const std::int64_t> index) const;
  /// The key from the digits one element received in every pass (pass_digits[p] for pass p, num_passes()
  /// entries), in the base of `dtype`. UINT64_MAX on overflow.
  std::uint64_t combine(DType dtype, std::span<const std::uint64_t> pass_digits) const;
  /// The element of a `dtype` tensor that has `key`: false when none has (past the range, or in a gap).
  /// `index` gets the tensor's rank.
  bool element(DType dtype, std::uint64_t key, std::size_t& tensor, Shape& index) const;

 private:
  std::vector<DType> dtypes_;
  std::vector<Shape> shapes_;
  std::vector<std::uint64_t> bases_;
  std::vector<std::size_t> place_start_;  // places of tensor t: places_[place_start_[t], + rank)
  std::vector<std::uint64_t> places_;
  std::vector<std::vector<std::size_t>> by_dtype_ = std::vector<std::vector<std::size_t>>(kNumDTypes);  // in key order
  std::vector<std::uint64_t> ranges_ = std::vector<std::uint64_t>(kNumDTypes, 0);
  int passes_ = 1;
};

}  // namespace wb::layout
