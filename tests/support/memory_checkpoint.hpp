// A bf16 checkpoint in memory, for tests that need values but no file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::testing {

class MemoryCheckpoint final : public CheckpointReader {
 public:
  void add(TensorInfo info, std::vector<std::uint16_t> data) {
    tensors_.push_back(std::move(info));
    data_.push_back(std::move(data));
  }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      if (tensors_[t].name != name) continue;
      auto whole = TensorView::contiguous(const_cast<std::uint16_t*>(data_[t].data()), DType::kBF16, tensors_[t].shape);
      copy_tensor(TensorView::contiguous(destination, DType::kBF16, box.extent), whole.box(box));
      return;
    }
    throw Error(ErrorCode::kNotFound, std::string(name));
  }
  std::string source() const override { return "memory"; }
  /// Element `flat` (row-major) of tensor `t`, in the order added.
  std::uint16_t at(std::size_t t, std::int64_t flat) const { return data_[t][static_cast<std::size_t>(flat)]; }

 private:
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<std::uint16_t>> data_;
};

}  // namespace wb::testing
