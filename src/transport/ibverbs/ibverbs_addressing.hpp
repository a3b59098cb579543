// Private: how a port is addressed, decided without a device so that tests can feed canned tables. No
// ibverbs header: values from <infiniband/verbs.h> (link layers, MTU and GID-type enums, port flags) are
// carried as plain integers with the same meaning.
//
//   GIDs     formatting, address family, link-local and FLID recognition
//   choice   the GID index of a port (RoCE version, address family and range, never link-local), the
//            P_Key index of a P_Key value
//   route    GRH or not, and the DLID, for one rail from the two ports' attributes
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace wb::ibv {

/// IBV_LINK_LAYER_INFINIBAND / IBV_LINK_LAYER_ETHERNET.
enum class LinkLayer : std::uint8_t { kInfiniBand = 1, kEthernet = 2 };
const char* link_layer_name(LinkLayer layer);  // "InfiniBand", "Ethernet (RoCE)"

/// MTU enum (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5) in bytes; 0 when out of range.
std::uint32_t mtu_bytes(std::uint8_t mtu);

using Gid = std::array<std::uint8_t, 16>;
/// "fe80:0000:0000:0000:0202:c9ff:fe00:0001", or "::ffff:10.1.2.3" for an IPv4-mapped GID (RoCE v2).
std::string format_gid(const Gid& gid);
bool gid_is_zero(const Gid& gid);
/// fe80::/64, the address every RoCE interface has without configuration: not routable.
bool gid_is_link_local(const Gid& gid);

/// What a RoCE GID holds: an IPv4 address (::ffff:a.b.c.d) or an IPv6 one. InfiniBand GIDs count as IPv6.
enum class AddressFamily : std::uint8_t { kAny = 0, kIpv4 = 4, kIpv6 = 6 };
AddressFamily gid_family(const Gid& gid);
const char* address_family_name(AddressFamily family);  // "IPv4", "IPv6", "any"

/// IBV_GID_TYPE_IB / _ROCE_V1 / _ROCE_V2.
enum class GidType : std::uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };
const char* gid_type_name(GidType type);  // "IB", "RoCE v1", "RoCE v2"
/// The text of /sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index> ("IB/RoCE v1\n",
/// "RoCE v2\n"): where the library cannot report GID types (rdma-core before v34). nullopt: unknown.
std::optional<GidType> parse_gid_type_text(std::string_view text);

/// An InfiniBand GID of the routable (FLID) form: the first 10 bits fixed (fec0::/10), 22 zero bits, a
/// 16-bit FLID (the port's LID in the global fabric), a 16-bit local subnet prefix, then the GUID. The
/// FLID, or 0 when the GID is not of that form.
std::uint16_t gid_flid(const Gid& gid);
/// Whether two InfiniBand ports are in one subnet: their local subnet prefixes agree (the low 16 bits
/// of the prefix for FLID-form GIDs, whose FLIDs differ port by port; the whole 64-bit prefix otherwise).
bool same_ib_subnet(const Gid& a, const Gid& b);

/// An address range "10.0.0.0/8" or "fd00::/8" (WB_IB_ADDR_RANGE); `bits` 0 matches everything.
struct AddressRange {
  AddressFamily family = AddressFamily::kAny;
  Gid prefix{};  // IPv4 as ::ffff:a.b.c.d, so that it compares with GIDs directly
  int bits = 0;  // prefix length in the GID's 128 bits
  bool contains(const Gid& gid) const;
  bool operator==(const AddressRange&) const = default;
};
/// Empty text: everything. Throws kInvalidArgument naming `variable` on malformed text.
AddressRange parse_address_range(std::string_view text, std::string_view variable);

// --- GID choice --------------------------------------------------------------------------------------

struct GidEntry {
  std::uint32_t index = 0;
  GidType type = GidType::kIb;
  Gid gid{};
};

/// What the WB_IB_* settings ask of a RoCE GID.
struct GidPreferences {
  std::int64_t requested = -1;  // WB_IB_GID_INDEX; >= 0 names the index, the rest is then not applied
  int roce_version = 0;         // WB_IB_ROCE_VERSION: 0 any (v2 preferred), 1 or 2
  AddressFamily family = AddressFamily::kAny;  // WB_IB_ADDR_FAMILY; kAny prefers IPv4
  AddressRange range;           // WB_IB_ADDR_RANGE
};

/// The GID index a port uses. A requested index must hold a GID. Otherwise InfiniBand takes the lowest
/// index whose GID carries a FLID (routable between subnets), else 0. Ethernet takes a non-zero,
/// non-link-local GID of the wanted RoCE version, family and range: RoCE v2 before v1, IPv4 before IPv6,
/// the lowest index among equals. Throws naming `nic`, the filters and the table when nothing fits
/// (kInvalidArgument for a requested index, kUnsupported otherwise).
std::uint32_t choose_gid_index(std::span<const GidEntry> table, LinkLayer layer, const GidPreferences& wanted,
                               std::string_view nic);

/// The index in a port's P_Key table (host order values) of `pkey` (WB_IB_PKEY). Membership bit 15 is
/// ignored in the match, a full member preferred. 0 asks for the default: index 0. Throws
/// kInvalidArgument naming `nic` and the table when the partition is not there.
std::uint16_t choose_pkey_index(std::span<const std::uint16_t> table, std::uint16_t pkey, std::string_view nic);

// --- route -------------------------------------------------------------------------------------------

/// What a queue pair needs to reach the peer's port on one rail (ibv_ah_attr).
struct Route {
  bool global = false;      // is_global: a GRH with the peer's GID
  std::uint16_t dlid = 0;   // the LID the packets are sent to (InfiniBand)
  std::string reason;       // why, for the debug log
};

/// One side of a rail as the route needs it.
struct RoutePort {
  LinkLayer link_layer = LinkLayer::kInfiniBand;
  std::uint16_t lid = 0;
  Gid gid{};
  bool grh_required = false;  // IBV_QPF_GRH_REQUIRED in the port's flags (SR-IOV virtual functions)
};

/// RoCE: always a GRH. InfiniBand in one subnet: DLID = the peer's LID, a GRH only when the local port
/// requires one or `force_global` (WB_IB_GID_INDEX given). Between subnets: a GRH, and DLID = the FLID of
/// the peer's GID. Throws kInvalidArgument naming `who` when the peer is in another subnet and its GID
/// carries no FLID (the path would need an IB router's LID, which nothing here can learn).
Route choose_route(const RoutePort& local, const RoutePort& remote, bool force_global, std::string_view who);

}  // namespace wb::ibv
