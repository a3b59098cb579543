// ibverbs transport, set-up: settings, device discovery, NICs (protection domain, completion queue, shared
// receive queue), capabilities and teardown.
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/ibverbs/ibverbs_internal.hpp"
#include "transport/ibverbs/ibverbs_transport.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"
#include "weightbridge/settings.hpp"

namespace wb {
namespace ibv {
namespace {

Setting<std::string> ib_devices_setting(
    "ib_devices", "",
    "RDMA NICs of the ibverbs transport: comma-separated device names, each with an optional :port "
    "(mlx5_0,mlx5_1:1). Empty: every active port of every device. Several NICs: each batch is striped over them.");
Setting<std::int64_t> ib_gid_index_setting(
    "ib_gid_index", -1,
    "GID index for RoCE (and for InfiniBand between subnets). -1: a RoCE v2 GID holding an IPv4 address "
    "(else any RoCE v2, else RoCE v1); index 0 on InfiniBand.");
Setting<std::int64_t> ib_sq_depth_setting(
    "ib_sq_depth", 512,
    "Send queue depth of each RC queue pair: work requests in flight per peer and NIC, and the most writes "
    "one post_writes takes.");
Setting<std::int64_t> ib_srq_depth_setting(
    "ib_srq_depth", 1024, "Receives kept posted per NIC (shared receive queue) for the immediates of arriving batches.");
Setting<std::int64_t> ib_cq_depth_setting(
    "ib_cq_depth", 8192,
    "Completion queue entries per NIC (at least ib_srq_depth + ib_sq_depth); bounds the batches in flight per NIC.");
Setting<std::int64_t> ib_timeout_setting(
    "ib_timeout", 20, "Local ACK timeout of the RC queue pairs: 4.096 us * 2^value (20: about 4 s), 1..31.");
Setting<std::int64_t> ib_retry_count_setting("ib_retry_count", 7,
                                             "Transport retries before a write fails with 'retry exceeded', 0..7.");
Setting<std::int64_t> ib_service_level_setting("ib_service_level", 0, "InfiniBand service level of the queue pairs, 0..15.");
Setting<std::int64_t> ib_traffic_class_setting("ib_traffic_class", 0,
                                               "Traffic class of the GRH (RoCE), 0..255 (DSCP << 2).");
Setting<std::int64_t> ib_stripe_min_bytes_setting(
    "ib_stripe_min_bytes", std::int64_t{1} << 20,
    "With several NICs, a batch is striped over them only when each NIC's share is at least this many bytes; "
    "smaller batches go to one NIC (rotating).");
Setting<bool> ib_relaxed_ordering_setting(
    "ib_relaxed_ordering", false,
    "Register memory with IBV_ACCESS_RELAXED_ORDERING (faster PCIe writes on some platforms; completions stay "
    "ordered after the data).");

std::int64_t in_range(const Setting<std::int64_t>& setting, std::int64_t low, std::int64_t high) {
  const std::int64_t value = setting.get();
  if (value < low || value > high)
    throw Error(ErrorCode::kInvalidArgument, setting.environment_variable() + "=" + std::to_string(value) +
                                                 " is out of range [" + std::to_string(low) + ", " +
                                                 std::to_string(high) + "]");
  return value;
}

struct DeviceListFree {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};

const char* port_state_name(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
  }
  return "unknown";
}

Gid gid_bytes(const ibv_gid& gid) {
  Gid out{};
  std::memcpy(out.data(), gid.raw, out.size());
  return out;
}

/// The valid GID entries of one port: ibv_query_gid_table, or entry by entry where that is unsupported.
std::vector<GidEntry> query_gid_table(ibv_context* context, const ibv_device_attr& attr, std::uint8_t port,
                                      const ibv_port_attr& port_attr) {
  std::vector<GidEntry> table;
  auto add = [&](const ibv_gid_entry& e) {
    GidEntry entry;
    entry.index = e.gid_index;
    entry.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? GidType::kRoceV2
                 : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1
                                                      : GidType::kIb;
    entry.gid = gid_bytes(e.gid);
    if (!gid_is_zero(entry.gid)) table.push_back(entry);
  };
  const std::size_t capacity = static_cast<std::size_t>(std::max(port_attr.gid_tbl_len, 1)) *
                               static_cast<std::size_t>(std::max<int>(attr.phys_port_cnt, 1));
  std::vector<ibv_gid_entry> entries(capacity);
  const ssize_t n = ibv_query_gid_table(context, entries.data(), entries.size(), 0);
  if (n >= 0) {
    for (ssize_t i = 0; i < n; ++i)
      if (entries[static_cast<std::size_t>(i)].port_num == port) add(entries[static_cast<std::size_t>(i)]);
    return table;
  }
  for (int index = 0; index < port_attr.gid_tbl_len; ++index) {
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(context, port, static_cast<std::uint32_t>(index), &e, 0) == 0) add(e);
  }
  return table;
}

/// Opens the completion queue and shared receive queue of one NIC and posts its receives.
void open_queues(Nic& nic, const Device& device, const Config& config) {
  if (device.attr.max_srq == 0 || device.attr.max_srq_wr == 0)
    throw Error(ErrorCode::kUnsupported, nic.address.label() + " has no shared receive queue, which the ibverbs transport "
                                                               "uses for the immediates of arriving batches");
  const std::uint32_t cq_depth = std::max(config.cq_depth, config.srq_depth + config.sq_depth);
  const auto max_cqe = static_cast<std::uint32_t>(std::max(device.attr.max_cqe, 1));
  if (cq_depth > max_cqe || config.srq_depth > static_cast<std::uint32_t>(device.attr.max_srq_wr))
    throw Error(ErrorCode::kInvalidArgument,
                nic.address.label() + " allows " + std::to_string(device.attr.max_cqe) + " completion queue entries and " +
                    std::to_string(device.attr.max_srq_wr) + " shared receives; WB_IB_CQ_DEPTH / WB_IB_SRQ_DEPTH / "
                    "WB_IB_SQ_DEPTH ask for " + std::to_string(cq_depth) + " and " + std::to_string(config.srq_depth));
  nic.cq.reset(WB_CHECK_IBV_PTR(ibv_create_cq(device.context.get(), static_cast<int>(cq_depth), nullptr, nullptr, 0)));
  const auto cqe = static_cast<std::uint32_t>(nic.cq->cqe);
  nic.send_credits = cqe - config.srq_depth;

  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = config.srq_depth;
  srq_attr.attr.max_sge = 1;
  nic.srq.reset(WB_CHECK_IBV_PTR(ibv_create_srq(device.pd.get(), &srq_attr)));
  nic.srq_depth = config.srq_depth;

  // Zero-length receives: a WRITE_WITH_IMM consumes one and places no data through it.
  nic.recv_wrs.assign(config.srq_depth, ibv_recv_wr{});
  for (std::size_t i = 0; i < nic.recv_wrs.size(); ++i) {
    nic.recv_wrs[i].wr_id = kReceiveWrId;
    nic.recv_wrs[i].next = i + 1 < nic.recv_wrs.size() ? &nic.recv_wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  WB_CHECK_IBV(ibv_post_srq_recv(nic.srq.get(), nic.recv_wrs.data(), &bad));
}

}  // namespace

Config read_config() {
  Config config;
  config.devices = parse_device_list(ib_devices_setting.get());
  config.gid_index = in_range(ib_gid_index_setting, -1, 0xffff);
  config.sq_depth = static_cast<std::uint32_t>(in_range(ib_sq_depth_setting, 1, 1 << 16));
  config.srq_depth = static_cast<std::uint32_t>(in_range(ib_srq_depth_setting, 1, 1 << 20));
  config.cq_depth = static_cast<std::uint32_t>(in_range(ib_cq_depth_setting, 1, 1 << 22));
  config.timeout = static_cast<std::uint8_t>(in_range(ib_timeout_setting, 1, 31));
  config.retry_count = static_cast<std::uint8_t>(in_range(ib_retry_count_setting, 0, 7));
  config.service_level = static_cast<std::uint8_t>(in_range(ib_service_level_setting, 0, 15));
  config.traffic_class = static_cast<std::uint8_t>(in_range(ib_traffic_class_setting, 0, 255));
  config.stripe_min_bytes = static_cast<std::uint64_t>(in_range(ib_stripe_min_bytes_setting, 0, std::int64_t{1} << 40));
  config.relaxed_ordering = ib_relaxed_ordering_setting.get();
  return config;
}

IbverbsTransport::IbverbsTransport(int rank, Config config, std::vector<Device> devices, std::vector<Nic> nics)
    : rank_(rank), config_(std::move(config)), devices_(std::move(devices)), nics_(std::move(nics)) {}

IbverbsTransport::~IbverbsTransport() {
  // Queue pairs first (they reference the CQs and SRQs), then memory regions, then the queues, the
  // protection domains and the contexts: the reverse of the member order, spelled out here.
  peers_.clear();
  local_.clear();
  nics_.clear();
  devices_.clear();
}

TransportCapabilities IbverbsTransport::capabilities() const {
  TransportCapabilities caps;
  caps.host_memory = true;
#ifdef WB_HAVE_CUDA
  caps.cuda_memory = true;
#endif
  caps.between_machines = true;
  caps.max_writes_per_batch = config_.sq_depth;
  return caps;
}

}  // namespace ibv

