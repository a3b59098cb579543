// Private: the parts of the ibverbs transport that need no RDMA device, so that tests/unit/test_ibverbs.cpp
// checks them on any machine. No ibverbs header here: values from <infiniband/verbs.h> (link layers, MTU
// enums, GID types) are carried as plain integers with the same meaning.
//
//   records      the versioned endpoint record and memory key a rank sends its peers (over MPI), with
//                validation that names the peer
//   settings     WB_IB_DEVICES parsing, GID choice for RoCE v2 / InfiniBand
//   data path    write range checks, striping a batch over rails (one rail = one NIC pair = one RC QP),
//                splitting writes longer than the port's message limit, send-queue accounting, matching
//                per-rail completions to batches and per-rail arrivals to one kArrival
//   messages     the text of a failed work completion
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightbridge/status.hpp"
#include "weightbridge/transport.hpp"

namespace wb::ibv {

// --- a growable FIFO that allocates only when it grows (reserve once, then never on the update path) --

template <class T>
class Ring {
 public:
  explicit Ring(std::size_t capacity = 0) { reserve(capacity); }

  void reserve(std::size_t capacity) {
    if (capacity <= slots_.size()) return;
    std::vector<T> grown(capacity);
    for (std::size_t i = 0; i < size_; ++i) grown[i] = slots_[(head_ + i) % slots_.size()];
    slots_ = std::move(grown);
    head_ = 0;
  }
  void push_back(const T& value) {
    if (size_ == slots_.size()) reserve(slots_.empty() ? 16 : 2 * slots_.size());
    slots_[(head_ + size_) % slots_.size()] = value;
    ++size_;
  }
  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }
  /// The i-th oldest entry (0 = front); i < size().
  T& at(std::size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  void pop_front() {
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::vector<T> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

// --- endpoint record ---------------------------------------------------------------------------------

inline constexpr std::uint8_t kEndpointVersion = 1;
inline constexpr std::uint8_t kMemoryKeyVersion = 1;
inline constexpr std::size_t kMaxNics = 64;

/// IBV_LINK_LAYER_INFINIBAND / IBV_LINK_LAYER_ETHERNET.
enum class LinkLayer : std::uint8_t { kInfiniBand = 1, kEthernet = 2 };
const char* link_layer_name(LinkLayer layer);  // "InfiniBand", "Ethernet (RoCE)"

using Gid = std::array<std::uint8_t, 16>;
/// "fe80:0000:0000:0000:0202:c9ff:fe00:0001", or "::ffff:10.1.2.3" for an IPv4-mapped GID (RoCE v2).
std::string format_gid(const Gid& gid);
bool gid_is_zero(const Gid& gid);

/// MTU enum (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5) in bytes; 0 when out of range.
std::uint32_t mtu_bytes(std::uint8_t mtu);

/// One NIC (device port) of a rank, as its peers need to see it.
struct NicAddress {
  std::string device;  // "mlx5_0", for messages
  std::uint8_t port = 1;
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  std::uint16_t lid = 0;
  Gid gid{};
  std::uint32_t gid_index = 0;
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

/// What endpoint(peer) returns: rank `rank` describes, for `peer`, its NICs and the RC queue pair it
/// created on each of them for that peer (qps[i] lives on nics[i]).
struct EndpointRecord {
  int rank = -1;
  int peer = -1;
  std::vector<NicAddress> nics;
  std::vector<QueuePairAddress> qps;

  bool operator==(const EndpointRecord&) const = default;
};

std::vector<std::byte> serialize_endpoint(const EndpointRecord& record);
/// Parses the record given for `peer`. Malformed bytes: kCorruptData; another format or version:
/// kInvalidArgument. Every message names the peer.
EndpointRecord parse_endpoint(std::span<const std::byte> bytes, int peer);

/// Checks that `local` (the record this rank made for `peer`) and `remote` (the one `peer` made for this
/// rank) can connect; returns the number of rails: min(local NICs, remote NICs), rail i pairing NIC i
/// of both. Throws kInvalidArgument naming the peer and the NICs when they cannot.
int check_connectable(const EndpointRecord& local, const EndpointRecord& remote, int peer);

// --- memory key --------------------------------------------------------------------------------------

/// What MemoryRegistration::remote_key holds: the owner, the address (the iova of the memory regions),
/// the size, and one rkey per NIC of the owner (rail i writes with rkeys[i]).
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

// --- settings ----------------------------------------------------------------------------------------

struct DeviceSpec {
  std::string name;
  int port = 0;  // 0: every active port of the device
  bool operator==(const DeviceSpec&) const = default;
};
/// WB_IB_DEVICES: "mlx5_0,mlx5_1:1" (names, each with an optional port). Empty: every device. Throws
/// kInvalidArgument on a malformed entry.
std::vector<DeviceSpec> parse_device_list(std::string_view text);

/// IBV_GID_TYPE_IB / _ROCE_V1 / _ROCE_V2.
enum class GidType : std::uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };
struct GidEntry {
  std::uint32_t index = 0;
  GidType type = GidType::kIb;
  Gid gid{};
};
/// The GID index a NIC uses. `requested` >= 0 (WB_IB_GID_INDEX) must name a valid entry. Otherwise:
/// InfiniBand uses index 0; Ethernet prefers a RoCE v2 GID holding an IPv4 address, then any RoCE v2,
/// then RoCE v1. Throws naming `nic` and listing the table when nothing fits.
std::uint32_t choose_gid_index(std::span<const GidEntry> table, LinkLayer layer, std::int64_t requested,
                               std::string_view nic);

// --- data path ---------------------------------------------------------------------------------------

/// Checks every write against the registered sizes (local_sizes[id], remote_sizes[id] of this peer)
/// before anything is posted. kInvalidArgument naming the peer, the write, the memory and the offset.
Status check_write_ranges(int peer, std::span<const WriteRequest> writes, std::span<const std::uint64_t> local_sizes,
                          std::span<const std::uint64_t> remote_sizes);

/// Bytes [offset, offset + bytes) of the batch counted from the start of writes[write]: one RDMA write. A
/// piece may run on into the following writes when they continue it on both sides (see plan_stripes).
struct Piece {
  std::uint32_t write = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  bool operator==(const Piece&) const = default;
};

struct StripeOptions {
  int rails = 1;
  int first_rail = 0;                   // the rail of a batch too small to stripe (rotated by the caller)
  std::uint64_t max_message = 1u << 30; // longer pieces are split
  std::uint64_t min_stripe_bytes = 0;   // a batch below rails * this goes on one rail
  std::uint64_t alignment = 4096;       // stripe boundaries are multiples of this
};

/// Spreads a batch over the rails. Consecutive writes that continue each other on both sides (same
/// memories, local and remote offsets each where the previous write ended) are merged first, so a packed
/// buffer sent in many writes costs one work request. The batch's bytes, in order, are then cut into
/// `rails` contiguous shares of about equal size (boundaries aligned), each merged run becoming a piece
/// on every rail its bytes touch; pieces longer than max_message are split. Zero-byte writes make no
/// piece. `out` is resized to `rails` and reused (no allocation once warm).
void plan_stripes(std::span<const WriteRequest> writes, const StripeOptions& options,
                  std::vector<std::vector<Piece>>& out);

/// Work requests a rail posts for its pieces: one per piece, and at least one (a zero-length
/// WRITE_WITH_IMM when the rail carries no bytes), since every rail ends its part of every batch with
/// the immediate.
inline std::size_t rail_work_requests(const std::vector<Piece>& pieces) { return pieces.empty() ? 1 : pieces.size(); }

/// Send-queue slots of one queue pair. A batch's work requests hold their slots until its one signalled
/// work request completes (selective signalling: only the last is signalled; RC completes in order).
class SendQueue {
 public:
  SendQueue() = default;
  explicit SendQueue(std::uint32_t depth) { reset(depth); }
  void reset(std::uint32_t depth);

  std::uint32_t depth() const { return depth_; }
  std::uint32_t outstanding() const { return outstanding_; }
  std::uint32_t free_slots() const { return depth_ - outstanding_; }
  std::size_t batches_in_flight() const { return in_flight_.size(); }
  bool fits(std::size_t work_requests) const { return work_requests <= free_slots(); }

  /// Records a posted batch of `work_requests` whose signalled request carries wr_id = token. Requires fits.
  void push(std::uint64_t token, std::uint32_t work_requests);
  /// The signalled completion with this wr_id arrived: frees its batch's slots and returns how many.
  /// kInternal when it is not the oldest batch in flight.
  Status complete(std::uint64_t wr_id, std::uint32_t& freed);

 private:
  struct Batch {
    std::uint64_t token = 0;
    std::uint32_t work_requests = 0;
  };
  std::uint32_t depth_ = 0;
  std::uint32_t outstanding_ = 0;
  Ring<Batch> in_flight_;
};

/// The batches posted to one peer: each is complete when every rail has completed its part. Each rail
/// completes its parts in order, and every batch has a part on every rail, so batches complete in order.
class BatchTracker {
 public:
  void reset(int rails, std::size_t capacity);
  void push(std::uint64_t token);
  /// `rail` completed its part of the oldest batch it had not yet completed, whose token is `token`.
  /// kInternal when that is not what was posted.
  Status rail_done(int rail, std::uint64_t token);
  /// Pops the oldest batch when every rail has completed it.
  bool pop_complete(std::uint64_t& token);
  std::size_t in_flight() const { return tokens_.size(); }

 private:
  Ring<std::uint64_t> tokens_;
  std::vector<std::size_t> done_;  // per rail: parts completed among tokens_ (from the front)
};

/// Arrivals from one peer: every rail carries one WRITE_WITH_IMM per batch, each with the batch's
/// immediate; the batch has landed when it arrived on every rail (RC orders each rail). The k-th arrival
/// of every rail belongs to the same batch, so the immediates must agree.
class ArrivalMatcher {
 public:
  void reset(int rails);
  /// Records an arrival on `rail`; sets `complete` (and `immediate`) when that batch has now arrived on
  /// every rail. kCorruptData when the rails disagree about the immediate.
  Status arrive(int rail, std::uint32_t imm, bool& complete, std::uint32_t& immediate);
  std::size_t pending(int rail) const { return rails_[static_cast<std::size_t>(rail)].size(); }

 private:
  std::vector<Ring<std::uint32_t>> rails_;
};

/// The immediate on the wire is big-endian (htonl on post, ntohl on receipt).
std::uint32_t immediate_to_wire(std::uint32_t immediate);
std::uint32_t immediate_from_wire(std::uint32_t wire);

// --- messages ----------------------------------------------------------------------------------------

/// A failed work completion, in words a person can act on.
struct CompletionError {
  int peer = -1;
  std::string nic;            // "mlx5_0:1"
  int rail = 0;
  bool receive = false;       // a receive (an arriving immediate) rather than our own write
  std::string status_text;    // ibv_wc_status_str
  int status = 0;
  std::string opcode;         // the completion's opcode (meaningful only on success; providers vary)
  std::uint32_t vendor_err = 0;
  std::uint64_t wr_id = 0;    // the batch token for a write
};
std::string describe_completion_error(const CompletionError& error);
/// A hint for the most common failures (e.g. "the peer is dead or unreachable" for a retry-exceeded
/// status), or "" when there is none. `status` is an ibv_wc_status value.
std::string completion_error_hint(int status);
/// The name of an ibv_wc_opcode value ("RDMA_WRITE", "RECV_RDMA_WITH_IMM", ...).
std::string wc_opcode_name(int opcode);

}  // namespace wb::ibv
