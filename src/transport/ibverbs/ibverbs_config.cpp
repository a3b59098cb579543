// The WB_IB_* settings of the ibverbs transport (see ibverbs_config.hpp).
#include "transport/ibverbs/ibverbs_config.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "core/settings.hpp"
#include "transport/ibverbs/ibverbs_wire.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

Setting<std::string> ib_library_setting(
    "ib_library", "libibverbs.so.1",
    "The libibverbs the ibverbs transport loads (dlopen) when it is first used; a host without it still runs "
    "every other transport.");
Setting<bool> ib_fork_safe_setting(
    "ib_fork_safe", true,
    "Call ibv_fork_init before any verbs object, so that a process that forks (data loaders, subprocesses) "
    "does not corrupt registered memory.");
Setting<std::string> ib_devices_setting(
    "ib_devices", "",
    "RDMA NICs of the ibverbs transport: comma-separated device names, each with an optional :port "
    "(mlx5_0,mlx5_1:1); a name ending in * is a prefix (mlx5_*); a leading ^ lists the NICs not to use "
    "(^mlx5_2). Empty: every active port. Several NICs: each batch is striped over them.");
Setting<std::string> ib_nic_locality_setting(
    "ib_nic_locality", "auto",
    "auto: of the NICs WB_IB_DEVICES admits, use those nearest (PCI) to the GPU whose CUDA context is current "
    "when the transport is made, and all of them without one; all: every admitted NIC.");
Setting<std::int64_t> ib_gid_index_setting(
    "ib_gid_index", -1,
    "GID index for RoCE (and for InfiniBand between subnets). -1: chosen from WB_IB_ROCE_VERSION, "
    "WB_IB_ADDR_FAMILY and WB_IB_ADDR_RANGE (never a link-local GID); on InfiniBand index 0, or a GID with a FLID.",
    -1, 0xffff);
Setting<std::int64_t> ib_roce_version_setting(
    "ib_roce_version", 0, "RoCE version of the GID: 0 (v2 preferred, else v1), 1 or 2.", 0, 2);
Setting<std::string> ib_addr_family_setting(
    "ib_addr_family", "auto", "Address family of a RoCE GID: auto (IPv4 preferred), ipv4 or ipv6.");
Setting<std::string> ib_addr_range_setting(
    "ib_addr_range", "", "Address range a RoCE GID must lie in, e.g. 10.0.0.0/8 or fd00::/8. Empty: any.");
Setting<std::string> ib_pkey_setting(
    "ib_pkey", "0",
    "InfiniBand partition key of the queue pairs: a P_Key value (0x8001, or decimal), 0..0xffff, whose index in "
    "each port's P_Key table is looked up. 0: the port's default partition (index 0).");
Setting<std::int64_t> ib_qps_per_connection_setting(
    "ib_qps_per_connection", 1,
    "RC queue pairs per NIC pair and peer: each is a rail of its own, so one batch spreads over more "
    "flows (ECMP paths on RoCE). Must be equal on every rank.",
    1, kMaxQpsPerNic);
Setting<std::int64_t> ib_sq_depth_setting(
    "ib_sq_depth", 512,
    "Send queue depth of each RC queue pair: work requests in flight per rail, and one more than "
    "the most writes one post_writes takes.",
    2, 1 << 16);
Setting<std::int64_t> ib_srq_depth_setting(
    "ib_srq_depth", 0,
    "Receives kept posted per NIC (shared receive queue) for the immediates of arriving batches. "
    "They must cover every connected writer's WB_IB_BATCHES_IN_FLIGHT (checked at connect). 0: the device's "
    "limit, at most 16384.",
    0, 1 << 20);
Setting<std::int64_t> ib_cq_depth_setting(
    "ib_cq_depth", 0,
    "Completion queue entries per NIC: the receives plus one per work request in flight (a failed "
    "queue pair completes every one). 0: the receives plus 16 full send queues, within the device's limit.",
    0, 1 << 22);
Setting<std::int64_t> ib_batches_in_flight_setting(
    "ib_batches_in_flight", 64,
    "Batches this rank keeps unacknowledged to one peer (post_writes answers kRetryLater beyond). "
    "Receivers size their receives by it.",
    1, 1 << 16);
Setting<std::int64_t> ib_timeout_setting(
    "ib_timeout", 20, "Local ACK timeout of the RC queue pairs: 4.096 us * 2^value (20: about 4 s).", 1, 31);
Setting<std::int64_t> ib_retry_count_setting("ib_retry_count", 7,
                                             "Transport retries before a write fails with 'retry exceeded'.", 0, 7);
Setting<std::int64_t> ib_service_level_setting("ib_service_level", 0, "InfiniBand service level of the queue pairs.", 0, 15);
Setting<std::int64_t> ib_traffic_class_setting("ib_traffic_class", 0, "Traffic class of the GRH (RoCE): DSCP << 2.",
                                               0, 255);
Setting<std::int64_t> ib_stripe_min_bytes_setting(
    "ib_stripe_min_bytes", std::int64_t{1} << 20,
    "With several rails, a batch is striped over them only when each rail's share is at least this many bytes; "
    "smaller batches go to one rail (rotating).",
    0, std::int64_t{1} << 40);
