#include "exec/connect_handshake.hpp"

#include <cstring>

#include "core/checks.hpp"

namespace wb::exec {
namespace {

constexpr int kEndpointTag = 0x5742;  // connect-time records
constexpr std::size_t kIdBytes = 256;  // a machine id and the CUDA flag, per rank

}  // namespace

std::vector<std::byte> swap_record(int peer, const std::vector<std::byte>& bytes, MPI_Comm comm) {
  std::uint64_t size = bytes.size(), peer_size = 0;
  WB_CHECK_MPI(MPI_Sendrecv(&size, 1, MPI_UINT64_T, peer, kEndpointTag, &peer_size, 1, MPI_UINT64_T, peer, kEndpointTag,
                            comm, MPI_STATUS_IGNORE));
  std::vector<std::byte> received(peer_size);
  WB_CHECK_MPI(MPI_Sendrecv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, peer, kEndpointTag, received.data(),
                            static_cast<int>(peer_size), MPI_BYTE, peer, kEndpointTag, comm, MPI_STATUS_IGNORE));
  return received;
}

RankPlaces gather_rank_places(bool cuda_parameters, MPI_Comm comm) {
  int size = 0;
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  // Per rank: the machine id, NUL-terminated, in the first kIdBytes - 1 bytes; the CUDA flag in the last.
  std::vector<char> gathered(static_cast<std::size_t>(size) * kIdBytes, '\0');
  char mine[kIdBytes] = {};
  std::strncpy(mine, machine_id().c_str(), kIdBytes - 2);
  mine[kIdBytes - 1] = cuda_parameters ? 1 : 0;
  WB_CHECK_MPI(MPI_Allgather(mine, static_cast<int>(kIdBytes), MPI_CHAR, gathered.data(), static_cast<int>(kIdBytes),
                             MPI_CHAR, comm));
  RankPlaces places;
  for (int r = 0; r < size; ++r) {
    const char* record = &gathered[static_cast<std::size_t>(r) * kIdBytes];
    places.machines.emplace_back(record);
    places.cuda.push_back(record[kIdBytes - 1] != 0);
    places.any_cuda = places.any_cuda || record[kIdBytes - 1] != 0;
  }
  return places;
}

void gather_device_buffers(RankPlaces& places, bool mine, MPI_Comm comm) {
  char flag = mine ? 1 : 0;
  std::vector<char> flags(places.machines.size(), 0);
  WB_CHECK_MPI(MPI_Allgather(&flag, 1, MPI_CHAR, flags.data(), 1, MPI_CHAR, comm));
  places.device_buffers.assign(flags.size(), false);
  for (std::size_t r = 0; r < flags.size(); ++r) places.device_buffers[r] = flags[r] != 0;
}

MemoryKind pair_memory(const RankPlaces& places, int rank, int peer) {
  const auto r = static_cast<std::size_t>(rank), p = static_cast<std::size_t>(peer);
  if (places.machines.at(r) != places.machines.at(p)) return places.cuda.at(r) ? MemoryKind::kCuda : MemoryKind::kHost;
  for (std::size_t other = 0; other < places.machines.size(); ++other)
    if (places.machines[other] == places.machines[r] && !places.device_buffers.at(other)) return MemoryKind::kHost;
  return MemoryKind::kCuda;
}

}  // namespace wb::exec
