// A checkpoint reader over boxes held in memory: what a baseline's rollout worker received (whole
// tensors after a broadcast, only the boxes it needs after P2P), read by its own load_weights.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "weightbridge/checkpoint.hpp"

namespace wb::bench {

class BoxReader final : public CheckpointReader {
 public:
  /// `tensors`: the checkpoint's tensor list; boxes are added with add().
  BoxReader(std::vector<TensorInfo> tensors, std::string source);
  /// Box `box` of tensor `tensor` is at `data`, contiguous and row-major in the box's extent. The memory
  /// stays the caller's.
  void add(std::size_t tensor, const Box& box, const std::byte* data);

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  /// Composes `box` from the held boxes that intersect it; throws kNotFound naming the tensor and the
  /// first element no held box covers (what this worker never received).
  void read_box(std::string_view name, const Box& box, void* destination) const override;
  std::string source() const override { return source_; }

 private:
  struct Held {
    Box box;
    const std::byte* data = nullptr;
  };
  std::vector<TensorInfo> tensors_;
  std::string source_;
  std::vector<std::vector<Held>> held_;  // by tensor index
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace wb::bench
