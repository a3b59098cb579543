// safetensors' own cases: the file layout other tools expect, hand-written files, the index of a sharded
// checkpoint, and one test per kind of corrupt file, each checking that the error names the file and the
// tensor (what every format does is in test_checkpoint_conformance.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::TempDir;

/// A safetensors file from a header text and raw data, written by hand (independent of our writer).
std::string raw_file(const std::string& header, const std::string& data, std::uint64_t length_override = 0) {
  const std::uint64_t length = length_override != 0 ? length_override : header.size();
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((length >> (8 * b)) & 0xFF);
  return bytes + header + data;
}

TEST(SafetensorsCheckpointTest, LayoutMatchesTheReferenceFormat) {
  TempDir dir;
  const std::vector<TensorInfo> tensors = {{"a.weight", DType::kBF16, {2, 3}}, {"b.bias", DType::kF8E5M2, {5}}};
  const auto data = testing::random_data(tensors, 3);
  const std::string path = dir.file("m.safetensors");
  testing::write_checkpoint(path, CheckpointFormat::kSafetensors, tensors, data);

  const std::string bytes = testing::read_file(path);
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  EXPECT_EQ(length % 8, 0u);  // padded, so the data starts 8-byte aligned
  const std::string header_text = bytes.substr(8, length);
  const json header = json::parse(header_text);
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.weight"]["dtype"], "BF16");
  EXPECT_EQ(header["a.weight"]["shape"], json::array({2, 3}));
  EXPECT_EQ(header["a.weight"]["data_offsets"], json::array({0, 12}));
  EXPECT_EQ(header["b.bias"]["dtype"], "F8_E5M2");
  EXPECT_EQ(header["b.bias"]["data_offsets"], json::array({12, 17}));
  EXPECT_EQ(bytes.size(), 8 + length + 17);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + length, data[0].data(), 12), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + length + 12, data[1].data(), 5), 0);
}

TEST(SafetensorsCheckpointTest, ReadsAHandWrittenFileInDataOrder) {
  TempDir dir;
  // JSON key order (alphabetical) differs from data order: the tensor list follows the data. Extra
  // metadata, gaps between tensors and unpadded headers are all accepted.
  const std::string good =
      R"({"__metadata__":{"format":"pt","note":"x"},"a":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},"z":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
      R"("e":{"dtype":"F32","shape":[0,4],"data_offsets":[8,8]},"s":{"dtype":"I8","shape":[],"data_offsets":[4,5]}})";
  const std::string path = dir.file("hand.safetensors");
  testing::write_file(path, raw_file(good, std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8)));
  const auto reader = open_safetensors_checkpoint(path);
  ASSERT_EQ(reader->tensors().size(), 4u);
  EXPECT_EQ(reader->tensors()[0].name, "z");
  EXPECT_EQ(reader->tensors()[1].name, "s");
  EXPECT_EQ(reader->tensors()[2].name, "a");
  EXPECT_EQ(reader->tensors()[3].name, "e");
  EXPECT_EQ(reader->tensors()[3].shape, (Shape{0, 4}));
  std::uint8_t a[2];
  reader->read("a", a);
  EXPECT_EQ(a[0], 7);
  EXPECT_EQ(a[1], 8);
  std::int8_t s = 0;
  reader->read("s", &s);
  EXPECT_EQ(s, 5);
}

