// The record two round executors swap at connect, one per pair of ranks (exec/connect_handshake.hpp): how
// to reach the sender over the transport both chose, where its receive buffer is, and which of the batches
// it will write to the peer are split over several posts (each post notifies, so the peer must expect that
// many arrivals). Byte codec: varints, a magic and a version first. No MPI: the fuzz targets decode it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "exec/round_work.hpp"
#include "transport/transport.hpp"

namespace wb::exec {

/// What one rank tells one peer at connect.
struct ConnectRecord {
  TransportKind transport = TransportKind::kCma;
  std::int64_t receive_slot_stride = 0;
  std::vector<std::byte> endpoint;     // Transport::endpoint for the peer
  std::vector<std::byte> receive_key;  // the receive buffer's MemoryRegistration::remote_key
  std::vector<SplitBatch> splits;      // batches to the peer sent in several posts
  bool operator==(const ConnectRecord&) const = default;
};

/// The record's bytes.
std::vector<std::byte> encode_connect_record(const ConnectRecord& record);
/// Throws wb::Error (kCorruptData) naming `peer` for a record that is truncated or malformed (a length is
/// checked against what is left of the record, never added to a position), or that announces a split batch
/// outside `rounds` rounds and the stages, or in fewer than 2 or more than 2^30 posts.
ConnectRecord decode_connect_record(std::span<const std::byte> bytes, int peer, int rounds);

}  // namespace wb::exec
