// HDF5's own cases: corrupt files, and files that crash libhdf5 (what every format does is in
// test_checkpoint_conformance.cpp). The tests do not link HDF5 itself, so files with a missing or wrong
// `dtype` attribute are made by patching bytes of a file our writer made (attribute names and fixed-length
// string values are stored verbatim in the object header).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb {
namespace {

using testing::expect_error;
using testing::TempDir;

/// Replaces the single occurrence of `from` in the file by `to` (same length); fails the test otherwise.
void patch_file(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = testing::read_file(path);
  const std::size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  ASSERT_EQ(bytes.find(from, at + 1), std::string::npos) << from << " occurs twice";
  bytes.replace(at, from.size(), to);
  testing::write_file(path, bytes);
}

// --- corrupt files --------------------------------------------------------------------------------------

class Hdf5CorruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("c.h5");
    testing::write_checkpoint(path_, CheckpointFormat::kHdf5, tensors_, testing::random_data(tensors_, 3));
  }
  TempDir dir_;
  std::string path_;
  const std::vector<TensorInfo> tensors_ = {{"model.norm.weight", DType::kF32, {256}}};
};

TEST_F(Hdf5CorruptTest, NotAnHdf5File) {
  const std::string path = dir_.file("text.h5");
  testing::write_file(path, std::string(4096, 'x'));
  expect_error([&] { open_checkpoint(path); }, ErrorCode::kCorruptData, {path, "not an HDF5 file"});
  testing::write_file(path, "");
  expect_error([&] { open_checkpoint(path); }, ErrorCode::kCorruptData, {path});
  expect_error([&] { open_checkpoint(dir_.file("absent.h5")); }, ErrorCode::kNotFound, {"absent.h5"});
}

TEST_F(Hdf5CorruptTest, Truncated) {
  const std::string bytes = testing::read_file(path_);
  for (std::size_t keep : {bytes.size() - 1, bytes.size() / 2, std::size_t{100}}) {
    testing::write_file(path_, bytes.substr(0, keep));
    SCOPED_TRACE(keep);
    // HDF5 compares the file's size with the end of its address space at open.
    expect_error([&] { open_checkpoint(path_); }, ErrorCode::kCorruptData, {path_});
  }
}

TEST_F(Hdf5CorruptTest, DtypeAttributeNeededOnlyForIntegerBits) {
  // A float32 dataset says what it is: without the attribute it still reads as f32, bit for bit.
  const std::vector<std::byte> data = testing::random_data(tensors_, 3)[0];
  patch_file(path_, "dtype", "dtypx");
  const auto reader = open_checkpoint(path_);
  ASSERT_EQ(reader->tensors(), tensors_);
  std::vector<std::byte> out(data.size());
  reader->read("model.norm.weight", out.data());
  EXPECT_EQ(out, data);

  // 16-bit integers holding bf16 bits do not: without the attribute they are refused.
  const std::string bits = dir_.file("bits.h5");
  const std::vector<TensorInfo> bf16 = {{"model.embed_tokens.weight", DType::kBF16, {4, 2}}};
  testing::write_checkpoint(bits, CheckpointFormat::kHdf5, bf16, testing::random_data(bf16, 4));
  patch_file(bits, "dtype", "dtypx");
  expect_error([&] { open_checkpoint(bits); }, ErrorCode::kCorruptData,
               {bits, "model.embed_tokens.weight", "16-bit unsigned integer", "no 'dtype' attribute", "bf16 or f16"});
}

TEST_F(Hdf5CorruptTest, StorageDoesNotMatchDtype) {
  patch_file(path_, "f32", "i32");  // float storage, integer attribute
  expect_error([&] { open_checkpoint(path_); }, ErrorCode::kCorruptData,
               {path_, "model.norm.weight", "32-bit float", "i32"});
}

TEST_F(Hdf5CorruptTest, UnknownDtype) {
  patch_file(path_, "f32", "q32");
  expect_error([&] { open_checkpoint(path_); }, ErrorCode::kCorruptData, {path_, "model.norm.weight", "q32"});
}

