// The FP8 quantize kernels' per-thread source (exec/fp8_kernel_body.hpp, what kernels/fp8_quantize_kernel.cu
// runs in every thread) executed on the host over the kernels' own grid, thread by thread, against the
// host's reference form: every element and block a thread reaches, the amax folds, the scales and the codes,
// bit for bit, for the three scale rules. The device itself (atomics, intrinsics, launches) is checked by
// tests/gpu/test_fp8_kernel.cpp where a GPU is.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "../support/fp8_kernel_case.hpp"
#include "core/fp8.hpp"
#include "exec/fp8_kernel_body.hpp"

namespace wb {
namespace {

using testing_support::Fp8KernelCase;

// The launch shape of kernels/fp8_quantize_kernel.cu: 64 blocks of 256 threads per item.
constexpr std::int64_t kItemThreads = 64 * 256;

TEST(Fp8KernelBody, E4m3CastEqualsTheHostsOnEveryFloatBitPattern) {
  // Every 7th pattern of all 2^32 (both signs, NaN, Inf, subnormals) and every pattern near each rounding
  // boundary of the normal range: the low 20 bits around a half step.
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 7) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    ASSERT_EQ(exec::fp8_body::e4m3_from_float(x), fp8::e4m3_from_float(x)) << "float bits 0x" << std::hex << bits;
  }
  for (std::uint32_t high = 0; high < (1u << 12); ++high)
    for (std::uint32_t low : {0x7FFFEu, 0x7FFFFu, 0x80000u, 0x80001u, 0xFFFFFu, 0x00000u, 0x00001u}) {
      const float x = std::bit_cast<float>((high << 20) | low);
      ASSERT_EQ(exec::fp8_body::e4m3_from_float(x), fp8::e4m3_from_float(x)) << "float bits 0x" << std::hex << ((high << 20) | low);
    }
}

TEST(Fp8KernelBody, ScaleOfEveryAmaxEqualsTheHostsBlockScale) {
  // Every magnitude a bf16 block's amax can have: finite, Inf and the NaNs, whose amax the host folds to its
  // canonical quiet NaN (core/fp8_kernels.cpp), as the kernel's scale does from any NaN's bits.
  for (int r = 0; r < fp8::kNumScaleRules; ++r) {
    const auto rule = static_cast<fp8::ScaleRule>(r);
    for (std::uint32_t b = 0; b <= 0x7FFFu; ++b) {
      const float amax = b > 0x7F80u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(b << 16);
      float scale = 0, factor = 0;
      exec::fp8_body::block_scale(b << 16, rule, scale, factor);
      const fp8::BlockScale want = fp8::block_scale(rule, amax);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(scale), std::bit_cast<std::uint32_t>(want.scale_inv))
          << fp8::scale_rule_name(rule) << ", amax " << amax;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(factor), std::bit_cast<std::uint32_t>(want.factor))
          << fp8::scale_rule_name(rule) << ", amax " << amax;
      ASSERT_EQ(rule == fp8::ScaleRule::kPlain, want.divide);
    }
  }
}

class Fp8KernelBodyGrid : public ::testing::TestWithParam<fp8::ScaleRule> {};

TEST_P(Fp8KernelBodyGrid, EveryCodeAndScaleOfTheKernelsGridEqualsTheHostReference) {
  const Fp8KernelCase c(GetParam());
  const auto blocks = static_cast<std::size_t>(c.blocks);
  std::vector<std::uint8_t> top_codes(c.top.size(), 0xAA), bottom_codes(c.bottom_t.size(), 0xAA);
  std::vector<std::uint32_t> amax(blocks, 0);
  std::vector<float> scales(blocks), factors(blocks);
  const std::vector<exec::Fp8CopyItem> items =
      c.items(c.top.data(), top_codes.data(), c.bottom_t.data(), bottom_codes.data(), amax.data(), factors.data());
  // The amax launch: every thread of every item, folding into its blocks as the atomic max does.
  for (const exec::Fp8CopyItem& item : items)
    for (std::int64_t t = 0; t < kItemThreads; ++t)
      exec::fp8_body::amax_thread(item, t, kItemThreads, [&](std::int64_t block, std::uint32_t bits) {
        ASSERT_GE(block, 0);
        ASSERT_LT(block, c.blocks);
        amax[static_cast<std::size_t>(block)] = std::max(amax[static_cast<std::size_t>(block)], bits);
      });
  // locate maps the items' elements one to one onto the tensor's.
  std::vector<int> reads(c.values.size(), 0);
  for (std::int64_t k = 0; k < items[0].rows * items[0].cols; ++k) {
    std::int64_t element = 0, block = 0;
    exec::fp8_body::locate(items[0], k, element, block);
    ++reads[static_cast<std::size_t>(element)];
  }
  for (std::int64_t k = 0; k < items[1].rows * items[1].cols; ++k) {
    std::int64_t element = 0, block = 0;
    exec::fp8_body::locate(items[1], k, element, block);
    const std::int64_t i = k / c.kCols, j = k % c.kCols;
    ASSERT_EQ(element, j * (c.kRows - c.kCut) + i);
    ASSERT_EQ(block, (c.kCut + i) / 128 * c.scales_shape[1] + j / 128);
    ++reads[c.index(c.kCut, 0) + static_cast<std::size_t>(element)];
  }
  ASSERT_TRUE(std::all_of(reads.begin(), reads.end(), [](int n) { return n == 1; }));
  // The scale launch, block by block; then the cast launch, twice, over codes filled with two different
  // values first: a code the threads leave unwritten differs from the reference in one of the two.
  for (std::size_t b = 0; b < blocks; ++b) exec::fp8_body::block_scale(amax[b], c.config.rule, scales[b], factors[b]);
  const auto cast = [&] {
    for (const exec::Fp8CopyItem& item : items)
      for (std::int64_t t = 0; t < kItemThreads; ++t) exec::fp8_body::cast_thread(item, t, kItemThreads, c.config.rule);
  };
  cast();
  std::vector<std::uint8_t> first_top = top_codes, first_bottom = bottom_codes;
  std::fill(top_codes.begin(), top_codes.end(), std::uint8_t{0x55});
  std::fill(bottom_codes.begin(), bottom_codes.end(), std::uint8_t{0x55});
  cast();
  ASSERT_TRUE(first_top == top_codes && first_bottom == bottom_codes) << "the cast threads left codes unwritten";
  for (std::size_t b = 0; b < blocks; ++b)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(scales[b]), std::bit_cast<std::uint32_t>(c.want_scales[b]))
        << "scale of block " << b << ": " << scales[b] << " vs " << c.want_scales[b];
  for (std::int64_t r = 0; r < c.kRows; ++r)
    for (std::int64_t col = 0; col < c.kCols; ++col)
      ASSERT_EQ(c.code_at(top_codes, bottom_codes, r, col), c.want_codes[c.index(r, col)]) << "code of element (" << r << ", " << col << ")";
}

INSTANTIATE_TEST_SUITE_P(Rules, Fp8KernelBodyGrid,
                         ::testing::Values(fp8::ScaleRule::kPlain, fp8::ScaleRule::kPerBlockCast, fp8::ScaleRule::kUe8m0),
                         [](const ::testing::TestParamInfo<fp8::ScaleRule>& info) { return testing_support::scale_rule_test_name(info.param); });

}  // namespace
}  // namespace wb
