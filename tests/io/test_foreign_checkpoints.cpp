// Checkpoints written by other tools: HDF5 files from h5py (tests/io/h5py_checkpoints.py, run with
// Debian's /usr/bin/python3, which has python3-h5py) and safetensors files from the independent writer
// in independent_safetensors.hpp. Each is read back bit for bit, or refused naming file, tensor and cause.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/setting_scope.hpp"
#include "independent_safetensors.hpp"
#include "io_test_util.hpp"
#include "weightbridge/checkpoint.hpp"

#ifndef WB_TEST_IO_DIR
#error "WB_TEST_IO_DIR must name tests/io (tests/CMakeLists.txt)"
#endif

namespace wb {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::TempDir;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<std::byte> as_bytes(const std::string& text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

/// Runs the h5py script into `dir`; returns "" when it wrote the files, else why the test must skip.
std::string write_h5py_files(const TempDir& dir) {
  const char* python = "/usr/bin/python3";  // Debian's: the one python3-h5py installs into
  if (::access(python, X_OK) != 0) return std::string(python) + " not found: cannot write HDF5 files with h5py";
  const std::string log = dir.file("h5py.log");
  const std::string command = std::string(python) + " " + WB_TEST_IO_DIR + "/h5py_checkpoints.py " + dir.path().string() +
                              " > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) return testing::read_file(log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << testing::read_file(log);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : "h5py_checkpoints.py failed";
}

TEST(H5pyCheckpointTest, ReadsWhatH5pyWritesAndRefusesTheRest) {
  TempDir dir;
  if (const std::string skip = write_h5py_files(dir); !skip.empty()) GTEST_SKIP() << skip;
  const json manifest = json::parse(testing::read_file(dir.file("manifest.json")));
  std::size_t readable = 0, refused = 0;
  for (const auto& [file, spec] : manifest.items()) {
    SCOPED_TRACE(file);
    const std::string path = dir.file(file);
    if (spec.contains("error")) {
      std::vector<std::string> parts = {path};
      for (const json& part : spec["error"]) parts.push_back(part.get<std::string>());
      try {
        open_checkpoint(path);
        ADD_FAILURE() << "opened, but must be refused";
      } catch (const Error& error) {
        EXPECT_EQ(error.code(), ErrorCode::kCorruptData) << error.what();
        for (const std::string& part : parts)
          EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << "lacks \"" << part << "\": " << error.what();
      }
      ++refused;
      continue;
    }
    const auto reader = open_checkpoint(path);
    const json& expected = spec["tensors"];
    ASSERT_EQ(reader->tensors().size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const TensorInfo& info = reader->tensors()[i];
      const json& want = expected[i];
      SCOPED_TRACE(info.name);
      EXPECT_EQ(info.name, want["name"].get<std::string>());
      EXPECT_EQ(dtype_name(info.dtype), want["dtype"].get<std::string>());
      EXPECT_EQ(info.shape, want["shape"].get<Shape>());
      const std::vector<std::byte> bytes = as_bytes(from_hex(want["hex"].get<std::string>()));
      ASSERT_EQ(bytes.size(), info.nbytes());
      std::vector<std::byte> whole(info.nbytes());
      reader->read(info.name, whole.data());
      EXPECT_EQ(whole, bytes);
      if (info.shape.size() == 2 && info.shape[0] > 1 && info.shape[1] > 1) {  // a box: hyperslab and byte order
        const Box box{{1, 1}, {info.shape[0] - 1, info.shape[1] - 1}};
        std::vector<std::byte> part(static_cast<std::size_t>(box.numel()) * dtype_size(info.dtype));
        reader->read_box(info.name, box, part.data());
        EXPECT_EQ(part, testing::reference_box(bytes, info.shape, dtype_size(info.dtype), box));
      }
    }
    ++readable;
  }
  EXPECT_EQ(readable, 2u);  // the script's files, so that losing one fails here
  EXPECT_EQ(refused, 9u);
}

/// Sets the size of the first object of the file's one global heap collection (where h5py keeps the
/// variable-length strings of attributes): libhdf5 1.10 trusts it.
std::string with_heap_object_size(const std::string& bytes, std::uint64_t size) {
  const std::size_t collection = bytes.find("GCOL");
  EXPECT_NE(collection, std::string::npos);
  EXPECT_EQ(bytes.find("GCOL", collection + 1), std::string::npos);
  // "GCOL", version, 3 reserved, 8-byte collection size; then per object: index (2), references (2),
  // reserved (4), size (8).
  std::string out = bytes;
  for (int b = 0; b < 8; ++b) out[collection + 24 + b] = static_cast<char>((size >> (8 * b)) & 0xFF);
  return out;
}

TEST(H5pyCheckpointTest, CorruptHeapIsAnErrorAfterAnotherFileWasOpened) {
  TempDir dir;
  if (const std::string skip = write_h5py_files(dir); !skip.empty()) GTEST_SKIP() << skip;
  testing::SettingScope settings;
  settings.set("hdf5_check_seconds", "2");
  // Another HDF5 file open in this process (the case: libhdf5's free lists then hold its blocks).
  const auto other = open_checkpoint(dir.file("native.h5"));
  const std::string strings = testing::read_file(dir.file("strings.h5"));

  // A huge size: libhdf5 reads past its buffer and faults.
  const std::string faults = dir.file("faults.h5");
  testing::write_file(faults, with_heap_object_size(strings, std::uint64_t{1} << 20));
  const std::string crashed = expect_error([&] { open_checkpoint(faults); }, ErrorCode::kCorruptData,
                                           {faults, "tensor a.vlen_utf8", "metadata is corrupt", "child process that checks"});
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer takes the child's fault and ends it with its own exit status instead of the signal.
  EXPECT_NE(crashed.find("with exit status"), std::string::npos) << crashed;
#else
  EXPECT_NE(crashed.find("crashed the HDF5 library"), std::string::npos) << crashed;
#endif
  // A size that leaves the collection's end unreachable: libhdf5 decodes it forever.
  const std::string loops = dir.file("loops.h5");
  testing::write_file(loops, with_heap_object_size(strings, 4000));
  expect_error([&] { open_checkpoint(loops); }, ErrorCode::kCorruptData,
               {loops, "tensor a.vlen_utf8", "made no progress for 2 s"});

  // This process is unharmed: both good files read as before.
  std::vector<std::byte> scratch(other->tensors().front().nbytes());
  other->read(other->tensors().front().name, scratch.data());
  const auto again = open_checkpoint(dir.file("strings.h5"));
  EXPECT_EQ(again->tensors().size(), 9u);
}

// --- safetensors from the independent writer ----------------------------------------------------------

std::string random_bytes(std::size_t n, std::uint64_t seed) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    out[i] = static_cast<char>(seed >> 56);
  }
  return out;
}

