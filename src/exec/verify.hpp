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
#include <span>
#include <string>
#include <vector>

#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

/// A 64-bit digest of a byte stream, computed in pieces: per 8-byte word of four lanes a running sum and a
/// sum of running sums (so that a word's place counts, as in Fletcher's checksum), mixed with the length at
/// the end. Two adds per word: it runs at the speed the bytes come from cache. Not cryptographic: it
/// catches corruption (a lost, stale, shifted or flipped range), not an attacker.
class Digest {
 public:
  void update(const std::byte* data, std::size_t bytes);
  std::uint64_t finish() const;

 private:
  void block(const std::byte* data);
  std::uint64_t sum_[4] = {}, sums_[4] = {};
  std::byte tail_[32] = {};
  std::size_t tail_bytes_ = 0;
  std::uint64_t length_ = 0;
};
std::uint64_t digest_bytes(const std::byte* data, std::size_t bytes);

class Verifier {
 public:
  /// Everything sized from the schedule here; an update allocates nothing. Throws kUnsupported when a
  /// write of the schedule does not cover whole segments (then segments cannot be matched across ranks).
  /// `parameter_bytes`, `send_slot_bytes`, `receive_slot_bytes`: as the executor compiles its programs with.
  Verifier(const RoundSchedule& schedule, MPI_Comm comm, int tag, std::span<const std::int64_t> parameter_bytes = {},
           std::int64_t send_slot_bytes = 0, std::int64_t receive_slot_bytes = 0);
  ~Verifier();
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  /// At the start of every update.
  void begin_update();
  /// The executor's pack and assemble of `round` when verifying: in chunks of about kChunkBytes of the
  /// buffer, each digested while it is in cache (a pack chunk right after it is written, an assemble chunk
  /// right before it is read), so that verifying costs little more than the digests' arithmetic.
  static constexpr std::int64_t kChunkBytes = 128 << 10;
  void pack(int round, std::span<std::byte* const> parameters, std::byte* send_slot);
  void assemble(int round, std::span<std::byte* const> parameters, std::byte* receive_slot);
  /// The digests alone (tests): of what `round` packed into `send_slot`, of what arrived in `receive_slot`.
  void packed(int round, const std::byte* send_slot);
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
