// The trainers' update mark, a bench's knob (issue 31): where a joiner's knock, or the kill of an engine,
// falls in the trainers' update decides what it measures (a knock during the replica's update waits for it
// unless the replica stages; a kill before the receive is noticed by the transport, one after it by the
// deadline), and left to chance it falls anywhere. Trainer rank 0 of a job with --update-mark FILE writes
// the version and the wall time at which it enters each send_weights there; an engine job of the same
// machine's clock (the emulated cluster's hosts share it) reads it to start its join, or a fault, a chosen
// time into an update.
#pragma once

#include <cstdint>
#include <stop_token>
#include <string>

namespace wb::emu {

struct UpdateMark {
  std::uint64_t version = 0;  // 0: none written yet
  double began = 0;           // wall_seconds() when trainer rank 0 entered send_weights(version)

  /// Replaces `path` with this mark (a rename: a reader sees the old mark or the new one, whole).
  void write(const std::string& path) const;
  /// The mark in `path`; version 0 when there is none (yet).
  static UpdateMark read(const std::string& path);
  /// Waits until the trainers enter an update after the one marked now (a version above it), then until
  /// `ms` into it, and returns that update's mark (version 0 once `stop` is requested). Throws wb::Error
  /// (kTimeout) after `timeout` seconds without a new update.
  static UpdateMark wait_into_next(const std::string& path, double ms, double timeout, const std::stop_token& stop = {});
};

}  // namespace wb::emu
