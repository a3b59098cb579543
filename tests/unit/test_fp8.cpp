// FP8 block quantization against an independent reference written here: the e4m3fn values enumerated
// from the format's definition and the nearest one searched in double precision (ties to the even code),
// the three scale rules as the engines write them, in float32, and the block grid walked element by element.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "exec/fp8_cast_program.hpp"
#include "exec/pack.hpp"
#include "exec/quantized_pack.hpp"
#include "layout/fp8_form.hpp"
#include "../support/expect_error.hpp"
#include "../support/memory_checkpoint.hpp"
#include "../support/setting_scope.hpp"

namespace wb {
namespace {

using layout::QuantizationConfig;
using fp8::ScaleRule;

// ---- the reference ----

/// Value of every non-negative finite e4m3fn code 0x00..0x7E, from the definition: subnormals k * 2^-9,
/// normals (8 + m) * 2^(e - 10) for exponent field e in 1..15 (e = 15, m = 7 is NaN).
const std::vector<double>& reference_values() {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (int k = 0; k < 8; ++k) v.push_back(k / 512.0);
    for (int e = 1; e <= 15; ++e)
      for (int m = 0; m < 8; ++m)
        if (!(e == 15 && m == 7)) v.push_back((8 + m) * std::pow(2.0, e - 10));
    return v;
  }();
  return values;
}

std::uint8_t reference_cast(float x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const double a = std::fabs(static_cast<double>(x));
  const std::vector<double>& values = reference_values();
  if (a >= values.back()) return sign | 0x7E;
  std::size_t best = 0;
  for (std::size_t code = 1; code < values.size(); ++code) {
    const double d = std::fabs(values[code] - a), best_d = std::fabs(values[best] - a);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return static_cast<std::uint8_t>(sign | best);
}

float reference_pow2_at_least(float m) {
  double p = std::pow(2.0, -150);
  while (p < static_cast<double>(m)) p *= 2.0;
  return static_cast<float>(p);
}

struct RefScale {
  float scale_inv;
  std::function<float(float)> scaled;
};

RefScale reference_scale(ScaleRule rule, float amax) {
  switch (rule) {
    case ScaleRule::kPlain: {
      const float s = amax == 0.0f ? 1.0f : amax / 448.0f;
      return {s, [s](float x) { return x / s; }};
    }
    case ScaleRule::kPerBlockCast: {
      const float a = std::isnan(amax) ? amax : std::max(amax, 1e-4f);
      const float f = 448.0f / a;
      return {a / 448.0f, [f](float x) { return x * f; }};
    }
    case ScaleRule::kUe8m0: {
      const float a = std::isnan(amax) ? amax : std::max(amax, 1e-4f);
      const float q = a / 448.0f;
      const float s = std::isnan(q) || std::isinf(q) ? q : reference_pow2_at_least(q);
      const float inv = 1.0f / s;
      return {s, [inv](float x) { return x * inv; }};
    }
  }
  return {};
}

float bf16_value(std::uint16_t bits) {
  std::uint32_t wide = std::uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

std::uint16_t bf16_bits(float f) {  // truncation: any bf16 pattern is as good as another for the tests
  std::uint32_t wide;
  std::memcpy(&wide, &f, 4);
  return static_cast<std::uint16_t>(wide >> 16);
}

/// The whole tensor quantized element by element on the block grid.
void reference_quantize(const std::vector<std::uint16_t>& x, std::int64_t rows, std::int64_t cols,
                        const QuantizationConfig& config, std::vector<std::uint8_t>& q, std::vector<float>& s) {
  const std::int64_t br = (rows + config.block_rows - 1) / config.block_rows;
  const std::int64_t bc = (cols + config.block_cols - 1) / config.block_cols;
  std::vector<float> amax(static_cast<std::size_t>(br * bc), 0.0f);
  std::vector<bool> nan(amax.size(), false);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t b = static_cast<std::size_t>((r / config.block_rows) * bc + c / config.block_cols);
      const float v = std::fabs(bf16_value(x[static_cast<std::size_t>(r * cols + c)]));
      if (std::isnan(v)) nan[b] = true;
      else amax[b] = std::max(amax[b], v);
    }
  s.assign(amax.size(), 0.0f);
  std::vector<RefScale> scales;
  for (std::size_t b = 0; b < amax.size(); ++b) {
    scales.push_back(reference_scale(config.rule, nan[b] ? std::numeric_limits<float>::quiet_NaN() : amax[b]));
    s[b] = scales.back().scale_inv;
  }
  q.assign(x.size(), 0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      const std::size_t b = static_cast<std::size_t>((r / config.block_rows) * bc + c / config.block_cols);
      q[i] = reference_cast(scales[b].scaled(bf16_value(x[i])));
    }
}

// ---- a checkpoint in memory ----

using testing::MemoryCheckpoint;

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

// ---- the cast ----

TEST(Fp8Cast, EveryBf16ValueRoundsAsTheReference) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float x = bf16_value(static_cast<std::uint16_t>(bits));
    ASSERT_EQ(fp8::e4m3_from_float(x), reference_cast(x)) << "bf16 0x" << std::hex << bits << " = " << x;
  }
}

