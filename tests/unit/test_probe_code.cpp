// The probe's value encoding (code spaces, pass plan) and the probe checkpoint that serves it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../support/expect_error.hpp"
#include "layout/keyed_lanes.hpp"
#include "layout/probe_checkpoint.hpp"
#include "layout/probe_code.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

using wb::testing::expect_error;

using ::testing::HasSubstr;

constexpr DType kAllDTypes[] = {DType::kBF16, DType::kF16,    DType::kF32,    DType::kF64, DType::kI8,
                                DType::kU8,   DType::kI32,    DType::kI64,    DType::kF8E4M3, DType::kF8E5M2};

// --- classifying bit patterns by their fields, independently of the code space ----------------------

struct FloatFormat {
  int exponent_bits;
  int mantissa_bits;
  bool e4m3fn;  // no infinity; only all-ones exponent and mantissa is NaN
};

FloatFormat float_format(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return {8, 7, false};
    case DType::kF16: return {5, 10, false};
    case DType::kF32: return {8, 23, false};
    case DType::kF64: return {11, 52, false};
    case DType::kF8E4M3: return {4, 3, true};
    case DType::kF8E5M2: return {5, 2, false};
    default: ADD_FAILURE() << "not a float dtype"; return {0, 0, false};
  }
}

// True when the bits are a positive normal number: not NaN, inf, denormal, zero or negative.
bool positive_normal(DType dtype, std::uint64_t bits) {
  const FloatFormat f = float_format(dtype);
  const std::uint64_t mantissa = bits & ((1ULL << f.mantissa_bits) - 1);
  const std::uint64_t exponent = (bits >> f.mantissa_bits) & ((1ULL << f.exponent_bits) - 1);
  const std::uint64_t sign = bits >> (f.mantissa_bits + f.exponent_bits);
  const std::uint64_t all_ones = (1ULL << f.exponent_bits) - 1;
  if (sign != 0 || exponent == 0) return false;
  if (f.e4m3fn) return !(exponent == all_ones && mantissa == ((1ULL << f.mantissa_bits) - 1));
  return exponent != all_ones;
}

// bf16 <-> f32: bf16 is the high half of an f32; round to nearest even on the way back.
float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
std::uint16_t float_to_bf16(float x) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  bits += 0x7fffU + ((bits >> 16) & 1U);
  return static_cast<std::uint16_t>(bits >> 16);
}

// --- code spaces ------------------------------------------------------------------------------------

TEST(ProbeCodeSpace, Table) {
  struct Row {
    DType dtype;
    std::uint64_t lo, end;
  };
  const Row rows[] = {
      {DType::kBF16, 0x0080, 0x7F80},
      {DType::kF16, 0x0400, 0x7C00},
      {DType::kF32, 0x00800000, 0x7F800000},
      {DType::kF64, 0x0010000000000000ULL, 0x0010000000000000ULL + (1ULL << 62)},
      {DType::kF8E4M3, 0x08, 0x7F},
      {DType::kF8E5M2, 0x04, 0x7C},
      {DType::kI8, 1, 256},
      {DType::kU8, 1, 256},
      {DType::kI32, 1, 1ULL << 31},
      {DType::kI64, 1, (1ULL << 62) + 1},
  };
  ASSERT_EQ(std::size(rows), static_cast<std::size_t>(kNumDTypes));
  for (const Row& r : rows) {
    const CodeSpace cs = code_space(r.dtype);
    EXPECT_EQ(cs.lo, r.lo) << dtype_name(r.dtype);
    EXPECT_EQ(cs.lo + cs.size, r.end) << dtype_name(r.dtype);
  }
  EXPECT_EQ(code_space(DType::kBF16).size, 32512u);
  EXPECT_EQ(code_space(DType::kF16).size, 30720u);
  EXPECT_EQ(code_space(DType::kF8E4M3).size, 119u);
  EXPECT_EQ(code_space(DType::kF8E5M2).size, 120u);
}

TEST(ProbeCodeSpace, FirstLastAndSentinel) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const CodeSpace cs = code_space(dtype);
    const std::uint64_t width_mask = dtype_size(dtype) == 8 ? ~0ULL : (1ULL << (8 * dtype_size(dtype))) - 1;
    EXPECT_GT(cs.lo, kSentinelBits);
    EXPECT_LE(cs.lo + cs.size - 1, width_mask);
    EXPECT_EQ(encode_digit(dtype, 0), cs.lo);
    EXPECT_EQ(encode_digit(dtype, cs.size - 1), cs.lo + cs.size - 1);
    EXPECT_EQ(decode_digit(dtype, cs.lo), 0u);
    EXPECT_EQ(decode_digit(dtype, cs.lo + cs.size - 1), cs.size - 1);
    EXPECT_FALSE(decode_digit(dtype, kSentinelBits).has_value());
    EXPECT_FALSE(decode_digit(dtype, cs.lo - 1).has_value());
    EXPECT_FALSE(decode_digit(dtype, cs.lo + cs.size).has_value());
    if (cs.lo + cs.size - 1 < width_mask) {
      EXPECT_FALSE(decode_digit(dtype, width_mask).has_value());
    }
    try {
      (void)encode_digit(dtype, cs.size);
      ADD_FAILURE() << "digit D must not encode";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr(std::string(dtype_name(dtype))));
    }
  }
}

// For 1- and 2-byte dtypes every bit pattern is checked: the codes are exactly the positive normal
// numbers (floats) or the nonzero patterns (integers), and each decodes to its own digit.
TEST(ProbeCodeSpace, EverySmallPattern) {
  for (DType dtype : kAllDTypes) {
    if (dtype_size(dtype) > 2) continue;
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const CodeSpace cs = code_space(dtype);
    const std::uint64_t patterns = 1ULL << (8 * dtype_size(dtype));
    std::uint64_t codes = 0;
    for (std::uint64_t bits = 0; bits < patterns; ++bits) {
      const bool valid = dtype_is_floating(dtype) ? positive_normal(dtype, bits) : bits != 0;
      const auto digit = decode_digit(dtype, bits);
      ASSERT_EQ(digit.has_value(), valid) << "bits 0x" << std::hex << bits;
      if (!digit) continue;
      ++codes;
      ASSERT_EQ(*digit, bits - cs.lo);
      ASSERT_EQ(encode_digit(dtype, *digit), bits);
    }
    EXPECT_EQ(codes, cs.size);
  }
}