Setting<std::string> ib_adaptive_routing_setting(
    "ib_adaptive_routing", "auto",
    "auto | on | off. On: a batch's bytes go as plain RDMA_WRITEs (which an adaptively routed fabric may "
    "place out of order) and each rail's immediate follows as a zero-length RDMA_WRITE_WITH_IMM. auto: on "
    "for InfiniBand, off for RoCE.");
Setting<std::string> ib_relaxed_ordering_setting(
    "ib_relaxed_ordering", "auto",
    "auto | on | off: register memory with IBV_ACCESS_RELAXED_ORDERING (faster PCIe writes on some platforms; "
    "completions stay ordered after the data). auto: on where the library takes the flag (rdma-core >= 28; the "
    "kernel drops it where unsupported).");
Setting<std::string> ib_dmabuf_setting(
    "ib_dmabuf", "auto",
    "auto | on | off: register CUDA memory through a dma-buf (ibv_reg_dmabuf_mr). auto: dma-buf where the "
    "library and CUDA driver offer it, else nvidia-peermem; off: nvidia-peermem only; on: dma-buf only.");

std::string lower(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (c == ' ' || c == '\t') continue;
    out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::uint16_t parse_pkey(std::string_view text) {
  const std::string value(trim(text));
  std::size_t used = 0;
  unsigned long pkey = 0;
  bool ok = !value.empty() && value.front() != '-' && value.front() != '+';
  if (ok) {
    try {
      pkey = std::stoul(value, &used, 0);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || used != value.size() || pkey > 0xffff)
    throw Error(ErrorCode::kInvalidArgument, "WB_IB_PKEY='" + std::string(text) + "' is not a P_Key: a number from 0 to 0xffff");
  return static_cast<std::uint16_t>(pkey);
}

Switch parse_switch(std::string_view text, std::string_view variable) {
  const std::string value = lower(text);
  if (value.empty() || value == "auto") return Switch::kAuto;
  if (value == "on" || value == "1" || value == "true" || value == "yes") return Switch::kOn;
  if (value == "off" || value == "0" || value == "false" || value == "no") return Switch::kOff;
  throw Error(ErrorCode::kInvalidArgument, std::string(variable) + "='" + std::string(text) + "' is not auto, on or off");
}

const char* switch_name(Switch value) {
  switch (value) {
    case Switch::kAuto: return "auto";
    case Switch::kOn: return "on";
    case Switch::kOff: return "off";
  }
  return "?";
}

bool DeviceFilter::admits(std::string_view device, int port) const {
  if (entries.empty()) return true;
  bool named = false;
  for (const DeviceSpec& e : entries) {
    const bool name_matches = e.prefix ? device.substr(0, e.name.size()) == e.name : device == e.name;
    if (name_matches && (e.port == 0 || e.port == port)) named = true;
  }
  return named != exclude;
}

bool DeviceFilter::names(std::string_view device) const {
  return std::any_of(entries.begin(), entries.end(), [&](const DeviceSpec& e) {
    return e.prefix ? device.substr(0, e.name.size()) == e.name : device == e.name;
  });
}

DeviceFilter parse_device_filter(std::string_view text) {
  DeviceFilter filter;
  text = trim(text);
  if (!text.empty() && text.front() == '^') {
    filter.exclude = true;
    text.remove_prefix(1);
  }
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = trim(text.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) continue;
    auto fail = [&](const std::string& why) {
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES entry '" + std::string(item) + "' " + why);
    };
    DeviceSpec spec;
    const std::size_t colon = item.find(':');
    std::string_view name = trim(item.substr(0, colon));
    if (!name.empty() && name.back() == '*') {
      spec.prefix = true;
      name.remove_suffix(1);
    }
    spec.name = std::string(name);
    if (spec.name.empty() && !spec.prefix) fail("has no device name");
    if (spec.name.find_first_of("*^") != std::string::npos) fail("has '*' or '^' inside a name ('*' ends a prefix, '^' starts the list)");
    if (colon != std::string_view::npos) {
      const std::string_view port = trim(item.substr(colon + 1));
      int value = 0;
      bool ok = !port.empty() && port.size() <= 3;
      for (const char c : port) {
        if (c < '0' || c > '9') ok = false;
        else value = value * 10 + (c - '0');
      }
      if (!ok || value < 1 || value > 255) fail(": the port after ':' must be a number from 1 to 255");
      spec.port = value;
    }
    if (std::find(filter.entries.begin(), filter.entries.end(), spec) == filter.entries.end())
      filter.entries.push_back(std::move(spec));
  }
  if (filter.exclude && filter.entries.empty())
    throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES='^' excludes nothing: name the NICs after '^'");
  return filter;
}

Config read_config() {
  Config config;
  config.library = ib_library_setting.get();
  if (config.library.empty()) throw Error(ErrorCode::kInvalidArgument, "WB_IB_LIBRARY is empty");
  config.fork_safe = ib_fork_safe_setting.get();
  config.devices = parse_device_filter(ib_devices_setting.get());
  const std::string locality = lower(ib_nic_locality_setting.get());
  if (locality == "auto" || locality.empty()) config.locality = NicLocality::kAuto;
  else if (locality == "all") config.locality = NicLocality::kAll;
  else
    throw Error(ErrorCode::kInvalidArgument, "WB_IB_NIC_LOCALITY='" + ib_nic_locality_setting.get() + "' is not auto or all");
  // The numeric settings' ranges are checked as they are read (core/settings.hpp), so the casts keep every value.
  config.gid.requested = *ib_gid_index_setting;
  config.gid.roce_version = static_cast<int>(*ib_roce_version_setting);
  const std::string family = lower(ib_addr_family_setting.get());
  if (family == "auto" || family.empty()) config.gid.family = AddressFamily::kAny;
  else if (family == "ipv4" || family == "af_inet" || family == "4") config.gid.family = AddressFamily::kIpv4;
  else if (family == "ipv6" || family == "af_inet6" || family == "6") config.gid.family = AddressFamily::kIpv6;
  else
    throw Error(ErrorCode::kInvalidArgument, "WB_IB_ADDR_FAMILY='" + ib_addr_family_setting.get() + "' is not auto, ipv4 or ipv6");
  config.gid.range = parse_address_range(ib_addr_range_setting.get(), "WB_IB_ADDR_RANGE");
  if (config.gid.range.family != AddressFamily::kAny && config.gid.family != AddressFamily::kAny &&
      config.gid.range.family != config.gid.family)
    throw Error(ErrorCode::kInvalidArgument, "WB_IB_ADDR_RANGE='" + ib_addr_range_setting.get() + "' is an " +
                                                 address_family_name(config.gid.range.family) +
                                                 " range, but WB_IB_ADDR_FAMILY asks for " +
                                                 address_family_name(config.gid.family));
  config.pkey = parse_pkey(ib_pkey_setting.get());
  config.qps_per_connection = static_cast<int>(*ib_qps_per_connection_setting);
  config.sq_depth = static_cast<std::uint32_t>(*ib_sq_depth_setting);
  config.srq_depth = static_cast<std::uint32_t>(*ib_srq_depth_setting);
  config.cq_depth = static_cast<std::uint32_t>(*ib_cq_depth_setting);
  config.batches_in_flight = static_cast<std::uint32_t>(*ib_batches_in_flight_setting);
  config.timeout = static_cast<std::uint8_t>(*ib_timeout_setting);
  config.retry_count = static_cast<std::uint8_t>(*ib_retry_count_setting);
  config.service_level = static_cast<std::uint8_t>(*ib_service_level_setting);
  config.traffic_class = static_cast<std::uint8_t>(*ib_traffic_class_setting);
  config.stripe_min_bytes = static_cast<std::uint64_t>(*ib_stripe_min_bytes_setting);
  config.adaptive_routing = parse_switch(ib_adaptive_routing_setting.get(), "WB_IB_ADAPTIVE_ROUTING");
  config.relaxed_ordering = parse_switch(ib_relaxed_ordering_setting.get(), "WB_IB_RELAXED_ORDERING");
  config.dmabuf = parse_switch(ib_dmabuf_setting.get(), "WB_IB_DMABUF");
  return config;
}

QueueSizes choose_queue_sizes(const Config& config, std::uint32_t max_srq_wr, std::uint32_t max_cqe, const std::string& nic) {
  QueueSizes sizes;
  if (config.srq_depth > max_srq_wr)
    throw Error(ErrorCode::kInvalidArgument, "WB_IB_SRQ_DEPTH=" + std::to_string(config.srq_depth) + ": " + nic +
                                                 " allows at most " + std::to_string(max_srq_wr) + " shared receives");
  sizes.srq = config.srq_depth != 0 ? config.srq_depth : std::min(max_srq_wr, kAutoSrqDepth);
  // Room for one full send queue and its drain marker at least; more so that several peers post at once.
  const std::uint64_t minimum = std::uint64_t{sizes.srq} + config.sq_depth + 2;
  const std::uint64_t wanted = config.cq_depth != 0 ? std::max<std::uint64_t>(config.cq_depth, minimum)
                                                    : sizes.srq + std::max<std::uint64_t>(16ull * config.sq_depth, 8192);
  if (wanted > max_cqe && (config.cq_depth != 0 || minimum > max_cqe))
    throw Error(ErrorCode::kInvalidArgument,
                nic + " allows " + std::to_string(max_cqe) + " completion queue entries; WB_IB_CQ_DEPTH / WB_IB_SRQ_DEPTH / "
                "WB_IB_SQ_DEPTH ask for " + std::to_string(wanted) + " (" + std::to_string(sizes.srq) + " receives and " +
                "room for the send queues)");
  sizes.cq = static_cast<std::uint32_t>(std::min<std::uint64_t>(wanted, max_cqe));
  return sizes;
}

bool adaptive_routing_on(Switch setting, LinkLayer layer) {
  if (setting == Switch::kAuto) return layer == LinkLayer::kInfiniBand;
  return setting == Switch::kOn;
}

}  // namespace wb::ibv