testing::ForeignTensor foreign(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape,
                               std::uint64_t seed) {
  std::size_t count = 1;
  for (const std::int64_t extent : shape) count *= static_cast<std::size_t>(extent);
  return {name, dtype, shape, random_bytes(count * testing::foreign_element_size(dtype), seed)};
}

void expect_tensor(const CheckpointReader& reader, const testing::ForeignTensor& want) {
  SCOPED_TRACE(want.name);
  const TensorInfo& info = reader.info(want.name);
  EXPECT_EQ(dtype_safetensors_name(info.dtype), want.dtype);
  EXPECT_EQ(info.shape, Shape(want.shape.begin(), want.shape.end()));
  std::vector<std::byte> got(info.nbytes());
  reader.read(want.name, got.data());
  EXPECT_EQ(got, as_bytes(want.bytes));
}

TEST(IndependentSafetensorsTest, MixedDtypesTensorByTensor) {
  TempDir dir;
  // As DeepSeek-V3-family checkpoints are: bf16 weights, the router's correction bias in float32.
  const std::vector<testing::ForeignTensor> tensors = {
      foreign("model.layers.1.mlp.gate.weight", "BF16", {8, 6}, 1),
      foreign("model.layers.1.mlp.gate.e_score_correction_bias", "F32", {8}, 2),
      foreign("model.layers.1.mlp.experts.0.up_proj.weight", "F8_E4M3", {4, 6}, 3),
      foreign("model.norm.weight", "F16", {6}, 4),
      foreign("step", "I64", {}, 5),
  };
  const std::string path = dir.file("model.safetensors");
  testing::write_file(path, testing::safetensors_file(tensors, {{"format", "pt"}, {"producer", "test"}}));
  const auto reader = open_checkpoint(path);
  // Data order, as the reference writer placed them: larger elements first, then by name.
  const std::vector<std::string> order = {"step", "model.layers.1.mlp.gate.e_score_correction_bias",
                                          "model.layers.1.mlp.gate.weight", "model.norm.weight",
                                          "model.layers.1.mlp.experts.0.up_proj.weight"};
  ASSERT_EQ(reader->tensors().size(), order.size());
  for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(reader->tensors()[i].name, order[i]);
  for (const auto& tensor : tensors) expect_tensor(*reader, tensor);

  const Box box{{2, 1}, {5, 4}};
  std::vector<std::byte> part(static_cast<std::size_t>(box.numel()) * 2);
  reader->read_box("model.layers.1.mlp.gate.weight", box, part.data());
  EXPECT_EQ(part, testing::reference_box(as_bytes(tensors[0].bytes), {8, 6}, 2, box));
}

