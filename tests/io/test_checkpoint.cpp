// Opening a checkpoint by name: formats by extension, directories with an index or one file, and paths
// that are not checkpoints (FIFOs, devices, directories) refused without blocking. What each format must
// do once open is in test_checkpoint_conformance.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb {
namespace {

using testing::expect_error;
using testing::TempDir;

TEST(CheckpointFormatTest, ParsesNames) {
  EXPECT_EQ(parse_checkpoint_format("hdf5"), CheckpointFormat::kHdf5);
  EXPECT_EQ(parse_checkpoint_format("h5"), CheckpointFormat::kHdf5);
  EXPECT_EQ(parse_checkpoint_format("HDF5"), CheckpointFormat::kHdf5);
  EXPECT_EQ(parse_checkpoint_format("safetensors"), CheckpointFormat::kSafetensors);
  expect_error([] { parse_checkpoint_format("pickle"); }, ErrorCode::kInvalidArgument, {"pickle"});
}

TEST(CheckpointWriterTest, RejectsBadTensorLists) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  expect_error([&] { create_checkpoint(path, CheckpointFormat::kSafetensors, {{"a", DType::kF32, {2}}, {"a", DType::kF32, {3}}}); },
               ErrorCode::kInvalidArgument, {path, "a", "more than once"});
  expect_error([&] { create_checkpoint(path, CheckpointFormat::kSafetensors, {{"neg", DType::kF32, {2, -1}}}); },
               ErrorCode::kInvalidArgument, {path, "neg"});
  expect_error([&] { create_checkpoint(dir.file("x.h5"), CheckpointFormat::kHdf5, {{"a", DType::kF32, {2}}}, {.max_shard_bytes = 8}); },
               ErrorCode::kInvalidArgument, {"max_shard_bytes"});
  EXPECT_TRUE(dir.entries().empty());
}

// --- dispatch ----------------------------------------------------------------------------------------

class CheckpointDispatchTest : public ::testing::Test {
 protected:
  const std::vector<TensorInfo> tensors_ = {{"w", DType::kF32, {3, 4}}, {"b", DType::kBF16, {4}}};
  std::vector<std::vector<std::byte>> data_ = {testing::random_tensor_bytes(tensors_[0], 1),
                                               testing::random_tensor_bytes(tensors_[1], 2)};
  TempDir dir_;

  void write(const std::string& path, CheckpointFormat format, const CheckpointWriterOptions& options = {}) {
    testing::write_checkpoint(path, format, tensors_, data_, options);
  }
  void expect_opens(const std::string& path) {
    SCOPED_TRACE(path);
    const auto reader = open_checkpoint(path);
    ASSERT_EQ(reader->tensors(), tensors_);
    std::vector<std::byte> out(tensors_[0].nbytes());
    reader->read("w", out.data());
    EXPECT_EQ(out, data_[0]);
  }
};

TEST_F(CheckpointDispatchTest, ByExtension) {
  write(dir_.file("m.h5"), CheckpointFormat::kHdf5);
  write(dir_.file("m.hdf5"), CheckpointFormat::kHdf5);
  write(dir_.file("m.safetensors"), CheckpointFormat::kSafetensors);
  std::filesystem::create_directory(dir_.path() / "sharded");
  write((dir_.path() / "sharded" / "model.safetensors.index.json").string(), CheckpointFormat::kSafetensors,
        {.max_shard_bytes = 16});
  expect_opens(dir_.file("m.h5"));
  expect_opens(dir_.file("m.hdf5"));
  expect_opens(dir_.file("m.safetensors"));
  expect_opens((dir_.path() / "sharded" / "model.safetensors.index.json").string());
  EXPECT_EQ(open_checkpoint(dir_.file("m.h5"))->source(), dir_.file("m.h5"));
}

TEST_F(CheckpointDispatchTest, DirectoryWithIndexOrOneFile) {
  const auto sharded = dir_.path() / "sharded";
  std::filesystem::create_directory(sharded);
  write((sharded / "model.safetensors.index.json").string(), CheckpointFormat::kSafetensors, {.max_shard_bytes = 16});
  expect_opens(sharded.string());
  EXPECT_EQ(open_checkpoint(sharded.string())->source(), (sharded / "model.safetensors.index.json").string());

  const auto single = dir_.path() / "single";
  std::filesystem::create_directory(single);
  write((single / "model.safetensors").string(), CheckpointFormat::kSafetensors);
  expect_opens(single.string());
}

