// Core types: dtypes, tensor views and strided copies, status and check macros, settings, logging.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <string>
#include <unistd.h>
#include <vector>

#include "../support/expect_error.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "weightbridge/dtype.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;
using wb::testing::expect_error;

TEST(DType, SizesNamesAndParsing) {
  const std::vector<std::pair<DType, std::size_t>> expected = {
      {DType::kBF16, 2}, {DType::kF16, 2}, {DType::kF32, 4}, {DType::kF64, 8},    {DType::kI8, 1},
      {DType::kU8, 1},   {DType::kI32, 4}, {DType::kI64, 8}, {DType::kF8E4M3, 1}, {DType::kF8E5M2, 1}};
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kNumDTypes));
  for (auto [dtype, size] : expected) {
    EXPECT_EQ(dtype_size(dtype), size) << dtype_name(dtype);
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
    EXPECT_EQ(parse_dtype(dtype_safetensors_name(dtype)), dtype);
  }
  EXPECT_EQ(dtype_safetensors_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_FALSE(parse_dtype("complex64").has_value());
}

// A reference strided copy, element by element through multi-indices.
std::vector<std::uint16_t> iota_u16(std::size_t n) {
  std::vector<std::uint16_t> v(n);
  std::iota(v.begin(), v.end(), std::uint16_t{1});
  return v;
}

TEST(TensorView, NarrowBoxPermuteUnflattenAddressTheRightElements) {
  auto data = iota_u16(4 * 6);  // [4, 6], value = 1 + 6*r + c
  TensorView t = TensorView::contiguous(data.data(), DType::kBF16, {4, 6});
  EXPECT_TRUE(t.is_contiguous());
  TensorView rows = t.narrow(0, 1, 2);
  EXPECT_EQ(rows.shape, (Shape{2, 6}));
  EXPECT_TRUE(rows.is_contiguous());
  std::int64_t idx[2] = {1, 2};
  EXPECT_EQ(*reinterpret_cast<std::uint16_t*>(rows.element(idx)), 1 + 6 * 2 + 2);

  TensorView cols = t.box(Box{{1, 3}, {3, 2}});
  EXPECT_FALSE(cols.is_contiguous());
  std::int64_t idx2[2] = {2, 1};
  EXPECT_EQ(*reinterpret_cast<std::uint16_t*>(cols.element(idx2)), 1 + 6 * 3 + 4);

  TensorView tr = t.transpose(0, 1);
  EXPECT_EQ(tr.shape, (Shape{6, 4}));
  std::int64_t idx3[2] = {5, 3};
  EXPECT_EQ(*reinterpret_cast<std::uint16_t*>(tr.element(idx3)), 1 + 6 * 3 + 5);

  TensorView un = t.unflatten(1, 3);  // [4, 3, 2]
  EXPECT_EQ(un.shape, (Shape{4, 3, 2}));
  std::int64_t idx4[3] = {2, 1, 1};
  EXPECT_EQ(*reinterpret_cast<std::uint16_t*>(un.element(idx4)), 1 + 6 * 2 + 3);

  EXPECT_THROW(t.narrow(0, 3, 2), Error);
  EXPECT_THROW(t.box(Box{{0, 5}, {1, 2}}), Error);
  EXPECT_THROW(t.unflatten(1, 4), Error);
}

TEST(TensorView, SelectDropsTheAxisAtTheIndex) {
  // A stacked MoE weight [experts 3, rows 4, cols 5], value = 1 + 20*e + 5*r + c: one expert of it.
  auto data = iota_u16(3 * 4 * 5);
  TensorView stacked = TensorView::contiguous(data.data(), DType::kBF16, {3, 4, 5});
  for (std::int64_t e = 0; e < 3; ++e) {
    const TensorView expert = stacked.select(0, e);
    EXPECT_EQ(expert.shape, (Shape{4, 5}));
    EXPECT_TRUE(expert.is_contiguous());
    std::vector<std::uint16_t> copy(20);
    copy_tensor(TensorView::contiguous(copy.data(), DType::kBF16, {4, 5}), expert);
    for (std::int64_t i = 0; i < 20; ++i) EXPECT_EQ(copy[static_cast<std::size_t>(i)], 1 + 20 * e + i);
  }
  // A middle axis: rows r of every expert, [3, 5], strided.
  const TensorView row = stacked.select(1, 2);
  EXPECT_EQ(row.shape, (Shape{3, 5}));
  EXPECT_EQ(row.strides, (Shape{20, 1}));
  std::int64_t at[2] = {1, 4};
  EXPECT_EQ(*reinterpret_cast<std::uint16_t*>(row.element(at)), 1 + 20 * 1 + 5 * 2 + 4);
  // The last axis of a transposed view, down to a vector.
  const TensorView column = stacked.select(0, 2).transpose(0, 1).select(0, 3);  // expert 2, column 3
  EXPECT_EQ(column.shape, (Shape{4}));
  std::int64_t r[1] = {2};
  EXPECT_EQ(*reinterpret_cast<std::uint16_t*>(column.element(r)), 1 + 20 * 2 + 5 * 2 + 3);
  EXPECT_THROW(stacked.select(0, 3), Error);
  EXPECT_THROW(stacked.select(3, 0), Error);
  EXPECT_THROW(stacked.select(-1, 0), Error);
}

