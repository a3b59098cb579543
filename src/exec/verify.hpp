// End-to-end verification of an update (ExecutorOptions::verify). The unit is the planned segment: one box
// of one atom in one round, which every rank that handles it holds as one contiguous range of its buffer,
// in checkpoint order (round_schedule.hpp). So the digest of a segment is the same wherever it is:
//   - a trainer digests each segment as it packs it, in the same pass (exec/digest.hpp, pack.hpp);
//   - a rollout digests each segment of its receive buffer as it assembles it, i.e. the bytes it installs,
//     in the same pass too;
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

#include "exec/digest.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

class Verifier {
 public:
  /// Everything sized from the schedule here; an update allocates nothing. Throws kUnsupported when a
  /// write of the schedule does not cover whole segments (then segments cannot be matched across ranks),
  /// or when two copies of a round read overlapping but different ranges of a buffer.
  /// `parameter_bytes`, `send_slot_bytes`, `receive_slot_bytes`: as the executor compiles its programs with.
  Verifier(const RoundSchedule& schedule, MPI_Comm comm, int tag, std::span<const std::int64_t> parameter_bytes = {},
           std::int64_t send_slot_bytes = 0, std::int64_t receive_slot_bytes = 0);
  ~Verifier();
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  /// At the start of every update.
  void begin_update();
  /// The executor's pack and assemble of `round` when verifying: the round's programs, compiled with its
  /// segments as digest segments (exec/pack.hpp), so that each byte is digested in the pass that copies it
  /// and verifying costs little more than the digests' arithmetic.
  void pack(int round, std::span<std::byte* const> parameters, std::byte* send_slot);
  void assemble(int round, std::span<std::byte* const> parameters, std::byte* receive_slot);
  /// The digests alone (tests): of what `round` packed into `send_slot`, of what arrived in `receive_slot`.
  void packed(int round, const std::byte* send_slot);
  void arrived(int round, const std::byte* receive_slot);

  /// Once per update, when every round is done: takes every writer's expected digests, sends this rank's
  /// to its peers (a forwarder once it has what it passes on), and compares. `poll` is called while it
  /// waits (a non-ok status ends the wait with it); fails with kTimeout after `timeout` seconds without
  /// progress, with kCorruptData naming the elements on a mismatch (`describe_rank`, `describe_element`
  /// name what the message shows). Idle, it yields, then sleeps up to `idle_sleep_us` (0: only yields) as
  /// the executor's progress loop does, so that a rank waiting for digests leaves the core to the peer that
  /// is still assembling (ranks often outnumber cores).
  Status exchange(double timeout, const std::function<Status()>& poll, const std::function<std::string(int)>& describe_rank,
                  const std::function<std::string(std::uint32_t, std::int64_t)>& describe_element,
                  std::int64_t idle_sleep_us = 0);

  std::int64_t segments() const;

 private:
  struct State;
  State* state_;
};

}  // namespace wb::exec
