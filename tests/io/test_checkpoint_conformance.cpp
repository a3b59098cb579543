// What every checkpoint format must do, run against each of them (HDF5, one safetensors file, sharded
// safetensors with an index): bit-exact round trips of every dtype in the declared order, empty and scalar
// tensors, many tensors; a writer that takes each tensor once, leaves nothing behind unless finished and
// refuses a missing directory; lookups and box reads checked against an element-by-element reference,
// bad reads naming the tensor, concurrent readers. test_hdf5.cpp and test_safetensors.cpp hold what is
// particular to one format (its file layout, its corrupt files).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
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

struct FormatCase {
  const char* name;
  CheckpointFormat format;
  const char* file;                // what the writer is given and the reader opens
  std::size_t max_shard_bytes;     // 0: one file
  ErrorCode missing_directory;     // creating a checkpoint in a directory that does not exist
};

const FormatCase kFormats[] = {
    {"Hdf5", CheckpointFormat::kHdf5, "c.h5", 0, ErrorCode::kHdf5},
    {"Safetensors", CheckpointFormat::kSafetensors, "c.safetensors", 0, ErrorCode::kNotFound},
    {"SafetensorsSharded", CheckpointFormat::kSafetensors, "model.safetensors.index.json", 1000, ErrorCode::kNotFound},
};

std::string format_name(const ::testing::TestParamInfo<FormatCase>& info) { return info.param.name; }

class CheckpointConformance : public ::testing::TestWithParam<FormatCase> {
 protected:
  std::string path() const { return dir_.file(GetParam().file); }
  CheckpointWriterOptions options() const { return {.max_shard_bytes = GetParam().max_shard_bytes}; }
  void write(const std::vector<TensorInfo>& tensors, const std::vector<std::vector<std::byte>>& data) {
    testing::write_checkpoint(path(), GetParam().format, tensors, data, options());
  }
  /// A finished checkpoint leaves no temporary file (the writers write "<name>.partial-*", then rename).
  void expect_no_temporaries() const {
    for (const std::string& entry : dir_.entries()) EXPECT_EQ(entry.find(".partial-"), std::string::npos) << entry;
  }

  TempDir dir_;
};

TEST_P(CheckpointConformance, RoundTripEveryDtypeBitExactInDeclaredOrder) {
  // Declared neither alphabetically nor in write order (write_checkpoint writes the last first).
  std::vector<TensorInfo> tensors = {{"zeta", DType::kF32, {2}}, {"alpha", DType::kI8, {3}}};
  int i = 0;
  for (DType dtype : testing::all_dtypes())
    tensors.push_back({"model.layers." + std::to_string(i++) + ".w_" + std::string(dtype_name(dtype)), dtype, {4, 3 + i}});
  const auto data = testing::random_data(tensors, 21);
  write(tensors, data);
  testing::expect_round_trip(*open_checkpoint(path()), tensors, data);
  expect_no_temporaries();
}

TEST_P(CheckpointConformance, ZeroSizeAndScalarTensors) {
  const std::vector<TensorInfo> tensors = {{"empty", DType::kBF16, {0, 8}}, {"scalar", DType::kF64, {}}, {"x", DType::kU8, {3}}};
  const auto data = testing::random_data(tensors, 9);
  write(tensors, data);
  testing::expect_round_trip(*open_checkpoint(path()), tensors, data);
}

TEST_P(CheckpointConformance, ManyTensors) {
  std::vector<TensorInfo> tensors;
  for (int i = 0; i < 300; ++i) tensors.push_back({"t." + std::to_string(299 - i), DType::kF16, {2, 2}});
  const auto data = testing::random_data(tensors, 2);
  write(tensors, data);  // HDF5: dense link storage; sharded: several shards
  testing::expect_round_trip(*open_checkpoint(path()), tensors, data);
}