TEST(CopyTensor, StridedAndTransposedCopiesMatchAnElementwiseReference) {
  for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kF64}) {
    const std::size_t es = dtype_size(dtype);
    const Shape shape = {5, 7, 3};
    const std::int64_t n = shape_numel(shape);
    std::vector<std::byte> src(static_cast<std::size_t>(n) * es), dst(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
    TensorView s = TensorView::contiguous(src.data(), dtype, shape);
    // Destination holds the permuted tensor [3, 5, 7]; copy s into its permuted view.
    TensorView d = TensorView::contiguous(dst.data(), dtype, {3, 5, 7});
    const int order[3] = {1, 2, 0};
    copy_tensor(d.permute(order), s);
    for (std::int64_t a = 0; a < 5; ++a)
      for (std::int64_t b = 0; b < 7; ++b)
        for (std::int64_t c = 0; c < 3; ++c) {
          std::int64_t si[3] = {a, b, c}, di[3] = {c, a, b};
          ASSERT_EQ(std::memcmp(s.element(si), d.element(di), es), 0);
        }
    EXPECT_TRUE(tensors_bitwise_equal(d.permute(order), s));
    // A box copy back into a contiguous buffer.
    std::vector<std::byte> small(static_cast<std::size_t>(2 * 3 * 2) * es);
    TensorView sm = TensorView::contiguous(small.data(), dtype, {2, 3, 2});
    copy_tensor(sm, s.box(Box{{3, 4, 1}, {2, 3, 2}}));
    EXPECT_TRUE(tensors_bitwise_equal(sm, s.box(Box{{3, 4, 1}, {2, 3, 2}})));
    small[0] = static_cast<std::byte>(static_cast<int>(small[0]) ^ 1);
    EXPECT_FALSE(tensors_bitwise_equal(sm, s.box(Box{{3, 4, 1}, {2, 3, 2}})));
  }
}

// Transposes larger than copy_tensor's tiles (and not a multiple of them, so whole tiles go in vector blocks
// and the edges element by element), with a middle axis: every element lands where the element-wise
// reference puts it, both ways, and the tiled comparison finds one flipped bit anywhere.
TEST(CopyTensor, TiledTransposesMatchAnElementwiseReference) {
  // The second shape crosses the long tiles of vector blocks (512 along the destination's lines).
  for (const Shape& shape : {Shape{37, 3, 50}, Shape{530, 2, 21}})
    for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kF64}) {
      const std::size_t es = dtype_size(dtype);
      const std::int64_t n = shape_numel(shape), n0 = shape[0], n1 = shape[1], n2 = shape[2];
      std::vector<std::byte> src(static_cast<std::size_t>(n) * es), dst(src.size());
      for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
      const TensorView s = TensorView::contiguous(src.data(), dtype, shape);
      const TensorView d = TensorView::contiguous(dst.data(), dtype, {n2, n1, n0});
      const TensorView dt = d.transpose(0, 2);  // the shape of s, innermost stride n1 * n0
      copy_tensor(dt, s);
      for (std::int64_t a = 0; a < n0; ++a)
        for (std::int64_t b = 0; b < n1; ++b)
          for (std::int64_t c = 0; c < n2; ++c) {
            std::int64_t si[3] = {a, b, c}, di[3] = {c, b, a};
            ASSERT_EQ(std::memcmp(s.element(si), d.element(di), es), 0)
                << dtype_name(dtype) << " " << a << "," << b << "," << c;
          }
      EXPECT_TRUE(tensors_bitwise_equal(dt, s));
      EXPECT_TRUE(tensors_bitwise_equal(s, dt));
      // And back: the transposed view read into a contiguous buffer (the other orientation of the blocks).
      std::vector<std::byte> back(src.size());
      copy_tensor(TensorView::contiguous(back.data(), dtype, shape), dt);
      EXPECT_EQ(back, src) << dtype_name(dtype);
      // One flipped bit anywhere: in a block (inner lanes too), at an edge, past the first long tile.
      for (const std::int64_t flat : {std::int64_t{0}, n / 2 + 7, (17 * n1 + 1) * n0 + 21, n - 1}) {
        for (const std::size_t byte : {std::size_t{0}, es - 1}) {  // the element's low and high byte
          dst[static_cast<std::size_t>(flat) * es + byte] ^= std::byte{0x81};
          EXPECT_FALSE(tensors_bitwise_equal(dt, s)) << dtype_name(dtype) << " element " << flat << " byte " << byte;
          EXPECT_FALSE(tensors_bitwise_equal(s, dt)) << dtype_name(dtype) << " element " << flat << " byte " << byte;
          dst[static_cast<std::size_t>(flat) * es + byte] ^= std::byte{0x81};
        }
      }
    }
}

