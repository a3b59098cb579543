// The device-independent parts of the ibverbs transport (see ibverbs_logic.hpp).
#include "transport/ibverbs/ibverbs_logic.hpp"

#include <arpa/inet.h>
#include <infiniband/verbs.h>  // enum values only (opcode and status names); no library call here

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "core/byte_codec.hpp"

namespace wb::ibv {
namespace {

constexpr std::array<std::uint8_t, 4> kEndpointMagic{'W', 'B', 'I', 'B'};
constexpr std::array<std::uint8_t, 4> kMemoryKeyMagic{'W', 'B', 'M', 'K'};
constexpr std::uint32_t kMaxQpn = 0xffffff;

std::string peer_text(int peer) { return "peer " + std::to_string(peer); }

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

std::string hex32(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%x", v);
  return text;
}

}  // namespace

// --- endpoint record ---------------------------------------------------------------------------------

const char* link_layer_name(LinkLayer layer) {
  switch (layer) {
    case LinkLayer::kInfiniBand: return "InfiniBand";
    case LinkLayer::kEthernet: return "Ethernet (RoCE)";
  }
  return "unknown link layer";
}

bool gid_is_zero(const Gid& gid) {
  return std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; });
}

std::string format_gid(const Gid& gid) {
  const bool v4_mapped = std::all_of(gid.begin(), gid.begin() + 10, [](std::uint8_t b) { return b == 0; }) &&
                         gid[10] == 0xff && gid[11] == 0xff;
  char text[64];
  if (v4_mapped) {
    std::snprintf(text, sizeof text, "::ffff:%u.%u.%u.%u", gid[12], gid[13], gid[14], gid[15]);
    return text;
  }
  std::string out;
  for (std::size_t i = 0; i < gid.size(); i += 2) {
    std::snprintf(text, sizeof text, "%02x%02x", gid[i], gid[i + 1]);
    if (i != 0) out += ':';
    out += text;
  }
  return out;
}

std::uint32_t mtu_bytes(std::uint8_t mtu) { return mtu >= 1 && mtu <= 5 ? 128u << mtu : 0u; }

std::vector<std::byte> serialize_endpoint(const EndpointRecord& record) {
  if (record.nics.empty() || record.nics.size() > kMaxNics || record.qps.size() != record.nics.size())
    throw Error(ErrorCode::kInternal, "serialize_endpoint: " + std::to_string(record.nics.size()) + " NICs and " +
                                          std::to_string(record.qps.size()) + " queue pairs");
  codec::ByteWriter out;
  write_magic(out, kEndpointMagic, kEndpointVersion);
  out.varint(static_cast<std::uint64_t>(record.rank));
  out.varint(static_cast<std::uint64_t>(record.peer));
  out.varint(record.nics.size());
  for (std::size_t i = 0; i < record.nics.size(); ++i) {
    const NicAddress& nic = record.nics[i];
    out.text(nic.device);
    out.byte(nic.port);
    out.byte(static_cast<std::uint8_t>(nic.link_layer));
    out.varint(nic.lid);
    out.bytes(std::as_bytes(std::span(nic.gid)));
    out.varint(nic.gid_index);
    out.byte(nic.mtu);
    out.varint(nic.max_message);
    out.varint(record.qps[i].qpn);
    out.varint(record.qps[i].psn);
  }
  return out.take();
}

EndpointRecord parse_endpoint(std::span<const std::byte> bytes, int peer) {
  const std::string what = "ibverbs endpoint record of " + peer_text(peer);
  codec::ByteReader in(bytes, what);
  read_magic(in, kEndpointMagic, kEndpointVersion, what);
  EndpointRecord record;
  record.rank = static_cast<int>(in.bounded(std::numeric_limits<int>::max(), "rank"));
  record.peer = static_cast<int>(in.bounded(std::numeric_limits<int>::max(), "peer rank"));
  const std::size_t nics = static_cast<std::size_t>(in.bounded(kMaxNics, "NIC count"));
  if (nics == 0) in.fail("no NIC");
  record.nics.resize(nics);
  record.qps.resize(nics);
  for (std::size_t i = 0; i < nics; ++i) {
    NicAddress& nic = record.nics[i];
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
    nic.mtu = in.byte();
    if (mtu_bytes(nic.mtu) == 0) in.fail("MTU code " + std::to_string(nic.mtu));
    nic.max_message = in.varint();
    if (nic.max_message == 0) in.fail("max message size 0");
    record.qps[i].qpn = static_cast<std::uint32_t>(in.bounded(kMaxQpn, "queue pair number"));
    if (record.qps[i].qpn == 0) in.fail("queue pair number 0");
    record.qps[i].psn = static_cast<std::uint32_t>(in.bounded(0xffffff, "packet sequence number"));
  }
  in.expect_done();
  return record;
}

