// Synthetic checkpoints: values depend on (seed, name, element index) only, so every box agrees with the
// whole tensor; floating-point values look like trained weights (finite, normal, small).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../support/expect_error.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using wb::testing::expect_error;

std::vector<std::byte> fill(const TensorInfo& info, const Box& box, std::uint64_t seed) {
  std::vector<std::byte> out(static_cast<std::size_t>(box.numel()) * dtype_size(info.dtype));
  fill_synthetic(info, box, seed, out.data());
  return out;
}

std::vector<std::byte> fill_whole(const TensorInfo& info, std::uint64_t seed) {
  return fill(info, Box::whole(info.shape), seed);
}

// The elements of `box` cut out of a whole tensor, independently of the code under test.
std::vector<std::byte> cut(const std::vector<std::byte>& whole, const TensorInfo& info, const Box& box) {
  const std::size_t elem = dtype_size(info.dtype);
  const Shape strides = contiguous_strides(info.shape);
  std::vector<std::byte> out;
  const std::int64_t n = box.numel();
  std::vector<std::int64_t> index(box.extent.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t rest = k, flat = 0;
    for (int d = box.ndim() - 1; d >= 0; --d) {
      index[d] = rest % box.extent[d];
      rest /= box.extent[d];
      flat += (box.offset[d] + index[d]) * strides[d];
    }
    const std::byte* p = whole.data() + static_cast<std::size_t>(flat) * elem;
    out.insert(out.end(), p, p + elem);
  }
  return out;
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

TEST(Synthetic, BoxesAgreeWithTheWholeTensor) {
  std::mt19937_64 rng(7);
  const std::vector<TensorInfo> tensors = {
      {"a.weight", DType::kBF16, {37, 53}},     {"b.weight", DType::kF32, {5, 7, 11}},
      {"c.weight", DType::kF16, {301}},         {"d.weight", DType::kF8E4M3, {9, 4, 3, 5}},
      {"e.weight", DType::kI64, {13, 17}},      {"f.weight", DType::kF8E5M2, {64, 3}},
      {"g.weight", DType::kF64, {6, 10}},       {"h.weight", DType::kI8, {100}},
      {"i.weight", DType::kU8, {4, 25}},        {"j.weight", DType::kI32, {8, 8}},
  };
  for (const TensorInfo& info : tensors) {
    SCOPED_TRACE(info.name);
    const std::vector<std::byte> whole = fill_whole(info, 42);
    EXPECT_EQ(whole, fill_whole(info, 42));  // deterministic
    for (int trial = 0; trial < 20; ++trial) {
      Box box;
      for (std::int64_t extent : info.shape) {
        const std::int64_t begin = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(extent));
        const std::int64_t length = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(extent - begin));
        box.offset.push_back(begin);
        box.extent.push_back(length);
      }
      EXPECT_EQ(fill(info, box, 42), cut(whole, info, box)) << box.to_string();
    }
  }
}

TEST(Synthetic, ScalarAndEmptyTensors) {
  const TensorInfo scalar{"scale", DType::kF32, {}};
  const std::vector<std::byte> v = fill_whole(scalar, 1);
  ASSERT_EQ(v.size(), 4u);
  float x;
  std::memcpy(&x, v.data(), 4);
  EXPECT_TRUE(std::isnormal(x));
  const TensorInfo empty{"empty", DType::kBF16, {0, 8}};
  EXPECT_TRUE(fill_whole(empty, 1).empty());
}

TEST(Synthetic, SeedAndNameChangeTheValues) {
  const TensorInfo a{"model.layers.0.mlp.up_proj.weight", DType::kBF16, {64, 64}};
  TensorInfo b = a;
  b.name = "model.layers.1.mlp.up_proj.weight";
  const auto count_equal = [](const std::vector<std::byte>& x, const std::vector<std::byte>& y) {
    std::size_t same = 0;
    for (std::size_t i = 0; i + 1 < x.size(); i += 2) same += std::memcmp(&x[i], &y[i], 2) == 0;
    return same;
  };
  const std::size_t n = 64 * 64;
  // Chance agreement of two bf16 values of this distribution is well under 1 %.
  EXPECT_LT(count_equal(fill_whole(a, 1), fill_whole(a, 2)), n / 50);
  EXPECT_LT(count_equal(fill_whole(a, 1), fill_whole(b, 1)), n / 50);
}

