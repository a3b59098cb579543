// Model versions for end-to-end replays: what an RL step does to a checkpoint, deterministically.
#pragma once

#include <cstdint>
#include <string>

#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

/// Version `version` of `base`: every element's low bits (2 of a 1-byte element, 4 of 2 bytes, 8 of 4,
/// 16 of 8) are XOR-ed with a nonzero value hashed from (version, tensor, flat index), so every element
/// changes from one version to the next, differently per element. Version 0 is `base` unchanged. Any box
/// agrees with the whole tensor, so every worker reading its own boxes sees the same version.
class VersionedCheckpoint final : public CheckpointReader {
 public:
  VersionedCheckpoint(const CheckpointReader& base, std::uint64_t version) : base_(base), version_(version) {}
  const std::vector<TensorInfo>& tensors() const override { return base_.tensors(); }
  void read_box(std::string_view name, const Box& box, void* destination) const override;
  std::string source() const override;
  std::uint64_t version() const { return version_; }

 private:
  const CheckpointReader& base_;
  std::uint64_t version_;
};

}  // namespace wb::emu
