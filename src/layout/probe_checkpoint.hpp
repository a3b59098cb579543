// The probe checkpoint: the real tensor list (names, shapes, dtypes) whose values are probe codes,
// computed box by box as load_weights reads them, so the model is never materialized.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "layout/probe_code.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::layout {

class ProbeCheckpoint final : public CheckpointReader {
 public:
  /// `plan` must have been built from `tensors` (same dtypes and shapes, same order); throws
  /// kInvalidArgument otherwise or when a name repeats.
  ProbeCheckpoint(std::vector<TensorInfo> tensors, ProbePlan plan);

  /// Serves the codes of pass p (0-based): element i of tensor t holds digit_space(dtype).bits(plan.digit(p, t, i)).
  /// Not to be called while another thread reads.
  void set_pass(int p);
  /// Serves verification values instead: a code derived from a hash of (seed, tensor index, flat index),
  /// so that replaying a decoded source map on this checkpoint must reproduce what load_weights wrote.
  /// Unlike the coordinate passes, these values are not affine, so arithmetic that maps codes onto other
  /// codes (a scale, an offset, a dtype round trip) cannot go unnoticed.
  void set_verification(std::uint64_t seed);

  bool verification() const { return verification_; }
  int current_pass() const { return pass_; }
  const ProbePlan& plan() const { return plan_; }

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  /// Thread-safe (reads nothing mutable).
  void read_box(std::string_view name, const Box& box, void* destination) const override;
  /// The same for tensor `tensor` of the list, without looking up a name (throws kInvalidArgument when out
  /// of range).
  void read_box(std::size_t tensor, const Box& box, void* destination) const;
  /// "probe pass 2 of 3 (key digit 1)" (passes counted from 1 here) or "probe verification (seed s)".
  std::string source() const override;

 private:
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::vector<TensorInfo> tensors_;
  ProbePlan plan_;
  // Views into tensors_' names (fixed after construction; the class is neither copied nor moved): no
  // string of its own per tensor.
  std::unordered_map<std::string_view, std::size_t, NameHash> by_name_;
  // The tensor after the last one read: loaders mostly read in list order, so most reads find their tensor
  // without hashing the name. Only a hint (checked by name), so relaxed: reads stay thread-safe.
  mutable std::atomic<std::size_t> next_{0};
  int pass_ = 0;
  bool verification_ = false;
  std::uint64_t seed_ = 0;
};

}  // namespace wb::layout