// The bulk kernels (SSE2 / AVX2) against the reference cast: every bf16 value, scaled as each rule scales
// blocks of several amaxes (tiny ones make many products subnormal or zero in e4m3, huge ones saturate),
// at every offset of a run so that vector bodies and scalar tails both see every value.
TEST(Fp8Bulk, QuantizeEveryBf16ValueAsTheReference) {
  std::vector<std::uint16_t> values(0x10000 + 37);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = static_cast<std::uint16_t>(k * 40503u);  // a permutation
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) values[bits] = static_cast<std::uint16_t>(bits);
  std::vector<std::uint8_t> codes(values.size());
  for (const ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0})
    for (const float amax : {0.0f, 1e-30f, 3e-5f, 0.02f, 1.0f, 448.0f, 3e9f}) {
      const fp8::BlockScale scale = fp8::block_scale(rule, amax);
      for (const std::size_t start : {std::size_t{0}, std::size_t{5}, std::size_t{17}}) {
        const std::int64_t count = static_cast<std::int64_t>(values.size() - start);
        fp8::quantize_bf16(scale, values.data() + start, count, codes.data());
        for (std::int64_t k = 0; k < count; ++k) {
          const float x = bf16_value(values[start + static_cast<std::size_t>(k)]);
          const float y = scale.divide ? x / scale.factor : x * scale.factor;
          ASSERT_EQ(codes[static_cast<std::size_t>(k)], reference_cast(y))
              << fp8::scale_rule_name(rule) << " amax " << amax << ": bf16 " << x << " at " << k;
        }
      }
    }
}

// The senders' cast of a row through its blocks' tables (make_cast_table, quantize_bf16_blocks: the table
// kernel where the CPU has AVX-512 VBMI, the float path for the elements and scales it does not cover):
// every bf16 value, in each of three blocks of different scales, at several leads into the first block,
// as the reference cast of x * factor (or x / factor), in the three rules and at amaxes from 0 to 3e9
// (factors that leave the normal floats get no table).
TEST(Fp8Bulk, RowsThroughBlockTablesCastEveryBf16ValueAsTheReference) {
  const std::int64_t block = 0x10000;  // every value in every block
  std::vector<std::uint16_t> values(static_cast<std::size_t>(3 * block));
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = static_cast<std::uint16_t>((k * 40503u) ^ (k >> 16));
  std::vector<std::uint8_t> codes(values.size());
  // (Not a NaN amax: which NaN's sign x * NaN keeps where x is a NaN too is the compiler's choice of
  // operand order, in the reference as in the float path.)
  const float amaxes[] = {0.0f, 1e-30f, 3e-5f, 0.02f, 1.0f, 448.0f, 3e9f, std::numeric_limits<float>::infinity()};
  int tables = 0;
  for (const ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0})
    for (std::size_t a = 0; a < std::size(amaxes); ++a) {
      std::array<fp8::CastTable, 3> blocks;
      for (std::size_t b = 0; b < 3; ++b) {
        fp8::make_cast_table(fp8::block_scale(rule, amaxes[(a + b) % std::size(amaxes)]), blocks[b]);
        tables += blocks[b].table ? 1 : 0;
      }
      for (const std::int64_t lead : {std::int64_t{0}, std::int64_t{7}, std::int64_t{45}}) {
        const std::int64_t count = static_cast<std::int64_t>(values.size()) - lead - 3;
        fp8::quantize_bf16_blocks(blocks.data(), block, lead, values.data(), count, codes.data());
        for (std::int64_t k = 0; k < count; ++k) {
          const fp8::BlockScale& scale = blocks[static_cast<std::size_t>((lead + k) / block)].scale;
          const float x = bf16_value(values[static_cast<std::size_t>(k)]);
          const float y = scale.divide ? x / scale.factor : x * scale.factor;
          ASSERT_EQ(codes[static_cast<std::size_t>(k)], reference_cast(y))
              << fp8::scale_rule_name(rule) << " amax " << amaxes[a] << " lead " << lead << ": bf16 " << x << " at " << k;
        }
      }
    }
  if (__builtin_cpu_supports("avx512vbmi")) {
    EXPECT_GT(tables, 30);  // the table kernel ran
  }
}