TEST_F(CheckpointDispatchTest, DirectoryErrors) {
  const auto two = dir_.path() / "two";
  std::filesystem::create_directory(two);
  write((two / "a.safetensors").string(), CheckpointFormat::kSafetensors);
  write((two / "b.safetensors").string(), CheckpointFormat::kSafetensors);
  expect_error([&] { open_checkpoint(two.string()); }, ErrorCode::kInvalidArgument, {two.string(), "index"});

  const auto empty = dir_.path() / "empty";
  std::filesystem::create_directory(empty);
  expect_error([&] { open_checkpoint(empty.string()); }, ErrorCode::kNotFound, {empty.string()});
  expect_error([&] { open_checkpoint(dir_.file("missing.h5")); }, ErrorCode::kNotFound, {"missing.h5"});
  testing::write_file(dir_.file("weights.bin"), "x");
  expect_error([&] { open_checkpoint(dir_.file("weights.bin")); }, ErrorCode::kInvalidArgument, {"weights.bin"});
}

/// Opens `path` on another thread and expects the error within a few seconds: opening a FIFO for
/// reading blocks until a writer comes, so a reader that does not check would hang here. Should it hang,
/// the FIFO is opened for writing to release it, and the test fails.
void expect_refused_promptly(const std::string& path, const std::string& fifo, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(path);
  auto opening = std::async(std::launch::async, [&] { expect_error([&] { open_checkpoint(path); }, ErrorCode::kInvalidArgument, parts); });
  if (opening.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "opening " << path << " blocked";
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  opening.get();
}

TEST_F(CheckpointDispatchTest, FifosAndDevicesAreRefusedWithoutBlocking) {
  for (const char* name : {"pipe.h5", "pipe.safetensors", "model.safetensors.index.json"}) {
    const std::string fifo = dir_.file(name);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    expect_refused_promptly(fifo, fifo, {fifo, "FIFO", "not a regular file"});
    if (std::string(name) == "model.safetensors.index.json")
      expect_refused_promptly(dir_.path().string(), fifo, {fifo, "FIFO"});  // the directory's index
    std::filesystem::remove(fifo);
  }
  // The direct entry points check too, and an index's shard may be a FIFO.
  const std::string fifo = dir_.file("model-00001-of-00001.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  testing::write_file(dir_.file("model.safetensors.index.json"), R"({"weight_map": {"w": "model-00001-of-00001.safetensors"}})");
  expect_refused_promptly(dir_.file("model.safetensors.index.json"), fifo, {fifo, "FIFO"});
  auto hdf5 = std::async(std::launch::async, [&] {
    expect_error([&] { open_hdf5_checkpoint(fifo); }, ErrorCode::kInvalidArgument, {fifo, "FIFO"});
    expect_error([&] { open_safetensors_checkpoint(fifo); }, ErrorCode::kInvalidArgument, {fifo, "FIFO"});
  });
  ASSERT_EQ(hdf5.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "blocked on " << fifo;
  hdf5.get();

  // A character device behind a checkpoint name (reading /dev/zero never ends).
  std::filesystem::create_symlink("/dev/zero", dir_.path() / "zero.safetensors");
  std::filesystem::create_symlink("/dev/zero", dir_.path() / "zero.h5");
  for (const char* name : {"zero.safetensors", "zero.h5"})
    expect_error([&] { open_checkpoint(dir_.file(name)); }, ErrorCode::kInvalidArgument,
                 {dir_.file(name), "character device"});
  // A directory with a checkpoint's name.
  std::filesystem::create_directory(dir_.path() / "dir.h5");
  expect_error([&] { open_hdf5_checkpoint(dir_.file("dir.h5")); }, ErrorCode::kInvalidArgument, {"dir.h5", "a directory"});
}

}  // namespace
}  // namespace wb