TEST(ProbeCodeSpace, WideFloatsAreNormal) {
  std::mt19937_64 rng(7);
  {
    const CodeSpace cs = code_space(DType::kF32);
    std::vector<std::uint64_t> digits = {0, 1, cs.size / 2, cs.size - 2, cs.size - 1};
    for (int i = 0; i < 200000; ++i) digits.push_back(rng() % cs.size);
    for (std::uint64_t d : digits) {
      const auto bits = static_cast<std::uint32_t>(encode_digit(DType::kF32, d));
      const float x = std::bit_cast<float>(bits);
      ASSERT_EQ(std::fpclassify(x), FP_NORMAL) << d;
      ASSERT_FALSE(std::signbit(x));
      ASSERT_TRUE(positive_normal(DType::kF32, bits));
    }
    // Just outside: the largest denormal and +inf.
    EXPECT_EQ(std::fpclassify(std::bit_cast<float>(static_cast<std::uint32_t>(cs.lo - 1))), FP_SUBNORMAL);
    EXPECT_TRUE(std::isinf(std::bit_cast<float>(static_cast<std::uint32_t>(cs.lo + cs.size))));
  }
  {
    const CodeSpace cs = code_space(DType::kF64);
    std::vector<std::uint64_t> digits = {0, 1, cs.size / 2, cs.size - 1};
    for (int i = 0; i < 200000; ++i) digits.push_back(rng() % cs.size);
    for (std::uint64_t d : digits) {
      const double x = std::bit_cast<double>(encode_digit(DType::kF64, d));
      ASSERT_EQ(std::fpclassify(x), FP_NORMAL) << d;
      ASSERT_FALSE(std::signbit(x));
      ASSERT_TRUE(positive_normal(DType::kF64, encode_digit(DType::kF64, d)));
    }
    EXPECT_EQ(std::fpclassify(std::bit_cast<double>(cs.lo - 1)), FP_SUBNORMAL);
  }
}

// A code copied bitwise or through a float of its own type (the copy a framework's dtype-preserving
// load does, possibly through registers) still decodes to the same digit.
TEST(ProbeCodeSpace, CopiesKeepTheDigit) {
  std::mt19937_64 rng(11);
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const CodeSpace cs = code_space(dtype);
    for (int i = 0; i < 20000; ++i) {
      const std::uint64_t digit = i < 2 ? (i == 0 ? 0 : cs.size - 1) : rng() % cs.size;
      unsigned char source[8] = {}, copy[8] = {};
      store_bits(dtype, source, 0, encode_digit(dtype, digit));
      std::memcpy(copy, source, dtype_size(dtype));
      ASSERT_EQ(decode_digit(dtype, load_bits(dtype, copy, 0)), digit);
      if (dtype == DType::kF32) {
        volatile float x = std::bit_cast<float>(static_cast<std::uint32_t>(load_bits(dtype, source, 0)));
        volatile float y = x;
        const float z = y * 1.0f + 0.0f;  // arithmetic identities a copy kernel might apply
        ASSERT_EQ(decode_digit(dtype, std::bit_cast<std::uint32_t>(static_cast<float>(y))), digit);
        ASSERT_EQ(decode_digit(dtype, std::bit_cast<std::uint32_t>(z)), digit);
      } else if (dtype == DType::kF64) {
        volatile double x = std::bit_cast<double>(load_bits(dtype, source, 0));
        volatile double y = x;
        const double z = y * 1.0 + 0.0;
        ASSERT_EQ(decode_digit(dtype, std::bit_cast<std::uint64_t>(static_cast<double>(y))), digit);
        ASSERT_EQ(decode_digit(dtype, std::bit_cast<std::uint64_t>(z)), digit);
      } else if (dtype == DType::kBF16) {
        // bf16 -> f32 -> bf16 is exact for every code.
        const auto bits = static_cast<std::uint16_t>(load_bits(dtype, source, 0));
        ASSERT_EQ(decode_digit(dtype, float_to_bf16(bf16_to_float(bits))), digit);
      }
#ifdef __FLT16_MAX__
      else if (dtype == DType::kF16) {
        const auto bits = static_cast<std::uint16_t>(load_bits(dtype, source, 0));
        volatile _Float16 h = std::bit_cast<_Float16>(bits);
        const auto back = static_cast<_Float16>(static_cast<float>(h));
        ASSERT_EQ(decode_digit(dtype, std::bit_cast<std::uint16_t>(back)), digit);
      }
#endif
    }
  }
}

TEST(ProbeCodeSpace, DigitArithmetic) {
  EXPECT_EQ(digits_needed(0, 10), 0);
  EXPECT_EQ(digits_needed(9, 10), 1);
  EXPECT_EQ(digits_needed(10, 10), 2);
  EXPECT_EQ(digits_needed(163839, 32512), 2);
  EXPECT_EQ(digits_needed(7167, 32512), 1);
  EXPECT_EQ(place_value(10, 3), 1000u);
  EXPECT_EQ(place_value(1ULL << 62, 2), UINT64_MAX);
  EXPECT_EQ(digit_of(12345, 10, 0), 5u);
  EXPECT_EQ(digit_of(12345, 10, 4), 1u);
  EXPECT_EQ(digit_of(12345, 1ULL << 62, 3), 0u);
  const std::uint64_t digits[] = {5, 4, 3, 2, 1};
  EXPECT_EQ(combine_digits(digits, 10), 12345u);
  const std::uint64_t huge[] = {0, 0, 3};
  EXPECT_EQ(combine_digits(huge, 1ULL << 62), UINT64_MAX);
}

// --- the pass plan ----------------------------------------------------------------------------------

