// How a port is addressed (see ibverbs_addressing.hpp).
#include "transport/ibverbs/ibverbs_addressing.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

bool ipv4_mapped(const Gid& g) {
  return std::all_of(g.begin(), g.begin() + 10, [](std::uint8_t b) { return b == 0; }) && g[10] == 0xff && g[11] == 0xff;
}

std::string hex16(std::uint16_t v) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%04x", v);
  return text;
}

/// Bits [0, bits) of a and b agree.
bool prefix_equal(const Gid& a, const Gid& b, int bits) {
  for (int i = 0; i < bits / 8; ++i)
    if (a[static_cast<std::size_t>(i)] != b[static_cast<std::size_t>(i)]) return false;
  const int rest = bits % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  const auto i = static_cast<std::size_t>(bits / 8);
  return (a[i] & mask) == (b[i] & mask);
}

}  // namespace

const char* link_layer_name(LinkLayer layer) {
  switch (layer) {
    case LinkLayer::kInfiniBand: return "InfiniBand";
    case LinkLayer::kEthernet: return "Ethernet (RoCE)";
  }
  return "unknown link layer";
}

std::uint32_t mtu_bytes(std::uint8_t mtu) { return mtu >= 1 && mtu <= 5 ? 128u << mtu : 0u; }

bool gid_is_zero(const Gid& gid) {
  return std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; });
}

bool gid_is_link_local(const Gid& gid) {
  return gid[0] == 0xfe && gid[1] == 0x80 && std::all_of(gid.begin() + 2, gid.begin() + 8, [](std::uint8_t b) { return b == 0; });
}

std::string format_gid(const Gid& gid) {
  char text[64];
  if (ipv4_mapped(gid)) {
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

AddressFamily gid_family(const Gid& gid) { return ipv4_mapped(gid) ? AddressFamily::kIpv4 : AddressFamily::kIpv6; }

const char* address_family_name(AddressFamily family) {
  switch (family) {
    case AddressFamily::kIpv4: return "IPv4";
    case AddressFamily::kIpv6: return "IPv6";
    case AddressFamily::kAny: return "any";
  }
  return "?";
}

const char* gid_type_name(GidType type) {
  switch (type) {
    case GidType::kIb: return "IB";
    case GidType::kRoceV1: return "RoCE v1";
    case GidType::kRoceV2: return "RoCE v2";
  }
  return "?";
}

std::optional<GidType> parse_gid_type_text(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) text.remove_suffix(1);
  if (text == "RoCE v2") return GidType::kRoceV2;
  // The kernel writes "IB/RoCE v1" for both: the port's link layer tells them apart.
  if (text == "IB/RoCE v1" || text == "RoCE v1") return GidType::kRoceV1;
  if (text == "IB") return GidType::kIb;
  return std::nullopt;
}

std::uint16_t gid_flid(const Gid& gid) {
  // fec0::/10, then 22 zero bits: bytes 0-3 are fe c0|00 00 00 with the low 6 bits of byte 1 zero.
  const bool form = gid[0] == 0xfe && (gid[1] & 0xc0) == 0xc0 && (gid[1] & 0x3f) == 0 && gid[2] == 0 && gid[3] == 0;
  if (!form) return 0;
  return static_cast<std::uint16_t>((gid[4] << 8) | gid[5]);
}

bool same_ib_subnet(const Gid& a, const Gid& b) {
  if (gid_flid(a) != 0 && gid_flid(b) != 0) return a[6] == b[6] && a[7] == b[7];
  return std::equal(a.begin(), a.begin() + 8, b.begin());
}

bool AddressRange::contains(const Gid& gid) const {
  if (bits == 0) return family == AddressFamily::kAny || gid_family(gid) == family;
  if (family != AddressFamily::kAny && gid_family(gid) != family) return false;
  return prefix_equal(prefix, gid, bits);
}

AddressRange parse_address_range(std::string_view text, std::string_view variable) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  AddressRange range;
  if (text.empty()) return range;
  auto fail = [&](const std::string& why) -> AddressRange {
    throw Error(ErrorCode::kInvalidArgument, std::string(variable) + "='" + std::string(text) + "': " + why +
                                                 " (expected an address and a prefix length: 10.0.0.0/8, fd00::/8)");
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return fail("no '/'");
  const std::string address(text.substr(0, slash));
  const std::string_view length = text.substr(slash + 1);
  int bits = 0;
  if (length.empty() || length.size() > 3) return fail("bad prefix length");
  for (const char c : length) {
    if (c < '0' || c > '9') return fail("bad prefix length");
    bits = bits * 10 + (c - '0');
  }
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) {
    if (bits > 32) return fail("an IPv4 prefix is at most 32 bits");
    range.family = AddressFamily::kIpv4;
    range.prefix[10] = 0xff;
    range.prefix[11] = 0xff;
    std::memcpy(range.prefix.data() + 12, &v4, 4);
    range.bits = 96 + bits;
  } else if (::inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    if (bits > 128) return fail("an IPv6 prefix is at most 128 bits");
    range.family = AddressFamily::kIpv6;
    std::memcpy(range.prefix.data(), &v6, 16);
    range.bits = bits;
  } else {
    return fail("'" + address + "' is not an IPv4 or IPv6 address");
  }
  return range;
}

// --- GID choice --------------------------------------------------------------------------------------