bool rdma_device_present(std::string& why) {
  errno = 0;
  int count = 0;
  const std::unique_ptr<ibv_device*, ibv::DeviceListFree> list(ibv_get_device_list(&count));
  if (list == nullptr) {
    const int error = errno;
    why = std::string("ibv_get_device_list failed: ") + (error != 0 ? std::strerror(error) : "unknown error");
    return false;
  }
  if (count <= 0) {
    why = "ibv_get_device_list returned no device";
    return false;
  }
  return true;
}

std::unique_ptr<Transport> make_ibverbs_transport(int rank) {
  using namespace ibv;
  errno = 0;
  int count = 0;
  const std::unique_ptr<ibv_device*, DeviceListFree> list(ibv_get_device_list(&count));
  if (list == nullptr) {
    const int error = errno;
    throw Error(ErrorCode::kUnsupported, std::string("no RDMA device: ibv_get_device_list failed: ") +
                                             (error != 0 ? std::strerror(error) : "unknown error"));
  }
  if (count <= 0) throw Error(ErrorCode::kUnsupported, "no RDMA device: ibv_get_device_list returned no device");

  const Config config = read_config();
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.emplace_back(ibv_get_device_name(list.get()[i]));
  auto all_names = [&] {
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
    return text;
  };

  // What to open: every device (all ports), or the WB_IB_DEVICES entries in their order.
  std::vector<DeviceSpec> wanted = config.devices;
  if (wanted.empty())
    for (const std::string& n : names) wanted.push_back(DeviceSpec{n, 0});
  for (const DeviceSpec& spec : wanted)
    if (std::find(names.begin(), names.end(), spec.name) == names.end())
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES names '" + spec.name +
                                                   "', which is not an RDMA device here (devices: " + all_names() + ")");

  std::vector<Device> devices;
  std::vector<Nic> nics;
  std::vector<std::string> unusable;
  for (const DeviceSpec& spec : wanted) {
    // One Device per name, even when several entries name ports of it.
    auto found = std::find_if(devices.begin(), devices.end(), [&](const Device& d) { return d.name == spec.name; });
    std::size_t device_index = static_cast<std::size_t>(found - devices.begin());
    if (found == devices.end()) {
      ibv_device* dev = list.get()[std::find(names.begin(), names.end(), spec.name) - names.begin()];
      Device device;
      device.name = spec.name;
      device.context.reset(WB_CHECK_IBV_PTR(ibv_open_device(dev)));
      WB_CHECK_IBV(ibv_query_device(device.context.get(), &device.attr));
      device.pd.reset(WB_CHECK_IBV_PTR(ibv_alloc_pd(device.context.get())));
      devices.push_back(std::move(device));
      device_index = devices.size() - 1;
    }
    Device& device = devices[device_index];
    if (spec.port > device.attr.phys_port_cnt)
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES names port " + std::to_string(spec.port) + " of " + spec.name +
                                                   ", which has " + std::to_string(device.attr.phys_port_cnt) + " port(s)");
    const int first_port = spec.port > 0 ? spec.port : 1;
    const int last_port = spec.port > 0 ? spec.port : device.attr.phys_port_cnt;
    for (int port = first_port; port <= last_port; ++port) {
      const std::string label = spec.name + ":" + std::to_string(port);
      if (std::any_of(nics.begin(), nics.end(), [&](const Nic& n) { return n.address.label() == label; })) continue;
      ibv_port_attr port_attr{};
      WB_CHECK_IBV(ibv_query_port(device.context.get(), static_cast<std::uint8_t>(port), &port_attr));
      if (port_attr.state != IBV_PORT_ACTIVE) {
        unusable.push_back(label + " is " + port_state_name(port_attr.state));
        continue;
      }
      Nic nic;
      nic.device = device_index;
      NicAddress& a = nic.address;
      a.device = spec.name;
      a.port = static_cast<std::uint8_t>(port);
      a.link_layer = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::kEthernet : LinkLayer::kInfiniBand;
      a.lid = port_attr.lid;
      a.mtu = static_cast<std::uint8_t>(port_attr.active_mtu);
      a.max_message = port_attr.max_msg_sz;
      if (a.link_layer == LinkLayer::kInfiniBand && a.lid == 0) {
        unusable.push_back(label + " is an InfiniBand port without a LID (no subnet manager?)");
        continue;
      }
      const std::vector<GidEntry> table = query_gid_table(device.context.get(), device.attr, a.port, port_attr);
      a.gid_index = choose_gid_index(table, a.link_layer, config.gid_index, label);
      for (const GidEntry& e : table)
        if (e.index == a.gid_index) a.gid = e.gid;
      open_queues(nic, device, config);
      nics.push_back(std::move(nic));
      if (nics.size() > kMaxNics)
        throw Error(ErrorCode::kInvalidArgument, "more than " + std::to_string(kMaxNics) + " RDMA ports; choose with WB_IB_DEVICES");
    }
  }
  if (nics.empty()) {
    std::string why;
    for (const std::string& u : unusable) why += (why.empty() ? "" : "; ") + u;
    throw Error(ErrorCode::kUnsupported, "no RDMA device: no active port (" + (why.empty() ? all_names() : why) + ")");
  }
  // Close the devices without a usable port, renumbering the NICs' device indices.
  std::vector<Device> used;
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const bool has_nic = std::any_of(nics.begin(), nics.end(), [&](const Nic& n) { return n.device == d; });
    if (!has_nic) continue;
    for (Nic& n : nics)
      if (n.device == d) n.device = used.size();
    used.push_back(std::move(devices[d]));
  }
  for (const std::string& u : unusable) WB_LOG(kInfo) << "ibverbs: not using " << u;
  if (log_level() >= LogLevel::kInfo) {
    std::string text;
    for (const Nic& n : nics) {
      const NicAddress& a = n.address;
      text += (text.empty() ? "" : "; ") + a.label() + " " + link_layer_name(a.link_layer) + " LID " + std::to_string(a.lid) +
              " GID[" + std::to_string(a.gid_index) + "] " + format_gid(a.gid) + " MTU " + std::to_string(mtu_bytes(a.mtu)) +
              " max message " + std::to_string(a.max_message);
    }
    WB_LOG(kInfo) << "ibverbs: " << nics.size() << " NIC(s): " << text;
  }
  return std::make_unique<IbverbsTransport>(rank, config, std::move(used), std::move(nics));
}

}  // namespace wb