TEST(Synthetic, FloatValuesAreSmallNormalAndWeightLike) {
  constexpr std::int64_t kN = 1 << 18;
  {
    const TensorInfo info{"w", DType::kBF16, {kN}};
    const std::vector<std::byte> raw = fill_whole(info, 3);
    std::vector<std::uint16_t> bits(kN);
    std::memcpy(bits.data(), raw.data(), raw.size());
    double sum = 0, sum2 = 0;
    std::set<std::uint16_t> distinct;
    for (std::uint16_t b : bits) {
      const float x = bf16_to_float(b);
      ASSERT_TRUE(std::isnormal(x)) << std::hex << b;
      ASSERT_LT(std::fabs(x), 0.25f);
      sum += x;
      sum2 += static_cast<double>(x) * x;
      distinct.insert(b);
    }
    const double mean = sum / kN, stddev = std::sqrt(sum2 / kN - mean * mean);
    EXPECT_LT(std::fabs(mean), 0.002);
    EXPECT_GT(stddev, 0.03);
    EXPECT_LT(stddev, 0.12);
    EXPECT_GT(distinct.size(), 2000u);  // uses the mantissa, both signs, many exponents
  }
  {
    const TensorInfo info{"w", DType::kF16, {kN}};
    const std::vector<std::byte> raw = fill_whole(info, 3);
    std::vector<std::uint16_t> bits(kN);
    std::memcpy(bits.data(), raw.data(), raw.size());
    bool negative = false, positive = false;
    for (std::uint16_t b : bits) {
      const unsigned exponent = (b >> 10) & 0x1f;
      ASSERT_GE(exponent, 1u) << std::hex << b;   // no zero or denormal
      ASSERT_LE(exponent, 12u) << std::hex << b;  // |x| < 2^-2
      (b & 0x8000 ? negative : positive) = true;
    }
    EXPECT_TRUE(negative && positive);
  }
  {
    const TensorInfo info{"w", DType::kF32, {kN}};
    const std::vector<std::byte> raw = fill_whole(info, 3);
    std::vector<float> v(kN);
    std::memcpy(v.data(), raw.data(), raw.size());
    for (float x : v) {
      ASSERT_TRUE(std::isnormal(x)) << x;
      ASSERT_LT(std::fabs(x), 0.25f);
    }
  }
  {
    const TensorInfo info{"w", DType::kF64, {kN}};
    const std::vector<std::byte> raw = fill_whole(info, 3);
    std::vector<double> v(kN);
    std::memcpy(v.data(), raw.data(), raw.size());
    for (double x : v) {
      ASSERT_TRUE(std::isnormal(x)) << x;
      ASSERT_LT(std::fabs(x), 0.25);
    }
  }
  for (const DType dtype : {DType::kF8E4M3, DType::kF8E5M2}) {
    const TensorInfo info{"w", dtype, {kN}};
    const std::vector<std::byte> raw = fill_whole(info, 3);
    const bool e4m3 = dtype == DType::kF8E4M3;
    std::set<std::uint8_t> distinct;
    for (std::byte b : raw) {
      const auto bits = static_cast<std::uint8_t>(b);
      const unsigned exponent = e4m3 ? (bits >> 3) & 0xf : (bits >> 2) & 0x1f;
      ASSERT_GE(exponent, 1u) << int(bits);                 // never zero or denormal
      ASSERT_LE(exponent, e4m3 ? 4u : 12u) << int(bits);    // |x| < 0.25, never NaN or inf
      distinct.insert(bits);
    }
    EXPECT_EQ(distinct.size(), 64u);  // every allowed pattern appears (2 signs x 4 or 8 exponents x 8 or 4 mantissas)
  }
}

TEST(Synthetic, IntegerTensorsGetHashedBits) {
  const TensorInfo info{"ids", DType::kI32, {4096}};
  const std::vector<std::byte> raw = fill_whole(info, 5);
  std::vector<std::int32_t> v(4096);
  std::memcpy(v.data(), raw.data(), raw.size());
  const std::set<std::int32_t> distinct(v.begin(), v.end());
  EXPECT_GT(distinct.size(), 4000u);
  EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](std::int32_t x) { return x < 0; }));
}

