// The records the ibverbs transport sends its peers (see ibverbs_wire.hpp).
#include "transport/ibverbs/ibverbs_wire.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

#include "core/byte_codec.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

constexpr std::array<std::uint8_t, 4> kEndpointMagic{'W', 'B', 'I', 'B'};
constexpr std::array<std::uint8_t, 4> kMemoryKeyMagic{'W', 'B', 'M', 'K'};
constexpr std::uint32_t kMaxQpn = 0xffffff;

void write_magic(codec::ByteWriter& out, const std::array<std::uint8_t, 4>& magic, std::uint8_t version) {
  for (const std::uint8_t b : magic) out.byte(b);
  out.byte(version);
}

/// Reads the magic and version; kInvalidArgument (not corrupt data) when they belong to something else.
void read_magic(codec::ByteReader& in, const std::array<std::uint8_t, 4>& magic, std::uint8_t version,
                const std::string& what) {
  const auto head = in.bytes(magic.size());
  for (std::size_t i = 0; i < magic.size(); ++i) {
    if (static_cast<std::uint8_t>(head[i]) != magic[i])
      throw Error(ErrorCode::kInvalidArgument,
                  what + " does not start with the ibverbs transport's magic: it was made by another transport "
                         "(WB_TRANSPORT differs between the ranks?) or is not a record at all");
  }
  const std::uint8_t got = in.byte();
  if (got != version)
    throw Error(ErrorCode::kInvalidArgument, what + " has format version " + std::to_string(got) +
                                                 "; this build reads version " + std::to_string(version) +
                                                 " (ranks run different WeightBridge builds?)");
}

}  // namespace

std::string rank_text(int rank) { return "rank " + std::to_string(rank); }

// --- endpoint record ---------------------------------------------------------------------------------

std::vector<std::byte> serialize_endpoint(const EndpointRecord& record) {
  if (record.nics.empty() || record.nics.size() > kMaxNics || record.qps_per_nic < 1 ||
      record.qps_per_nic > kMaxQpsPerNic ||
      record.qps.size() != record.nics.size() * static_cast<std::size_t>(record.qps_per_nic))
    throw Error(ErrorCode::kInternal, "serialize_endpoint: " + std::to_string(record.nics.size()) + " NICs, " +
                                          std::to_string(record.qps_per_nic) + " queue pairs per NIC and " +
                                          std::to_string(record.qps.size()) + " queue pairs");
  codec::ByteWriter out;
  write_magic(out, kEndpointMagic, kEndpointVersion);
  out.varint(static_cast<std::uint64_t>(record.rank));
  out.varint(static_cast<std::uint64_t>(record.peer));
  out.varint(static_cast<std::uint64_t>(record.qps_per_nic));
  out.varint(record.batches_in_flight);
  out.varint(record.nics.size());
  for (const NicAddress& nic : record.nics) {
    out.text(nic.device);
    out.byte(nic.port);
    out.byte(static_cast<std::uint8_t>(nic.link_layer));
    out.varint(nic.lid);
    out.bytes(std::as_bytes(std::span(nic.gid)));
    out.varint(nic.gid_index);
    out.byte(static_cast<std::uint8_t>(nic.gid_type));
    out.byte(static_cast<std::uint8_t>(nic.family));
    out.byte(nic.mtu);
    out.varint(nic.max_message);
  }
  for (const QueuePairAddress& qp : record.qps) {
    out.varint(qp.qpn);
    out.varint(qp.psn);
  }
  return out.take();
}