// 2-byte transposes large enough for 32 x 32 register blocks (core/transpose16, where the CPU has AVX-512BW;
// elsewhere the same shapes go in 8 x 8 blocks): several tiles of 512 lines, edges of every width short of a
// block, both orientations, the destination 64-byte aligned and over 4 MiB (streaming stores) or not. Every
// element lands where the element-wise reference puts it, and the comparison finds one flipped bit at every
// line of a block, its lanes' low and high bytes.
TEST(CopyTensor, WideTransposeBlocksMatchAnElementwiseReference) {
  for (const Shape& shape : {Shape{1100, 2, 560}, Shape{33, 1, 1030}, Shape{2112, 1, 1070}}) {
    const std::int64_t n = shape_numel(shape), n0 = shape[0], n1 = shape[1], n2 = shape[2];
    for (const std::size_t misalign : {std::size_t{0}, std::size_t{16}}) {
      std::vector<std::uint16_t> src(static_cast<std::size_t>(n)), storage(static_cast<std::size_t>(n) + 64);
      for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint16_t>(i * 40503u + (i >> 16));
      const auto skip = (64 - reinterpret_cast<std::uintptr_t>(storage.data()) % 64) % 64 + misalign;
      std::uint16_t* dst = storage.data() + skip / 2;
      const TensorView s = TensorView::contiguous(src.data(), DType::kBF16, shape);
      const TensorView dt = TensorView::contiguous(dst, DType::kBF16, {n2, n1, n0}).transpose(0, 2);
      SCOPED_TRACE(shape_to_string(shape) + " misaligned by " + std::to_string(misalign));
      copy_tensor(dt, s);
      for (std::int64_t a = 0; a < n0; ++a)
        for (std::int64_t b = 0; b < n1; ++b)
          for (std::int64_t c = 0; c < n2; ++c)
            ASSERT_EQ(dst[(c * n1 + b) * n0 + a], src[static_cast<std::size_t>((a * n1 + b) * n2 + c)]) << a << "," << b << "," << c;
      EXPECT_TRUE(tensors_bitwise_equal(dt, s));
      EXPECT_TRUE(tensors_bitwise_equal(s, dt));
      std::vector<std::uint16_t> back(src.size());
      copy_tensor(TensorView::contiguous(back.data(), DType::kBF16, shape), dt);
      EXPECT_EQ(back, src);
      // One flipped bit in each line of the block at source rows 512.., columns 32.. (the second tile of lines),
      // at every lane of it, then at the edges.
      std::vector<std::int64_t> flips;
      for (std::int64_t k = 0; k < 32; ++k) flips.push_back(((32 + k) * n1 + 0) * n0 + std::min<std::int64_t>(n0 - 1, 512 + (k * 7) % 32));
      flips.push_back(n - 1);
      flips.push_back((n2 - 1) * n1 * n0);
      for (const std::int64_t flat : flips)
        for (const std::uint16_t bit : {std::uint16_t{0x0001}, std::uint16_t{0x8000}}) {
          dst[flat] ^= bit;
          EXPECT_FALSE(tensors_bitwise_equal(dt, s)) << "element " << flat << " bit " << bit;
          EXPECT_FALSE(tensors_bitwise_equal(s, dt)) << "element " << flat << " bit " << bit;
          dst[flat] ^= bit;
        }
    }
  }
}

TEST(CopyTensor, RejectsMismatchedShapesAndDtypes) {
  std::vector<std::uint16_t> a(6), b(6);
  TensorView va = TensorView::contiguous(a.data(), DType::kBF16, {2, 3});
  EXPECT_THROW(copy_tensor(va, TensorView::contiguous(b.data(), DType::kBF16, {3, 2})), Error);
  EXPECT_THROW(copy_tensor(va, TensorView::contiguous(b.data(), DType::kF16, {2, 3})), Error);
}