int check_connectable(const EndpointRecord& local, const EndpointRecord& remote, int peer) {
  const std::string who = peer_text(peer);
  if (remote.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, "the ibverbs endpoint record given for " + who + " was made by rank " +
                                                 std::to_string(remote.rank) + " (records exchanged in the wrong order?)");
  if (remote.peer != local.rank)
    throw Error(ErrorCode::kInvalidArgument, "the ibverbs endpoint record " + who + " sent here was made for rank " +
                                                 std::to_string(remote.peer) + ", not for this rank " +
                                                 std::to_string(local.rank) + " (each peer needs its own endpoint(peer))");
  const std::size_t rails = std::min(local.nics.size(), remote.nics.size());
  if (rails == 0 || remote.qps.size() != remote.nics.size() || local.qps.size() != local.nics.size())
    throw Error(ErrorCode::kInvalidArgument, "connect to " + who + ": no NIC on one side");
  for (std::size_t r = 0; r < rails; ++r) {
    const NicAddress& mine = local.nics[r];
    const NicAddress& theirs = remote.nics[r];
    const std::string pair = "rail " + std::to_string(r) + " (local " + mine.label() + ", " + who + "'s " + theirs.label() + ")";
    if (mine.link_layer != theirs.link_layer)
      throw Error(ErrorCode::kInvalidArgument, "cannot connect to " + who + ": " + pair + " pairs " +
                                                   link_layer_name(mine.link_layer) + " with " +
                                                   link_layer_name(theirs.link_layer) +
                                                   "; choose matching NICs with WB_IB_DEVICES");
    if (theirs.link_layer == LinkLayer::kEthernet && gid_is_zero(theirs.gid))
      throw Error(ErrorCode::kInvalidArgument, "cannot connect to " + who + ": " + pair +
                                                   ": the peer's RoCE NIC has a zero GID at index " +
                                                   std::to_string(theirs.gid_index));
    if (theirs.link_layer == LinkLayer::kInfiniBand && theirs.lid == 0)
      throw Error(ErrorCode::kInvalidArgument, "cannot connect to " + who + ": " + pair +
                                                   ": the peer's InfiniBand port has LID 0 (no subnet manager?)");
  }
  return static_cast<int>(rails);
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
  const std::string what = "ibverbs memory key imported from " + peer_text(peer);
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
                                                 ", not by " + peer_text(peer) + " (keys exchanged in the wrong order?)");
  if (nics == 0 && key.bytes != 0) throw Error(ErrorCode::kCorruptData, what + ": no rkey for " + std::to_string(key.bytes) + " bytes");
  return key;
}

// --- settings ----------------------------------------------------------------------------------------

std::vector<DeviceSpec> parse_device_list(std::string_view text) {
  std::vector<DeviceSpec> specs;
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) continue;
    DeviceSpec spec;
    const std::size_t colon = item.find(':');
    spec.name = std::string(trim(item.substr(0, colon)));
    if (spec.name.empty())
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES entry '" + std::string(item) + "' has no device name");
    if (colon != std::string_view::npos) {
      const std::string_view port = trim(item.substr(colon + 1));
      int value = 0;
      bool ok = !port.empty() && port.size() <= 3;
      for (const char c : port) {
        if (c < '0' || c > '9') ok = false;
        else value = value * 10 + (c - '0');
      }
      if (!ok || value < 1 || value > 255)
        throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES entry '" + std::string(item) +
                                                     "': the port after ':' must be a number from 1 to 255");
      spec.port = value;
    }
    if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(std::move(spec));
  }
  return specs;
}