// The table kernel's own path (no zero, NaN or subnormal in a run): all 65,536 bf16 values in order, in
// blocks of 128 (one sign and exponent each, every mantissa), so that most runs are normal values that the
// tables cast; the runs of exponent 0 (zeros, subnormals) and 255 (infinities, NaNs) and those whose outputs
// fall below e4m3's normals go to the float path. Three rules, amaxes from 1e-35 (the plain rule's factor
// then too large for a table whose zeros stay below code 8: no table) to 3e9 (a block's scale need not be
// its own amax here), leads that cut runs anywhere: every code as the reference's.
TEST(Fp8Bulk, TableRunsOfEveryExponentCastAsTheReference) {
  const std::int64_t block = 128;
  std::vector<std::uint16_t> values(0x10000);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = static_cast<std::uint16_t>(k);
  std::vector<std::uint8_t> codes(values.size());
  fp8::CastTable huge_factor;
  fp8::make_cast_table(fp8::block_scale(ScaleRule::kPlain, 1e-35f), huge_factor);
  EXPECT_FALSE(huge_factor.table);
  const float amaxes[] = {1e-35f, 1e-30f, 3e-5f, 0.02f, 1.0f, 448.0f, 3e9f};
  std::int64_t by_table = 0;
  for (const ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0})
    for (const float amax : amaxes)
      for (const std::int64_t lead : {std::int64_t{0}, std::int64_t{5}, std::int64_t{77}}) {
        const std::int64_t count = static_cast<std::int64_t>(values.size()) - lead;
        std::vector<fp8::CastTable> tables(static_cast<std::size_t>((lead + count + block - 1) / block));
        for (std::size_t g = 0; g < tables.size(); ++g)  // neighbouring blocks of different scales
          fp8::make_cast_table(fp8::block_scale(rule, g % 2 == 0 ? amax : amax * 3.0f), tables[g]);
        by_table += fp8::quantize_bf16_blocks(tables.data(), block, lead, values.data() + lead, count, codes.data());
        for (std::int64_t k = 0; k < count; ++k) {
          const fp8::BlockScale& scale = tables[static_cast<std::size_t>((lead + k) / block)].scale;
          const float x = bf16_value(values[static_cast<std::size_t>(lead + k)]);
          const float y = scale.divide ? x / scale.factor : x * scale.factor;
          ASSERT_EQ(codes[static_cast<std::size_t>(k)], reference_cast(y))
              << fp8::scale_rule_name(rule) << " amax " << amax << " lead " << lead << ": bf16 0x" << std::hex
              << values[static_cast<std::size_t>(lead + k)];
        }
      }
  if (__builtin_cpu_supports("avx512vbmi")) {
    EXPECT_GT(by_table, 18 * 0x10000 / 4);  // the tables cast most of them (about a third of each rule's runs)
  } else {
    EXPECT_EQ(by_table, 0);
  }
}

// A run the tables cover but for one element (a NaN, an infinity, a zero, a subnormal input, an output
// below e4m3's normals) at any place: the whole run by the float path, every code as the reference's.
TEST(Fp8Bulk, OneElementOutsideATableSendsItsRunToTheFloatPath) {
  const std::int64_t block = 128;
  const fp8::BlockScale scale = fp8::block_scale(ScaleRule::kPerBlockCast, 0.5f);
  fp8::CastTable tables[2];
  fp8::make_cast_table(scale, tables[0]);
  tables[1] = tables[0];
  std::mt19937 generator(11);
  std::vector<std::uint16_t> values(static_cast<std::size_t>(2 * block));
  std::vector<std::uint8_t> codes(values.size());
  const std::uint16_t odd[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x8070, 0x3000, 0xB000};
  for (const std::uint16_t special : odd)
    for (std::size_t at = 0; at < values.size(); at += 37) {
      for (std::uint16_t& v : values) v = static_cast<std::uint16_t>(0x3C00u + generator() % 0x380u);  // |x| in [2^-7, 0.5)
      if (generator() % 2 == 0)
        for (std::uint16_t& v : values) v = static_cast<std::uint16_t>(v | 0x8000u);
      values[at] = special;
      const std::int64_t by_table = fp8::quantize_bf16_blocks(tables, block, 0, values.data(), 2 * block, codes.data());
      for (std::size_t k = 0; k < values.size(); ++k)
        ASSERT_EQ(codes[k], reference_cast(bf16_value(values[k]) * scale.factor))
            << "special 0x" << std::hex << special << " at " << std::dec << at << ", element " << k;
      if (__builtin_cpu_supports("avx512vbmi")) {
        EXPECT_EQ(by_table, block) << "special 0x" << std::hex << special;  // the other run by its table
      }
    }
}

// The column maxima of magnitudes over rows, whose bf16_amax is the rows' amax (NaN above infinity).
TEST(Fp8Bulk, MagnitudeMaximaOverRowsGiveTheAmax) {
  std::mt19937 generator(5);
  for (int trial = 0; trial < 100; ++trial) {
    const std::size_t cols = 1 + generator() % 300, rows = 1 + generator() % 5;
    std::vector<std::uint16_t> running(cols, 0);
    float expected = 0.0f;
    for (std::size_t r = 0; r < rows; ++r) {
      std::vector<std::uint16_t> row(cols);
      for (std::uint16_t& v : row) {
        v = static_cast<std::uint16_t>(generator());
        if (trial % 3 != 0 && (v & 0x7F80u) == 0x7F80u) v = static_cast<std::uint16_t>(v & 0xBF80u);  // mostly finite
        expected = fp8::amax_combine(expected, std::fabs(bf16_value(v)));
      }
      fp8::bf16_magnitude_max(row.data(), static_cast<std::int64_t>(cols), running.data());
    }
    const float amax = fp8::bf16_amax(running.data(), static_cast<std::int64_t>(cols));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(amax)) << trial;
    } else {
      EXPECT_EQ(amax, expected) << trial;
    }
  }
}