std::uint32_t choose_gid_index(std::span<const GidEntry> table, LinkLayer layer, const GidPreferences& wanted,
                               std::string_view nic) {
  auto listing = [&] {
    std::string text;
    for (const GidEntry& e : table) {
      if (gid_is_zero(e.gid)) continue;
      if (!text.empty()) text += ", ";
      text += std::to_string(e.index) + " (" + gid_type_name(e.type) + " " + format_gid(e.gid) + ")";
    }
    return text.empty() ? std::string("the table is empty") : "GIDs: " + text;
  };
  auto find = [&](std::uint32_t index) -> const GidEntry* {
    for (const GidEntry& e : table)
      if (e.index == index && !gid_is_zero(e.gid)) return &e;
    return nullptr;
  };
  if (wanted.requested >= 0) {
    if (wanted.requested > 0xffff || find(static_cast<std::uint32_t>(wanted.requested)) == nullptr)
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_GID_INDEX=" + std::to_string(wanted.requested) + ": " + std::string(nic) +
                                                   " has no GID at that index (" + listing() + ")");
    return static_cast<std::uint32_t>(wanted.requested);
  }
  if (layer == LinkLayer::kInfiniBand) {
    // Index 0 holds the port GID (subnet prefix + GUID); a GID with a FLID also routes between subnets.
    const GidEntry* routable = nullptr;
    for (const GidEntry& e : table)
      if (gid_flid(e.gid) != 0 && (routable == nullptr || e.index < routable->index)) routable = &e;
    return routable != nullptr ? routable->index : 0;
  }
  const GidEntry* best = nullptr;
  int best_rank = 0;
  for (const GidEntry& e : table) {
    if (gid_is_zero(e.gid) || gid_is_link_local(e.gid)) continue;
    if (e.type == GidType::kIb) continue;
    if (wanted.roce_version == 1 && e.type != GidType::kRoceV1) continue;
    if (wanted.roce_version == 2 && e.type != GidType::kRoceV2) continue;
    const AddressFamily family = gid_family(e.gid);
    if (wanted.family != AddressFamily::kAny && family != wanted.family) continue;
    if (!wanted.range.contains(e.gid)) continue;
    const int rank = (e.type == GidType::kRoceV2 ? 2 : 0) + (family == AddressFamily::kIpv4 ? 1 : 0) + 1;
    if (rank > best_rank || (rank == best_rank && e.index < best->index)) {
      best = &e;
      best_rank = rank;
    }
  }
  if (best == nullptr) {
    std::string filters = "RoCE ";
    filters += wanted.roce_version == 0 ? std::string("v1 or v2") : "v" + std::to_string(wanted.roce_version);
    if (wanted.family != AddressFamily::kAny) filters += std::string(", ") + address_family_name(wanted.family);
    if (wanted.range.bits != 0) filters += ", in WB_IB_ADDR_RANGE";
    throw Error(ErrorCode::kUnsupported, std::string(nic) + " is an Ethernet (RoCE) port without a usable GID (" + filters +
                                             ", not link-local; " + listing() +
                                             "): is an IP address configured on its interface? (WB_IB_ROCE_VERSION, "
                                             "WB_IB_ADDR_FAMILY, WB_IB_ADDR_RANGE, WB_IB_GID_INDEX choose)");
  }
  return best->index;
}

std::uint16_t choose_pkey_index(std::span<const std::uint16_t> table, std::uint16_t pkey, std::string_view nic) {
  if (pkey == 0) return 0;
  constexpr std::uint16_t kMembership = 0x8000;
  std::optional<std::uint16_t> limited;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if ((table[i] & ~kMembership) != (pkey & ~kMembership) || (table[i] & ~kMembership) == 0) continue;
    if ((table[i] & kMembership) != 0) return static_cast<std::uint16_t>(i);
    if (!limited) limited = static_cast<std::uint16_t>(i);
  }
  if (limited) return *limited;
  std::string listing;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (table[i] == 0) continue;
    listing += (listing.empty() ? "" : ", ") + std::to_string(i) + ": " + hex16(table[i]);
  }
  throw Error(ErrorCode::kInvalidArgument, "WB_IB_PKEY=" + hex16(pkey) + ": " + std::string(nic) +
                                               " is not a member of that partition (P_Key table " +
                                               (listing.empty() ? std::string("empty") : listing) + ")");
}

// --- route -------------------------------------------------------------------------------------------

Route choose_route(const RoutePort& local, const RoutePort& remote, bool force_global, std::string_view who) {
  Route route;
  if (local.link_layer == LinkLayer::kEthernet) {
    route.global = true;
    route.reason = "RoCE routes by GID";
    return route;
  }
  route.dlid = remote.lid;
  if (!gid_is_zero(local.gid) && !gid_is_zero(remote.gid) && !same_ib_subnet(local.gid, remote.gid)) {
    const std::uint16_t flid = gid_flid(remote.gid);
    if (flid == 0)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(who) + " is in another InfiniBand subnet (its GID " + format_gid(remote.gid) + ", ours " +
                      format_gid(local.gid) + ") and its GID carries no FLID: the route would need the LID of an IB "
                      "router, which is not known here. Use a GID with a routable FLID on both sides "
                      "(WB_IB_GID_INDEX), or ports of one subnet (WB_IB_DEVICES)");
    route.global = true;
    route.dlid = flid;
    route.reason = "another subnet: GRH, DLID = the peer's FLID " + std::to_string(flid);
    return route;
  }
  if (local.grh_required) {
    route.global = true;
    route.reason = "the port requires a GRH (IBV_QPF_GRH_REQUIRED: an SR-IOV virtual function?)";
  } else if (force_global) {
    route.global = true;
    route.reason = "WB_IB_GID_INDEX is set";
  } else {
    route.reason = "one subnet: DLID = the peer's LID, no GRH";
  }
  return route;
}

}  // namespace wb::ibv