EndpointRecord parse_endpoint(std::span<const std::byte> bytes, int peer) {
  const std::string what = "ibverbs endpoint record of " + rank_text(peer);
  codec::ByteReader in(bytes, what);
  read_magic(in, kEndpointMagic, kEndpointVersion, what);
  EndpointRecord record;
  record.rank = static_cast<int>(in.bounded(std::numeric_limits<int>::max(), "rank"));
  record.peer = static_cast<int>(in.bounded(std::numeric_limits<int>::max(), "peer rank"));
  record.qps_per_nic = static_cast<int>(in.bounded(kMaxQpsPerNic, "queue pairs per NIC"));
  if (record.qps_per_nic == 0) in.fail("0 queue pairs per NIC");
  record.batches_in_flight = static_cast<std::uint32_t>(in.bounded(0xffffffffu, "batches in flight"));
  if (record.batches_in_flight == 0) in.fail("0 batches in flight");
  const std::size_t nics = static_cast<std::size_t>(in.bounded(kMaxNics, "NIC count"));
  if (nics == 0) in.fail("no NIC");
  record.nics.resize(nics);
  for (NicAddress& nic : record.nics) {
    nic.device = in.text();
    nic.port = in.byte();
    if (nic.port == 0) in.fail("port 0");
    const std::uint8_t layer = in.byte();
    if (layer != static_cast<std::uint8_t>(LinkLayer::kInfiniBand) && layer != static_cast<std::uint8_t>(LinkLayer::kEthernet))
      in.fail("link layer " + std::to_string(layer));
    nic.link_layer = static_cast<LinkLayer>(layer);
    nic.lid = static_cast<std::uint16_t>(in.bounded(0xffff, "LID"));
    const auto gid = in.bytes(nic.gid.size());
    for (std::size_t b = 0; b < nic.gid.size(); ++b) nic.gid[b] = static_cast<std::uint8_t>(gid[b]);
    nic.gid_index = static_cast<std::uint32_t>(in.bounded(0xffff, "GID index"));
    const std::uint8_t type = in.byte();
    if (type > static_cast<std::uint8_t>(GidType::kRoceV2)) in.fail("GID type " + std::to_string(type));
    nic.gid_type = static_cast<GidType>(type);
    const std::uint8_t family = in.byte();
    if (family != static_cast<std::uint8_t>(AddressFamily::kIpv4) && family != static_cast<std::uint8_t>(AddressFamily::kIpv6))
      in.fail("address family " + std::to_string(family));
    nic.family = static_cast<AddressFamily>(family);
    nic.mtu = in.byte();
    if (mtu_bytes(nic.mtu) == 0) in.fail("MTU code " + std::to_string(nic.mtu));
    nic.max_message = in.varint();
    if (nic.max_message == 0) in.fail("max message size 0");
  }
  record.qps.resize(nics * static_cast<std::size_t>(record.qps_per_nic));
  for (QueuePairAddress& qp : record.qps) {
    qp.qpn = static_cast<std::uint32_t>(in.bounded(kMaxQpn, "queue pair number"));
    if (qp.qpn == 0) in.fail("queue pair number 0");
    qp.psn = static_cast<std::uint32_t>(in.bounded(0xffffff, "packet sequence number"));
  }
  in.expect_done();
  return record;
}

