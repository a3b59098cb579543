// Private: the configuration of the ibverbs transport. Every WB_IB_* setting is declared once, in
// ibverbs_config.cpp, with its default, range and doc; read_config reads and validates them all, so a bad
// value is an error naming its variable before any device is touched. The README lists them next to
// their NCCL counterparts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "transport/ibverbs/ibverbs_addressing.hpp"

namespace wb::ibv {

/// A three-way switch: "auto" decides from what the library and device offer.
enum class Switch : std::uint8_t { kAuto, kOn, kOff };
/// auto | on | off (also 1/0, true/false, yes/no); throws kInvalidArgument naming `variable`.
Switch parse_switch(std::string_view text, std::string_view variable);
const char* switch_name(Switch value);

/// WB_IB_PKEY: "0x8001" or "32769"; throws kInvalidArgument beyond 0xffff or on anything else.
std::uint16_t parse_pkey(std::string_view text);

/// One entry of WB_IB_DEVICES: a device name (a prefix when it ends in '*'), with an optional port.
struct DeviceSpec {
  std::string name;
  bool prefix = false;
  int port = 0;  // 0: every port
  bool operator==(const DeviceSpec&) const = default;
};

/// WB_IB_DEVICES: "mlx5_0,mlx5_1:1" uses those; "mlx5_*" every device whose name starts so; a leading
/// '^' turns the list into the devices *not* to use ("^mlx5_2,mlx5_3:2"). Empty: every device.
struct DeviceFilter {
  bool exclude = false;
  std::vector<DeviceSpec> entries;
  /// Whether port `port` of `device` passes.
  bool admits(std::string_view device, int port) const;
  /// Whether some entry names `device` at all (an include list that names no device here is a typo).
  bool names(std::string_view device) const;
  bool operator==(const DeviceFilter&) const = default;
};
/// Throws kInvalidArgument naming WB_IB_DEVICES on a malformed entry.
DeviceFilter parse_device_filter(std::string_view text);

/// Which NICs a rank uses when several pass WB_IB_DEVICES (WB_IB_NIC_LOCALITY).
enum class NicLocality : std::uint8_t {
  kAuto,  // the NICs nearest (PCI) to the GPU whose CUDA context is current when the transport is made; all without one
  kAll,   // every NIC that passes WB_IB_DEVICES
};

/// The WB_IB_* settings, read and validated once per transport.
struct Config {
  std::string library;   // WB_IB_LIBRARY: the libibverbs to dlopen
  bool fork_safe = true; // WB_IB_FORK_SAFE: ibv_fork_init before any verbs object
  DeviceFilter devices;
  NicLocality locality = NicLocality::kAuto;
  GidPreferences gid;
  std::uint16_t pkey = 0;  // 0: the port's default partition (P_Key index 0)
  int qps_per_connection = 1;
  std::uint32_t sq_depth = 0;
  std::uint32_t srq_depth = 0;  // 0: the device's limit, capped (see kAutoSrqDepth)
  std::uint32_t cq_depth = 0;   // 0: the receives plus room for 16 full send queues, capped by the device
  std::uint32_t batches_in_flight = 0;
  std::uint8_t timeout = 0;
  std::uint8_t retry_count = 0;
  std::uint8_t service_level = 0;
  std::uint8_t traffic_class = 0;
  std::uint64_t stripe_min_bytes = 0;
  Switch adaptive_routing = Switch::kAuto;
  Switch relaxed_ordering = Switch::kAuto;
  Switch dmabuf = Switch::kAuto;
};
/// Throws kInvalidArgument naming the WB_IB_* variable that is malformed or out of range.
Config read_config();

/// WB_IB_SRQ_DEPTH=0 takes the device's limit up to this many receives (zero-length receives cost a few
/// dozen bytes each).
inline constexpr std::uint32_t kAutoSrqDepth = 16384;

/// The sizes of one NIC's queues from the settings and the device's limits. Throws kInvalidArgument
/// naming `nic` and the settings when an explicit value exceeds what the device allows.
struct QueueSizes {
  std::uint32_t srq = 0;  // receives kept posted
  std::uint32_t cq = 0;   // completion queue entries to ask for
};
QueueSizes choose_queue_sizes(const Config& config, std::uint32_t max_srq_wr, std::uint32_t max_cqe,
                              const std::string& nic);

/// Adaptive routing on a NIC of this link layer: auto means on for InfiniBand, off for RoCE (as NCCL).
bool adaptive_routing_on(Switch setting, LinkLayer layer);

}  // namespace wb::ibv