// Several dtypes and ranks; extents that need two digits in the small bases; more tensors than the
// fp8 base, so the tensor index needs two fp8 digits.
std::vector<TensorInfo> mixed_tensors() {
  std::vector<TensorInfo> t = {
      {"emb", DType::kBF16, {70000, 3}},   // axis 0: 2 bf16 digits
      {"w8", DType::kF8E4M3, {300, 5, 7}},  // 3-D; axis 0: 2 fp8 digits
      {"u", DType::kU8, {600, 300}},        // both axes 2 u8 digits
      {"h", DType::kF16, {31000}},          // 2 f16 digits (D = 30720)
      {"f", DType::kF32, {17, 19}},
      {"d", DType::kF64, {5, 3, 2}},
      {"i", DType::kI32, {9}},
      {"l", DType::kI64, {4, 4}},
      {"s", DType::kI8, {}},  // scalar
      {"e5", DType::kF8E5M2, {130, 2}},
      {"empty", DType::kBF16, {0, 4}},
  };
  for (int i = 0; i < 120; ++i)
    t.push_back({"small." + std::to_string(i), i % 2 ? DType::kF8E5M2 : DType::kBF16, {2, 3}});
  return t;
}

// Visits every multi-index of a shape (or of a box) in row-major order.
template <typename F>
void for_each_index(const Shape& extent, F f) {
  const std::int64_t n = shape_numel(extent);
  Shape index(extent.size(), 0);
  for (std::int64_t e = 0; e < n; ++e) {
    f(index);
    for (int d = static_cast<int>(extent.size()) - 1; d >= 0; --d) {
      if (++index[static_cast<std::size_t>(d)] < extent[static_cast<std::size_t>(d)]) break;
      index[static_cast<std::size_t>(d)] = 0;
    }
  }
}

// The digit passes' codes: for 1- and 2-byte dtypes every bit pattern is checked; the codes are exactly
// the first `half` codes of the code space and (floats) the same patterns with the sign bit set, each decodes
// to its own digit, and the digits below `half` are the code space's own codes.
TEST(ProbeDigitSpace, EverySmallPattern) {
  for (DType dtype : kAllDTypes) {
    if (dtype_size(dtype) > 2) continue;
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const DigitSpace ds = digit_space(dtype);
    const CodeSpace cs = code_space(dtype);
    EXPECT_EQ(ds.lo, cs.lo);
    EXPECT_LE(ds.half, cs.size);
    EXPECT_EQ(ds.size, dtype_is_floating(dtype) ? 2 * ds.half : ds.half);
    const std::uint64_t patterns = 1ULL << (8 * dtype_size(dtype));
    const std::uint64_t sign = patterns / 2;
    std::uint64_t codes = 0;
    for (std::uint64_t bits = 0; bits < patterns; ++bits) {
      const std::uint64_t magnitude = dtype_is_floating(dtype) ? bits & (sign - 1) : bits;
      const bool valid = (dtype_is_floating(dtype) ? positive_normal(dtype, magnitude) : bits != 0) &&
                         magnitude - ds.lo < ds.half;
      const auto digit = ds.digit(bits - ds.lo);
      ASSERT_EQ(digit.has_value(), valid) << "bits 0x" << std::hex << bits;
      if (!digit) continue;
      ++codes;
      ASSERT_LT(*digit, ds.size);
      ASSERT_EQ(ds.bits(*digit), bits);
      if (*digit < ds.half) {
        ASSERT_EQ(decode_digit(dtype, bits), *digit);
      }
    }
    EXPECT_EQ(codes, ds.size);
  }
  EXPECT_EQ(digit_space(DType::kBF16).size, 61440u);
  // The wide floats: negative normals past the half, +inf and NaN in the hole.
  const DigitSpace f32 = digit_space(DType::kF32);
  EXPECT_EQ(f32.size, 1ULL << 31);
  for (const std::uint64_t d : {std::uint64_t{0}, f32.half - 1, f32.half, f32.size - 1}) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(f32.bits(d)));
    EXPECT_EQ(std::fpclassify(x), FP_NORMAL) << d;
    EXPECT_EQ(std::signbit(x), d >= f32.half) << d;
    EXPECT_EQ(f32.digit(f32.bits(d) - f32.lo), d);
  }
  EXPECT_FALSE(f32.digit(0x7F800000 - f32.lo).has_value());  // +inf
  EXPECT_FALSE(f32.digit(0x80000000 - f32.lo).has_value());  // -0
  EXPECT_EQ(digit_space(DType::kF64).size, code_space(DType::kF64).size);
  EXPECT_EQ(digit_space(DType::kI32).size, 1ULL << 30);
}