TEST(SafetensorsCheckpointTest, ShardedRoundTripAndIndex) {
  TempDir dir;
  std::vector<TensorInfo> tensors;
  for (int i = 0; i < 7; ++i) tensors.push_back({"layers." + std::to_string(i) + ".w", DType::kBF16, {16, 8 + i}});
  tensors.push_back({"big", DType::kF32, {100, 10}});  // larger than a shard: gets one of its own
  const auto data = testing::random_data(tensors, 5);
  const std::string index_path = dir.file("model.safetensors.index.json");
  testing::write_checkpoint(index_path, CheckpointFormat::kSafetensors, tensors, data, {.max_shard_bytes = 600});

  const json index = json::parse(testing::read_file(index_path));
  std::size_t total = 0;
  for (const TensorInfo& info : tensors) total += info.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"], total);
  ASSERT_EQ(index["weight_map"].size(), tensors.size());
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  const std::size_t n = shards.size();
  ASSERT_GT(n, 2u);
  char last[64];
  std::snprintf(last, sizeof last, "model-%05zu-of-%05zu.safetensors", n, n);
  EXPECT_EQ(*shards.rbegin(), last);
  EXPECT_EQ(index["weight_map"]["big"], last);
  EXPECT_EQ(dir.entries().size(), n + 1);  // shards and the index, nothing else
  for (const std::string& shard : shards) {
    const auto file = open_safetensors_checkpoint(dir.file(shard));
    std::size_t bytes = 0;
    for (const TensorInfo& info : file->tensors()) bytes += info.nbytes();
    EXPECT_TRUE(bytes <= 600 || file->tensors().size() == 1) << shard;
  }
  testing::expect_round_trip(*open_safetensors_checkpoint(index_path), tensors, data);
}

// --- corrupt files --------------------------------------------------------------------------------------

class SafetensorsCorruptTest : public ::testing::Test {
 protected:
  /// Writes `bytes` to a fresh file and expects opening it to fail with `code`, naming the file and `parts`.
  void expect_open_error(const std::string& bytes, ErrorCode code, std::initializer_list<std::string> parts) {
    const std::string path = dir_.file("bad" + std::to_string(count_++) + ".safetensors");
    testing::write_file(path, bytes);
    expect_error([&] { open_checkpoint(path); }, code, {path});
    expect_error([&] { open_checkpoint(path); }, code, parts);
  }
  static std::string entry(const std::string& name, const std::string& body) { return "\"" + name + "\":{" + body + "}"; }

  TempDir dir_;
  int count_ = 0;
};

TEST_F(SafetensorsCorruptTest, FileAndHeaderLength) {
  expect_open_error("", ErrorCode::kCorruptData, {"shorter than the 8-byte"});
  expect_open_error("abc", ErrorCode::kCorruptData, {"3 bytes"});
  expect_open_error(raw_file("{}", "", 1000), ErrorCode::kCorruptData, {"header length 1000"});
  expect_open_error(raw_file("{}", "", ~std::uint64_t{0}), ErrorCode::kCorruptData, {"header length"});
}

TEST_F(SafetensorsCorruptTest, HeaderNotJson) {
  expect_open_error(raw_file("{\"a\": [1, 2", ""), ErrorCode::kCorruptData, {"not valid JSON"});
  expect_open_error(raw_file("[1, 2]", ""), ErrorCode::kCorruptData, {"not a JSON object"});
  expect_open_error(raw_file(std::string("\xff\xfe{}", 4), ""), ErrorCode::kCorruptData, {"not valid JSON"});
}

TEST_F(SafetensorsCorruptTest, EntryFields) {
  const std::string data(64, '\0');
  expect_open_error(raw_file("{" + entry("t.w", R"("shape":[2],"data_offsets":[0,8])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "dtype"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","data_offsets":[0,8])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "shape"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2])") + "}", data), ErrorCode::kCorruptData,
                    {"t.w", "data_offsets"});
  expect_open_error(raw_file(R"({"t.w": 5})", data), ErrorCode::kCorruptData, {"t.w", "not a JSON object"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"C64","shape":[2],"data_offsets":[0,16])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "C64"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "shape"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2.5],"data_offsets":[0,8])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "shape"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "shape"});
  expect_open_error(
      raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])") + "}", data),
      ErrorCode::kCorruptData, {"t.w", "too large"});
}

TEST_F(SafetensorsCorruptTest, DataOffsets) {
  const std::string data(64, '\0');
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2],"data_offsets":[0,12])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "needs 8"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2],"data_offsets":[8,0])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "data_offsets"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2],"data_offsets":[0])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "data_offsets"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "data_offsets"});
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[4],"data_offsets":[56,72])") + "}", data),
                    ErrorCode::kCorruptData, {"t.w", "truncated"});
  expect_open_error(raw_file("{" + entry("a", R"("dtype":"F32","shape":[4],"data_offsets":[0,16])") + "," +
                                 entry("b", R"("dtype":"F32","shape":[4],"data_offsets":[8,24])") + "}",
                             data),
                    ErrorCode::kCorruptData, {"overlap", "a", "b"});
  expect_open_error(raw_file("{" + entry("a", R"("dtype":"F32","shape":[16],"data_offsets":[0,64])") + "," +
                                 entry("b", R"("dtype":"U8","shape":[1],"data_offsets":[63,64])") + "}",
                             data),
                    ErrorCode::kCorruptData, {"overlap"});
}