// A band's rows at once (four streams where the CPU has AVX-512): every column's maximum of the magnitudes'
// bits, over 1 to 13 rows a stride apart, as row by row; the running maxima it starts from kept.
TEST(Fp8Bulk, MagnitudeMaximaOfABandAsRowByRow) {
  std::mt19937 generator(9);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t cols = 1 + generator() % 300, rows = 1 + generator() % 13, stride = cols + generator() % 40;
    std::vector<std::uint16_t> band(static_cast<std::size_t>(rows * stride));
    for (std::uint16_t& v : band) v = static_cast<std::uint16_t>(generator());
    std::vector<std::uint16_t> running(static_cast<std::size_t>(cols)), expected;
    for (std::uint16_t& v : running) v = static_cast<std::uint16_t>(generator() % 0x4000u);
    expected = running;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        std::uint16_t& e = expected[static_cast<std::size_t>(c)];
        e = std::max<std::uint16_t>(e, band[static_cast<std::size_t>(r * stride + c)] & 0x7FFFu);
      }
    fp8::bf16_magnitude_max_rows(band.data(), stride, rows, cols, running.data());
    ASSERT_EQ(running, expected) << "trial " << trial << ": " << rows << " rows of " << cols;
  }
}

// The speculative cast of rows through tables of scales taken before (quantize_bf16_blocks_tracking): each
// block's |x| maxima folded into its lanes over several rows (bf16_amax of them the block's amax, NaN above
// infinity), and, where a table's scale is the one the block's amax gives (every |x| within it), every code
// as the reference's; leads that cut the first block, the three rules, zeros and subnormals in some runs.
TEST(Fp8Bulk, TrackingCastFoldsEachBlocksMagnitudesAndCastsAsTheReferenceUnderItsOwnScale) {
  std::mt19937 generator(21);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::int64_t block = 128;
  for (const ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0})
    for (int trial = 0; trial < 12; ++trial) {
      const std::int64_t lead = trial % 3 == 0 ? 0 : static_cast<std::int64_t>(generator() % block);
      const std::int64_t count = 1 + static_cast<std::int64_t>(generator() % (5 * block)), rows = 1 + trial % 4;
      const std::int64_t runs = (lead + count + block - 1) / block;
      std::vector<std::uint16_t> values(static_cast<std::size_t>(rows * count));
      for (std::uint16_t& v : values) v = bf16_bits(normal(generator));
      for (int k = 0; k < trial; ++k) values[generator() % values.size()] = static_cast<std::uint16_t>(generator() % 2 ? 0 : 0x8003);
      if (trial % 4 == 3) values[generator() % values.size()] = 0x7FC0;  // a NaN: its block's amax is NaN
      // Each run's own amax over the rows, and its scale: the tables every |x| of a block is within.
      std::vector<float> amax(static_cast<std::size_t>(runs), 0.0f);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < count; ++k) {
          float& a = amax[static_cast<std::size_t>((lead + k) / block)];
          a = fp8::amax_combine(a, std::fabs(bf16_value(values[static_cast<std::size_t>(r * count + k)])));
        }
      std::vector<fp8::CastTable> tables(static_cast<std::size_t>(runs));
      for (std::size_t g = 0; g < tables.size(); ++g) fp8::make_cast_table(fp8::block_scale(rule, amax[g]), tables[g]);
      std::vector<std::uint16_t> lanes(static_cast<std::size_t>(fp8::kMagnitudeLanes * runs), 0);
      std::vector<std::uint8_t> codes(values.size());
      for (std::int64_t r = 0; r < rows; ++r)
        fp8::quantize_bf16_blocks_tracking(tables.data(), block, lead, values.data() + r * count, count, codes.data() + r * count,
                                           lanes.data());
      for (std::int64_t g = 0; g < runs; ++g) {
        const float folded = fp8::bf16_amax(lanes.data() + fp8::kMagnitudeLanes * g, fp8::kMagnitudeLanes);
        ASSERT_TRUE(same_bits(folded, amax[static_cast<std::size_t>(g)]) ||
                    (std::isnan(folded) && std::isnan(amax[static_cast<std::size_t>(g)])))
            << fp8::scale_rule_name(rule) << " trial " << trial << " block " << g << ": " << folded << " against " << amax[static_cast<std::size_t>(g)];
        if (std::isnan(amax[static_cast<std::size_t>(g)])) continue;  // (which NaN x * NaN gives: the compiler's choice)
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t k = std::max<std::int64_t>(0, g * block - lead); k < std::min(count, (g + 1) * block - lead); ++k) {
            const fp8::BlockScale& scale = tables[static_cast<std::size_t>(g)].scale;
            const float x = bf16_value(values[static_cast<std::size_t>(r * count + k)]);
            ASSERT_EQ(codes[static_cast<std::size_t>(r * count + k)], reference_cast(scale.divide ? x / scale.factor : x * scale.factor))
                << fp8::scale_rule_name(rule) << " trial " << trial << " row " << r << " element " << k;
          }
      }
    }
}

TEST(Fp8Bulk, AmaxOfRunsAsTheElementwiseFold) {
  std::mt19937 generator(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::uint16_t> values(static_cast<std::size_t>(generator() % 300));
    for (std::uint16_t& v : values) v = static_cast<std::uint16_t>(generator());
    if (trial % 3 == 0)  // no NaN or infinity: exponent field below 0xFF
      for (std::uint16_t& v : values) v = static_cast<std::uint16_t>(v & 0xBFFFu);
    float expected = 0.0f;
    for (const std::uint16_t v : values) expected = fp8::amax_combine(expected, std::fabs(bf16_value(v)));
    const float got = fp8::bf16_amax(values.data(), static_cast<std::int64_t>(values.size()));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(expected)) << "trial " << trial;
  }
}