std::uint32_t choose_gid_index(std::span<const GidEntry> table, LinkLayer layer, std::int64_t requested,
                               std::string_view nic) {
  auto type_name = [](GidType type) {
    switch (type) {
      case GidType::kIb: return "IB";
      case GidType::kRoceV1: return "RoCE v1";
      case GidType::kRoceV2: return "RoCE v2";
    }
    return "?";
  };
  auto listing = [&] {
    std::string text;
    for (const GidEntry& e : table) {
      if (!text.empty()) text += ", ";
      text += std::to_string(e.index) + " (" + type_name(e.type) + " " + format_gid(e.gid) + ")";
    }
    return text.empty() ? std::string("the table is empty") : "valid: " + text;
  };
  auto find = [&](std::uint32_t index) -> const GidEntry* {
    for (const GidEntry& e : table)
      if (e.index == index && !gid_is_zero(e.gid)) return &e;
    return nullptr;
  };
  if (requested >= 0) {
    if (requested > 0xffff || find(static_cast<std::uint32_t>(requested)) == nullptr)
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_GID_INDEX=" + std::to_string(requested) + ": " + std::string(nic) +
                                                   " has no GID at that index (" + listing() + ")");
    return static_cast<std::uint32_t>(requested);
  }
  if (layer == LinkLayer::kInfiniBand) {
    // Index 0 holds the port GID (subnet prefix + GUID); only used when a GRH is needed.
    return 0;
  }
  auto ipv4_mapped = [](const Gid& g) {
    return std::all_of(g.begin(), g.begin() + 10, [](std::uint8_t b) { return b == 0; }) && g[10] == 0xff && g[11] == 0xff;
  };
  const GidEntry* best = nullptr;
  int best_rank = 0;
  for (const GidEntry& e : table) {
    if (gid_is_zero(e.gid)) continue;
    int rank = 0;
    if (e.type == GidType::kRoceV2) rank = ipv4_mapped(e.gid) ? 3 : 2;
    else if (e.type == GidType::kRoceV1) rank = 1;
    if (rank > best_rank || (rank == best_rank && best != nullptr && e.index < best->index)) {
      best = &e;
      best_rank = rank;
    }
  }
  if (best == nullptr)
    throw Error(ErrorCode::kUnsupported, std::string(nic) + " is an Ethernet (RoCE) port without a usable RoCE GID (" +
                                             listing() + "); is an IP address configured on its interface?");
  return best->index;
}

// --- data path ---------------------------------------------------------------------------------------

Status check_write_ranges(int peer, std::span<const WriteRequest> writes, std::span<const std::uint64_t> local_sizes,
                          std::span<const std::uint64_t> remote_sizes) {
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const WriteRequest& w = writes[i];
    // The text is built only for a failure: this runs for every write of every batch.
    auto head = [&] {
      return "post_writes to " + peer_text(peer) + ": write " + std::to_string(i) + " of " + std::to_string(writes.size());
    };
    if (w.local_memory >= local_sizes.size())
      return Status(ErrorCode::kInvalidArgument, head() + " names local memory " + std::to_string(w.local_memory) + ", but " +
                                                     std::to_string(local_sizes.size()) + " regions are registered here");
    if (w.remote_memory >= remote_sizes.size())
      return Status(ErrorCode::kInvalidArgument, head() + " names remote memory " + std::to_string(w.remote_memory) + ", but " +
                                                     std::to_string(remote_sizes.size()) + " regions were imported from " +
                                                     peer_text(peer));
    const std::uint64_t local_size = local_sizes[w.local_memory];
    if (w.local_offset > local_size || w.bytes > local_size - w.local_offset)
      return Status(ErrorCode::kInvalidArgument, head() + " reads local memory " + std::to_string(w.local_memory) + " at offset " +
                                                     std::to_string(w.local_offset) + " + " + std::to_string(w.bytes) +
                                                     " bytes, past its " + std::to_string(local_size) + " registered bytes");
    const std::uint64_t remote_size = remote_sizes[w.remote_memory];
    if (w.remote_offset > remote_size || w.bytes > remote_size - w.remote_offset)
      return Status(ErrorCode::kInvalidArgument, head() + " writes remote memory " + std::to_string(w.remote_memory) + " of " +
                                                     peer_text(peer) + " at offset " + std::to_string(w.remote_offset) + " + " +
                                                     std::to_string(w.bytes) + " bytes, past its " +
                                                     std::to_string(remote_size) + " registered bytes");
  }
  return Status::ok();
}

