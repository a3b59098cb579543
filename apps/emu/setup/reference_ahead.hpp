// What an engine job checks each install against (its own load_weights of that version), loaded ahead in
// its inference steps. Loaded at the install, that reference took 0.5-0.6 s between two polls of the
// engine (the 208 MB variant, two workers, on the loaded emulated cluster), and a joiner that knocked at the
// fleet replica's port then waited it out (0.25-0.29 s of a join in 3 of 5 async runs); a real engine does
// milliseconds of work between polls. So the version the engine expects next is loaded on a helper thread
// that runs only inside the engine's inference steps, at most a slice at a time, and never beside a
// library call: the step waits for the helper to stop at its next read of the checkpoint, so serial HDF5
// and the cores are the loop's again. The install then only compares; a version other than the one
// prepared (a joiner's first, from the replica) or one not loaded yet is loaded there, as before.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include "emu/frameworks/backend.hpp"
#include "emu/setup/run_setup.hpp"

namespace wb::emu {

class ReferenceAhead {
 public:
  /// `slice_ms`: the longest the helper runs in one inference step while its work is pending.
  ReferenceAhead(const EmulatedWorker& worker, const RunSetup& setup, double slice_ms = kSliceMs);
  ~ReferenceAhead();
  ReferenceAhead(const ReferenceAhead&) = delete;
  ReferenceAhead& operator=(const ReferenceAhead&) = delete;

  /// The version the engine expects to install next: loaded in later inference steps.
  void expect(std::uint64_t version);
  /// One inference step of at least `ms`. With a version still to load, the helper loads for the step, at
  /// least the slice, then stops at its next read before this returns.
  void inference_step(double ms);
  /// Whether the version is loaded (the helper has nothing left to do for it).
  bool holds(std::uint64_t version);
  /// "" when `params` hold exactly `version`, else what differs first (or why the reference is missing).
  /// Loads it first where not done, inline (the helper, with the loop waiting).
  std::string difference(const ParameterSet& params, std::uint64_t version);

  /// The default slice: a decoding step's order.
  static constexpr double kSliceMs = 20;
  /// Bounds on the loop's waits: for the helper to stop at its next read (one box of a tensor), and for a
  /// whole load at an install (0.5-0.6 s measured; unbounded when it was inline).
  static constexpr int kParkSeconds = 60;
  static constexpr int kLoadSeconds = 600;

 private:
  static constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();
  struct Cancelled {};
  class GatedReader;

  void loop();
  // On the helper, before each read of the checkpoint: parks while the gate is closed; throws Cancelled
  // when the loop now wants another version, or stops.
  void gate();
  // On the loop, with `lock` held: opens the gate until the wanted version is loaded or `until`, then waits
  // for the helper to park. Returns false when the helper did not park within kParkSeconds.
  bool run_helper(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point until);

  const EmulatedWorker& worker_;
  const RunSetup& setup_;
  const double slice_ms_;
  HostParameters expected_;  // the helper's while it loads; the loop's once loaded_ == target_
  std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t target_ = kNone;   // the version wanted
  std::uint64_t loading_ = kNone;  // the version the helper loads now
  std::uint64_t loaded_ = kNone;   // the version expected_ holds
  std::string failure_;            // load_weights of loaded_ threw this
  bool gate_open_ = false;
  bool running_ = false;           // the helper runs (not parked at a read, not idle)
  bool stop_ = false;
  std::thread helper_;
};

}  // namespace wb::emu