TEST_F(SafetensorsCorruptTest, TensorDefinedTwice) {
  // JSON parsers keep the last definition of a key; a header that names a tensor twice is refused, not
  // loaded with whichever definition came last.
  const std::string data(16, '\x07');
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                                 entry("t.w", R"("dtype":"F32","shape":[2],"data_offsets":[8,16])") + "}",
                             data),
                    ErrorCode::kCorruptData, {"tensor t.w", "defines it twice"});
  // A field given twice inside one entry is as ambiguous.
  expect_open_error(raw_file("{" + entry("t.w", R"("dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8])") + "}",
                             data),
                    ErrorCode::kCorruptData, {"tensor t.w", "\"dtype\" twice"});
}

TEST_F(SafetensorsCorruptTest, TruncatedFile) {
  const std::vector<TensorInfo> tensors = {{"first", DType::kF32, {64}}, {"last.weight", DType::kBF16, {64}}};
  const std::string path = dir_.file("t.safetensors");
  testing::write_checkpoint(path, CheckpointFormat::kSafetensors, tensors, testing::random_data(tensors, 4));
  const std::string bytes = testing::read_file(path);
  expect_open_error(bytes.substr(0, bytes.size() - 1), ErrorCode::kCorruptData, {"last.weight", "truncated"});
  expect_open_error(bytes.substr(0, 20), ErrorCode::kCorruptData, {"header length"});
}

TEST_F(SafetensorsCorruptTest, IndexProblems) {
  const std::vector<TensorInfo> tensors = {{"a", DType::kF32, {64}}, {"b", DType::kF32, {64}}, {"c", DType::kF32, {64}}};
  const std::string index_path = dir_.file("model.safetensors.index.json");
  testing::write_checkpoint(index_path, CheckpointFormat::kSafetensors, tensors, testing::random_data(tensors, 4),
                            {.max_shard_bytes = 256});
  json index = json::parse(testing::read_file(index_path));
  ASSERT_EQ(index["weight_map"]["c"], "model-00003-of-00003.safetensors");

  // A listed shard that is missing.
  json missing = index;
  missing["weight_map"]["c"] = "model-00009-of-00009.safetensors";
  const std::string missing_path = dir_.file("missing.index.json");
  testing::write_file(missing_path, missing.dump());
  expect_error([&] { open_checkpoint(missing_path); }, ErrorCode::kNotFound,
               {missing_path, "c", "model-00009-of-00009.safetensors", "missing"});

  // A tensor listed in a shard that does not hold it.
  json absent = index;
  absent["weight_map"]["d"] = "model-00001-of-00003.safetensors";
  const std::string absent_path = dir_.file("absent.index.json");
  testing::write_file(absent_path, absent.dump());
  expect_error([&] { open_checkpoint(absent_path); }, ErrorCode::kCorruptData,
               {absent_path, "tensor d", "model-00001-of-00003.safetensors"});

  // Not JSON, no weight_map, a non-string shard name.
  const std::string broken = dir_.file("broken.index.json");
  testing::write_file(broken, "{\"weight_map\": ");
  expect_error([&] { open_checkpoint(broken); }, ErrorCode::kCorruptData, {broken, "JSON"});
  testing::write_file(broken, R"({"metadata": {}})");
  expect_error([&] { open_checkpoint(broken); }, ErrorCode::kCorruptData, {broken, "weight_map"});
  testing::write_file(broken, R"({"weight_map": {"a": 3}})");
  expect_error([&] { open_checkpoint(broken); }, ErrorCode::kCorruptData, {broken, "tensor a"});
  expect_error([&] { open_checkpoint(dir_.file("nothing.index.json")); }, ErrorCode::kNotFound, {"nothing.index.json"});

  // A tensor named twice in the weight_map, the two naming different shards.
  const std::string twice = dir_.file("twice.index.json");
  testing::write_file(twice, R"({"weight_map": {"a": "model-00001-of-00003.safetensors", "b": "model-00002-of-00003.safetensors",)"
                             R"( "a": "model-00002-of-00003.safetensors"}})");
  expect_error([&] { open_checkpoint(twice); }, ErrorCode::kCorruptData, {twice, "tensor a", "names it twice"});

  // A corrupt shard is reported with the shard's own name.
  testing::write_file(dir_.file("model-00002-of-00003.safetensors"), "short");
  expect_error([&] { open_checkpoint(index_path); }, ErrorCode::kCorruptData, {"model-00002-of-00003.safetensors"});
}

