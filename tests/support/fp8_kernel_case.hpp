// Test support: the FP8 quantize kernels' test case, run on a GPU (tests/gpu/test_fp8_kernel.cpp) and, as
// the kernels' per-thread source on the host (tests/unit/test_fp8_kernel_body.cpp): a bf16 tensor of
// several 128 x 128 blocks with edge blocks, random values of every magnitude, an all-zero block, subnormal,
// huge and NaN blocks, held in two parameters (rows cut at 200, inside a block, and the second stored
// transposed), with the host's reference form (layout::quantize_band) of the whole tensor.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "exec/fp8_kernel_launch.hpp"
#include "layout/fp8_form.hpp"

namespace wb {
namespace fp8 {
// What gtest prints of a rule (and ctest's discovered names carry): its name.
inline void PrintTo(ScaleRule rule, std::ostream* out) { *out << scale_rule_name(rule); }
}  // namespace fp8

namespace testing_support {

/// A rule's name as a test name: "per_block_cast".
inline std::string scale_rule_test_name(fp8::ScaleRule rule) {
  std::string name(fp8::scale_rule_name(rule));
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}

struct Fp8KernelCase {
  static constexpr std::int64_t kRows = 300, kCols = 520, kCut = 200;

  layout::QuantizationConfig config;
  std::vector<std::uint16_t> values;  // [kRows, kCols]
  Shape scales_shape;
  std::int64_t blocks = 0;
  std::vector<std::uint8_t> want_codes;  // [kRows, kCols]
  std::vector<float> want_scales;
  std::vector<std::uint16_t> top;       // rows [0, kCut) as they are
  std::vector<std::uint16_t> bottom_t;  // rows [kCut, kRows) transposed: [kCols, kRows - kCut]

  static std::uint16_t bf16_bits(float x) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16); }

  explicit Fp8KernelCase(fp8::ScaleRule rule) {
    config.rule = rule;
    std::mt19937 random(32);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-30, 12);
    values.resize(static_cast<std::size_t>(kRows * kCols));
    for (std::uint16_t& x : values) x = bf16_bits(std::ldexp(normal(random), exponent(random) / 4));
    const auto fill = [&](std::int64_t r0, std::int64_t c0, const auto& value) {
      for (std::int64_t r = r0; r < std::min(r0 + 128, kRows); ++r)
        for (std::int64_t c = c0; c < std::min(c0 + 128, kCols); ++c) values[index(r, c)] = value(r, c);
    };
    fill(128, 128, [](std::int64_t, std::int64_t) { return std::uint16_t{0}; });                                // all zero
    fill(0, 256, [](std::int64_t r, std::int64_t c) { return static_cast<std::uint16_t>((r * 7 + c) % 128); });  // subnormal
    fill(256, 384, [](std::int64_t r, std::int64_t) { return bf16_bits(r % 2 ? 3.0e38f : -1.0e30f); });          // huge, edge block
    values[index(150, 3)] = 0x7FC0;  // NaN in block (1, 0), which the cut at 200 splits

    scales_shape = layout::scale_shape({kRows, kCols}, config);
    blocks = scales_shape[0] * scales_shape[1];
    want_codes.resize(values.size());
    want_scales.resize(static_cast<std::size_t>(blocks));
    for (std::int64_t r = 0; r < kRows; r += 128)
      layout::quantize_band(config, DType::kBF16, values.data() + r * kCols, std::min<std::int64_t>(128, kRows - r), kCols,
                            want_codes.data() + r * kCols, want_scales.data() + r / 128 * scales_shape[1]);
    top.assign(values.begin(), values.begin() + kCut * kCols);
    bottom_t.resize(static_cast<std::size_t>((kRows - kCut) * kCols));
    for (std::int64_t r = kCut; r < kRows; ++r)
      for (std::int64_t c = 0; c < kCols; ++c) bottom_t[static_cast<std::size_t>(c * (kRows - kCut) + (r - kCut))] = values[index(r, c)];
  }

  static std::size_t index(std::int64_t r, std::int64_t c) { return static_cast<std::size_t>(r * kCols + c); }

  /// The two parameters' copy items, over the memory the caller gives (device or host).
  std::vector<exec::Fp8CopyItem> items(const std::uint16_t* top_source, std::uint8_t* top_codes, const std::uint16_t* bottom_source,
                                       std::uint8_t* bottom_codes, std::uint32_t* amax_bits, const float* factors) const {
    std::vector<exec::Fp8CopyItem> out(2);
    for (exec::Fp8CopyItem& item : out) {
      item.amax_bits = amax_bits;
      item.factors = factors;
      item.cols = kCols;
      item.scale_cols = scales_shape[1];
    }
    out[0].source = top_source;
    out[0].codes = top_codes;
    out[0].rows = kCut;
    out[0].stride0 = kCols;
    out[1].source = bottom_source;
    out[1].codes = bottom_codes;
    out[1].row0 = kCut;
    out[1].rows = kRows - kCut;
    out[1].stride0 = 1;
    out[1].stride1 = kRows - kCut;
    return out;
  }

  /// The code the parameters hold for tensor element (r, c).
  std::uint8_t code_at(const std::vector<std::uint8_t>& top_codes, const std::vector<std::uint8_t>& bottom_codes, std::int64_t r,
                       std::int64_t c) const {
    return r < kCut ? top_codes[index(r, c)] : bottom_codes[static_cast<std::size_t>(c * (kRows - kCut) + (r - kCut))];
  }
};

}  // namespace testing_support
}  // namespace wb
