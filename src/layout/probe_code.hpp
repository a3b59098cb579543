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
// The pass plan.
//
// Every checkpoint element has fields: field 0 is its tensor's index in the checkpoint's tensor list,
// field 1 + a its coordinate along axis a (0 for axes the tensor lacks). A field is written in base-D
// digits, D the code-space size of the tensor's dtype, one digit per pass; a field gets as many digits
// as its largest value needs over all tensors (in that tensor's base). The tensor index always gets at
// least one digit, so every pass writes a code into every element it reaches and any pass tells
// sourced from unsourced elements.

inline constexpr int kTensorField = 0;
constexpr int axis_field(int axis) { return 1 + axis; }

struct ProbePass {
  int field;  // kTensorField or axis_field(a)
  int digit;  // k: this pass carries digit k of the field
  bool operator==(const ProbePass&) const = default;
};

class ProbePlan {
 public:
  ProbePlan() = default;
  /// Throws kInvalidArgument on a negative extent.
  explicit ProbePlan(const std::vector<TensorInfo>& tensors);

  int num_passes() const { return static_cast<int>(passes_.size()); }
  /// Throws kInvalidArgument when p is out of range.
  const ProbePass& pass(int p) const;
  const std::vector<ProbePass>& passes() const { return passes_; }

  /// 1 + the largest ndim of any tensor.
  int num_fields() const { return static_cast<int>(field_digits_.size()); }
  int max_ndim() const { return num_fields() - 1; }
  /// Digits (passes) of a field.
  int field_digits(int field) const { return field_digits_.at(static_cast<std::size_t>(field)); }
  /// "tensor index" / "axis 1".
  static std::string field_name(int field);
  /// "axis 0, digit 1"
  std::string describe_pass(int p) const;

  std::size_t num_tensors() const { return dtypes_.size(); }
  DType dtype(std::size_t tensor) const { return dtypes_[tensor]; }
  const Shape& shape(std::size_t tensor) const { return shapes_[tensor]; }

  /// Value of `field` for element `index` (a multi-index into the tensor) of tensor `tensor`.
  static std::uint64_t field_value(int field, std::size_t tensor, std::span<const std::int64_t> index);
  /// The digit pass p writes into that element (the element-wise definition the probe checkpoint follows).
  std::uint64_t digit(int p, std::size_t tensor, std::span<const std::int64_t> index) const;

  /// The value of `field` from the digits one element received in every pass (pass_digits[p] for pass
  /// p, num_passes() entries), in the base of `dtype`. UINT64_MAX on overflow.
  std::uint64_t combine(DType dtype, int field, std::span<const std::uint64_t> pass_digits) const;
  /// Every field at once: fields.size() must be num_fields().
  void combine_all(DType dtype, std::span<const std::uint64_t> pass_digits, std::span<std::uint64_t> fields) const;

 private:
  std::vector<DType> dtypes_;
  std::vector<Shape> shapes_;
  std::vector<int> field_digits_{1};
  std::vector<ProbePass> passes_{ProbePass{kTensorField, 0}};
};

}  // namespace wb::layout
