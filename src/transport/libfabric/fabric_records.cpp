#include "transport/libfabric/fabric_records.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <tuple>

#include "core/byte_codec.hpp"
#include "weightbridge/status.hpp"

namespace wb::fabric {
namespace {

constexpr std::uint64_t kEndpointMagic = 0x57424645;  // "WBFE"
constexpr std::uint64_t kKeyMagic = 0x5742464b;       // "WBFK"
constexpr std::uint64_t kVersion = 1;
constexpr std::size_t kMaxAddressBytes = 4096;  // fi_getname addresses are tens of bytes

void expect_header(codec::ByteReader& in, std::uint64_t magic, const char* kind) {
  if (in.varint() != magic) in.fail(std::string("not a libfabric ") + kind);
  if (const std::uint64_t version = in.varint(); version != kVersion)
    in.fail("version " + std::to_string(version) + ", this build reads " + std::to_string(kVersion));
}

}  // namespace

std::vector<std::byte> encode_endpoint(const EndpointRecord& record) {
  codec::ByteWriter out;
  out.varint(kEndpointMagic);
  out.varint(kVersion);
  out.signed_varint(record.rank);
  out.text(record.provider);
  out.varint(record.address_format);
  out.byte(record.rank_in_cq_data ? 1 : 0);
  out.varint(record.address.size());
  out.bytes(record.address);
  return out.take();
}

EndpointRecord decode_endpoint(std::span<const std::byte> bytes, int self, int peer, const EndpointRecord& mine) {
  const std::string what = "libfabric endpoint record of rank " + std::to_string(peer) + " (on rank " + std::to_string(self) + ")";
  codec::ByteReader in(bytes, what);
  expect_header(in, kEndpointMagic, "endpoint record");
  EndpointRecord record;
  record.rank = static_cast<int>(in.bounded_signed(0, INT_MAX, "rank"));
  record.provider = in.text();
  record.address_format = static_cast<std::uint32_t>(in.bounded(UINT32_MAX, "address format"));
  const std::uint8_t flag = in.byte();
  if (flag > 1) in.fail("CQ data mode " + std::to_string(flag));
  record.rank_in_cq_data = flag == 1;
  const auto length = static_cast<std::size_t>(in.bounded(kMaxAddressBytes, "address length"));
  if (length == 0) in.fail("empty address");
  const auto address = in.bytes(length);
  record.address.assign(address.begin(), address.end());
  in.expect_done();
  if (record.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, what + " was made by rank " + std::to_string(record.rank) +
                                                 ": records were given to the wrong peer");
  const auto mismatch = [&](const std::string& field, const std::string& theirs, const std::string& ours) {
    return Error(ErrorCode::kInvalidArgument,
                 "libfabric: rank " + std::to_string(peer) + " uses " + field + " " + theirs + " but rank " +
                     std::to_string(self) + " uses " + ours +
                     ": every rank must open the same provider and kind of address (set WB_FI_PROVIDER, and "
                     "WB_FI_DOMAIN where several networks exist, the same on every rank)");
  };
  if (record.provider != mine.provider) throw mismatch("provider", "'" + record.provider + "'", "'" + mine.provider + "'");
  if (record.address_format != mine.address_format)
    throw mismatch("address format", std::to_string(record.address_format), std::to_string(mine.address_format));
  if (record.rank_in_cq_data != mine.rank_in_cq_data)
    throw mismatch("CQ data mode", record.rank_in_cq_data ? "rank-in-data" : "FI_SOURCE",
                   mine.rank_in_cq_data ? "rank-in-data" : "FI_SOURCE");
  return record;
}

std::vector<std::byte> encode_memory_key(const MemoryKey& key) {
  codec::ByteWriter out;
  out.varint(kKeyMagic);
  out.varint(kVersion);
  out.signed_varint(key.rank);
  out.varint(key.address);
  out.varint(key.bytes);
  out.varint(key.key);
  out.varint(key.raw_key.size());
  out.bytes(key.raw_key);
  out.varint(key.raw_base);
  return out.take();
}

MemoryKey decode_memory_key(std::span<const std::byte> bytes, int self, int peer) {
  const std::string what = "libfabric memory key from rank " + std::to_string(peer) + " (imported on rank " + std::to_string(self) + ")";
  codec::ByteReader in(bytes, what);
  expect_header(in, kKeyMagic, "memory key");
  MemoryKey key;
  key.rank = static_cast<int>(in.bounded_signed(0, INT_MAX, "rank"));
  key.address = in.varint();
  key.bytes = in.varint();
  key.key = in.varint();
  const auto raw = static_cast<std::size_t>(in.bounded(kMaxAddressBytes, "raw key length"));
  const auto raw_bytes = in.bytes(raw);
  key.raw_key.assign(raw_bytes.begin(), raw_bytes.end());
  key.raw_base = in.varint();
  in.expect_done();
  if (key.bytes == 0 || key.address + key.bytes < key.address)
    in.fail("empty or wrapping region of " + std::to_string(key.bytes) + " bytes");
  if (key.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, what + " was registered by rank " + std::to_string(key.rank) +
                                                 ": keys were given to the wrong peer");
  return key;
}

std::span<const std::string_view> preferred_providers() {
  // cxi: HPE Slingshot; efa: AWS; verbs;ofi_rxm: InfiniBand/RoCE where ibverbs itself is not used; tcp last
  // (in libfabric >= 1.18 "tcp" is itself an RDM provider, before that "tcp;ofi_rxm").
  static constexpr std::array<std::string_view, 6> order = {"cxi", "efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "tcp", "sockets"};
  return order;
}

bool is_loopback(const Candidate& candidate) {
  return candidate.domain == "lo" || candidate.fabric.starts_with("127.") || candidate.fabric.starts_with("::1");
}

std::vector<std::size_t> rank_candidates(std::span<const Candidate> candidates, std::string_view provider,
                                         std::string_view domain) {
  const auto providers = preferred_providers();
  const auto provider_rank = [&](const Candidate& c) {
    const auto it = std::find(providers.begin(), providers.end(), c.provider);
    return static_cast<std::size_t>(it - providers.begin());
  };
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (!provider.empty() && candidates[i].provider != provider) continue;
    if (!domain.empty() && candidates[i].domain != domain) continue;
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Candidate& x = candidates[a];
    const Candidate& y = candidates[b];
    const auto key = [&](const Candidate& c) { return std::make_tuple(provider_rank(c), is_loopback(c), c.ipv6); };
    return key(x) < key(y);
  });
  return order;
}