namespace {

/// Calls f(first_write, bytes) for each run of the batch: consecutive non-empty writes that are contiguous
/// on both sides (same memories, each starting where the previous ended) form one run, so the pieces of a
/// packed buffer cost one work request, not one per write.
template <class F>
void for_each_run(std::span<const WriteRequest> writes, F&& f) {
  const WriteRequest* last = nullptr;
  std::size_t first = 0;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const WriteRequest& w = writes[i];
    if (w.bytes == 0) continue;
    if (last != nullptr && w.local_memory == last->local_memory && w.remote_memory == last->remote_memory &&
        w.local_offset == last->local_offset + last->bytes && w.remote_offset == last->remote_offset + last->bytes) {
      bytes += w.bytes;
    } else {
      if (last != nullptr) f(first, bytes);
      first = i;
      bytes = w.bytes;
    }
    last = &w;
  }
  if (last != nullptr) f(first, bytes);
}

}  // namespace

void plan_stripes(std::span<const WriteRequest> writes, const StripeOptions& options,
                  std::vector<std::vector<Piece>>& out) {
  const int rails = std::max(options.rails, 1);
  const std::uint64_t max_message = std::max<std::uint64_t>(options.max_message, 1);
  out.resize(static_cast<std::size_t>(rails));
  for (auto& rail : out) rail.clear();

  auto emit = [&](int rail, std::size_t write, std::uint64_t offset, std::uint64_t bytes) {
    auto& pieces = out[static_cast<std::size_t>(rail)];
    while (bytes > 0) {
      const std::uint64_t take = std::min(bytes, max_message);
      pieces.push_back(Piece{static_cast<std::uint32_t>(write), offset, take});
      offset += take;
      bytes -= take;
    }
  };

  std::uint64_t total = 0;
  for (const WriteRequest& w : writes) total += w.bytes;
  const auto rails64 = static_cast<std::uint64_t>(rails);
  if (rails == 1 || total / rails64 < options.min_stripe_bytes || total < rails64) {
    const int rail = ((options.first_rail % rails) + rails) % rails;
    for_each_run(writes, [&](std::size_t write, std::uint64_t bytes) { emit(rail, write, 0, bytes); });
    return;
  }
  const std::uint64_t align = std::max<std::uint64_t>(options.alignment, 1);
  std::uint64_t share = (total + rails64 - 1) / rails64;
  share = (share + align - 1) / align * align;

  int rail = 0;
  std::uint64_t position = 0;  // bytes of the batch before the current point
  std::uint64_t rail_end = share;
  for_each_run(writes, [&](std::size_t write, std::uint64_t bytes) {
    std::uint64_t offset = 0;
    while (offset < bytes) {
      const std::uint64_t take = std::min(bytes - offset, rail_end - position);
      emit(rail, write, offset, take);
      offset += take;
      position += take;
      if (position == rail_end && rail < rails - 1) {
        ++rail;
        rail_end = rail == rails - 1 ? std::numeric_limits<std::uint64_t>::max() : rail_end + share;
      }
    }
  });
}

void SendQueue::reset(std::uint32_t depth) {
  depth_ = depth;
  outstanding_ = 0;
  in_flight_.clear();
  in_flight_.reserve(depth);
}

void SendQueue::push(std::uint64_t token, std::uint32_t work_requests) {
  outstanding_ += work_requests;
  in_flight_.push_back(Batch{token, work_requests});
}

Status SendQueue::complete(std::uint64_t wr_id, std::uint32_t& freed) {
  freed = 0;
  if (in_flight_.empty())
    return Status(ErrorCode::kInternal, "send completion with wr_id " + std::to_string(wr_id) + " but no batch is in flight");
  const Batch oldest = in_flight_.front();
  if (oldest.token != wr_id)
    return Status(ErrorCode::kInternal, "send completion with wr_id " + std::to_string(wr_id) +
                                            " but the oldest batch in flight has token " + std::to_string(oldest.token));
  in_flight_.pop_front();
  outstanding_ -= oldest.work_requests;
  freed = oldest.work_requests;
  return Status::ok();
}

void BatchTracker::reset(int rails, std::size_t capacity) {
  tokens_.clear();
  tokens_.reserve(capacity);
  done_.assign(static_cast<std::size_t>(std::max(rails, 1)), 0);
}

void BatchTracker::push(std::uint64_t token) { tokens_.push_back(token); }

