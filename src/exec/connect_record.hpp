// The record two round executors swap at connect, one per pair of ranks: how to reach the sender over the
// transport both chose, where its receive buffer is, and which of the batches it will write to the peer
// are split over several posts (each post notifies, so the peer must expect that many arrivals).
// Native-endian 64-bit fields (both ends run one build on one kind of machine); a length before each
// variable part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace wb::exec {

struct ConnectRecord {
  std::uint64_t transport = 0;               // the sender's TransportKind for this peer
  std::uint64_t receive_slot_stride = 0;     // bytes between the sender's receive slots
  std::vector<std::byte> endpoint;           // the transport's endpoint record for the peer
  std::vector<std::byte> memory_key;         // the remote key of the sender's receive buffer
  std::vector<std::uint64_t> split_batches;  // (round, stage, posts) triples
  bool operator==(const ConnectRecord&) const = default;
};

std::vector<std::byte> encode_connect_record(const ConnectRecord& record);

/// Decodes the record received from `peer`. Throws wb::Error (kCorruptData), naming the peer, when it
/// is truncated, has trailing bytes, or has lengths that do not fit what is left of it; the meaning of the
/// fields (transport, rounds, stages) is the caller's to check.
ConnectRecord decode_connect_record(std::span<const std::byte> bytes, int peer);

}  // namespace wb::exec
