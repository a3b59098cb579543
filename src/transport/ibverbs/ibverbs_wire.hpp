// Private: the records the ibverbs transport sends its peers over MPI, with validation that names the
// peer as "rank N". No ibverbs header (see ibverbs_addressing.hpp).
//
//   endpoint record   a rank's NICs and the RC queue pairs it created on them for one peer, versioned
//   memory key        a registration's owner, address, size and one rkey per NIC of the owner
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/ibverbs/ibverbs_addressing.hpp"

namespace wb::ibv {

/// "rank N": how every message of the transport names a peer.
std::string rank_text(int rank);

inline constexpr std::uint8_t kEndpointVersion = 2;
inline constexpr std::uint8_t kMemoryKeyVersion = 1;
inline constexpr std::size_t kMaxNics = 64;
inline constexpr int kMaxQpsPerNic = 16;

/// One NIC (device port) of a rank, as its peers need to see it.
struct NicAddress {
  std::string device;  // "mlx5_0", for messages
  std::uint8_t port = 1;
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  std::uint16_t lid = 0;
  Gid gid{};
  std::uint32_t gid_index = 0;
  GidType gid_type = GidType::kIb;                // of the chosen GID (RoCE v1 and v2 do not talk)
  AddressFamily family = AddressFamily::kIpv6;    // of the chosen GID (IPv4 and IPv6 GIDs do not route)
  std::uint8_t mtu = 0;           // active MTU, enum ibv_mtu
  std::uint64_t max_message = 0;  // the port's max_msg_sz

  std::string label() const { return device + ":" + std::to_string(port); }
  bool operator==(const NicAddress&) const = default;
};

/// The queue pair a rank created on one of its NICs for one peer.
struct QueuePairAddress {
  std::uint32_t qpn = 0;  // 24 bits
  std::uint32_t psn = 0;  // 24 bits: the first packet sequence number it sends
  bool operator==(const QueuePairAddress&) const = default;
};

/// What endpoint(peer) returns: rank `rank` describes, for `peer`, its NICs and the RC queue pairs it
/// created on them for that peer: qps_per_nic of them on each NIC, qps[n * qps_per_nic + j] the j-th on
/// nics[n]. `batches_in_flight` is the most batches it keeps unacknowledged to one peer (WB_IB_BATCHES_IN_
/// FLIGHT), which the peer needs to size its receives.
struct EndpointRecord {
  int rank = -1;
  int peer = -1;
  int qps_per_nic = 1;
  std::uint32_t batches_in_flight = 1;
  std::vector<NicAddress> nics;
  std::vector<QueuePairAddress> qps;

  bool operator==(const EndpointRecord&) const = default;
};

std::vector<std::byte> serialize_endpoint(const EndpointRecord& record);
/// Parses the record given for `peer`. Malformed bytes: kCorruptData; another format or version:
/// kInvalidArgument. Every message names the peer.
EndpointRecord parse_endpoint(std::span<const std::byte> bytes, int peer);

/// How two records connect: NIC pair i pairs nics[i] of both sides, each carrying qps_per_nic rails.
struct Connection {
  int nic_pairs = 0;
  int qps_per_nic = 1;
  int rails() const { return nic_pairs * qps_per_nic; }
};

/// Checks that `local` (the record this rank made for `peer`) and `remote` (the one `peer` made for this
/// rank) can connect: NIC pairs of one link layer, RoCE GIDs of one type and address family, as many
/// queue pairs per NIC on both sides. Throws kInvalidArgument naming the peer, the NICs and what to set.
Connection check_connectable(const EndpointRecord& local, const EndpointRecord& remote, int peer);

/// What MemoryRegistration::remote_key holds: the owner, the address (the iova of the memory regions),
/// the size, and one rkey per NIC of the owner (a rail over NIC pair i writes with rkeys[i]).
struct MemoryKey {
  int owner = -1;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::vector<std::uint32_t> rkeys;

  bool operator==(const MemoryKey&) const = default;
};

std::vector<std::byte> serialize_memory_key(const MemoryKey& key);
/// Parses a key imported from `peer`; throws (kCorruptData / kInvalidArgument) naming the peer, also when
/// the key was registered by another rank.
MemoryKey parse_memory_key(std::span<const std::byte> bytes, int peer);

}  // namespace wb::ibv