TEST(ProbePlan, KeysAndPasses) {
  const auto tensors = mixed_tensors();
  const ProbePlan plan(tensors);
  // Per dtype. 1-byte codes give every inner axis whole digits: u8 [600, 300] has rows of 240^2 keys, so
  // 601 * 57,600 > 240^3 keys take four u8 digits.
  EXPECT_EQ(plan.key_range(DType::kU8), 601u * 57600u);
  // bf16: emb [70000, 3] (more than a span of 30,720 keys) at pitch 4, a divisor of the span; "empty" [0, 4]
  // and the 60 small [2, 3] compact (5 and 12 keys) right after it, inside the same span.
  EXPECT_EQ(plan.key_range(DType::kBF16), 280004u + 5u + 60u * 12u);
  EXPECT_EQ(plan.base(10), 280004u);
  EXPECT_EQ(plan.key_range(DType::kF8E4M3), 301u * 192u * 192u);  // [300, 5, 7]: one digit per inner axis
  EXPECT_EQ(plan.key_range(DType::kF16), 61440u);  // [31000]: longer than 30,720, two spans
  EXPECT_EQ(plan.key_range(DType::kI8), 1u);  // the scalar
  EXPECT_EQ(plan.num_passes(), 4);
  EXPECT_EQ(plan.describe_pass(3), "key digit 3");
  EXPECT_THROW((void)plan.describe_pass(4), Error);
  // Keys: the base of the tensor's dtype plus its row-major index with a gap after every axis.
  const std::int64_t w8[] = {2, 3, 4};
  EXPECT_EQ(plan.key(1, w8), 2u * 192u * 192u + 3u * 192u + 4u);
  const std::int64_t small[] = {1, 2};
  EXPECT_EQ(plan.key(11 + 2, small), 280009u + 12u + 1u * 4u + 2u);  // the second bf16 "small"
  EXPECT_EQ(plan.places(0)[0], 4u);

  // One tensor still gets a pass; a bf16 matrix of 4096 x 4096 (pitch 5,120) needs two digits (61,440 each),
  // and so does an embedding table beside it (pitch 7,680).
  EXPECT_EQ(ProbePlan({{"x", DType::kBF16, {}}}).num_passes(), 1);
  EXPECT_EQ(ProbePlan({{"x", DType::kBF16, {4096, 4096}}}).num_passes(), 2);
  EXPECT_EQ(ProbePlan({{"x", DType::kBF16, {163840, 7168}}, {"y", DType::kBF16, {7168}}}).num_passes(), 2);
  EXPECT_EQ(ProbePlan({{"x", DType::kF8E4M3, {163840, 7168}}}).num_passes(), 5);  // 163,841 * 192^2 > 192^4
  EXPECT_THROW(ProbePlan({{"x", DType::kBF16, {-1}}}), Error);
  // Small tensors never straddle a span of u keys (the digits' wraps and the hole lie on span ends), large
  // ones start on a multiple of their row pitch or of u.
  std::vector<TensorInfo> many;
  for (int i = 0; i < 3000; ++i) many.push_back({"t" + std::to_string(i), DType::kBF16, {7 + i % 5, 13 + i % 3}});
  many.push_back({"big", DType::kBF16, {100, 40000}});
  many.push_back({"after", DType::kBF16, {3, 3}});
  const ProbePlan spans(many);
  const std::uint64_t u = digit_space(DType::kBF16).half;
  for (std::size_t t = 0; t < many.size(); ++t) {
    const std::uint64_t size = static_cast<std::uint64_t>(many[t].shape[0] + 1) * spans.places(t)[0];
    if (size <= u) {
      EXPECT_EQ(spans.base(t) / u, (spans.base(t) + size - 1) / u) << many[t].name;
    } else {
      EXPECT_EQ(spans.base(t) % u, 0u) << many[t].name;
      EXPECT_EQ(spans.places(t)[0], 2 * u) << many[t].name;  // 40,001 rounded up to spans
    }
  }
  expect_error([] { ProbePlan({{"huge", DType::kF64, {1LL << 40, 1LL << 40}}}); }, ErrorCode::kInvalidArgument,
               {"huge", "2^64"});
}

// Every element of every tensor: digits → codes → (copy) → digits → key → element gives back its tensor
// and coordinates; keys in the gaps and past the range name no element.
TEST(ProbePlan, EveryElementRoundTrips) {
  const auto tensors = mixed_tensors();
  const ProbePlan plan(tensors);
  const auto passes = static_cast<std::size_t>(plan.num_passes());
  std::vector<std::uint64_t> digits(passes);
  std::int64_t checked = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const DType dtype = tensors[t].dtype;
    const DigitSpace ds = digit_space(dtype);
    std::size_t found = 0;
    Shape at;
    for_each_index(tensors[t].shape, [&](const Shape& index) {
      for (std::size_t p = 0; p < passes; ++p) {
        const std::uint64_t bits = ds.bits(plan.digit(static_cast<int>(p), t, index));
        const auto digit = ds.digit(bits - ds.lo);
        ASSERT_TRUE(digit.has_value());
        digits[p] = *digit;
      }
      const std::uint64_t key = plan.combine(dtype, digits);
      ASSERT_EQ(key, plan.key(t, index));
      ASSERT_TRUE(plan.element(dtype, key, found, at)) << tensors[t].name;
      ASSERT_EQ(found, t) << tensors[t].name;
      ASSERT_EQ(at, index) << tensors[t].name;
      ++checked;
    });
    // One past the end of each axis is a gap.
    if (tensors[t].shape.empty()) continue;
    for (std::size_t a = 0; a < tensors[t].shape.size(); ++a) {
      Shape gap(tensors[t].shape.size(), 0);
      gap[a] = tensors[t].shape[a];
      EXPECT_FALSE(plan.element(dtype, plan.key(t, gap), found, at)) << tensors[t].name << " axis " << a;
    }
  }
  EXPECT_GT(checked, 400000);
  Shape at;
  std::size_t found = 0;
  EXPECT_FALSE(plan.element(DType::kBF16, plan.key_range(DType::kBF16), found, at));
  EXPECT_TRUE(plan.element(DType::kI32, 0, found, at));  // each dtype's keys start at 0: i32 "i"
  EXPECT_EQ(found, 6u);
  EXPECT_FALSE(plan.element(DType::kI32, 9, found, at));  // "i" [9]: key 9 is its gap
}

// --- the probe checkpoint ---------------------------------------------------------------------------

// The element-wise definition: what read_box must produce for `box` of tensor t in pass p.
std::vector<std::uint64_t> expected_codes(const ProbePlan& plan, int p, std::size_t t, const Box& box) {
  std::vector<std::uint64_t> out;
  out.reserve(static_cast<std::size_t>(box.numel()));
  for_each_index(box.extent, [&](const Shape& rel) {
    Shape index = rel;
    for (std::size_t a = 0; a < index.size(); ++a) index[a] += box.offset[a];
    out.push_back(digit_space(plan.dtype(t)).bits(plan.digit(p, t, index)));
  });
  return out;
}

std::vector<std::uint64_t> read_codes(const ProbeCheckpoint& ckpt, const TensorInfo& info, const Box& box) {
  std::vector<unsigned char> raw(static_cast<std::size_t>(box.numel()) * dtype_size(info.dtype) + 1);
  ckpt.read_box(info.name, box, raw.data());
  std::vector<std::uint64_t> out(static_cast<std::size_t>(box.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_bits(info.dtype, raw.data(), i);
  return out;
}

Box random_box(const Shape& shape, std::mt19937_64& rng) {
  Box box;
  for (std::int64_t e : shape) {
    const std::int64_t a = e == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e + 1));
    const std::int64_t b = e == 0 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e + 1));
    box.offset.push_back(std::min(a, b));
    box.extent.push_back(std::max(a, b) - std::min(a, b));
  }
  return box;
}

