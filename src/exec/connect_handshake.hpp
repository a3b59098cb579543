// The round executor's connect handshake (collective, at construction): every rank learns on which machine
// every other rank is, which decides the transport of each pair; then every pair swaps one record
// (MPI_Sendrecv, peers in ascending order on both sides, so the pairwise exchanges cannot deadlock):
// the transport, the endpoint for the other side, the key of the receive buffer and its slot stride, and
// the batches this side splits into several posts (the receiver then expects that many arrivals).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "exec/round_work.hpp"
#include "weightbridge/transport.hpp"

namespace wb {
struct ExecutorStats;
}

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

/// The record's bytes (byte codec: varints, a magic and a version first).
std::vector<std::byte> encode_connect_record(const ConnectRecord& record);
/// Throws wb::Error (kCorruptData) naming `peer` for a record that is truncated or malformed, or that
/// announces a split batch outside `rounds` rounds and the stages, or in fewer than 2 or more than 2^30
/// posts.
ConnectRecord decode_connect_record(std::span<const std::byte> bytes, int peer, int rounds);

/// Sends `bytes` to `peer` over `comm` and returns the peer's (both directions at once). Throws wb::Error
/// (kMpi).
std::vector<std::byte> swap_record(int peer, const std::vector<std::byte>& bytes, MPI_Comm comm);

/// Every rank's machine (machine_id) and whether it has CUDA parameters, all-gathered over `comm`.
struct RankPlaces {
  std::vector<std::string> machines;
  bool any_cuda = false;
};
RankPlaces gather_rank_places(bool cuda_parameters, MPI_Comm comm);

}  // namespace wb::exec
