// Helpers shared by the checkpoint tests: a scratch directory, random bit patterns, an independent
// element-by-element box extraction, files written and read whole (and expect_error, from tests/support).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../support/expect_error.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace wb::testing {

/// A fresh directory under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::random_device device;
    path_ = std::filesystem::temp_directory_path() /
            ("wb-io-test-" + std::to_string(::getpid()) + "-" + std::to_string(device()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  /// Names of the entries in the directory (to check that nothing was left behind).
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) names.push_back(entry.path().filename().string());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes = {DType::kBF16, DType::kF16,   DType::kF32,    DType::kF64,    DType::kI8,
                                            DType::kU8,   DType::kI32,   DType::kI64,    DType::kF8E4M3, DType::kF8E5M2};
  return dtypes;
}

/// Random bytes, with the first elements set to awkward patterns of each width (NaNs with payloads,
/// infinities, negative zero, denormals, all ones), which a copy must carry through unchanged.
inline std::vector<std::byte> random_tensor_bytes(const TensorInfo& info, std::uint64_t seed) {
  std::vector<std::byte> bytes(info.nbytes());
  std::mt19937_64 generator(seed);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(generator() & 0xFF);
  const std::size_t width = dtype_size(info.dtype);
  std::vector<std::uint64_t> odd;
  if (width == 1) odd = {0xFF, 0x7F, 0x80, 0x00, 0x01, 0x7E, 0xFE};
  if (width == 2) odd = {0x7FC1, 0xFFFF, 0x8000, 0x0001, 0x7F80, 0xFF81, 0x7C01, 0x03FF};
  if (width == 4) odd = {0x7FC00001, 0xFFFFFFFF, 0x80000000, 0x00000001, 0x7F800000};
  if (width == 8) odd = {0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF, 0x8000000000000000, 0x1};
  for (std::size_t i = 0; i < odd.size() && (i + 1) * width <= bytes.size(); ++i)
    std::memcpy(bytes.data() + i * width, &odd[i], width);  // little-endian host
  return bytes;
}

/// The elements of `box` of a contiguous row-major tensor, one element at a time (the reference the
/// readers' run-based copies are checked against).
inline std::vector<std::byte> reference_box(const std::vector<std::byte>& whole, const Shape& shape,
                                            std::size_t element_size, const Box& box) {
  const std::size_t count = static_cast<std::size_t>(box.numel());
  std::vector<std::byte> out(count * element_size);
  const Shape strides = contiguous_strides(shape);
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t n = 0; n < count; ++n) {
    std::int64_t flat = 0;
    for (std::size_t a = 0; a < shape.size(); ++a) flat += (box.offset[a] + index[a]) * strides[a];
    std::memcpy(out.data() + n * element_size, whole.data() + static_cast<std::size_t>(flat) * element_size, element_size);
    for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
      if (++index[a] < box.extent[a]) break;
      index[a] = 0;
    }
  }
  return out;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Random bytes for every tensor, one seed after the other.
inline std::vector<std::vector<std::byte>> random_data(const std::vector<TensorInfo>& tensors, std::uint64_t seed) {
  std::vector<std::vector<std::byte>> data;
  for (const TensorInfo& info : tensors) data.push_back(random_tensor_bytes(info, seed++));
  return data;
}

/// `reader` lists exactly `tensors`, in that order, and reads back `data` (parallel) bit for bit.
inline void expect_round_trip(const CheckpointReader& reader, const std::vector<TensorInfo>& tensors,
                              const std::vector<std::vector<std::byte>>& data) {
  ASSERT_EQ(reader.tensors(), tensors);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::vector<std::byte> out(tensors[i].nbytes());
    reader.read(tensors[i].name, out.data());
    EXPECT_EQ(out, data[i]) << tensors[i].name;
  }
}

/// Writes `tensors` with `data` (parallel) to `path` through create_checkpoint.
inline void write_checkpoint(const std::string& path, CheckpointFormat format, const std::vector<TensorInfo>& tensors,
                             const std::vector<std::vector<std::byte>>& data,
                             const CheckpointWriterOptions& options = {}) {
  auto writer = create_checkpoint(path, format, tensors, options);
  for (std::size_t i = tensors.size(); i-- > 0;) writer->write(tensors[i].name, data[i].data());  // any order
  writer->finish();
}

}  // namespace wb::testing