TEST(ProbeCheckpoint, RandomBoxesMatchTheDefinition) {
  const auto tensors = mixed_tensors();
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  const ProbePlan& plan = ckpt.plan();
  std::mt19937_64 rng(3);
  for (int p = 0; p < plan.num_passes(); ++p) {
    ckpt.set_pass(p);
    EXPECT_EQ(ckpt.current_pass(), p);
    for (std::size_t t = 0; t < 12 && t < tensors.size(); ++t) {
      for (int trial = 0; trial < 12; ++trial) {
        // First the whole tensor, then boxes that tend to straddle the digit wraps of the big axes.
        const Box box = trial == 0 ? Box::whole(tensors[t].shape) : random_box(tensors[t].shape, rng);
        ASSERT_EQ(read_codes(ckpt, tensors[t], box), expected_codes(plan, p, t, box))
            << tensors[t].name << " box " << box.to_string() << " pass " << p;
      }
    }
    // Thin boxes across the hole of the bf16 digits (key 30,720: row 7,680) and their wrap (key 61,440:
    // row 15,360), and a box of one column.
    for (const Box& box : {Box{{7670, 0}, {20, 3}}, Box{{15350, 1}, {20, 2}}, Box{{0, 2}, {70000, 1}}})
      ASSERT_EQ(read_codes(ckpt, tensors[0], box), expected_codes(plan, p, 0, box)) << box.to_string();
  }
}

// Reading every pass of whole tensors and combining gives back each element's own key and coordinates.
TEST(ProbeCheckpoint, PassesCombineToCoordinates) {
  const auto tensors = mixed_tensors();
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  const ProbePlan& plan = ckpt.plan();
  for (std::size_t t : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5},
                        std::size_t{8}, std::size_t{9}, tensors.size() - 1}) {
    const TensorInfo& info = tensors[t];
    const DigitSpace ds = digit_space(info.dtype);
    const Box whole = Box::whole(info.shape);
    std::vector<std::vector<std::uint64_t>> per_pass;
    for (int p = 0; p < plan.num_passes(); ++p) {
      ckpt.set_pass(p);
      per_pass.push_back(read_codes(ckpt, info, whole));
    }
    std::vector<std::uint64_t> digits(per_pass.size());
    std::size_t e = 0, found = 0;
    Shape at;
    for_each_index(info.shape, [&](const Shape& index) {
      for (std::size_t p = 0; p < per_pass.size(); ++p) {
        const auto digit = ds.digit(per_pass[p][e] - ds.lo);
        ASSERT_TRUE(digit.has_value()) << info.name << " element " << e;
        digits[p] = *digit;
      }
      ASSERT_TRUE(plan.element(info.dtype, plan.combine(info.dtype, digits), found, at));
      ASSERT_EQ(found, t);
      ASSERT_EQ(at, index);
      ++e;
    });
    EXPECT_EQ(e, static_cast<std::size_t>(info.numel()));
  }
}

TEST(ProbeCheckpoint, VerificationValues) {
  const auto tensors = mixed_tensors();
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  std::mt19937_64 rng(5);
  for (std::size_t t = 0; t < 11; ++t) {
    const TensorInfo& info = tensors[t];
    const Box whole = Box::whole(info.shape);
    ckpt.set_verification(1);
    EXPECT_TRUE(ckpt.verification());
    const auto a = read_codes(ckpt, info, whole);
    ckpt.set_verification(2);
    const auto b = read_codes(ckpt, info, whole);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(is_code(info.dtype, a[i])) << info.name << " " << i;
      ASSERT_TRUE(is_code(info.dtype, b[i])) << info.name << " " << i;
      differ += a[i] != b[i];
    }
    // Codes drawn uniformly from D >= 119 values: two seeds agree on under 1% of elements.
    if (a.size() >= 100) {
      EXPECT_GT(differ, a.size() * 95 / 100) << info.name;
    }
    // Any box agrees with the whole tensor (values depend on the element, not on the read).
    const Box box = random_box(info.shape, rng);
    const auto part = read_codes(ckpt, info, box);
    std::size_t i = 0;
    const Shape strides = contiguous_strides(info.shape);
    for_each_index(box.extent, [&](const Shape& rel) {
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < rel.size(); ++d) flat += (box.offset[d] + rel[d]) * strides[d];
      ASSERT_EQ(part[i++], b[static_cast<std::size_t>(flat)]) << info.name;
    });
  }
  // Verification values spread over the code space rather than repeating the coordinate codes.
  ckpt.set_verification(1);
  const auto v = read_codes(ckpt, tensors[0], Box::whole(tensors[0].shape));
  ckpt.set_pass(0);
  EXPECT_FALSE(ckpt.verification());
  EXPECT_NE(read_codes(ckpt, tensors[0], Box::whole(tensors[0].shape)), v);
}

// The keyed pass (plans of 2-byte codes): every box, read in 16-bit lanes, holds the code of
// KeyedDigit::value(key) per element (the scalar definition the decoder inverts), the top digit comes back
// from the lower digits and that code, and another seed gives other values. Two passes, and three (low digits
// past 2^16: several hash blocks, and rows across a wrap of the two lower digits at 61,440^2 keys).
TEST(ProbeCheckpoint, KeyedValuesMatchTheDefinitionAndGiveBackTheTopDigit) {
  const std::vector<TensorInfo> two = {{"w", DType::kBF16, {300, 4096}}, {"e", DType::kBF16, {20, 30}},
                                       {"h", DType::kF16, {70000}}};
  const std::vector<TensorInfo> three = {{"big", DType::kBF16, {1000000, 4000}}, {"e", DType::kBF16, {20, 30}}};
  std::mt19937_64 rng(7);
  for (const int passes : {2, 3}) {
    const std::vector<TensorInfo>& tensors = passes == 2 ? two : three;
    ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
    const ProbePlan& plan = ckpt.plan();
    ASSERT_EQ(plan.num_passes(), passes);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const TensorInfo& info = tensors[t];
      const DigitSpace ds = digit_space(info.dtype);
      const KeyedDigit keyed(11, info.dtype, plan);
      std::vector<Box> boxes;
      if (info.numel() < 4'000'000) {
        boxes.push_back(Box::whole(info.shape));
        for (int trial = 0; trial < 5; ++trial) boxes.push_back(random_box(info.shape, rng));
      } else {  // rows at the start, in the middle, across the wrap of the lower digits (row 737,280 starts at
                // key 61,440^2: rows pitched 5,120), at the end
        for (const std::int64_t row : {std::int64_t{0}, std::int64_t{16}, std::int64_t{500000}, std::int64_t{737279},
                                       std::int64_t{999997}})
          boxes.push_back(Box{{row, 0}, {3, 4000}});
      }
      for (const Box& box : boxes) {
        ckpt.set_keyed(11);
        EXPECT_TRUE(ckpt.keyed());
        const auto codes = read_codes(ckpt, info, box);
        std::size_t e = 0;
        for_each_index(box.extent, [&](const Shape& rel) {
          Shape index(rel.size());
          for (std::size_t d = 0; d < rel.size(); ++d) index[d] = box.offset[d] + rel[d];
          const std::uint64_t key = plan.key(t, index);
          ASSERT_EQ(codes[e], ds.bits(keyed.value(key))) << info.name << " " << shape_to_string(index);
          const auto written = ds.digit(codes[e] - ds.lo);
          ASSERT_TRUE(written.has_value());
          ASSERT_EQ(keyed.top(key % keyed.place(), *written), key / keyed.place()) << info.name;
          ++e;
        });
        ckpt.set_keyed(12);
        const auto other = read_codes(ckpt, info, box);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < codes.size(); ++i) differ += codes[i] != other[i];
        EXPECT_GE(differ, codes.size() * 95 / 100) << info.name << " " << box.to_string();
      }
    }
    ckpt.set_pass(0);
    EXPECT_FALSE(ckpt.keyed());
  }
}