TEST(Hdf5CheckpointTest, Fp8AttributeWithWrongWidth) {
  // bf16 stored as uint16: an attribute claiming fp8 (stored as uint8) must be refused.
  TempDir dir;
  const std::string path = dir.file("w.h5");
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {8}}};
  testing::write_checkpoint(path, CheckpointFormat::kHdf5, tensors, testing::random_data(tensors, 1));
  patch_file(path, "bf16", std::string("u8\0\0", 4));
  expect_error([&] { open_checkpoint(path); }, ErrorCode::kCorruptData, {path, "w", "16-bit unsigned integer"});
}

// Files fuzz/fuzz_hdf5 found, on which libhdf5 1.10 itself faults (a global heap object read past its
// buffer; the metadata accumulator copying past its own) or frees a pointer it never set (a corrupt link
// message: "free(): invalid size" once another file has been through the heap). Each must be an error
// here, with another HDF5 file open, and the process must go on reading that one.
TEST(Hdf5CheckpointTest, FilesThatCrashLibhdf5AreErrors) {
  TempDir dir;
  const std::vector<TensorInfo> tensors = {{"model.norm.weight", DType::kBF16, {64}}};
  const auto data = testing::random_data(tensors, 5);
  testing::write_checkpoint(dir.file("good.h5"), CheckpointFormat::kHdf5, tensors, data);
  const auto good = open_checkpoint(dir.file("good.h5"));
  for (const char* name : {"global_heap_segv.h5", "accumulator_segv.h5", "link_message_bad_free.h5"}) {
    SCOPED_TRACE(name);
    const std::string path = std::string(WB_TEST_IO_DIR) + "/corrupt_hdf5/" + name;
    expect_error([&] { open_checkpoint(path); }, ErrorCode::kCorruptData, {path});
  }
  std::vector<std::byte> out(tensors[0].nbytes());
  good->read("model.norm.weight", out.data());
  EXPECT_EQ(out, data[0]);
}

// A file changed under an open reader is an error naming the file and the change at the next read, as in
// the safetensors reader (SafetensorsCheckpointTest.AFileChangedUnderTheReaderIsAnErrorNotASignal): libhdf5
// reads through its own descriptor, so a file rewritten in place would give another checkpoint's bytes.
TEST(Hdf5CheckpointTest, AFileChangedUnderTheReaderIsAnError) {
  TempDir dir;
  const std::vector<TensorInfo> tensors = {{"first", DType::kF32, {4096}}, {"last.weight", DType::kBF16, {4096}}};
  const auto data = testing::random_data(tensors, 6);
  const std::string path = dir.file("t.h5");
  std::vector<std::byte> out(tensors[0].nbytes());
  const Box part{{0}, {16}};

  testing::write_checkpoint(path, CheckpointFormat::kHdf5, tensors, data);
  auto reader = open_checkpoint(path);
  reader->read_box("first", Box{{0}, {4096}}, out.data());
  EXPECT_EQ(std::memcmp(out.data(), data[0].data(), out.size()), 0);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.write("abcd", 4);
  }
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(1));
  expect_error([&] { reader->read_box("first", part, out.data()); }, ErrorCode::kCorruptData,
               {path, "first", "changed while the job reads it", "it was modified"});

  testing::write_checkpoint(path, CheckpointFormat::kHdf5, tensors, data);
  reader = open_checkpoint(path);
  std::filesystem::resize_file(path, 64);
  expect_error([&] { reader->read_box("last.weight", part, out.data()); }, ErrorCode::kCorruptData,
               {path, "last.weight", "size went from"});

  testing::write_checkpoint(path, CheckpointFormat::kHdf5, tensors, data);
  reader = open_checkpoint(path);
  const std::string other = dir.file("other.h5");
  testing::write_checkpoint(other, CheckpointFormat::kHdf5, tensors, data);
  std::filesystem::rename(other, path);
  expect_error([&] { reader->read_box("first", part, out.data()); }, ErrorCode::kCorruptData, {path, "first", "replaced"});
}

}  // namespace
}  // namespace wb