TEST(ParameterSet, KeepsOrderAndRejectsDuplicates) {
  std::vector<float> x(4), y(2);
  ParameterSet params;
  params.add("b", TensorView::contiguous(x.data(), DType::kF32, {4}));
  params.add("a", TensorView::contiguous(y.data(), DType::kF32, {2}));
  EXPECT_EQ(params[0].name, "b");
  EXPECT_EQ(params.total_bytes(), 24u);
  EXPECT_EQ(params.at("a").view.numel(), 2);
  EXPECT_THROW(params.add("a", TensorView::contiguous(y.data(), DType::kF32, {2})), Error);
  expect_error([&] { params.at("missing"); }, ErrorCode::kNotFound, {"missing"});
}

int failing_mpi_call() { return MPI_ERR_COMM; }

TEST(Checks, MpiCheckNamesTheCallTheErrorStringAndTheLocation) {
  // The MPI error string itself is checked under mpiexec (tests/mpi); here MPI is not initialized.
  expect_error([] { WB_CHECK_MPI(failing_mpi_call()); }, ErrorCode::kMpi,
               {"failing_mpi_call()", "test_core.cpp:", "MPI error code"});
  auto try_form = []() -> Status {
    WB_TRY_MPI(failing_mpi_call());
    return Status::ok();
  };
  const Status status = try_form();
  EXPECT_EQ(status.code(), ErrorCode::kMpi);
  EXPECT_THAT(status.message(), HasSubstr("failing_mpi_call()"));
}

// ibverbs calls return an errno value (or -1 with errno set), or NULL with errno for constructors.
int failing_verbs_call() { return EINVAL; }
int failing_verbs_call_with_errno() {
  errno = ENOSYS;
  return -1;
}
void* failing_verbs_constructor() {
  errno = ENOMEM;
  return nullptr;
}

TEST(Checks, IbverbsChecksReportTheErrnoText) {
  expect_error([] { WB_CHECK_IBV(failing_verbs_call()); }, ErrorCode::kIbverbs,
               {"failing_verbs_call() failed: Invalid argument"});
  expect_error([] { WB_CHECK_IBV(failing_verbs_call_with_errno()); }, ErrorCode::kIbverbs, {"Function not implemented"});
  expect_error([] { (void)WB_CHECK_IBV_PTR(failing_verbs_constructor()); }, ErrorCode::kIbverbs,
               {"failing_verbs_constructor() failed: Cannot allocate memory", "test_core.cpp:"});
}

TEST(Checks, SystemCheckReportsErrno) {
  expect_error([] { WB_CHECK_SYS(::close(-1)); }, ErrorCode::kSystem, {"Bad file descriptor"});
}

TEST(Checks, RankAppearsInMessagesWhenTheLauncherSetsIt) {
  ::setenv("OMPI_COMM_WORLD_RANK", "7", 1);
  const Error e(ErrorCode::kCorruptData, "tensor x");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_THAT(e.what(), HasSubstr("[rank 7]"));
  EXPECT_THAT(e.what(), HasSubstr("corrupt data: tensor x"));
}

Setting<std::int64_t> test_int_setting("test_chunk_bytes", 4096, "A setting used only by the unit test.");
Setting<bool> test_bool_setting("test_enable_thing", false, "A boolean used only by the unit test.");
Setting<double> test_ranged_setting("test_ranged_ratio", 0.5, "A ranged setting used only by the unit test.", 0.0, 1.0);

TEST(Settings, DefaultThenEnvironmentThenCommandLine) {
  EXPECT_EQ(test_int_setting.environment_variable(), "WB_TEST_CHUNK_BYTES");
  EXPECT_EQ(test_int_setting.flag(), "test-chunk-bytes");
  ASSERT_EQ(::setenv("WB_TEST_ENABLE_THING", "yes", 1), 0);
  EXPECT_TRUE(test_bool_setting.get());
  EXPECT_EQ(test_bool_setting.source(), SettingSource::kEnvironment);

  // What the apps' --test-chunk-bytes flag does (apps/emu/options/setting_flags.cpp).
  find_setting("test_chunk_bytes")->override_from_text("8192");
  EXPECT_EQ(test_int_setting.get(), 8192);
  EXPECT_EQ(test_int_setting.source(), SettingSource::kCommandLine);
  EXPECT_THAT(describe_settings(), HasSubstr("test_chunk_bytes = 8192 (--test-chunk-bytes)"));
  EXPECT_THAT(describe_settings(), HasSubstr("test_enable_thing = true (WB_TEST_ENABLE_THING)"));
  EXPECT_THAT(describe_settings(), HasSubstr("log_level"));
  expect_error([] { test_int_setting.override_from_text("12k"); }, ErrorCode::kInvalidArgument, {"WB_TEST_CHUNK_BYTES"});
  ASSERT_NE(find_setting("log_level"), nullptr);
}