// The keyed pass's 2-byte codes in every lane width this CPU runs, against KeyedDigit::value: runs of lows of
// every length around the vector widths, at the start, in the middle and at the end of blocks of 2^16 (a
// three-pass plan: lows up to D^2, so many blocks), for top digits at both ends and in the middle, bf16 and f16.
TEST(ProbeCheckpoint, KeyedCodesInEveryLaneWidthMatchTheDefinition) {
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::vector<TensorInfo> tensors = {{"big", dtype, {1000000, 4000}}};
    const ProbePlan plan(tensors);
    ASSERT_EQ(plan.num_passes(), 3);
    const DigitSpace ds = digit_space(dtype);
    const KeyedDigit keyed(21, dtype, plan);
    std::vector<std::uint16_t> out;
    for (const KeyedLanes lanes : {KeyedLanes::kScalar, KeyedLanes::kSse2, KeyedLanes::kAvx2, KeyedLanes::kAvx512}) {
      if (!keyed_lanes_supported(lanes)) continue;
      SCOPED_TRACE(std::string(keyed_lanes_name(lanes)) + " " + std::string(dtype_name(dtype)));
      for (const std::uint64_t top : {std::uint64_t{0}, std::uint64_t{1}, ds.size / 2, ds.size - 1})
        for (const std::uint64_t block : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{30000}})
          for (const std::int64_t n : {1, 7, 8, 9, 16, 31, 32, 33, 63, 64, 65, 100, 1000})
            for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{40000},
                                              65536 - static_cast<std::uint64_t>(n)}) {
              const KeyedRun16 run{static_cast<std::uint16_t>(top), static_cast<std::uint16_t>(ds.size),
                                   static_cast<std::uint16_t>(ds.lo), static_cast<std::uint16_t>(ds.half),
                                   static_cast<std::uint16_t>(ds.hole)};
              out.assign(static_cast<std::size_t>(n) + 1, 0xabcd);  // one past the run: left alone
              keyed_codes16(out.data(), n, static_cast<std::uint16_t>(first), keyed.block_key(block), run, lanes);
              for (std::int64_t k = 0; k < n; ++k) {
                const std::uint64_t key = top * keyed.place() + block * 65536 + first + static_cast<std::uint64_t>(k);
                ASSERT_EQ(out[static_cast<std::size_t>(k)], ds.bits(keyed.value(key)))
                    << "top " << top << " block " << block << " first " << first << " n " << n << " at " << k;
              }
              ASSERT_EQ(out.back(), 0xabcd) << "n " << n;
              // The comparison in the same width: equal to the codes, unequal with any one of them changed.
              ASSERT_TRUE(keyed_codes16_equal(out.data(), n, static_cast<std::uint16_t>(first), keyed.block_key(block), run, lanes));
              for (const std::int64_t k : {std::int64_t{0}, n / 2, n - 1}) {
                out[static_cast<std::size_t>(k)] ^= 0x0100;
                ASSERT_FALSE(keyed_codes16_equal(out.data(), n, static_cast<std::uint16_t>(first), keyed.block_key(block), run, lanes))
                    << "n " << n << " changed at " << k;
                out[static_cast<std::size_t>(k)] ^= 0x0100;
              }
            }
    }
  }
}

// Keys in arithmetic progression (a transposed line) in vector lanes and in the definition, against
// KeyedDigit::value key by key: steps below the place and past it (a carry into the top digit at almost every
// key), tops at both ends, lengths around the vector width, bf16 and f16 (two-pass plans: every low in block 0).
TEST(ProbeCheckpoint, KeyedProgressionsInEveryLaneWidthMatchTheDefinition) {
  std::mt19937_64 rng(8);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::vector<TensorInfo> tensors = {{"w", dtype, {3000, 5000}}};
    const ProbePlan plan(tensors);
    ASSERT_EQ(plan.num_passes(), 2);
    const DigitSpace ds = digit_space(dtype);
    const KeyedDigit keyed(13, dtype, plan);
    const std::uint64_t place = keyed.place(), base = keyed.base();
    ASSERT_LT(place, 65536u);
    const KeyedRun16 run{0, static_cast<std::uint16_t>(base), static_cast<std::uint16_t>(ds.lo),
                         static_cast<std::uint16_t>(ds.half), static_cast<std::uint16_t>(ds.hole)};
    for (const std::uint64_t step : {std::uint64_t{1}, std::uint64_t{4096}, place - 1, place, place + 38560,
                                     7 * place + 12345, rng() % (place * base)})
      for (const std::uint64_t key0 : {std::uint64_t{0}, place - 3, (base - 1) * place + place - 1, rng() % (place * base)})
        for (const std::int64_t n : {1, 31, 32, 33, 64, 100, 1000}) {
          std::vector<std::uint16_t> codes(static_cast<std::size_t>(n));
          for (std::int64_t k = 0; k < n; ++k)
            codes[static_cast<std::size_t>(k)] = static_cast<std::uint16_t>(ds.bits(keyed.value(key0 + static_cast<std::uint64_t>(k) * step)));
          const KeyedProgression16 keys{static_cast<std::uint16_t>(key0 % place), static_cast<std::uint16_t>(key0 / place % base),
                                        static_cast<std::uint16_t>(step % place), static_cast<std::uint16_t>(step / place % base),
                                        static_cast<std::uint16_t>(place)};
          for (const KeyedLanes lanes : {KeyedLanes::kScalar, KeyedLanes::kBest}) {
            SCOPED_TRACE(std::string(keyed_lanes_name(lanes)) + " " + std::string(dtype_name(dtype)) + " step " +
                         std::to_string(step) + " key " + std::to_string(key0) + " n " + std::to_string(n));
            ASSERT_TRUE(keyed_progression16_equal(codes.data(), n, keyed.block_key(0), keys, run, lanes));
            for (const std::int64_t k : {std::int64_t{0}, n / 2, n - 1}) {
              codes[static_cast<std::size_t>(k)] ^= 0x0100;
              ASSERT_FALSE(keyed_progression16_equal(codes.data(), n, keyed.block_key(0), keys, run, lanes)) << "changed at " << k;
              codes[static_cast<std::size_t>(k)] ^= 0x0100;
            }
          }
        }
  }
}