Status BatchTracker::rail_done(int rail, std::uint64_t token) {
  if (rail < 0 || static_cast<std::size_t>(rail) >= done_.size())
    return Status(ErrorCode::kInternal, "completion on rail " + std::to_string(rail) + " of " + std::to_string(done_.size()));
  std::size_t& done = done_[static_cast<std::size_t>(rail)];
  if (done >= tokens_.size())
    return Status(ErrorCode::kInternal, "rail " + std::to_string(rail) + " completed a batch (token " + std::to_string(token) +
                                            ") that was never posted");
  if (tokens_.at(done) != token)
    return Status(ErrorCode::kInternal, "rail " + std::to_string(rail) + " completed token " + std::to_string(token) +
                                            " where token " + std::to_string(tokens_.at(done)) + " was next");
  ++done;
  return Status::ok();
}

bool BatchTracker::pop_complete(std::uint64_t& token) {
  if (tokens_.empty()) return false;
  for (const std::size_t done : done_)
    if (done == 0) return false;
  token = tokens_.front();
  tokens_.pop_front();
  for (std::size_t& done : done_) --done;
  return true;
}

void ArrivalMatcher::reset(int rails) {
  rails_.assign(static_cast<std::size_t>(std::max(rails, 1)), Ring<std::uint32_t>(16));
}

Status ArrivalMatcher::arrive(int rail, std::uint32_t imm, bool& complete, std::uint32_t& immediate) {
  complete = false;
  if (rail < 0 || static_cast<std::size_t>(rail) >= rails_.size())
    return Status(ErrorCode::kInternal, "arrival on rail " + std::to_string(rail) + " of " + std::to_string(rails_.size()));
  rails_[static_cast<std::size_t>(rail)].push_back(imm);
  for (const auto& queue : rails_)
    if (queue.empty()) return Status::ok();
  // Every rail has an arrival: the oldest of each belong to one batch.
  const std::uint32_t first = rails_[0].front();
  for (std::size_t r = 1; r < rails_.size(); ++r) {
    if (rails_[r].front() != first)
      return Status(ErrorCode::kCorruptData, "the rails disagree about a batch's immediate: rail 0 carried " + hex32(first) +
                                                 ", rail " + std::to_string(r) + " carried " + hex32(rails_[r].front()) +
                                                 " (a batch posted on only some rails, or a peer running another build?)");
  }
  for (auto& queue : rails_) queue.pop_front();
  complete = true;
  immediate = first;
  return Status::ok();
}

std::uint32_t immediate_to_wire(std::uint32_t immediate) { return htonl(immediate); }
std::uint32_t immediate_from_wire(std::uint32_t wire) { return ntohl(wire); }

// --- messages ----------------------------------------------------------------------------------------

std::string wc_opcode_name(int opcode) {
  switch (opcode) {
    case IBV_WC_SEND: return "SEND";
    case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";
    case IBV_WC_COMP_SWAP: return "COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "FETCH_ADD";
    case IBV_WC_BIND_MW: return "BIND_MW";
    case IBV_WC_LOCAL_INV: return "LOCAL_INV";
    case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "opcode " + std::to_string(opcode);
  }
}

std::string completion_error_hint(int status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      return "the peer did not acknowledge: it is dead, unreachable, or its queue pair was not connected in time";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "the peer had no receive posted for the immediate (it stopped polling?)";
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer refused the write: remote address or rkey outside what it registered (stale memory key?)";
    case IBV_WC_LOC_PROT_ERR: return "a local address or lkey is outside the registered memory";
    case IBV_WC_WR_FLUSH_ERR: return "flushed after an earlier error on the same connection";
    default: return "";
  }
}

std::string describe_completion_error(const CompletionError& e) {
  std::string text = "RDMA ";
  text += e.receive ? "receive of an immediate from " : "write to ";
  text += peer_text(e.peer);
  text += " failed on " + e.nic + " (rail " + std::to_string(e.rail) + "): " + e.status_text;
  text += " (status " + std::to_string(e.status) + ", opcode " + e.opcode + ", vendor_err " + hex32(e.vendor_err);
  if (!e.receive) text += ", batch token " + std::to_string(e.wr_id);
  text += ")";
  const std::string hint = completion_error_hint(e.status);
  if (!hint.empty()) text += ": " + hint;
  return text;
}

}  // namespace wb::ibv
