// The round executor's connect handshake (collective, at construction): every rank learns on which machine
// every other rank is, which decides the transport of each pair; then every pair swaps one record
// (comm::swap, peers in ascending order on both sides, so the pairwise exchanges cannot deadlock):
// the transport, the endpoint for the other side, the key of the receive buffer and its slot stride, and
// the batches this side splits into several posts (the receiver then expects that many arrivals). Every
// wait has the executor's deadline and serves the coordinator's notices (`waiter`): a peer that never
// arrives fails the construction, naming the step, instead of holding this rank.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/operation.hpp"
#include "exec/connect_record.hpp"
#include "transport/transport.hpp"

namespace wb {
struct ExecutorStats;
}

namespace wb::exec {

/// Sends `bytes` to `peer` over `comm` and returns the peer's (both directions at once). Throws wb::Error
/// (kMpi, kTimeout).
std::vector<std::byte> swap_record(int peer, const std::vector<std::byte>& bytes, MPI_Comm comm, const comm::Waiter& waiter);

/// Every rank's machine (machine_id) and whether it has CUDA parameters, all-gathered over `comm`.
struct RankPlaces {
  std::vector<std::string> machines;
  std::vector<bool> cuda;            // per rank: CUDA parameters
  std::vector<bool> device_buffers;  // per rank: CUDA parameters, and its network transport (if it has
                                     // peers on other machines) registers CUDA memory
  bool any_cuda = false;
};
/// Fills machines, cuda and any_cuda.
RankPlaces gather_rank_places(bool cuda_parameters, MPI_Comm comm, const comm::Waiter& waiter);
/// Fills device_buffers from every rank's own answer (all-gathered over `comm`).
void gather_device_buffers(RankPlaces& places, bool mine, MPI_Comm comm, const comm::Waiter& waiter);

/// The memory the pair (rank, peer) moves through, which with the machines decides its transport
/// (choose_transport): between machines, the rank's own parameters' memory (the network transport then
/// registers what it can: transfer_memory.hpp); on one machine, CUDA memory (cuda_ipc) only when every rank
/// of that machine can keep device buffers, host memory (cma; pinned buffers on the ranks with CUDA
/// parameters) as soon as one cannot (host parameters, or a NIC that registers host memory only), so that
/// no rank needs buffers that two of its transports cannot both register. Both ranks of a pair compute the
/// same answer for it.
MemoryKind pair_memory(const RankPlaces& places, int rank, int peer);

}  // namespace wb::exec
