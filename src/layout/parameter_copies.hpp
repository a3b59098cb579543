// Host copies of a worker's parameters in one mapping, for the probe: the saved contents it restores at the
// end, and the host copies through which it reaches CUDA parameters.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "weightbridge/tensor.hpp"

namespace wb::layout {

/// One parameter-sized region of host memory per parameter (64-byte aligned), all in one mapping that is
/// populated when made: a first touch page by page costs a fault per 4 KiB, which on a virtual machine
/// costs several times the copy itself (a 1 GiB copy into fresh memory 2.5-8.6 s here, 0.6 s populated).
class ParameterCopies {
 public:
  /// Set-up: throws wb::Error (kSystem) naming the size when the memory cannot be mapped. `params` must
  /// outlive the copies.
  explicit ParameterCopies(const ParameterSet& params);
  ~ParameterCopies();
  ParameterCopies(const ParameterCopies&) = delete;
  ParameterCopies& operator=(const ParameterCopies&) = delete;

  /// The regions as parameters (each one's view, with host memory at its copy); made on first use.
  const ParameterSet& views() const;
  std::byte* data(std::size_t i) const { return memory_ + offsets_[i]; }
  /// The parameters' bytes, without alignment padding.
  std::size_t bytes() const { return bytes_; }

 private:
  const ParameterSet& params_;
  std::byte* memory_ = nullptr;
  std::size_t mapped_ = 0, bytes_ = 0;
  std::vector<std::size_t> offsets_;
  mutable std::optional<ParameterSet> views_;  // a name index per parameter: only the CUDA probe needs it
};

/// Saves host parameters' contents into ParameterCopies and writes them back when destroyed, however the
/// probe ends.
class SavedParameters {
 public:
  explicit SavedParameters(const ParameterSet& params);
  ~SavedParameters();
  SavedParameters(const SavedParameters&) = delete;
  SavedParameters& operator=(const SavedParameters&) = delete;
  std::size_t bytes() const { return copies_.bytes(); }

 private:
  const ParameterSet& params_;
  ParameterCopies copies_;
};

}  // namespace wb::layout