TEST_P(CheckpointConformance, WriterTakesEachTensorOnceAndLeavesNothingUnfinished) {
  const std::vector<TensorInfo> tensors = {{"a", DType::kF32, {64}}, {"b", DType::kI32, {64}}};
  const auto data = testing::random_data(tensors, 1);
  {
    auto writer = create_checkpoint(path(), GetParam().format, tensors, options());
    writer->write("a", data[0].data());
    expect_error([&] { writer->write("a", data[0].data()); }, ErrorCode::kInvalidArgument, {path(), "a", "twice"});
    expect_error([&] { writer->write("c", data[0].data()); }, ErrorCode::kInvalidArgument, {path(), "c"});
    expect_error([&] { writer->finish(); }, ErrorCode::kInvalidArgument, {path(), "b"});
  }
  EXPECT_TRUE(dir_.entries().empty()) << "a writer destroyed without finish left files";

  auto writer = create_checkpoint(path(), GetParam().format, tensors, options());
  writer->write("b", data[1].data());  // any order
  writer->write("a", data[0].data());
  writer->finish();
  writer.reset();
  testing::expect_round_trip(*open_checkpoint(path()), tensors, data);
  expect_no_temporaries();
}

TEST_P(CheckpointConformance, WriterIntoAMissingDirectoryFailsAtCreation) {
  const std::string missing = dir_.file(std::string("no/such/") + GetParam().file);
  expect_error([&] { create_checkpoint(missing, GetParam().format, {{"a", DType::kF32, {2}}}, options()); },
               GetParam().missing_directory, {"no/such/"});
  EXPECT_TRUE(dir_.entries().empty());
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointConformance, ::testing::ValuesIn(kFormats), format_name);

// --- lookups and box reads -------------------------------------------------------------------------------

class CheckpointBoxReads : public CheckpointConformance {
 protected:
  void SetUp() override {
    tensors_ = {{"vec", DType::kBF16, {37}},           {"mat", DType::kF32, {13, 29}},
                {"cube", DType::kF8E4M3, {5, 7, 11}},  {"four", DType::kI64, {3, 4, 5, 6}},
                {"scalar", DType::kF64, {}},           {"empty", DType::kF16, {4, 0, 3}}};
    data_ = testing::random_data(tensors_, 100);
    write(tensors_, data_);
    reader_ = open_checkpoint(path());
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

  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<std::byte>> data_;
  std::unique_ptr<CheckpointReader> reader_;
};

TEST_P(CheckpointBoxReads, ListsTensorsAndLooksThemUp) {
  EXPECT_EQ(reader_->tensors(), tensors_);  // declaration order survives
  ASSERT_NE(reader_->find("cube"), nullptr);
  EXPECT_EQ(reader_->find("cube")->shape, (Shape{5, 7, 11}));
  EXPECT_EQ(reader_->find("nope"), nullptr);
  EXPECT_EQ(reader_->info("mat").dtype, DType::kF32);
  expect_error([&] { reader_->info("nope"); }, ErrorCode::kNotFound, {"nope", reader_->source()});
  std::size_t total = 0;
  for (const TensorInfo& info : tensors_) total += info.nbytes();
  EXPECT_EQ(reader_->total_bytes(), total);
}

TEST_P(CheckpointBoxReads, WholeTensors) {
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    std::vector<std::byte> out(tensors_[i].nbytes());
    reader_->read(tensors_[i].name, out.data());
    EXPECT_EQ(out, data_[i]) << tensors_[i].name;
  }
}

TEST_P(CheckpointBoxReads, EdgeBoxes) {
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

TEST_P(CheckpointBoxReads, RandomBoxes) {
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

TEST_P(CheckpointBoxReads, BadReadsNameTheTensor) {
  std::vector<std::byte> out(4096);
  expect_error([&] { reader_->read_box("nope", {{0}, {1}}, out.data()); }, ErrorCode::kNotFound, {"nope", reader_->source()});
  expect_error([&] { reader_->read_box("mat", {{10, 0}, {4, 29}}, out.data()); }, ErrorCode::kInvalidArgument,
               {"mat", reader_->source(), "[10:14, 0:29]"});
  expect_error([&] { reader_->read_box("mat", {{0}, {3}}, out.data()); }, ErrorCode::kInvalidArgument, {"mat"});
  expect_error([&] { reader_->read_box("vec", {{-1}, {3}}, out.data()); }, ErrorCode::kInvalidArgument, {"vec"});
}

TEST_P(CheckpointBoxReads, ConcurrentReaders) {
  // Several readers of one file at once (as MPI ranks do), each read from several threads.
  auto second = open_checkpoint(path());
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

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointBoxReads, ::testing::ValuesIn(kFormats), format_name);

}  // namespace
}  // namespace wb
