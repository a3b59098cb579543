#include "exec/connect_handshake.hpp"

#include <cstring>

#include "comm/collectives.hpp"
#include "core/checks.hpp"

namespace wb::exec {
namespace {

constexpr int kEndpointTag = 0x5742;  // connect-time records
constexpr std::size_t kIdBytes = 256;  // a machine id and the CUDA flag, per rank

}  // namespace

std::vector<std::byte> swap_record(int peer, const std::vector<std::byte>& bytes, MPI_Comm comm, const comm::Waiter& waiter) {
  return wb::comm::swap(peer, bytes, kEndpointTag, comm, waiter, "connecting the transports: the record swapped with rank " + std::to_string(peer));
}

RankPlaces gather_rank_places(bool cuda_parameters, MPI_Comm comm, const comm::Waiter& waiter) {
  int size = 0;
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  // Per rank: the machine id, NUL-terminated, in the first kIdBytes - 1 bytes; the CUDA flag in the last.
  std::vector<char> gathered(static_cast<std::size_t>(size) * kIdBytes, '\0');
  char mine[kIdBytes] = {};
  std::strncpy(mine, machine_id().c_str(), kIdBytes - 2);
  mine[kIdBytes - 1] = cuda_parameters ? 1 : 0;
  const std::vector<std::byte> all = wb::comm::allgather_fixed(std::as_bytes(std::span(mine)), comm, waiter,
                                                              "connecting the transports: every rank's machine");
  std::memcpy(gathered.data(), all.data(), std::min(all.size(), gathered.size()));
  RankPlaces places;
  for (int r = 0; r < size; ++r) {
    const char* record = &gathered[static_cast<std::size_t>(r) * kIdBytes];
    places.machines.emplace_back(record);
    places.cuda.push_back(record[kIdBytes - 1] != 0);
    places.any_cuda = places.any_cuda || record[kIdBytes - 1] != 0;
  }
  return places;
}

void gather_device_buffers(RankPlaces& places, bool mine, MPI_Comm comm, const comm::Waiter& waiter) {
  const std::byte flag{static_cast<unsigned char>(mine ? 1 : 0)};
  const std::vector<std::byte> flags = wb::comm::allgather_fixed(std::span(&flag, 1), comm, waiter,
                                                                "connecting the transports: every rank's device buffers");
  places.device_buffers.assign(places.machines.size(), false);
  for (std::size_t r = 0; r < flags.size() && r < places.device_buffers.size(); ++r)
    places.device_buffers[r] = flags[r] != std::byte{0};
}

MemoryKind pair_memory(const RankPlaces& places, int rank, int peer) {
  const auto r = static_cast<std::size_t>(rank), p = static_cast<std::size_t>(peer);
  if (places.machines.at(r) != places.machines.at(p)) return places.cuda.at(r) ? MemoryKind::kCuda : MemoryKind::kHost;
  for (std::size_t other = 0; other < places.machines.size(); ++other)
    if (places.machines[other] == places.machines[r] && !places.device_buffers.at(other)) return MemoryKind::kHost;
  return MemoryKind::kCuda;
}

}  // namespace wb::exec
