// Private: the per-peer byte counters every transport keeps (Transport::traffic). A batch is counted when
// post_writes accepts it (its bytes then leave unless the peer fails, which fails the update), so what a
// run reports having crossed a link is what the transport was given, independent of the plan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "transport/transport.hpp"

namespace wb {

/// The payload of a batch.
inline std::uint64_t batch_bytes(std::span<const WriteRequest> writes) {
  std::uint64_t bytes = 0;
  for (const WriteRequest& w : writes) bytes += w.bytes;
  return bytes;
}

class TrafficCounter {
 public:
  void add(int peer, std::uint64_t bytes) {
    PeerTraffic& entry = peers_[peer];
    entry.peer = peer;
    entry.bytes += bytes;
    entry.batches += 1;
  }
  std::vector<PeerTraffic> snapshot() const {
    std::vector<PeerTraffic> out;
    out.reserve(peers_.size());
    for (const auto& [peer, entry] : peers_) out.push_back(entry);
    std::sort(out.begin(), out.end(), [](const PeerTraffic& a, const PeerTraffic& b) { return a.peer < b.peer; });
    return out;
  }

 private:
  std::unordered_map<int, PeerTraffic> peers_;
};

}  // namespace wb
