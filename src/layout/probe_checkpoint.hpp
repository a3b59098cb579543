// The probe checkpoint: the real tensor list (names, shapes, dtypes) whose values are probe codes,
// computed box by box as load_weights reads them, so the model is never materialized.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "layout/probe_code.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::layout {

/// The keyed pass: the last digit of the key (digit P - 1 of a P-pass plan) written as
/// v = (top + h(seed, low)) mod D, with low = key mod D^(P-1) (what the other passes write), top = key / D^(P-1)
/// and h a hash into [0, D). Where the other passes decide low, v decides top (v -> top is a bijection for each
/// low), and v is no affine function of the key, so it also serves as the verification values: a decoded map
/// that is wrong at an element (a wrong top there always changes v) or a value load_weights computed shows.
class KeyedDigit {
 public:
  KeyedDigit(std::uint64_t seed, DType dtype, const ProbePlan& plan);
  std::uint64_t place() const { return place_; }  // D^(P-1)
  std::uint64_t base() const { return base_; }    // D
  /// h(seed, low), in [0, D).
  std::uint64_t offset(std::uint64_t low) const;
  /// The digit the keyed pass writes for `key`.
  std::uint64_t value(std::uint64_t key) const { return (key / place_ % base_ + offset(key % place_)) % base_; }
  /// The top digit of the key whose lower digits are `low` and whose keyed digit is `written` (< D).
  std::uint64_t top(std::uint64_t low, std::uint64_t written) const { return (written + base_ - offset(low)) % base_; }
  /// 2-byte codes (D < 2^16): offset = hash16(low mod 2^16 xor block_key(low / 2^16)), less D where it is D or
  /// more, so that consecutive lows of one block go 8 at a time in 16-bit lanes.
  std::uint16_t block_key(std::uint64_t block) const;

 private:
  std::uint64_t seed_key_;
  std::uint16_t key16_;
  std::uint64_t place_, base_;
};

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
  /// Serves the keyed pass (KeyedDigit with `seed`; plans of two passes or more): the codes of
  /// digit_space(dtype).bits(KeyedDigit::value(key)).
  void set_keyed(std::uint64_t seed);

  bool keyed() const { return keyed_; }

  bool verification() const { return verification_; }
  int current_pass() const { return pass_; }
  const ProbePlan& plan() const { return plan_; }

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  /// Thread-safe (reads nothing mutable).
  void read_box(std::string_view name, const Box& box, void* destination) const override;
  /// The same for tensor `tensor` of the list, without looking up a name (throws kInvalidArgument when out
  /// of range).
  void read_box(std::size_t tensor, const Box& box, void* destination) const;
  /// Whether `data` (the box's elements contiguous, in its row-major order) holds what read_box(tensor, box)
  /// writes. The keyed pass's 2-byte codes are compared in registers, never written (the verification of a
  /// bf16 worker); anything else through a buffer.
  bool box_equals(std::size_t tensor, const Box& box, const void* data) const;
  /// Whether the keyed pass's 2-byte codes of `box` are at data + sum of index[a] * strides[a] (elements,
  /// >= 0), compared in registers along the axis of stride 1, whose keys are a progression
  /// (KeyedProgression16): the verification of a copy that a transpose lays out, without writing its codes
  /// anywhere and without a transposed walk. nullopt where that does not apply (not the keyed pass, not 2-byte
  /// codes, no axis of stride 1 and 32 elements or more, lower digits beyond one block, no vector lanes for it): then the caller
  /// compares through a buffer.
  std::optional<bool> strided_box_equals(std::size_t tensor, const Box& box, const void* data, const Shape& strides) const;
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
  bool keyed_ = false;
  std::uint64_t seed_ = 0;
};

}  // namespace wb::layout
