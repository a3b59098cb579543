// Per-round work of the round executor, compiled at connect: the batches of one-sided writes (one per peer
// and stage; a batch longer than its transport takes in one post goes out in several posts, each one
// notification, and the receiver is told at connect how many arrivals to expect), the arrivals expected per
// stage, the writers to grant the slot to, and the payload the assemble moves. The pack and assemble
// programs themselves live in the copy engine (exec/copy_engine.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "weightbridge/round_schedule.hpp"
#include "weightbridge/transport.hpp"

namespace wb::exec {

// One batch: the writes of one round to one peer in one stage (offsets within the slots).
struct Batch {
  int peer = 0;
  Stage stage = Stage::kReceive;
  std::vector<WriteRequest> writes;  // local/remote offsets relative to the slots; memory ids filled in
  std::int64_t bytes = 0;
  std::size_t writes_per_post = 0;   // the transport takes this many at once: a longer batch goes out in
                                     // several posts, each one notification (the receiver expects them all)
};

struct RoundWork {
  std::vector<Batch> batches;               // in stage order
  std::array<int, kStageCount> arrivals{};  // notifications expected per stage
  std::vector<int> writers;                 // distinct peers that write into this rank in this round
  bool packs = false;
  std::int64_t assembled_bytes = 0;
};

/// A batch this rank sends in several posts: what its receiver must be told at connect.
struct SplitBatch {
  std::uint64_t round = 0;
  std::uint32_t stage = 0;
  std::uint64_t posts = 0;
  bool operator==(const SplitBatch&) const = default;
};

/// Writes `transport` takes in one post: its own limit, or the max_writes_per_post setting when lower.
std::size_t writes_per_post(const Transport& transport);

/// Per peer, the batches of `schedule` longer than `per_post(peer)` writes.
template <class PerPost>
std::map<int, std::vector<SplitBatch>> split_batches(const RoundSchedule& schedule, PerPost&& per_post) {
  std::map<int, std::vector<SplitBatch>> splits;
  for (std::size_t r = 0; r < schedule.rounds.size(); ++r) {
    std::map<std::pair<int, int>, std::size_t> writes;  // (peer, stage) -> writes
    for (const Write& write : schedule.rounds[r].writes) ++writes[{write.peer, static_cast<int>(write.stage)}];
    for (const auto& [key, count] : writes) {
      const std::size_t limit = per_post(key.first);
      if (count > limit)
        splits[key.first].push_back({r, static_cast<std::uint32_t>(key.second), (count + limit - 1) / limit});
    }
  }
  return splits;
}

/// Where the batches of a round go: per peer, the transport and the peer's imported receive buffer; per
/// transport, this rank's send and receive registrations.
struct BatchTargets {
  struct Peer {
    const Transport* transport = nullptr;
    std::uint32_t receive_memory = 0;
  };
  std::map<int, Peer> peers;
  std::map<TransportKind, std::pair<std::uint32_t, std::uint32_t>> local_memory;  // send, receive ids
};

/// The work of one round. `extra_arrivals[stage]`: notifications beyond one per region, from peers that
/// split their batches.
RoundWork build_round_work(const RoundPlan& plan, const BatchTargets& targets,
                           const std::array<int, kStageCount>& extra_arrivals);

}  // namespace wb::exec
