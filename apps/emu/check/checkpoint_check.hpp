// The check of an emulated worker's parameters against an independent reference: the checkpoint read
// directly, never through load_weights. ("verify" is the library's own end-to-end digests, exec/verify.hpp.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

struct CheckpointCheck {
  std::size_t pieces = 0;           // checkpoint pieces the worker's parameters hold
  std::size_t bytes_compared = 0;   // bytes compared against the file
  std::size_t unsourced_bytes = 0;  // parameter bytes no checkpoint element reaches (padding)
  std::vector<std::string> failures;  // empty when verified
  bool ok() const { return failures.empty(); }
};

/// Compares every piece export_weights reports with the same box read from `checkpoint`, and checks
/// that parameter elements no piece covers are still zero (padding that load_weights must not touch).
CheckpointCheck check_against_checkpoint(const EmulatedWorker& worker, const ParameterSet& params,
                                         const CheckpointReader& checkpoint);

/// Boxes of one checkpoint tensor covered by a group of workers.
struct TensorBoxes {
  Shape shape;
  std::vector<Box> boxes;
};

/// Checks that the pieces of a group of workers cover every element of every checkpoint tensor (with
/// wb::first_uncovered_box); one message per tensor with a gap, naming the tensor and the uncovered box.
std::vector<std::string> coverage_gaps(const std::vector<TensorInfo>& tensors,
                                       const std::vector<std::vector<Box>>& boxes_per_tensor,
                                       const std::string& group);

/// The first parameter whose bytes differ between two parameter sets of the same layout, as "NAME differs
/// in N of M bytes, first at byte B"; empty when every byte is equal.
std::string first_difference(const ParameterSet& got, const ParameterSet& want);

}  // namespace wb::emu
