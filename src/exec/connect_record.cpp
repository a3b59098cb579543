// The connect record's byte codec (see connect_record.hpp).
#include "exec/connect_record.hpp"

#include <string>

#include "core/byte_codec.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

constexpr std::uint64_t kMagic = 0x57425843;  // "WBXC"
constexpr std::uint64_t kVersion = 1;
constexpr std::uint64_t kMaxPosts = std::uint64_t{1} << 30;

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

}  // namespace wb::exec
