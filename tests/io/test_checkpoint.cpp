// Format-independent checkpoint behaviour: dispatch, lookups, and box reads checked against an
// element-by-element reference, run against both formats.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <thread>
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

// --- lookups and box reads, both formats ---------------------------------------------------------------

struct FormatCase {
  const char* name;
  CheckpointFormat format;
  const char* file;
  std::size_t max_shard_bytes;
};

class CheckpointBoxReadTest : public ::testing::TestWithParam<FormatCase> {
 protected:
  void SetUp() override {
    tensors_ = {{"vec", DType::kBF16, {37}},           {"mat", DType::kF32, {13, 29}},
                {"cube", DType::kF8E4M3, {5, 7, 11}},  {"four", DType::kI64, {3, 4, 5, 6}},
                {"scalar", DType::kF64, {}},           {"empty", DType::kF16, {4, 0, 3}}};
    for (std::size_t i = 0; i < tensors_.size(); ++i) data_.push_back(testing::random_tensor_bytes(tensors_[i], 100 + i));
    path_ = dir_.file(GetParam().file);
    testing::write_checkpoint(path_, GetParam().format, tensors_, data_, {.max_shard_bytes = GetParam().max_shard_bytes});
    reader_ = open_checkpoint(path_);
  }

  void expect_box(std::size_t tensor, const Box& box) {
    const TensorInfo& info = tensors_[tensor];
    SCOPED_TRACE(info.name + " " + box.to_string());
    const std::size_t element = dtype_size(info.dtype);
    const std::vector<std::byte> expected = testing::reference_box(data_[tensor], info.shape, element, box);
    std::vector<std::byte> out(expected.size() + 16, std::byte{0xA5});  // guard bytes catch overruns
    reader_->read_box(info.name, box, out.data());
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), out.begin()));
    for (std::size_t i = expected.size(); i < out.size(); ++i) ASSERT_EQ(out[i], std::byte{0xA5}) << "overrun";
  }

  TempDir dir_;
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<std::byte>> data_;
  std::unique_ptr<CheckpointReader> reader_;
};

TEST_P(CheckpointBoxReadTest, ListsTensorsAndLooksThemUp) {
  EXPECT_EQ(reader_->tensors(), tensors_);  // declaration order survives in both formats
  ASSERT_NE(reader_->find("cube"), nullptr);
  EXPECT_EQ(reader_->find("cube")->shape, (Shape{5, 7, 11}));
  EXPECT_EQ(reader_->find("nope"), nullptr);
  EXPECT_EQ(reader_->info("mat").dtype, DType::kF32);
  expect_error([&] { reader_->info("nope"); }, ErrorCode::kNotFound, {"nope", reader_->source()});
  std::size_t total = 0;
  for (const TensorInfo& info : tensors_) total += info.nbytes();
  EXPECT_EQ(reader_->total_bytes(), total);
}

TEST_P(CheckpointBoxReadTest, WholeTensors) {
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    std::vector<std::byte> out(tensors_[i].nbytes());
    reader_->read(tensors_[i].name, out.data());
    EXPECT_EQ(out, data_[i]) << tensors_[i].name;
  }
}

TEST_P(CheckpointBoxReadTest, EdgeBoxes) {
  expect_box(0, {{0}, {37}});
  expect_box(0, {{36}, {1}});
  expect_box(0, {{5}, {20}});
  expect_box(1, {{0, 0}, {13, 29}});
  expect_box(1, {{4, 0}, {6, 29}});    // a range of rows: one run
  expect_box(1, {{0, 28}, {13, 1}});   // the last column
  expect_box(1, {{12, 0}, {1, 29}});   // the last row
  expect_box(1, {{12, 28}, {1, 1}});   // the last element
  expect_box(1, {{3, 7}, {5, 11}});
  expect_box(2, {{0, 0, 0}, {5, 7, 11}});
  expect_box(2, {{4, 6, 10}, {1, 1, 1}});
  expect_box(2, {{1, 0, 0}, {3, 7, 11}});
  expect_box(2, {{1, 2, 0}, {3, 4, 11}});
  expect_box(2, {{0, 3, 5}, {5, 4, 6}});
  expect_box(2, {{2, 0, 10}, {1, 7, 1}});
  expect_box(3, {{1, 1, 1, 1}, {2, 3, 4, 5}});
  expect_box(4, {{}, {}});
  expect_box(5, {{0, 0, 0}, {4, 0, 3}});
  expect_box(1, {{3, 3}, {0, 5}});  // an empty box reads nothing
}

TEST_P(CheckpointBoxReadTest, RandomBoxes) {
  std::mt19937_64 generator(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t tensor = generator() % 4;
    const Shape& shape = tensors_[tensor].shape;
    Box box{Shape(shape.size()), Shape(shape.size())};
    for (std::size_t a = 0; a < shape.size(); ++a) {
      box.offset[a] = static_cast<std::int64_t>(generator() % static_cast<std::uint64_t>(shape[a]));
      box.extent[a] = 1 + static_cast<std::int64_t>(generator() % static_cast<std::uint64_t>(shape[a] - box.offset[a]));
    }
    expect_box(tensor, box);
  }
}

TEST_P(CheckpointBoxReadTest, BadReadsNameTheTensor) {
  std::vector<std::byte> out(4096);
  expect_error([&] { reader_->read_box("nope", {{0}, {1}}, out.data()); }, ErrorCode::kNotFound, {"nope", reader_->source()});
  expect_error([&] { reader_->read_box("mat", {{10, 0}, {4, 29}}, out.data()); }, ErrorCode::kInvalidArgument,
               {"mat", reader_->source(), "[10:14, 0:29]"});
  expect_error([&] { reader_->read_box("mat", {{0}, {3}}, out.data()); }, ErrorCode::kInvalidArgument, {"mat"});
  expect_error([&] { reader_->read_box("vec", {{-1}, {3}}, out.data()); }, ErrorCode::kInvalidArgument, {"vec"});
}

TEST_P(CheckpointBoxReadTest, ConcurrentReaders) {
  // Several readers of one file at once (as MPI ranks do), each read from several threads.
  auto second = open_checkpoint(path_);
  std::vector<std::thread> threads;
  std::vector<int> good(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      const CheckpointReader& reader = t % 2 == 0 ? *reader_ : *second;
      std::vector<std::byte> out(tensors_[1].nbytes());
      for (int i = 0; i < 20; ++i) {
        reader.read("mat", out.data());
        good[t] += out == data_[1];
      }
    });
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(good[t], 20) << t;
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointBoxReadTest,
                         ::testing::Values(FormatCase{"Hdf5", CheckpointFormat::kHdf5, "c.h5", 0},
                                           FormatCase{"Safetensors", CheckpointFormat::kSafetensors, "c.safetensors", 0},
                                           FormatCase{"SafetensorsSharded", CheckpointFormat::kSafetensors,
                                                      "model.safetensors.index.json", 1000}),
                         [](const ::testing::TestParamInfo<FormatCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace wb