Connection check_connectable(const EndpointRecord& local, const EndpointRecord& remote, int peer) {
  const std::string who = rank_text(peer);
  if (remote.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, "the ibverbs endpoint record given for " + who + " was made by rank " +
                                                 std::to_string(remote.rank) + " (records exchanged in the wrong order?)");
  if (remote.peer != local.rank)
    throw Error(ErrorCode::kInvalidArgument, "the ibverbs endpoint record " + who + " sent here was made for rank " +
                                                 std::to_string(remote.peer) + ", not for this rank " +
                                                 std::to_string(local.rank) + " (each peer needs its own endpoint(peer))");
  if (remote.qps_per_nic != local.qps_per_nic)
    throw Error(ErrorCode::kInvalidArgument, "cannot connect to " + who + ": it opens " + std::to_string(remote.qps_per_nic) +
                                                 " queue pair(s) per NIC, this rank " + std::to_string(local.qps_per_nic) +
                                                 "; set WB_IB_QPS_PER_CONNECTION alike on every rank");
  const std::size_t pairs = std::min(local.nics.size(), remote.nics.size());
  const auto per_nic = static_cast<std::size_t>(local.qps_per_nic);
  if (pairs == 0 || remote.qps.size() != remote.nics.size() * per_nic || local.qps.size() != local.nics.size() * per_nic)
    throw Error(ErrorCode::kInvalidArgument, "connect to " + who + ": no NIC on one side");
  for (std::size_t r = 0; r < pairs; ++r) {
    const NicAddress& mine = local.nics[r];
    const NicAddress& theirs = remote.nics[r];
    const std::string pair = "NIC pair " + std::to_string(r) + " (local " + mine.label() + ", " + who + "'s " + theirs.label() + ")";
    auto refuse = [&](const std::string& why) {
      throw Error(ErrorCode::kInvalidArgument, "cannot connect to " + who + ": " + pair + why);
    };
    if (mine.link_layer != theirs.link_layer)
      refuse(std::string(" pairs ") + link_layer_name(mine.link_layer) + " with " + link_layer_name(theirs.link_layer) +
             "; choose matching NICs with WB_IB_DEVICES");
    if (theirs.link_layer == LinkLayer::kEthernet) {
      if (gid_is_zero(theirs.gid)) refuse(": the peer's RoCE NIC has a zero GID at index " + std::to_string(theirs.gid_index));
      if (mine.gid_type != theirs.gid_type)
        refuse(std::string(" pairs a ") + gid_type_name(mine.gid_type) + " GID (index " + std::to_string(mine.gid_index) +
               ") with a " + gid_type_name(theirs.gid_type) + " GID (index " + std::to_string(theirs.gid_index) +
               "), which cannot talk; set WB_IB_ROCE_VERSION (or WB_IB_GID_INDEX) alike on every rank");
      if (mine.family != theirs.family)
        refuse(std::string(" pairs an ") + address_family_name(mine.family) + " GID (" + format_gid(mine.gid) + ") with an " +
               address_family_name(theirs.family) + " GID (" + format_gid(theirs.gid) +
               "), which do not route to each other; set WB_IB_ADDR_FAMILY alike on every rank");
    }
    if (theirs.link_layer == LinkLayer::kInfiniBand && theirs.lid == 0)
      refuse(": the peer's InfiniBand port has LID 0 (no subnet manager?)");
  }
  return Connection{static_cast<int>(pairs), local.qps_per_nic};
}

// --- memory key --------------------------------------------------------------------------------------

std::vector<std::byte> serialize_memory_key(const MemoryKey& key) {
  codec::ByteWriter out;
  write_magic(out, kMemoryKeyMagic, kMemoryKeyVersion);
  out.varint(static_cast<std::uint64_t>(key.owner));
  out.varint(key.address);
  out.varint(key.bytes);
  out.varint(key.rkeys.size());
  for (const std::uint32_t rkey : key.rkeys) out.varint(rkey);
  return out.take();
}

MemoryKey parse_memory_key(std::span<const std::byte> bytes, int peer) {
  const std::string what = "ibverbs memory key imported from " + rank_text(peer);
  codec::ByteReader in(bytes, what);
  read_magic(in, kMemoryKeyMagic, kMemoryKeyVersion, what);
  MemoryKey key;
  key.owner = static_cast<int>(in.bounded(std::numeric_limits<int>::max(), "owner rank"));
  key.address = in.varint();
  key.bytes = in.varint();
  if (key.bytes > std::numeric_limits<std::uint64_t>::max() - key.address) in.fail("address + size overflows");
  const std::size_t nics = static_cast<std::size_t>(in.bounded(kMaxNics, "NIC count"));
  key.rkeys.resize(nics);
  for (std::uint32_t& rkey : key.rkeys) rkey = static_cast<std::uint32_t>(in.bounded(0xffffffffu, "rkey"));
  in.expect_done();
  if (key.owner != peer)
    throw Error(ErrorCode::kInvalidArgument, what + " was registered by rank " + std::to_string(key.owner) +
                                                 ", not by " + rank_text(peer) + " (keys exchanged in the wrong order?)");
  if (nics == 0 && key.bytes != 0) throw Error(ErrorCode::kCorruptData, what + ": no rkey for " + std::to_string(key.bytes) + " bytes");
  return key;
}

}  // namespace wb::ibv