// strided_box_equals against read_box laid out with other strides (transposes of 2-D boxes, permutations of a
// 3-D one, each in a larger parameter): equal where the layout holds what read_box wrote, unequal with one
// element changed (first, middle, last); nullopt outside the keyed pass, for lines shorter than a vector step,
// for 4-byte codes and for plans whose lower digits span several blocks.
TEST(ProbeCheckpoint, StridedBoxEqualsComparesTransposedLayouts) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {300, 70000}}, {"c", DType::kBF16, {6, 50, 40}},
                                           {"f", DType::kF32, {30, 70}}, {"v", DType::kF16, {500, 12345}},
                                           {"u", DType::kBF16, {5000, 37}}};
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  ASSERT_EQ(ckpt.plan().num_passes(), 2);
  ckpt.set_keyed(9);
  struct Case {
    std::size_t tensor;
    Box box;
    Shape order;  // the box's axes from the parameter's outermost to its contiguous one
  };
  const std::vector<Case> cases = {{0, Box{{17, 1000}, {40, 333}}, {1, 0}},   // column-major: the line walks rows
                                   {0, Box{{0, 69990}, {300, 10}}, {1, 0}},
                                   {1, Box{{1, 3, 5}, {4, 45, 33}}, {0, 2, 1}},
                                   {1, Box{{0, 0, 0}, {6, 50, 40}}, {2, 0, 1}},
                                   {3, Box{{3, 7}, {400, 50}}, {1, 0}},
                                   {4, Box{{0, 1}, {5000, 30}}, {1, 0}}};  // short rows: lows that carry every few vectors
  for (const Case& c : cases) {
    if (!keyed_progression16_in_lanes()) GTEST_SKIP() << "no vector lanes for progressions on this CPU";
    const std::int64_t n = c.box.numel();
    std::vector<std::uint16_t> values(static_cast<std::size_t>(n));
    ckpt.read_box(c.tensor, c.box, values.data());
    // The parameter: the box's axes in `order`, the contiguous one padded by 3 elements on every line.
    Shape strides(c.box.extent.size(), 0);
    std::int64_t size = 1;
    for (std::size_t k = c.order.size(); k-- > 0;) {
      const auto a = static_cast<std::size_t>(c.order[k]);
      strides[a] = size;
      size *= c.box.extent[a] + (k + 1 == c.order.size() ? 3 : 0);
    }
    std::vector<std::uint16_t> param(static_cast<std::size_t>(size), 0xffff);
    std::vector<std::int64_t> where(static_cast<std::size_t>(n));
    Shape index(c.box.extent.size(), 0);
    for (std::int64_t e = 0; e < n; ++e) {
      std::int64_t at = 0;
      for (std::size_t a = 0; a < index.size(); ++a) at += index[a] * strides[a];
      where[static_cast<std::size_t>(e)] = at;
      param[static_cast<std::size_t>(at)] = values[static_cast<std::size_t>(e)];
      for (std::size_t a = index.size(); a-- > 0;) {
        if (++index[a] < c.box.extent[a]) break;
        index[a] = 0;
      }
    }
    SCOPED_TRACE(tensors[c.tensor].name + c.box.to_string());
    ASSERT_EQ(ckpt.strided_box_equals(c.tensor, c.box, param.data(), strides), std::optional<bool>(true));
    for (const std::int64_t e : {std::int64_t{0}, n / 2, n - 1}) {
      auto& v = param[static_cast<std::size_t>(where[static_cast<std::size_t>(e)])];
      v ^= 0x0100;
      ASSERT_EQ(ckpt.strided_box_equals(c.tensor, c.box, param.data(), strides), std::optional<bool>(false)) << "at " << e;
      v ^= 0x0100;
    }
  }
  const std::vector<std::uint16_t> any(40 * 333);
  EXPECT_FALSE(ckpt.strided_box_equals(1, Box{{0, 0, 0}, {6, 5, 4}}, any.data(), Shape{1, 24, 6}).has_value());  // short lines
  EXPECT_FALSE(ckpt.strided_box_equals(2, Box{{0, 0}, {3, 7}}, any.data(), Shape{1, 3}).has_value());  // 4-byte codes
  ckpt.set_pass(0);
  EXPECT_FALSE(ckpt.strided_box_equals(0, Box{{17, 1000}, {40, 333}}, any.data(), Shape{1, 40}).has_value());
  const std::vector<TensorInfo> big = {{"big", DType::kBF16, {1000000, 4000}}};
  ProbeCheckpoint three(big, ProbePlan(big));
  ASSERT_EQ(three.plan().num_passes(), 3);
  three.set_keyed(9);
  EXPECT_FALSE(three.strided_box_equals(0, Box{{0, 0}, {40, 333}}, any.data(), Shape{1, 40}).has_value());
}