TEST(Synthetic, BadBoxNamesTheTensor) {
  const TensorInfo info{"model.norm.weight", DType::kBF16, {64}};
  std::vector<std::byte> out(1024);
  std::string message = expect_error([&] { fill_synthetic(info, Box{{60}, {8}}, 0, out.data()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("model.norm.weight"), std::string::npos) << message;
  message = expect_error([&] { fill_synthetic(info, Box{{0, 0}, {1, 1}}, 0, out.data()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("model.norm.weight"), std::string::npos) << message;
}

TEST(SyntheticCheckpoint, ReadsBoxesOnDemand) {
  const std::vector<TensorInfo> tensors = model_tensors(scale_model(load_named_model_config("qwen3-30b-a3b")));
  const SyntheticCheckpoint checkpoint(tensors, 11);
  EXPECT_EQ(checkpoint.tensors(), tensors);
  EXPECT_NE(checkpoint.source().find("synthetic"), std::string::npos);
  const TensorInfo& info = checkpoint.info("model.layers.2.mlp.experts.5.down_proj.weight");
  std::vector<std::byte> whole(info.nbytes());
  checkpoint.read(info.name, whole.data());
  EXPECT_EQ(whole, fill_whole(info, 11));
  const Box box{{3, 4}, {10, 9}};
  std::vector<std::byte> part(static_cast<std::size_t>(box.numel()) * 2);
  checkpoint.read_box(info.name, box, part.data());
  EXPECT_EQ(part, cut(whole, info, box));

  std::string message = expect_error([&] { checkpoint.read_box("model.layers.9.nothing", box, part.data()); }, ErrorCode::kNotFound);
  EXPECT_NE(message.find("model.layers.9.nothing"), std::string::npos) << message;
  message = expect_error([&] { checkpoint.read_box(info.name, Box{{0, 0}, {65, 1}}, part.data()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find(info.name), std::string::npos) << message;

  std::vector<TensorInfo> twice = {info, info};
  EXPECT_THROW(SyntheticCheckpoint(twice, 0), Error);
}

TEST(SyntheticCheckpoint, SurvivesAMove) {
  std::vector<SyntheticCheckpoint> checkpoints;
  checkpoints.emplace_back(std::vector<TensorInfo>{{"lm_head.weight", DType::kBF16, {4, 4}}}, 1);
  checkpoints.emplace_back(std::vector<TensorInfo>{{"lm_head.weight", DType::kBF16, {4, 4}}}, 2);
  checkpoints.reserve(100);  // moves both
  std::vector<std::byte> out(32);
  checkpoints[0].read_box("lm_head.weight", Box{{0, 0}, {4, 4}}, out.data());
  EXPECT_EQ(out, fill_whole(checkpoints[0].tensors()[0], 1));
}

// Any box is computed from its own elements alone: a box near the end of a tensor of 2^40 elements (2 TiB
// of bf16, far more than any run could fill) takes what a box at the start takes, and its elements are the
// ones single-element boxes give. (A fill that walked the tensor up to the box would not end within the
// test's timeout. How fast the elements come is bench/bench_checkpoint's BM_FillSynthetic.)
TEST(Synthetic, ABoxFarIntoAHugeTensorNeedsOnlyItsOwnElements) {
  constexpr std::int64_t kSide = std::int64_t{1} << 20;
  const TensorInfo info{"model.layers.0.mlp.experts.0.up_proj.weight", DType::kBF16, {kSide, kSide}};
  const Box box{{kSide - 1024, kSide - 512}, {1024, 512}};
  const std::vector<std::byte> got = fill(info, box, 3);
  for (const std::int64_t row : {std::int64_t{0}, std::int64_t{1}, std::int64_t{511}, std::int64_t{1023}})
    for (const std::int64_t column : {std::int64_t{0}, std::int64_t{7}, std::int64_t{511}}) {
      const std::vector<std::byte> one = fill(info, Box{{box.offset[0] + row, box.offset[1] + column}, {1, 1}}, 3);
      const std::size_t at = static_cast<std::size_t>(row * box.extent[1] + column) * 2;
      EXPECT_EQ(std::memcmp(one.data(), got.data() + at, 2), 0) << "element (" << row << ", " << column << ") of the box";
    }
  // And the values are not all alike: each element has its own.
  EXPECT_NE(std::memcmp(got.data(), got.data() + 2, 2), 0);
}

class SyntheticFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::temp_directory_path() /
                 ("wb_test_synthetic_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(directory_);
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  // Every tensor read back equals the synthetic values.
  static void expect_same(const CheckpointReader& reader, const std::vector<TensorInfo>& tensors, std::uint64_t seed) {
    ASSERT_EQ(reader.tensors().size(), tensors.size());
    const SyntheticCheckpoint expected(tensors, seed);
    for (const TensorInfo& t : tensors) {
      const TensorInfo* found = reader.find(t.name);
      ASSERT_NE(found, nullptr) << t.name;
      EXPECT_EQ(*found, t);
      std::vector<std::byte> got(t.nbytes()), want(t.nbytes());
      reader.read(t.name, got.data());
      expected.read(t.name, want.data());
      ASSERT_EQ(got, want) << t.name;
    }
  }

  std::filesystem::path directory_;
};

TEST_F(SyntheticFiles, WritesHdf5AndSafetensors) {
  const std::vector<TensorInfo> tensors = model_tensors(scale_model(load_named_model_config("moonlight-16b-a3b")));
  const std::string h5 = (directory_ / "tiny.h5").string();
  write_synthetic_checkpoint(h5, CheckpointFormat::kHdf5, tensors, 9);
  expect_same(*open_checkpoint(h5), tensors, 9);

  const std::string st = (directory_ / "tiny.safetensors").string();
  write_synthetic_checkpoint(st, CheckpointFormat::kSafetensors, tensors, 9);
  expect_same(*open_checkpoint(st), tensors, 9);

  const std::string index = (directory_ / "sharded" / "model.safetensors.index.json").string();
  std::filesystem::create_directories(directory_ / "sharded");
  CheckpointWriterOptions options;
  options.max_shard_bytes = 256 << 10;
  write_synthetic_checkpoint(index, CheckpointFormat::kSafetensors, tensors, 9, options);
  std::size_t shards = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory_ / "sharded"))
    shards += entry.path().extension() == ".safetensors";
  EXPECT_GT(shards, 1u);
  expect_same(*open_checkpoint(index), tensors, 9);
}

TEST_F(SyntheticFiles, DuplicateNamesWriteNothing) {
  const TensorInfo t{"x.weight", DType::kBF16, {2, 2}};
  const std::string path = (directory_ / "dup.h5").string();
  EXPECT_THROW(write_synthetic_checkpoint(path, CheckpointFormat::kHdf5, {t, t}, 0), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace wb::emu
