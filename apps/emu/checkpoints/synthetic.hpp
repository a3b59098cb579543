// Deterministic synthetic checkpoints: values computed from (seed, tensor name, element index), so tests
// and the demo need no download and any box can be produced without the rest of the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

/// Fills `destination` (contiguous, row-major in box.extent) with the synthetic values of `box` of
/// tensor `info`. Floating-point values are finite, normal and small (|x| < 0.25, as trained weights
/// are); integer tensors get hashed bits. Element values depend on (seed, name, flat index) only, so any
/// box of the same tensor agrees with the whole.
void fill_synthetic(const TensorInfo& info, const Box& box, std::uint64_t seed, void* destination);

/// A checkpoint that holds no data: read_box computes the synthetic values on demand.
class SyntheticCheckpoint final : public CheckpointReader {
 public:
  SyntheticCheckpoint(std::vector<TensorInfo> tensors, std::uint64_t seed);
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void read_box(std::string_view name, const Box& box, void* destination) const override;
  std::string source() const override;

 private:
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;  // owned keys: safe to move, read from many threads
  std::uint64_t seed_;
};

/// Writes the synthetic checkpoint of `tensors` to `path` one tensor at a time. `between_tensors`, when
/// given, runs before each tensor; what it throws abandons the checkpoint (the writer removes its files).
void write_synthetic_checkpoint(const std::string& path, CheckpointFormat format,
                                const std::vector<TensorInfo>& tensors, std::uint64_t seed,
                                const CheckpointWriterOptions& options = {},
                                const std::function<void()>& between_tensors = {});

}  // namespace wb::emu