TEST(IndependentSafetensorsTest, HuggingFaceCacheLayoutWithLinkedShards) {
  // snapshots/<revision>/ holds symbolic links into blobs/, outside the index's directory: shard names
  // are checked, not where links lead.
  TempDir dir;
  const std::vector<testing::ForeignTensor> first = {foreign("model.embed_tokens.weight", "BF16", {10, 4}, 7),
                                                     foreign("model.layers.0.self_attn.q_proj.weight", "BF16", {4, 4}, 8)};
  const std::vector<testing::ForeignTensor> second = {foreign("lm_head.weight", "BF16", {10, 4}, 9),
                                                      foreign("model.norm.weight", "F32", {4}, 10)};
  fs::create_directories(dir.path() / "blobs");
  fs::create_directories(dir.path() / "snapshots" / "0123abc");
  testing::write_file(dir.file("blobs/1f3e"), testing::safetensors_file(first, {{"format", "pt"}}));
  testing::write_file(dir.file("blobs/a9c2"), testing::safetensors_file(second, {{"format", "pt"}}));
  std::map<std::string, std::string> weight_map;
  std::uint64_t total = 0;
  for (const auto& t : first) weight_map[t.name] = "model-00001-of-00002.safetensors", total += t.bytes.size();
  for (const auto& t : second) weight_map[t.name] = "model-00002-of-00002.safetensors", total += t.bytes.size();
  testing::write_file(dir.file("blobs/77aa"), testing::safetensors_index(weight_map, total));
  const fs::path snapshot = dir.path() / "snapshots" / "0123abc";
  fs::create_symlink("../../blobs/1f3e", snapshot / "model-00001-of-00002.safetensors");
  fs::create_symlink("../../blobs/a9c2", snapshot / "model-00002-of-00002.safetensors");
  fs::create_symlink("../../blobs/77aa", snapshot / "model.safetensors.index.json");

  const auto reader = open_checkpoint(snapshot.string());  // the directory, as users pass it
  ASSERT_EQ(reader->tensors().size(), 4u);
  for (const auto& t : first) expect_tensor(*reader, t);
  for (const auto& t : second) expect_tensor(*reader, t);
}

TEST(IndependentSafetensorsTest, ShardsInASubdirectory) {
  TempDir dir;
  const std::vector<testing::ForeignTensor> tensors = {foreign("a.weight", "F32", {3, 3}, 11)};
  fs::create_directories(dir.path() / "shards");
  testing::write_file(dir.file("shards/part-0.safetensors"), testing::safetensors_file(tensors));
  testing::write_file(dir.file("model.safetensors.index.json"),
                      testing::safetensors_index({{"a.weight", "shards/./part-0.safetensors"}}, 36));
  const auto reader = open_checkpoint(dir.file("model.safetensors.index.json"));
  expect_tensor(*reader, tensors[0]);
}

}  // namespace
}  // namespace wb