// box_equals against read_box: keyed 2-byte boxes (compared in registers) across rows, top-digit runs and
// blocks of the lower digits, and the other passes (through a buffer): equal to what read_box wrote, unequal
// with one element changed at the start, in the middle or at the end.
TEST(ProbeCheckpoint, BoxEqualsComparesWhatReadBoxWrites) {
  const std::vector<TensorInfo> tensors = {{"big", DType::kBF16, {1000000, 4000}}, {"f", DType::kF32, {30, 70}}};
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  std::mt19937_64 rng(3);
  std::vector<Box> boxes = {Box{{737278, 0}, {4, 4000}}, Box{{16, 100}, {3, 1000}}, Box{{999999, 3999}, {1, 1}}};
  for (int trial = 0; trial < 6; ++trial) {
    Box box = random_box(tensors[0].shape, rng);
    box.extent[0] = std::min<std::int64_t>(box.extent[0], 5);
    boxes.push_back(box);
  }
  for (const int mode : {0, 1, 2}) {  // keyed, digit pass 0, verification values
    if (mode == 0) ckpt.set_keyed(5);
    if (mode == 1) ckpt.set_pass(0);
    if (mode == 2) ckpt.set_verification(5);
    for (std::size_t t = 0; t < tensors.size(); ++t)
      for (const Box& box : t == 0 ? boxes : std::vector<Box>{Box::whole(tensors[1].shape), Box{{3, 5}, {7, 9}}}) {
        const std::size_t size = dtype_size(tensors[t].dtype);
        std::vector<std::byte> values(static_cast<std::size_t>(box.numel()) * size);
        ckpt.read_box(t, box, values.data());
        ASSERT_TRUE(ckpt.box_equals(t, box, values.data())) << ckpt.source() << " " << box.to_string();
        for (const std::int64_t k : {std::int64_t{0}, box.numel() / 2, box.numel() - 1}) {
          values[static_cast<std::size_t>(k) * size] ^= std::byte{1};
          ASSERT_FALSE(ckpt.box_equals(t, box, values.data())) << ckpt.source() << " " << box.to_string() << " at " << k;
          values[static_cast<std::size_t>(k) * size] ^= std::byte{1};
        }
      }
  }
}

// Lookups by name (CheckpointReader::find, and read_box's own) try the tensor after the last one found
// first: in any order of names, each finds its own tensor, reads its own values, and an unknown name none.
TEST(ProbeCheckpoint, LookupsInAnyOrderFindTheirTensor) {
  const auto tensors = mixed_tensors();
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  ckpt.set_verification(3);
  std::vector<std::size_t> order;
  for (std::size_t t = 0; t < tensors.size(); ++t) order.push_back(t);                // list order
  for (std::size_t t = tensors.size(); t-- > 0;) order.push_back(t);                   // reversed
  for (std::size_t t = 0; t < tensors.size(); ++t) order.push_back((t * 7) % tensors.size());  // jumps
  for (std::size_t t = 0; t < tensors.size(); ++t) order.push_back(t);                // each twice
  std::vector<std::vector<std::uint64_t>> whole;
  for (const TensorInfo& info : tensors) whole.push_back(read_codes(ckpt, info, Box::whole(info.shape)));
  for (const std::size_t t : order) {
    const TensorInfo* found = ckpt.find(tensors[t].name);
    ASSERT_NE(found, nullptr) << tensors[t].name;
    EXPECT_EQ(found, &ckpt.tensors()[t]) << tensors[t].name;
    EXPECT_EQ(read_codes(ckpt, tensors[t], Box::whole(tensors[t].shape)), whole[t]) << tensors[t].name;
    EXPECT_EQ(ckpt.find(tensors[t].name + ".missing"), nullptr);
  }
}

TEST(ProbeCheckpoint, SourceAndErrors) {
  const auto tensors = mixed_tensors();
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  EXPECT_EQ(ckpt.source(), "probe pass 1 of 4 (key digit 0)");
  ckpt.set_pass(2);
  EXPECT_EQ(ckpt.source(), "probe pass 3 of 4 (key digit 2)");
  ckpt.set_verification(42);
  EXPECT_EQ(ckpt.source(), "probe verification (seed 42)");
  EXPECT_THROW(ckpt.set_pass(4), Error);
  EXPECT_THROW(ckpt.set_pass(-1), Error);

  std::vector<std::uint16_t> buffer(64);
  expect_error([&] { ckpt.read_box("nope", Box{{0}, {1}}, buffer.data()); }, ErrorCode::kNotFound, {"nope"});
  for (const Box& bad : {Box{{0, 0}, {70001, 1}}, Box{{0}, {1}}, Box{{0, 0}, {1}}, Box{{-1, 0}, {1, 1}}}) {
    expect_error([&] { ckpt.read_box("emb", bad, buffer.data()); }, ErrorCode::kInvalidArgument, {"tensor emb"});
  }
  // A plan of another tensor list, and a repeated name, are refused.
  auto other = tensors;
  other[0].shape[0] += 1;
  EXPECT_THROW(ProbeCheckpoint(tensors, ProbePlan(other)), Error);
  other = tensors;
  other.pop_back();
  EXPECT_THROW(ProbeCheckpoint(tensors, ProbePlan(other)), Error);
  other = tensors;
  other[1].name = other[0].name;
  EXPECT_THROW(ProbeCheckpoint(other, ProbePlan(other)), Error);
}

TEST(ProbeCheckpoint, ConcurrentReadsAgree) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {20000, 64}}, {"v", DType::kF8E4M3, {500, 500}}};
  ProbeCheckpoint ckpt(tensors, ProbePlan(tensors));
  ckpt.set_pass(0);
  const auto reference = read_codes(ckpt, tensors[0], Box::whole(tensors[0].shape));
  std::vector<std::thread> pool;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i)
    pool.emplace_back([&, i] {
      bool same = true;
      for (int r = 0; r < 3; ++r) same = same && read_codes(ckpt, tensors[0], Box::whole(tensors[0].shape)) == reference;
      ok[static_cast<std::size_t>(i)] = same;
    });
  for (auto& t : pool) t.join();
  for (int v : ok) EXPECT_TRUE(v);
}

}  // namespace
}  // namespace wb::layout
