// Round schedules: what one rank does in every round of a transfer plan. Built on rank 0 from the
// TransferPlan, serialized compactly and delivered with MPI_Scatterv (round_schedule_scatter.hpp); every
// update replays it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/source_map.hpp"

namespace wb {

/// Parameter box <-> buffer bytes. `copy.box` is the box in checkpoint coordinates; `copy.parameter`,
/// `copy.offset` and `copy.strides` place it in the rank's parameter (as in its source map). In the buffer
/// the box is contiguous and row-major in checkpoint order, starting at `buffer_offset` (bytes).
struct BufferCopy {
  SliceCopy copy;
  std::int64_t buffer_offset = 0;
  std::uint8_t element_bytes = 0;

  std::int64_t bytes() const { return copy.numel() * element_bytes; }
  bool operator==(const BufferCopy&) const = default;
};

/// One one-sided write: `bytes` from this rank's buffer at `local_offset` (its send buffer when it packs,
/// its receive buffer when it forwards) into `peer`'s receive buffer of the same round at `remote_offset`.
/// A relay forwards in round r what it received in round r - 1 (`lag` 1, external exchange only): it reads
/// the receive slot of round r - 1, which the executor keeps until these writes are done; the first round of
/// a schedule has no such writes.
struct Write {
  int peer = 0;
  Stage stage = Stage::kReceive;
  std::int64_t local_offset = 0;
  std::int64_t remote_offset = 0;
  std::int64_t bytes = 0;
  std::uint8_t lag = 0;  // rounds between the slot the bytes come from and this one: 0, or 1 for a relay
  bool operator==(const Write&) const = default;
};

/// One region of this rank's receive buffer that `peer` fills in `stage`. The peer may fill it with several
/// writes (when it forwards pieces that are not contiguous in its own buffer); only the last of them
/// notifies, which on an ordered channel (an RC queue pair) means the whole region has arrived. A peer that
/// both relays (lag 1) and forwards (lag 0) to this rank in one round and stage fills two regions.
struct Arrival {
  int peer = 0;
  Stage stage = Stage::kReceive;
  std::int64_t offset = 0;
  std::int64_t bytes = 0;
  bool operator==(const Arrival&) const = default;
};

/// One round of one rank. Order of work: pack, post the receive-stage writes; when the receive-stage
/// arrivals are in, post the external-exchange writes (relays, lag 1: once the previous round's arrivals
/// are in); when those are in too, the internal-exchange writes; when every arrival is in, assemble.
struct RoundPlan {
  std::vector<BufferCopy> pack;      // parameters -> send buffer (trainers)
  std::vector<Write> writes;         // in stage order
  std::vector<Arrival> arrivals;     // in stage order
  std::vector<BufferCopy> assemble;  // receive buffer -> parameters (rollouts)
  bool operator==(const RoundPlan&) const = default;
};

struct RoundSchedule {
  int rank = 0;
  Side side = Side::kTrainer;
  int pipeline_depth = setting_defaults::pipeline_depth();
  std::int64_t send_slot_bytes = 0;     // send buffer per pipeline slot
  std::int64_t receive_slot_bytes = 0;  // receive buffer per pipeline slot
  std::vector<int> peers;               // ranks it writes to or receives from, ascending: whom to connect
  std::vector<RoundPlan> rounds;        // every rank has the plan's number of rounds (some may be empty)
  bool operator==(const RoundSchedule&) const = default;
};

/// Builds the schedule of any rank of a plan. Construction indexes the plan once (buffer regions of every
/// receiver, the segments each worker takes part in), so building all ranks' schedules one by one costs
/// about as much as the plan itself; a schedule need not be kept after it is serialized.
class RoundScheduleBuilder {
 public:
  RoundScheduleBuilder(const Correspondence& correspondence, const TransferPlan& plan);
  ~RoundScheduleBuilder();
  RoundScheduleBuilder(const RoundScheduleBuilder&) = delete;
  RoundScheduleBuilder& operator=(const RoundScheduleBuilder&) = delete;

  /// The schedule of `rank` (world rank = worker index of the correspondence).
  RoundSchedule build(int rank) const;
  /// The same, into `schedule`, whose lists keep their memory from the schedule it held before: building
  /// every rank's schedule into one object allocates little beyond the first.
  void build(int rank, RoundSchedule& schedule) const;

 private:
  struct Index;
  const Correspondence& correspondence_;
  const TransferPlan& plan_;
  Index* index_;
};

/// Every rank's schedule of `builder`'s plan (ranks 0 .. ranks-1), serialized: what the planning rank
/// scatters. Built and serialized on up to `threads` threads (0: the machine's cores), each holding one
/// schedule at a time; `inspect`, when given, sees every schedule before it is dropped (one call at a time).
std::vector<std::vector<std::byte>> serialize_round_schedules(const RoundScheduleBuilder& builder, int ranks, int threads = 0,
                                                              const std::function<void(const RoundSchedule&)>& inspect = {});

/// A digest (64 bits) of every rank's serialized schedule, in rank order: equal digests mean, but for a
/// collision, the same schedules. What a test pins to catch a change that alters plans, and what wb-plan
/// prints so that two planners' results can be compared at full scale.
std::uint64_t round_schedules_digest(const std::vector<std::vector<std::byte>>& serialized);

/// Compact binary form (variable-length integers, deltas between neighbouring entries; a box that
/// continues the previous entry's slice copy takes 3-4 bytes). Throws wb::Error (kInvalidArgument), naming
/// the round and entry, for a schedule that deserialization would refuse: peers not strictly ascending, a
/// write or arrival to a rank not in `peers`, stages out of order, a buffer range outside its pipeline slot
/// (pack and receive-stage writes: send slot; arrivals, assemble and forwarding writes: receive slot), more
/// than 16 axes, strides not one per axis, element size 0, negative sizes or offsets, a lag other than 0 or
/// 1, a lag on a write outside the external exchange, in round 0 or with a pipeline depth of 1.
std::vector<std::byte> serialize_round_schedule(const RoundSchedule& schedule);
/// Throws wb::Error (kCorruptData) on a truncated or malformed buffer, naming the field, the byte and the
/// round and entry. Checks the same invariants as serialization; never allocates more than the input's
/// size justifies.
RoundSchedule deserialize_round_schedule(std::span<const std::byte> bytes);

}  // namespace wb
