// End-to-end verification of an update (ExecutorOptions::verify). The unit is the planned segment: one box
// of one atom in one round, which every rank that handles it holds as one contiguous range of its buffer,
// in checkpoint order (round_schedule.hpp). So the digest of a segment is the same wherever it is:
//   - a trainer digests each segment it packed, right after the pack of the round;
//   - a rollout digests each segment of its receive buffer right before the assemble of the round, i.e.
//     the bytes it installs;
//   - at the end of the update every writer sends each of its peers the expected digests of the segments it
//     wrote there, in the order both sides derive from the schedule (rounds, then stages, then buffer
//     offsets); a rollout that forwards passes on the digests it was sent, not its own, so that what a
//     rollout installs is checked against what the trainer packed, however many hops it took;
//   - a receiver compares; a mismatch names the parameter and elements the segment was installed into.
// Digests travel over MPI (control-sized: 8 bytes per segment per peer and update). Host buffers only.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weightbridge/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

/// A 64-bit digest of a byte stream: four multiply-rotate lanes over 8-byte words, then the length. Not
/// cryptographic: it catches corruption (a lost, stale, shifted or flipped range), not an attacker.
std::uint64_t digest_bytes(const std::byte* data, std::size_t bytes);

class Verifier {
 public:
  /// Everything sized from the schedule here; an update allocates nothing. Throws kUnsupported when a
  /// write of the schedule does not cover whole segments (then segments cannot be matched across ranks).
  Verifier(const RoundSchedule& schedule, MPI_Comm comm, int tag);
  ~Verifier();
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  /// At the start of every update.
  void begin_update();
  /// After the pack of `round` into the send slot at `send_slot`.
  void packed(int round, const std::byte* send_slot);
  /// Before the assemble of `round` from the receive slot at `receive_slot`.
  void arrived(int round, const std::byte* receive_slot);

  /// Once per update, when every round is done: takes every writer's expected digests, sends this rank's
  /// to its peers (a forwarder once it has what it passes on), and compares. `poll` is called while it
  /// waits (a non-ok status ends the wait with it); fails with kTimeout after `timeout` seconds without
  /// progress, with kCorruptData naming the elements on a mismatch (`describe_rank`, `describe_element`
  /// name what the message shows).
  Status exchange(double timeout, const std::function<Status()>& poll, const std::function<std::string(int)>& describe_rank,
                  const std::function<std::string(std::uint32_t, std::int64_t)>& describe_element);

  std::int64_t segments() const;

 private:
  struct State;
  State* state_;
};

}  // namespace wb::exec
