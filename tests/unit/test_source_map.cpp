// Source maps: normalization merges split copies, the compact form round-trips and rejects corrupt
// input, validation names the bad copy, and applying a map performs the copies.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <numeric>

#include "../support/expect_error.hpp"
#include "../support/memory_checkpoint.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using wb::testing::expect_error;
using wb::testing::MemoryCheckpoint;

using ::testing::HasSubstr;

// gate [4, 3] and up [4, 3] fused into one [8, 3] parameter, and the transpose of down [3, 4].
SourceMap fused_map(bool split_rows) {
  SourceMap map;
  map.parameters = {{"gate_up", DType::kBF16, {8, 3}}, {"down_t", DType::kBF16, {4, 3}}};
  auto rows = [&](std::uint32_t tensor, std::int64_t row0, std::int64_t count, std::int64_t param_row) {
    if (!split_rows) {
      map.copies.push_back({tensor, 0, Box{{row0, 0}, {count, 3}}, param_row * 3, {3, 1}});
      return;
    }
    for (std::int64_t r = 0; r < count; ++r)
      map.copies.push_back({tensor, 0, Box{{row0 + r, 0}, {1, 3}}, (param_row + r) * 3, {3, 1}});
  };
  rows(0, 0, 4, 0);
  rows(1, 0, 4, 4);
  map.copies.push_back({2, 1, Box{{0, 0}, {3, 4}}, 0, {1, 3}});  // transposed: down[i, j] → param[j, i]
  return map;
}

const std::vector<TensorInfo> kTensors = {
    {"gate", DType::kBF16, {4, 3}}, {"up", DType::kBF16, {4, 3}}, {"down", DType::kBF16, {3, 4}}};

TEST(SourceMap, NormalizationMergesRowsIntoBoxes) {
  const SourceMap whole = normalize_source_map(fused_map(false));
  const SourceMap split = normalize_source_map(fused_map(true));
  EXPECT_EQ(whole.copies, split.copies);
  EXPECT_EQ(split.copies.size(), 3u);
  EXPECT_EQ(split.copied_elements(), 36);
}

TEST(SourceMap, SerializedFormRoundTripsAndRejectsCorruption) {
  const SourceMap map = normalize_source_map(fused_map(true));
  const std::vector<std::byte> bytes = serialize_source_map(map);
  const SourceMap back = deserialize_source_map(bytes);
  EXPECT_EQ(back.copies, map.copies);
  EXPECT_EQ(back.parameters, map.parameters);
  EXPECT_LE(bytes.size(), 64 * (map.copies.size() + map.parameters.size()));
  for (std::size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_THROW(deserialize_source_map(std::span(bytes).first(cut)), Error) << "truncated to " << cut;
  std::vector<std::byte> bad = bytes;
  bad[0] = std::byte{0};
  EXPECT_THROW(deserialize_source_map(bad), Error);
}

TEST(SourceMap, ValidationNamesTheCopy) {
  SourceMap map = fused_map(false);
  map.copies[1].offset = 5 * 3;  // rows 5..8 of an 8-row parameter
  try {
    validate_source_map(map, kTensors);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter gate_up"));
    EXPECT_THAT(e.what(), HasSubstr("from up[0:4, 0:3]"));
    EXPECT_THAT(e.what(), HasSubstr("outside a parameter"));
  }
  map = fused_map(false);
  map.copies[0].box.extent[0] = 5;
  EXPECT_THROW(validate_source_map(map, kTensors), Error);
}

TEST(SourceMap, StridesThatOverflowAreRefusedNotWrapped) {
  // Found by fuzz/fuzz_source_map: (extent - 1) * stride past 2^63 was signed overflow, so a wrapped
  // product could make a copy that writes anywhere look inside its parameter.
  SourceMap map = fused_map(false);
  map.copies[2].strides = {std::int64_t{1} << 62, 1};
  try {
    validate_source_map(map, kTensors);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter down_t"));
    EXPECT_THAT(e.what(), HasSubstr("stride 4611686018427387904 of axis 0 reaches past any parameter"));
  }
  map = fused_map(false);
  map.copies[2].strides = {INT64_MIN / 2, -(INT64_MIN / 2)};  // each in range, their sum not
  EXPECT_THROW(validate_source_map(map, kTensors), Error);
  // A decoded parameter whose element count overflows is corrupt.
  SourceMap huge;
  huge.parameters = {{"p", DType::kBF16, {std::int64_t{1} << 40, std::int64_t{1} << 40}}};
  expect_error([&] { deserialize_source_map(serialize_source_map(huge)); }, ErrorCode::kCorruptData,
               {"parameter p has too many elements"});
}

TEST(SourceMap, ApplyPerformsTheCopies) {
  MemoryCheckpoint checkpoint;
  for (const TensorInfo& t : kTensors) {  // distinct values in every tensor
    std::vector<std::uint16_t> values(static_cast<std::size_t>(t.numel()));
    std::iota(values.begin(), values.end(), static_cast<std::uint16_t>(1000 * (checkpoint.tensors().size() + 1)));
    checkpoint.add(t, std::move(values));
  }
  const SourceMap map = fused_map(true);
  std::vector<std::uint16_t> gate_up(24, 0), down_t(12, 0);
  ParameterSet params;
  params.add("gate_up", TensorView::contiguous(gate_up.data(), DType::kBF16, {8, 3}));
  params.add("down_t", TensorView::contiguous(down_t.data(), DType::kBF16, {4, 3}));
  apply_source_map(map, checkpoint, params);
  for (std::int64_t r = 0; r < 8; ++r)
    for (std::int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(gate_up[static_cast<std::size_t>(r * 3 + c)], checkpoint.at(r < 4 ? 0 : 1, (r % 4) * 3 + c));
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(down_t[static_cast<std::size_t>(j * 3 + i)], checkpoint.at(2, i * 4 + j));
}

}  // namespace
}  // namespace wb