TEST(Fp8Cast, TiesAndNeighboursOfEveryMidpointRoundToEven) {
  const std::vector<double>& values = reference_values();
  int ties = 0;
  for (std::size_t code = 0; code + 1 < values.size(); ++code) {
    const float mid = static_cast<float>((values[code] + values[code + 1]) / 2);  // exact in float32
    ASSERT_EQ(static_cast<double>(mid), (values[code] + values[code + 1]) / 2);
    for (const float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      ASSERT_EQ(fp8::e4m3_from_float(x), reference_cast(x)) << x;
    }
    EXPECT_EQ(fp8::e4m3_from_float(mid) % 2, 0) << "tie at " << mid << " not to even";
    ++ties;
  }
  EXPECT_EQ(ties, 126);  // between the 127 non-negative finite codes
  // Saturation, infinities, NaN, float32 subnormals.
  EXPECT_EQ(fp8::e4m3_from_float(448.0f), 0x7E);
  EXPECT_EQ(fp8::e4m3_from_float(463.99f), 0x7E);
  EXPECT_EQ(fp8::e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(fp8::e4m3_from_float(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(fp8::e4m3_from_float(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(fp8::e4m3_from_float(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(fp8::e4m3_from_float(-std::numeric_limits<float>::denorm_min()), 0x80);
}

TEST(Fp8Cast, RandomFloat32AndDecodeRoundTrip) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t bits = any(gen);
    // Most random patterns are far outside e4m3's range: bring the exponent near it half of the time.
    if (i % 2 == 0) bits = (bits & 0x807FFFFFu) | ((110u + bits % 30u) << 23);
    const float x = std::bit_cast<float>(bits);
    ASSERT_EQ(fp8::e4m3_from_float(x), reference_cast(x)) << x;
  }
  for (int code = 0; code < 256; ++code) {
    const float v = fp8::e4m3_to_float(static_cast<std::uint8_t>(code));
    if ((code & 0x7F) == 0x7F) EXPECT_TRUE(std::isnan(v));
    else EXPECT_EQ(fp8::e4m3_from_float(v), code) << code;
  }
}

// ---- the scale rules on blocks ----

enum class Fill { kRandom, kConstant, kZero, kSubnormal, kHuge, kNan, kInf, kTiny };

std::vector<std::uint16_t> fill(Fill kind, std::int64_t n, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) {
    switch (kind) {
      case Fill::kRandom: x[i] = bf16_bits(normal(gen) * (i % 7 == 0 ? 50.0f : 1.0f)); break;
      case Fill::kConstant: x[i] = bf16_bits(-0.3125f); break;
      case Fill::kZero: x[i] = (i % 3 == 0) ? 0x8000 : 0x0000; break;  // zeros of both signs
      case Fill::kSubnormal: x[i] = static_cast<std::uint16_t>((gen() % 0x7F) + 1 + (i % 2 ? 0x8000 : 0)); break;
      case Fill::kHuge: x[i] = static_cast<std::uint16_t>(0x7F00 + gen() % 0x7F + (i % 2 ? 0x8000 : 0)); break;
      case Fill::kNan: x[i] = (i == 5) ? 0x7FC1 : bf16_bits(normal(gen)); break;
      case Fill::kInf: x[i] = (i == 9) ? 0xFF80 : bf16_bits(normal(gen)); break;
      case Fill::kTiny: x[i] = bf16_bits(normal(gen) * 1e-5f); break;  // amax under the 1e-4 clamp
    }
  }
  return x;
}

struct BlockCase {
  ScaleRule rule;
  Fill fill;
  std::int64_t block_rows, block_cols;
};

class Fp8Blocks : public ::testing::TestWithParam<BlockCase> {};

// A tensor of several blocks with edge blocks on both axes, read whole and by odd boxes through the FP8
// form, against the reference bit for bit.
TEST_P(Fp8Blocks, FormEqualsTheReference) {
  const BlockCase& c = GetParam();
  std::mt19937 gen(static_cast<unsigned>(c.block_rows * 31 + c.block_cols + static_cast<int>(c.fill) * 7 +
                                         static_cast<int>(c.rule) * 1000));
  const std::int64_t rows = 2 * c.block_rows + c.block_rows / 2 + 1, cols = 3 * c.block_cols - c.block_cols / 3;
  MemoryCheckpoint source;
  source.add({"model.layers.0.mlp.down_proj.weight", DType::kBF16, {rows, cols}}, fill(c.fill, rows * cols, gen));
  source.add({"model.norm.weight", DType::kBF16, {cols}}, fill(Fill::kRandom, cols, gen));
  QuantizationConfig config;
  config.block_rows = c.block_rows;
  config.block_cols = c.block_cols;
  config.rule = c.rule;
  const layout::Fp8Form form = layout::derive_fp8_form(source.tensors(), config);
  ASSERT_EQ(form.tensors.size(), 3u);
  const auto reader = layout::open_fp8_form(source, form);

  std::vector<std::uint16_t> x(static_cast<std::size_t>(rows * cols));
  source.read("model.layers.0.mlp.down_proj.weight", x.data());
  std::vector<std::uint8_t> want_q;
  std::vector<float> want_s;
  reference_quantize(x, rows, cols, config, want_q, want_s);

  std::vector<std::uint8_t> got_q(want_q.size());
  reader->read("model.layers.0.mlp.down_proj.weight", got_q.data());
  const Shape sshape = form.tensors[1].shape;
  ASSERT_EQ(sshape, (Shape{(rows + c.block_rows - 1) / c.block_rows, (cols + c.block_cols - 1) / c.block_cols}));
  std::vector<float> got_s(want_s.size());
  reader->read("model.layers.0.mlp.down_proj.weight_scale_inv", got_s.data());
  for (std::size_t b = 0; b < want_s.size(); ++b)
    ASSERT_TRUE(same_bits(got_s[b], want_s[b])) << "block " << b << ": " << got_s[b] << " vs " << want_s[b];
  for (std::size_t i = 0; i < want_q.size(); ++i)
    ASSERT_EQ(got_q[i], want_q[i]) << "element " << i << " (" << bf16_value(x[i]) << ")";
  if (c.fill == Fill::kZero) {
    for (float s : got_s) EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << s;
    for (std::uint8_t q : got_q) EXPECT_EQ(q & 0x7F, 0);
  }

  // Odd boxes of both tensors.
  const Box box{{c.block_rows / 2 + 1, 1}, {rows - c.block_rows / 2 - 2, cols - 2}};
  std::vector<std::uint8_t> part(static_cast<std::size_t>(box.numel()));
  reader->read_box("model.layers.0.mlp.down_proj.weight", box, part.data());
  for (std::int64_t r = 0; r < box.extent[0]; ++r)
    for (std::int64_t col = 0; col < box.extent[1]; ++col)
      ASSERT_EQ(part[static_cast<std::size_t>(r * box.extent[1] + col)],
                want_q[static_cast<std::size_t>((r + box.offset[0]) * cols + col + box.offset[1])]);
  std::vector<float> scale_part(static_cast<std::size_t>(sshape[0] - 1));
  reader->read_box("model.layers.0.mlp.down_proj.weight_scale_inv", Box{{1, sshape[1] - 1}, {sshape[0] - 1, 1}},
                   scale_part.data());
  for (std::int64_t r = 0; r + 1 < sshape[0]; ++r)
    ASSERT_TRUE(same_bits(scale_part[static_cast<std::size_t>(r)],
                          want_s[static_cast<std::size_t>((r + 1) * sshape[1] + sshape[1] - 1)]));
  // The norm is copied.
  std::vector<std::uint16_t> norm(static_cast<std::size_t>(cols)), norm_form(norm.size());
  source.read("model.norm.weight", norm.data());
  reader->read("model.norm.weight", norm_form.data());
  EXPECT_EQ(norm, norm_form);
}

std::vector<BlockCase> block_cases() {
  std::vector<BlockCase> cases;
  for (ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0})
    for (Fill f : {Fill::kRandom, Fill::kConstant, Fill::kZero, Fill::kSubnormal, Fill::kHuge, Fill::kNan, Fill::kInf,
                   Fill::kTiny})
      cases.push_back({rule, f, 128, 128});
  for (ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0}) {
    cases.push_back({rule, Fill::kRandom, 64, 32});
    cases.push_back({rule, Fill::kRandom, 1, 32});
    cases.push_back({rule, Fill::kSubnormal, 16, 8});
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<BlockCase>& info) {
  static const char* fills[] = {"random", "constant", "zero", "subnormal", "huge", "nan", "inf", "tiny"};
  std::string name(fp8::scale_rule_name(info.param.rule));
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name + "_" + fills[static_cast<int>(info.param.fill)] + "_" + std::to_string(info.param.block_rows) + "x" +
         std::to_string(info.param.block_cols);
}

// What gtest prints of a case (and ctest's discovered names carry): its name, not its bytes, whose padding
// is not initialized (names that changed between discoveries).
void PrintTo(const BlockCase& c, std::ostream* out) { *out << case_name(::testing::TestParamInfo<BlockCase>(c, 0)); }

INSTANTIATE_TEST_SUITE_P(Rules, Fp8Blocks, ::testing::ValuesIn(block_cases()), case_name);

TEST(Fp8Rules, AllZeroAndNonFiniteBlocks) {
  // Plain: 0 / 0 would be NaN; we give scale 1 and zeros.
  const fp8::BlockScale plain = fp8::block_scale(ScaleRule::kPlain, 0.0f);
  EXPECT_EQ(plain.scale_inv, 1.0f);
  EXPECT_EQ(fp8::quantize(plain, 0.0f), 0x00);
  EXPECT_EQ(fp8::quantize(plain, -0.0f), 0x80);
  EXPECT_TRUE(same_bits(fp8::block_scale(ScaleRule::kPerBlockCast, 0.0f).scale_inv, 1e-4f / 448.0f));
  EXPECT_TRUE(same_bits(fp8::block_scale(ScaleRule::kUe8m0, 0.0f).scale_inv, 0x1p-22f));  // >= 1e-4/448 = 2.23e-7
  // UE8M0 scales are powers of two, the smallest not below amax / 448: an amax of 448 * 2^k gives 2^k.
  EXPECT_EQ(fp8::block_scale(ScaleRule::kUe8m0, 448.0f).scale_inv, 1.0f);
  EXPECT_EQ(fp8::block_scale(ScaleRule::kUe8m0, std::nextafter(448.0f, 1e9f)).scale_inv, 2.0f);
  for (ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0}) {
    EXPECT_TRUE(std::isnan(fp8::block_scale(rule, std::numeric_limits<float>::quiet_NaN()).scale_inv));
    EXPECT_TRUE(std::isinf(fp8::block_scale(rule, std::numeric_limits<float>::infinity()).scale_inv));
  }
  EXPECT_TRUE(std::isnan(fp8::amax_combine(1.0f, std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(fp8::amax_combine(std::numeric_limits<float>::quiet_NaN(), 1.0f)));
  EXPECT_EQ(fp8::amax_combine(2.0f, 3.0f), 3.0f);
}

// ---- the form's tensor list ----

TEST(Fp8Form, TensorListFromTheConfig) {
  std::vector<TensorInfo> bf16 = {
      {"model.embed_tokens.weight", DType::kBF16, {1000, 512}},
      {"model.layers.0.self_attn.q_proj.weight", DType::kBF16, {513, 512}},
      {"model.layers.0.mlp.gate.weight", DType::kBF16, {8, 512}},
      {"model.layers.0.mlp.gate_proj.weight", DType::kBF16, {1024, 512}},
      {"model.layers.0.input_layernorm.weight", DType::kBF16, {512}},
      {"model.layers.0.self_attn.q_proj.bias", DType::kBF16, {513}},
      {"model.layers.0.counts.weight", DType::kI32, {4, 4}},
      {"lm_head.weight", DType::kBF16, {1000, 512}},
  };
  QuantizationConfig config;
  config.modules_to_not_convert = {"lm_head", "embed_tokens"};
  config.ignored_layers = {"model.layers.0.mlp.gate"};  // a module path: not gate_proj
  config.block_rows = 256;
  config.block_cols = 100;
  const layout::Fp8Form form = layout::derive_fp8_form(bf16, config);
  std::vector<std::string> names;
  for (const TensorInfo& t : form.tensors) names.push_back(t.name + ":" + std::string(dtype_name(t.dtype)) + shape_to_string(t.shape));
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.embed_tokens.weight:bf16[1000, 512]",
                       "model.layers.0.self_attn.q_proj.weight:f8e4m3[513, 512]",
                       "model.layers.0.self_attn.q_proj.weight_scale_inv:f32[3, 6]",
                       "model.layers.0.mlp.gate.weight:bf16[8, 512]",
                       "model.layers.0.mlp.gate_proj.weight:f8e4m3[1024, 512]",
                       "model.layers.0.mlp.gate_proj.weight_scale_inv:f32[4, 6]",
                       "model.layers.0.input_layernorm.weight:bf16[512]",
                       "model.layers.0.self_attn.q_proj.bias:bf16[513]",
                       "model.layers.0.counts.weight:i32[4, 4]",
                       "lm_head.weight:bf16[1000, 512]",
                   }));
  EXPECT_EQ(form.sources[2].role, layout::FormRole::kScale);
  EXPECT_EQ(form.sources[2].source, 1u);
  EXPECT_EQ(form.total_bytes(), 1000u * 512 * 2 * 2 + 513u * 512 + 18 * 4 + 8 * 512 * 2 + 1024 * 512 + 24 * 4 + 512 * 2 +
                                    513 * 2 + 16 * 4);

  bf16.push_back({"model.layers.0.self_attn.q_proj.weight_scale_inv", DType::kF32, {3, 6}});
  testing::expect_error([&] { layout::derive_fp8_form(bf16, config); }, ErrorCode::kInvalidArgument,
                        {"q_proj.weight_scale_inv", "already"});
}

TEST(Fp8Form, ConfigFromSettings) {
  {
    testing::SettingScope scope;
    scope.set("fp8_block", "1x32");
    scope.set("fp8_scale_rule", "ue8m0");
    const QuantizationConfig config = QuantizationConfig::from_settings();
    EXPECT_EQ(config.block_rows, 1);
    EXPECT_EQ(config.block_cols, 32);
    EXPECT_EQ(config.rule, ScaleRule::kUe8m0);
  }
  const QuantizationConfig defaults = QuantizationConfig::from_settings();
  EXPECT_EQ(defaults.block_rows, 128);
  EXPECT_EQ(defaults.block_cols, 128);
  std::int64_t r = 0, c = 0;
  testing::expect_error([&] { layout::parse_block_shape("128x0", r, c, "test"); }, ErrorCode::kInvalidArgument,
                        {"128x0", "positive"});
  testing::expect_error([&] { layout::parse_scale_rule_or_throw("fast", "test"); }, ErrorCode::kInvalidArgument,
                        {"fast", "ue8m0"});
  EXPECT_EQ(fp8::parse_scale_rule("per_block_cast_to_fp8"), ScaleRule::kPerBlockCast);
}

// ---- the senders' cast across updates ----

// A trainer rank holding a [610, 472] tensor whole (5 x 4 blocks, edge blocks on both axes) packs it for
// FP8 engines by Fp8CastProgram over seven updates: every code and scale equals the reference of that
// update's values, in the three rules, whichever way the cast went. The first two read the rows twice (no
// scale yet; then every scale had changed), the third casts with the last update's scales (none changes),
// the fourth changes four of them (a new largest element, a lower one, 3e9, a block of zeros: exactly those
// four blocks cast again), the fifth reads the changed bands twice again, the sixth speculates everywhere
// and moves an element that is not its block's largest by an ulp (no block cast again, its code right).
TEST(Fp8CastProgram, ScalesOfTheLastUpdateAreCheckedAndOnlyChangedBlocksCastAgain) {
  const std::int64_t rows = 610, cols = 472;
  std::mt19937 generator(17);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const ScaleRule rule : {ScaleRule::kPlain, ScaleRule::kPerBlockCast, ScaleRule::kUe8m0}) {
    const std::vector<TensorInfo> infos = {{"w.weight", DType::kBF16, {rows, cols}}};
    std::vector<std::uint16_t> values(static_cast<std::size_t>(rows * cols));
    for (std::uint16_t& v : values) v = bf16_bits(normal(generator));
    const auto at = [&](std::int64_t r, std::int64_t c) -> std::uint16_t& { return values[static_cast<std::size_t>(r * cols + c)]; };
    at(128 + 5, 128 + 7) = bf16_bits(1.0f);  // block (1, 1)'s largest, far above the others
    SourceMap map;
    map.parameters.push_back(infos[0]);
    map.copies.push_back({0, 0, Box::whole(infos[0].shape), 0, {cols, 1}});
    QuantizationConfig config;
    config.rule = rule;
    const layout::Fp8Form form = layout::derive_fp8_form(infos, config);
    exec::QuantizedPack pack(map, form);
    pack.cast_in_pack();
    const std::vector<std::byte*> parameters = {reinterpret_cast<std::byte*>(values.data())};
    const std::vector<std::byte*> memory = pack.form_memory(parameters);
    const SourceMap& fp8_map = pack.form_map();
    std::vector<BufferCopy> copies;
    std::vector<std::int64_t> parameter_bytes;
    std::int64_t buffer_bytes = 0;
    for (const TensorInfo& p : fp8_map.parameters) parameter_bytes.push_back(static_cast<std::int64_t>(p.nbytes()));
    for (const SliceCopy& copy : fp8_map.copies) {
      copies.push_back({copy, buffer_bytes, static_cast<std::uint8_t>(dtype_size(fp8_map.parameters[copy.parameter].dtype))});
      buffer_bytes += copies.back().bytes();
    }
    std::vector<BufferCopy> rest;
    const exec::Fp8CastProgram casts(copies, pack, buffer_bytes, rest);
    const exec::CopyProgram scales(exec::CopyDirection::kPack, rest, parameter_bytes, buffer_bytes);
    ASSERT_EQ(casts.own_amax_blocks(), 20);
    const std::function<void()> updates[] = {
        [] {},
        [] {},
        [] {},
        [&] {
          at(3, 9) = bf16_bits(0.9f);          // block (0, 0): a new largest
          at(128 + 5, 128 + 7) = bf16_bits(0.5f);  // block (1, 1): its largest lower
          at(300, 400) = bf16_bits(-3e9f);     // block (2, 3)
          for (std::int64_t r = 384; r < 512; ++r)
            for (std::int64_t c = 0; c < 128; ++c) at(r, c) = 0;  // block (3, 0)
        },
        [] {},
        [] {},
        [&] { at(600, 20) = static_cast<std::uint16_t>(at(600, 20) ^ 1); },  // block (4, 0), not its largest
    };
    const std::int64_t recast[] = {0, 0, 0, 4, 0, 0, 0};
    for (std::size_t u = 0; u < std::size(updates); ++u) {
      updates[u]();
      const std::int64_t before = casts.recast_blocks();
      ASSERT_TRUE(pack.quantize(parameters, [](std::span<std::uint32_t>) { return Status::ok(); }).ok());
      std::vector<std::byte> buffer(static_cast<std::size_t>(buffer_bytes), std::byte{0xAB});
      casts.execute(memory, buffer.data());
      scales.execute(memory, buffer.data());
      EXPECT_EQ(casts.recast_blocks() - before, recast[u]) << fp8::scale_rule_name(rule) << " update " << u;
      std::vector<std::uint8_t> q;
      std::vector<float> s;
      reference_quantize(values, rows, cols, config, q, s);
      for (const BufferCopy& c : copies) {
        const bool is_scale = fp8_map.parameters[c.copy.parameter].dtype == DType::kF32;
        const std::byte* got = buffer.data() + c.buffer_offset;
        const Box& box = c.copy.box;
        const std::int64_t width = is_scale ? (cols + 127) / 128 : cols;
        for (std::int64_t i = 0; i < box.extent[0]; ++i)
          for (std::int64_t j = 0; j < box.extent[1]; ++j) {
            const auto k = static_cast<std::size_t>((box.offset[0] + i) * width + box.offset[1] + j);
            const std::int64_t in_buffer = i * box.extent[1] + j;
            if (is_scale) {
              float v;
              std::memcpy(&v, got + in_buffer * 4, 4);
              ASSERT_TRUE(same_bits(v, s[k])) << fp8::scale_rule_name(rule) << " update " << u << ": scale of block " << k;
            } else {
              ASSERT_EQ(static_cast<std::uint8_t>(got[in_buffer]), q[k])
                  << fp8::scale_rule_name(rule) << " update " << u << ": element (" << k / cols << ", " << k % cols << ")";
            }
          }
      }
    }
  }
}

}  // namespace
}  // namespace wb