TEST_F(SafetensorsCorruptTest, ShardPathsOutsideTheIndexDirectory) {
  // A real shard outside the checkpoint's directory, which the index must not be able to reach.
  const std::filesystem::path inner = dir_.path() / "ckpt";
  std::filesystem::create_directories(inner);
  const std::vector<TensorInfo> tensors = {{"a", DType::kF32, {4}}};
  testing::write_checkpoint(dir_.file("outside.safetensors"), CheckpointFormat::kSafetensors, tensors,
                            testing::random_data(tensors, 8));
  const std::string index = (inner / "model.safetensors.index.json").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"../outside.safetensors", "leads out of it"},
      {"sub/../../outside.safetensors", "leads out of it"},
      {dir_.file("outside.safetensors"), "absolute path"},
      {"", "empty name"},
      {std::string("a\0b.safetensors", 15), "\"a\\x00b.safetensors\" holds a NUL"},
  };
  for (const auto& [shard, cause] : cases) {
    SCOPED_TRACE(cause);
    testing::write_file(index, json{{"weight_map", {{"a", shard}}}}.dump());
    expect_error([&] { open_checkpoint(index); }, ErrorCode::kInvalidArgument,
                 {index, "tensor a", cause, "shards must be files in the index's directory " + inner.string()});
  }
}

// A checkpoint changed under a running job (issue 28): truncated, rewritten in place or replaced while the
// reader has it mapped, the next read is an error naming the file, the tensor and the change, never SIGBUS.
TEST(SafetensorsCheckpointTest, AFileChangedUnderTheReaderIsAnErrorNotASignal) {
  TempDir dir;
  const std::vector<TensorInfo> tensors = {{"first", DType::kF32, {4096}}, {"last.weight", DType::kBF16, {4096}}};
  const auto data = testing::random_data(tensors, 5);
  const std::string path = dir.file("t.safetensors");
  std::vector<std::byte> out(tensors[1].nbytes());
  const Box whole{{0}, {4096}};

  testing::write_checkpoint(path, CheckpointFormat::kSafetensors, tensors, data);
  auto reader = open_checkpoint(path);
  reader->read_box("last.weight", whole, out.data());
  EXPECT_EQ(std::memcmp(out.data(), data[1].data(), out.size()), 0);
  std::filesystem::resize_file(path, 64);  // the mapped pages past 64 bytes are gone
  expect_error([&] { reader->read_box("last.weight", whole, out.data()); }, ErrorCode::kCorruptData,
               {path, "last.weight", "changed while the job reads it", "size went from"});

  testing::write_checkpoint(path, CheckpointFormat::kSafetensors, tensors, data);
  reader = open_checkpoint(path);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.write("abcd", 4);
  }
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(1));
  expect_error([&] { reader->read_box("first", Box{{0}, {16}}, out.data()); }, ErrorCode::kCorruptData,
               {path, "first", "it was modified"});

  reader = open_checkpoint(path);
  const std::string other = dir.file("other.safetensors");
  testing::write_checkpoint(other, CheckpointFormat::kSafetensors, tensors, data);
  std::filesystem::rename(other, path);
  expect_error([&] { reader->read_box("first", Box{{0}, {16}}, out.data()); }, ErrorCode::kCorruptData,
               {path, "first", "replaced"});
}

}  // namespace
}  // namespace wb
