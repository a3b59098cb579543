// Per-round work of the round executor, compiled at connect: the batches of one-sided writes (one per peer,
// stage and lag; a batch longer than its transport takes in one post goes out in several posts, each one
// notification, and the receiver is told at connect how many arrivals to expect), the arrivals expected per
// stage (and per writer, to name the missing ones), the writers to grant the slot to, and the payload the
// assemble moves. A batch with lag 1 relays what arrived in the round before, out of that round's slot. The pack and assemble
// programs themselves live in the copy engine (exec/copy_engine.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "plan/round_schedule.hpp"
#include "transport/transport.hpp"

namespace wb::exec {

// One batch: the writes of one round to one peer in one stage and lag (offsets within the slots).
struct Batch {
  int peer = 0;
  Stage stage = Stage::kReceive;
  std::uint8_t lag = 0;              // 1: relays out of the previous round's receive slot
  std::vector<WriteRequest> writes;  // local/remote offsets relative to the slots; memory ids filled in
  std::int64_t bytes = 0;
  std::size_t writes_per_post = 0;   // the transport takes this many at once: a longer batch goes out in
                                     // several posts, each one notification (the receiver expects them all)
};

struct RoundWork {
  std::vector<Batch> batches;               // in stage order
  std::array<int, kStageCount> arrivals{};  // notifications expected per stage
  std::vector<int> writers;                 // distinct peers that write into this rank in this round
  std::vector<std::array<int, kStageCount>> expected_from;  // per writer: notifications per stage
  int relay_batches = 0;                    // batches with lag 1
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

/// Per peer, the batches of `schedule` longer than `per_post(peer)` writes. A relay's two batches to one peer
/// in one stage (lag 0 and lag 1) are announced apart; the receiver adds up what each adds.
template <class PerPost>
std::map<int, std::vector<SplitBatch>> split_batches(const RoundSchedule& schedule, PerPost&& per_post) {
  std::map<int, std::vector<SplitBatch>> splits;
  for (std::size_t r = 0; r < schedule.rounds.size(); ++r) {
    std::map<std::tuple<int, int, int>, std::size_t> writes;  // (peer, stage, lag) -> writes
    for (const Write& write : schedule.rounds[r].writes) ++writes[{write.peer, static_cast<int>(write.stage), write.lag}];
    for (const auto& [key, count] : writes) {
      const auto [peer, stage, lag] = key;
      const std::size_t limit = per_post(peer);
      if (count > limit) splits[peer].push_back({r, static_cast<std::uint32_t>(stage), (count + limit - 1) / limit});
    }
  }
  return splits;
}

/// Notifications beyond one per region, per writer and stage, from peers that split their batches.
using ExtraArrivals = std::map<int, std::array<int, kStageCount>>;

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

/// The work of one round. `extra_arrivals`: the round's notifications beyond one per region.
RoundWork build_round_work(const RoundPlan& plan, const BatchTargets& targets, const ExtraArrivals& extra_arrivals);

}  // namespace wb::exec
