#include "exec/connect_handshake.hpp"

#include <cstring>

#include "core/byte_codec.hpp"
#include "weightbridge/checks.hpp"

namespace wb::exec {
namespace {

constexpr int kEndpointTag = 0x5742;        // connect-time records
constexpr std::uint64_t kMagic = 0x57425843;  // "WBXC"
constexpr std::uint64_t kVersion = 1;
constexpr std::uint64_t kMaxPosts = std::uint64_t{1} << 30;
constexpr std::size_t kIdBytes = 256;  // a machine id and the CUDA flag, per rank

}  // namespace

std::vector<std::byte> encode_connect_record(const ConnectRecord& record) {
  codec::ByteWriter out;
  out.varint(kMagic);
  out.varint(kVersion);
  out.varint(static_cast<std::uint64_t>(record.transport));
  out.varint(static_cast<std::uint64_t>(record.receive_slot_stride));
  out.varint(record.endpoint.size());
  out.bytes(record.endpoint);
  out.varint(record.receive_key.size());
  out.bytes(record.receive_key);
  out.varint(record.splits.size());
  for (const SplitBatch& split : record.splits) {
    out.varint(split.round);
    out.varint(split.stage);
    out.varint(split.posts);
  }
  return out.take();
}

ConnectRecord decode_connect_record(std::span<const std::byte> bytes, int peer, int rounds) {
  codec::ByteReader in(bytes, "executor connect record from rank " + std::to_string(peer));
  if (in.varint() != kMagic) in.fail("not an executor connect record");
  if (const std::uint64_t version = in.varint(); version != kVersion)
    in.fail("version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion));
  ConnectRecord record;
  record.transport = static_cast<TransportKind>(in.bounded(static_cast<std::uint64_t>(TransportKind::kLibfabric), "transport"));
  record.receive_slot_stride = static_cast<std::int64_t>(in.bounded(std::uint64_t{1} << 62, "receive slot stride"));
  const auto endpoint = in.bytes(static_cast<std::size_t>(in.bounded(in.remaining(), "endpoint size")));
  record.endpoint.assign(endpoint.begin(), endpoint.end());
  const auto key = in.bytes(static_cast<std::size_t>(in.bounded(in.remaining(), "key size")));
  record.receive_key.assign(key.begin(), key.end());
  record.splits.resize(in.count(3, "split batches"));
  for (SplitBatch& split : record.splits) {
    split.round = in.varint();
    split.stage = static_cast<std::uint32_t>(in.bounded(UINT32_MAX, "stage"));
    split.posts = in.varint();
    if (split.round >= static_cast<std::uint64_t>(rounds) || split.stage >= kStageCount || split.posts < 2 ||
        split.posts > kMaxPosts)
      throw Error(ErrorCode::kCorruptData, "rank " + std::to_string(peer) + " announced a split batch for round " +
                                               std::to_string(split.round) + " stage " + std::to_string(split.stage) +
                                               " in " + std::to_string(split.posts) + " posts");
  }
  in.expect_done();
  return record;
}

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
    places.any_cuda = places.any_cuda || record[kIdBytes - 1] != 0;
  }
  return places;
}

}  // namespace wb::exec
