#include "exec/round_work.hpp"

#include <algorithm>
#include <limits>

#include "core/settings.hpp"

namespace wb::exec {
namespace {

Setting<std::int64_t> max_writes_per_post_setting(
    "max_writes_per_post", 0,
    "Writes the executor hands a transport in one post (0: the transport's own limit). A batch longer than "
    "that goes out in several posts. Lower it only to exercise that path.",
    0, std::numeric_limits<std::int64_t>::max());

}  // namespace

std::size_t writes_per_post(const Transport& transport) {
  const std::size_t limit = std::max<std::size_t>(1, transport.capabilities().max_writes_per_batch);
  const std::int64_t cap = *max_writes_per_post_setting;
  return cap > 0 ? std::min(limit, static_cast<std::size_t>(cap)) : limit;
}

RoundWork build_round_work(const RoundPlan& plan, const BatchTargets& targets, const ExtraArrivals& extra_arrivals) {
  RoundWork work;
  for (const Write& write : plan.writes) {
    const BatchTargets::Peer& peer = targets.peers.at(write.peer);
    if (work.batches.empty() || work.batches.back().peer != write.peer || work.batches.back().stage != write.stage ||
        work.batches.back().lag != write.lag) {
      work.batches.push_back({write.peer, write.stage, write.lag, {}, 0, writes_per_post(*peer.transport)});
      if (write.lag != 0) ++work.relay_batches;
    }
    Batch& batch = work.batches.back();
    const auto [send_id, receive_id] = targets.local_memory.at(peer.transport->kind());
    batch.writes.push_back({write.stage == Stage::kReceive ? send_id : receive_id, static_cast<std::uint64_t>(write.local_offset),
                            peer.receive_memory, static_cast<std::uint64_t>(write.remote_offset),
                            static_cast<std::uint64_t>(write.bytes)});
    batch.bytes += write.bytes;
  }
  for (const Arrival& arrival : plan.arrivals) {
    ++work.arrivals[static_cast<std::size_t>(arrival.stage)];
    work.writers.push_back(arrival.peer);
  }
  for (const auto& [writer, extra] : extra_arrivals)
    for (std::size_t stage = 0; stage < kStageCount; ++stage) work.arrivals[stage] += extra[stage];
  std::sort(work.writers.begin(), work.writers.end());
  work.writers.erase(std::unique(work.writers.begin(), work.writers.end()), work.writers.end());
  work.expected_from.assign(work.writers.size(), std::array<int, kStageCount>{});
  const auto writer_index = [&work](int peer) {
    return static_cast<std::size_t>(std::lower_bound(work.writers.begin(), work.writers.end(), peer) - work.writers.begin());
  };
  for (const Arrival& arrival : plan.arrivals)
    ++work.expected_from[writer_index(arrival.peer)][static_cast<std::size_t>(arrival.stage)];
  for (const auto& [writer, extra] : extra_arrivals) {
    const std::size_t w = writer_index(writer);
    if (w == work.writers.size() || work.writers[w] != writer) continue;  // splits of a peer with no region here
    for (std::size_t stage = 0; stage < kStageCount; ++stage) work.expected_from[w][stage] += extra[stage];
  }
  work.packs = !plan.pack.empty();
  return work;
}

}  // namespace wb::exec