const char* batch_completion_name(BatchCompletion mode) {
  return mode == BatchCompletion::kOrdered ? "ordered" : "two_phase";
}

BatchCompletion choose_batch_completion(std::string_view setting, bool orders_writes, bool delivery_complete,
                                        const std::string& provider) {
  const bool can_order = orders_writes && delivery_complete;
  if (setting == "auto" || setting.empty()) return can_order ? BatchCompletion::kOrdered : BatchCompletion::kTwoPhase;
  if (setting == "two_phase") return BatchCompletion::kTwoPhase;
  if (setting == "ordered") {
    if (!can_order)
      throw Error(ErrorCode::kUnsupported,
                  "WB_FI_BATCH_COMPLETION=ordered: provider '" + provider + "' " +
                      (orders_writes ? "does not report delivery (FI_DELIVERY_COMPLETE)"
                                     : "does not order writes to one peer (FI_ORDER_WAW)") +
                      "; use auto or two_phase");
    return BatchCompletion::kOrdered;
  }
  throw Error(ErrorCode::kInvalidArgument, "setting fi_batch_completion (WB_FI_BATCH_COMPLETION): '" + std::string(setting) +
                                               "' is not one of auto, ordered, two_phase");
}

std::uint64_t encode_cq_data(int writer, std::uint32_t immediate, bool rank_in_cq_data) {
  if (!rank_in_cq_data) return immediate;
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(writer)) << 32) | immediate;
}

Arrival decode_cq_data(std::uint64_t data, bool rank_in_cq_data) {
  Arrival arrival;
  arrival.immediate = static_cast<std::uint32_t>(data);
  arrival.writer = rank_in_cq_data ? static_cast<int>(static_cast<std::uint32_t>(data >> 32)) : -1;
  return arrival;
}

}  // namespace wb::fabric
