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

#include "exec/connect_record.hpp"
#include "transport/transport.hpp"

namespace wb {
struct ExecutorStats;
}

namespace wb::exec {

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