TEST(Settings, RangesAreCheckedWhereverTheValueComesFrom) {
  EXPECT_EQ(test_ranged_setting.range_text(), "[0, 1]");
  EXPECT_EQ(test_int_setting.range_text(), "");
  test_ranged_setting.override_from_text("1");
  EXPECT_EQ(*test_ranged_setting, 1.0);
  for (const char* bad : {"1.5", "-0.1", "inf"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { test_ranged_setting.override_from_text(bad); }, ErrorCode::kInvalidArgument,
                 {"WB_TEST_RANGED_RATIO", "in [0, 1]"});
    EXPECT_EQ(*test_ranged_setting, 1.0) << "a refused value leaves the setting as it was";
  }
  expect_error([&] { test_ranged_setting.override_from_text("nan"); }, ErrorCode::kInvalidArgument,
               {"WB_TEST_RANGED_RATIO", "'nan' is not a number"});
}

TEST(Settings, NumbersAreDecimal) {
  // 010 is ten, as a user padding numbers means (strtoll's base 0 read it as octal 8); 0x10 is refused.
  find_setting("test_chunk_bytes")->override_from_text("010");
  EXPECT_EQ(*test_int_setting, 10);
  find_setting("test_chunk_bytes")->override_from_text("-007");
  EXPECT_EQ(*test_int_setting, -7);
  for (const char* bad : {"0x10", "0X10", "-0x10"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { test_int_setting.override_from_text(bad); }, ErrorCode::kInvalidArgument,
                 {"WB_TEST_CHUNK_BYTES", "hexadecimal"});
  }
  expect_error([&] { test_int_setting.override_from_text("99999999999999999999"); }, ErrorCode::kInvalidArgument,
               {"WB_TEST_CHUNK_BYTES", "range of a 64-bit integer"});
  EXPECT_EQ(*test_int_setting, -7);
  test_ranged_setting.override_from_text("0.25");
  expect_error([&] { test_ranged_setting.override_from_text("0x1p-2"); }, ErrorCode::kInvalidArgument,
               {"hexadecimal"});
  // Out of range, not "not a number": below the smallest normal double, and above the largest.
  for (const char* bad : {"1e-320", "1e400"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { test_ranged_setting.override_from_text(bad); }, ErrorCode::kInvalidArgument,
                 {"WB_TEST_RANGED_RATIO", "in the range of a double"});
  }
  EXPECT_EQ(*test_ranged_setting, 0.25);
}

TEST(Settings, UnknownEnvironmentVariablesAreNamedWithTheClosestSetting) {
  ASSERT_EQ(::setenv("WB_TEST_CHUNK_BYTE", "1", 1), 0);
  ASSERT_EQ(::setenv("WB_CLUSTER_NAME", "wb28", 1), 0);  // a script variable: known, not a setting
  const std::vector<std::string> warnings = unknown_environment_warnings();
  ::unsetenv("WB_TEST_CHUNK_BYTE");
  ::unsetenv("WB_CLUSTER_NAME");
  const auto mentions = [&](const std::string& what) {
    return std::count_if(warnings.begin(), warnings.end(),
                         [&](const std::string& w) { return w.find(what) != std::string::npos; });
  };
  EXPECT_EQ(mentions("WB_TEST_CHUNK_BYTE is no WeightBridge setting and is ignored; the closest setting is "
                     "WB_TEST_CHUNK_BYTES"),
            1);
  EXPECT_EQ(mentions("WB_CLUSTER_NAME"), 0);
  EXPECT_EQ(mentions("WB_TEST_ENABLE_THING "), 0) << "a declared setting's variable is known";
}

TEST(Log, ParsesLevels) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("0"), LogLevel::kError);
  EXPECT_THROW(parse_log_level("loud"), Error);
  set_log_level(LogLevel::kError);
  int evaluated = 0;
  WB_LOG(kInfo) << (++evaluated);
  EXPECT_EQ(evaluated, 0) << "arguments of a disabled level must not be evaluated";
}

}  // namespace
}  // namespace wb
