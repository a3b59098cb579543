// ibverbs transport, set-up: loading libibverbs, device discovery (one bad device or port is skipped with a
// warning), NIC choice (WB_IB_DEVICES, PCI locality), each NIC's completion queue and shared receive
// queue, capabilities and teardown.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "transport/ibverbs/ibverbs_cuda.hpp"
#include "transport/ibverbs/ibverbs_internal.hpp"
#include "transport/ibverbs/ibverbs_topology.hpp"
#include "transport/ibverbs/ibverbs_transport.hpp"

namespace wb {
namespace ibv {
namespace {

const char* port_state_name(int state) {
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

GidType gid_type_of(std::uint32_t type) {
  return type == IBV_GID_TYPE_ROCE_V2 ? GidType::kRoceV2 : type == IBV_GID_TYPE_ROCE_V1 ? GidType::kRoceV1 : GidType::kIb;
}

/// The GID entries of one port: ibv_query_gid_table where the library has it, else entry by entry with
/// the types from sysfs (rdma-core before v32).
std::vector<GidEntry> query_gid_table(const VerbsLibrary& lib, const Device& device, std::uint8_t port,
                                      const ibv_port_attr& port_attr) {
  std::vector<GidEntry> table;
  if (lib.query_gid_table != nullptr) {
    const std::size_t capacity = static_cast<std::size_t>(std::max(port_attr.gid_tbl_len, 1)) *
                                 static_cast<std::size_t>(std::max<int>(device.attr.phys_port_cnt, 1));
    std::vector<ibv_gid_entry> entries(capacity);
    const ssize_t n = lib.query_gid_table(device.context.get(), entries.data(), entries.size(), 0, sizeof(ibv_gid_entry));
    if (n >= 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const ibv_gid_entry& e = entries[static_cast<std::size_t>(i)];
        if (e.port_num != port) continue;
        GidEntry entry{e.gid_index, gid_type_of(e.gid_type), gid_bytes(e.gid)};
        if (!gid_is_zero(entry.gid)) table.push_back(entry);
      }
      return table;
    }
  }
  const bool ethernet = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  for (int index = 0; index < port_attr.gid_tbl_len; ++index) {
    ibv_gid gid{};
    if (lib.query_gid(device.context.get(), port, index, &gid) != 0) continue;
    GidEntry entry{static_cast<std::uint32_t>(index), GidType::kIb, gid_bytes(gid)};
    if (gid_is_zero(entry.gid)) continue;
    if (ethernet) {
      // In a container a GID index outside the container's namespace reads as an error: skip it.
      std::ifstream in(device.path + "/ports/" + std::to_string(port) + "/gid_attrs/types/" + std::to_string(index));
      std::string text;
      std::getline(in, text);
      const std::optional<GidType> type = parse_gid_type_text(text);
      if (!type) continue;
      entry.type = *type;
    }
    table.push_back(entry);
  }
  return table;
}

std::vector<std::uint16_t> query_pkey_table(const VerbsLibrary& lib, ibv_context* context, std::uint8_t port, int length) {
  std::vector<std::uint16_t> table;
  for (int i = 0; i < length; ++i) {
    __be16 pkey = 0;
    if (lib.query_pkey(context, port, i, &pkey) != 0) break;
    table.push_back(ntohs(pkey));
  }
  return table;
}

/// Opens the completion queue and shared receive queue of one NIC and posts its receives.
void open_queues(const VerbsLibrary& lib, Nic& nic, const Device& device, const Config& config) {
  if (device.attr.max_srq == 0 || device.attr.max_srq_wr == 0)
    throw Error(ErrorCode::kUnsupported, nic.address.label() + " has no shared receive queue, which the ibverbs transport "
                                                               "uses for the immediates of arriving batches");
  const QueueSizes sizes = choose_queue_sizes(config, static_cast<std::uint32_t>(device.attr.max_srq_wr),
                                              static_cast<std::uint32_t>(std::max(device.attr.max_cqe, 1)), nic.address.label());
  nic.cq = CqPtr(WB_IBV_CHECK_PTR("ibv_create_cq(" + nic.address.label() + ")",
                                  lib.create_cq(device.context.get(), static_cast<int>(sizes.cq), nullptr, nullptr, 0)),
                 CqDestroyer{&lib});
  const auto cqe = static_cast<std::uint32_t>(std::max(nic.cq->cqe, 0));
  if (cqe <= sizes.srq)
    throw Error(ErrorCode::kIbverbs, nic.address.label() + ": ibv_create_cq gave " + std::to_string(cqe) +
                                         " entries, not more than the " + std::to_string(sizes.srq) + " receives");
  nic.credits.reset(cqe - sizes.srq);

  ibv_srq_init_attr srq_attr{};
  srq_attr.attr.max_wr = sizes.srq;
  srq_attr.attr.max_sge = 1;
  nic.srq = SrqPtr(WB_IBV_CHECK_PTR("ibv_create_srq(" + nic.address.label() + ")", lib.create_srq(device.pd.get(), &srq_attr)),
                   SrqDestroyer{&lib});
  nic.srq_depth = sizes.srq;
  nic.receives = ReceiveBudget(sizes.srq);

  // Zero-length receives: a WRITE_WITH_IMM consumes one and places no data through it.
  nic.recv_wrs.assign(sizes.srq, ibv_recv_wr{});
  for (std::size_t i = 0; i < nic.recv_wrs.size(); ++i) {
    nic.recv_wrs[i].wr_id = kReceiveWrId;
    nic.recv_wrs[i].next = i + 1 < nic.recv_wrs.size() ? &nic.recv_wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  WB_IBV_CHECK("ibv_post_srq_recv(" + nic.address.label() + ")", ibv_post_srq_recv(nic.srq.get(), nic.recv_wrs.data(), &bad));
}

/// A device opened for discovery: its context, protection domain and attributes.
Device open_device(const VerbsLibrary& lib, ibv_device* handle, const std::string& name) {
  Device device;
  device.name = name;
  device.path = handle->ibdev_path;
  device.pci = read_pci_place(device.path + "/device");
  device.context = ContextPtr(WB_IBV_CHECK_PTR("ibv_open_device(" + name + ")", lib.open_device(handle)), ContextCloser{&lib});
  // Asynchronous events are read in poll, which never blocks.
  const int flags = ::fcntl(device.context->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(device.context->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw Error(make_call_error(ErrorCode::kSystem, "fcntl(async_fd, O_NONBLOCK)", std::strerror(errno), __FILE__, __LINE__));
  WB_IBV_CHECK("ibv_query_device(" + name + ")", lib.query_device(device.context.get(), &device.attr));
  device.pd = PdPtr(WB_IBV_CHECK_PTR("ibv_alloc_pd(" + name + ")", lib.alloc_pd(device.context.get())), PdDeallocator{&lib});
  return device;
}

/// Describes one port as a NIC (no queues yet): nullopt with `inactive` set when the port is not active
/// (no news: an unplugged port); throws what makes an active port unusable.
std::optional<Nic> describe_port(const VerbsLibrary& lib, const Device& device, std::size_t device_index, int port,
                                 const Config& config, std::string& inactive) {
  const std::string label = device.name + ":" + std::to_string(port);
  ibv_port_attr port_attr{};
  WB_IBV_CHECK("ibv_query_port(" + label + ")", lib.query_port(device.context.get(), static_cast<std::uint8_t>(port), &port_attr));
  if (port_attr.state != IBV_PORT_ACTIVE) {
    inactive = std::string("is ") + port_state_name(port_attr.state);
    return std::nullopt;
  }
  Nic nic;
  nic.device = device_index;
  NicAddress& a = nic.address;
  a.device = device.name;
  a.port = static_cast<std::uint8_t>(port);
  a.link_layer = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::kEthernet : LinkLayer::kInfiniBand;
  a.lid = port_attr.lid;
  a.mtu = static_cast<std::uint8_t>(port_attr.active_mtu);
  a.max_message = port_attr.max_msg_sz;
  nic.grh_required = (port_attr.flags & IBV_QPF_GRH_REQUIRED) != 0;
  if (a.link_layer == LinkLayer::kInfiniBand && a.lid == 0)
    throw Error(ErrorCode::kUnsupported, label + " is an InfiniBand port without a LID (no subnet manager?)");
  const std::vector<GidEntry> table = query_gid_table(lib, device, a.port, port_attr);
  a.gid_index = choose_gid_index(table, a.link_layer, config.gid, label);
  for (const GidEntry& e : table) {
    if (e.index != a.gid_index) continue;
    a.gid = e.gid;
    a.gid_type = a.link_layer == LinkLayer::kInfiniBand ? GidType::kIb : e.type;
  }
  a.family = gid_family(a.gid);
  if (config.pkey != 0)
    nic.pkey_index = choose_pkey_index(query_pkey_table(lib, device.context.get(), a.port, port_attr.pkey_tbl_len),
                                       config.pkey, label);
  nic.adaptive_routing = adaptive_routing_on(config.adaptive_routing, a.link_layer);
  return nic;
}

std::string describe_nic(const Nic& n) {
  const NicAddress& a = n.address;
  std::ostringstream text;
  text << a.label() << " " << link_layer_name(a.link_layer) << " LID " << a.lid << " GID[" << a.gid_index << "] "
       << format_gid(a.gid);
  if (a.link_layer == LinkLayer::kEthernet) text << " (" << gid_type_name(a.gid_type) << ")";
  text << " MTU " << mtu_bytes(a.mtu) << " max message " << a.max_message << " P_Key index " << n.pkey_index
       << (n.grh_required ? " GRH required" : "") << (n.adaptive_routing ? " adaptive routing" : "") << " receives "
       << n.srq_depth << " send credits " << n.credits.available();
  return text.str();
}

/// Whether any port of `name` could pass the filter (so that the device is worth opening).
bool may_pass(const DeviceFilter& filter, const std::string& name) {
  if (!filter.exclude) return filter.entries.empty() || filter.names(name);
  // Excluded whole only by an entry without a port.
  return std::none_of(filter.entries.begin(), filter.entries.end(), [&](const DeviceSpec& e) {
    const bool matches = e.prefix ? name.compare(0, e.name.size(), e.name) == 0 : name == e.name;
    return matches && e.port == 0;
  });
}

}  // namespace

IbverbsTransport::IbverbsTransport(const VerbsLibrary& lib, int rank, Config config, std::vector<Device> devices,
                                   std::vector<Nic> nics)
    : lib_(lib), rank_(rank), config_(std::move(config)), devices_(std::move(devices)), nics_(std::move(nics)) {
  relaxed_ordering_ = config_.relaxed_ordering == Switch::kOn ||
                      (config_.relaxed_ordering == Switch::kAuto && lib_.reg_mr_iova2 != nullptr);
}

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
  // One send-queue slot stays for a separate zero-length immediate (adaptive routing).
  caps.max_writes_per_batch = config_.sq_depth - 1;
  return caps;
}

}  // namespace ibv

bool rdma_device_present(std::string& why) {
  using namespace ibv;
  const VerbsLibrary* lib = nullptr;
  try {
    const Config config = read_config();
    lib = &load_verbs_library(config.library, config.fork_safe);
  } catch (const Error& error) {
    why = error.status().message();
    return false;
  }
  errno = 0;
  int count = 0;
  ibv_device** list = lib->get_device_list(&count);
  if (list == nullptr) {
    const int error = errno;
    why = std::string("ibv_get_device_list failed: ") + (error != 0 ? std::strerror(error) : "unknown error");
    return false;
  }
  lib->free_device_list(list);
  if (count <= 0) {
    why = "ibv_get_device_list returned no device";
    return false;
  }
  return true;
}

std::unique_ptr<Transport> make_ibverbs_transport(int rank) {
  using namespace ibv;
  const Config config = read_config();
  const VerbsLibrary& lib = load_verbs_library(config.library, config.fork_safe);
  if (config.relaxed_ordering == Switch::kOn && lib.reg_mr_iova2 == nullptr)
    throw Error(ErrorCode::kUnsupported, "WB_IB_RELAXED_ORDERING=on, but " + lib.path +
                                             " has no ibv_reg_mr_iova2 (rdma-core < 28); set it to auto or off");

  errno = 0;
  int count = 0;
  struct ListFree {
    const VerbsLibrary* lib;
    void operator()(ibv_device** list) const noexcept { lib->free_device_list(list); }
  };
  const std::unique_ptr<ibv_device*, ListFree> list(lib.get_device_list(&count), ListFree{&lib});
  if (list == nullptr) {
    const int error = errno;
    throw Error(ErrorCode::kUnsupported, std::string("no RDMA device: ibv_get_device_list failed: ") +
                                             (error != 0 ? std::strerror(error) : "unknown error"));
  }
  if (count <= 0) throw Error(ErrorCode::kUnsupported, "no RDMA device: ibv_get_device_list returned no device");

  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.emplace_back(lib.get_device_name(list.get()[i]));
  auto all_names = [&] {
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
    return text;
  };
  // An include list's exact names must exist: a typo would otherwise quietly use fewer NICs.
  if (!config.devices.exclude)
    for (const DeviceSpec& spec : config.devices.entries)
      if (!spec.prefix && std::find(names.begin(), names.end(), spec.name) == names.end())
        throw Error(ErrorCode::kInvalidArgument, "WB_IB_DEVICES names '" + spec.name +
                                                     "', which is not an RDMA device here (devices: " + all_names() + ")");

  // Discovery: every device and port WB_IB_DEVICES admits. One that fails is skipped with a warning.
  std::vector<Device> devices;
  std::vector<Nic> candidates;
  std::vector<std::string> skipped;  // why, one entry per device or port
  bool setting_error = false;
  auto skip = [&](const std::string& what, const Error& e) {
    skipped.push_back(what + ": " + e.status().message());
    setting_error = setting_error || e.code() == ErrorCode::kInvalidArgument;
    WB_LOG(kWarn) << "ibverbs: skipping " << what << ": " << e.status().message();
  };
  for (int i = 0; i < count; ++i) {
    const std::string& name = names[static_cast<std::size_t>(i)];
    if (!may_pass(config.devices, name)) continue;
    try {
      devices.push_back(open_device(lib, list.get()[i], name));
    } catch (const Error& e) {
      skip(name, e);
      continue;
    }
    const std::size_t d = devices.size() - 1;
    for (int port = 1; port <= devices[d].attr.phys_port_cnt; ++port) {
      if (!config.devices.admits(name, port)) continue;
      const std::string label = name + ":" + std::to_string(port);
      try {
        std::string inactive;
        if (std::optional<Nic> nic = describe_port(lib, devices[d], d, port, config, inactive)) {
          candidates.push_back(std::move(*nic));
        } else {
          skipped.push_back(label + " " + inactive);
          WB_LOG(kInfo) << "ibverbs: not using " << label << ": it " << inactive;
        }
      } catch (const Error& e) {
        skip(label, e);
      }
    }
  }

  // Locality: of the admitted NICs, those nearest the GPU this rank works on.
  if (config.locality == NicLocality::kAuto && candidates.size() > 1) {
    const std::string bus_id = current_gpu_bus_id();
    const PciPlace gpu = bus_id.empty() ? PciPlace{} : read_pci_place("/sys/bus/pci/devices/" + bus_id);
    if (!gpu.path.empty()) {
      std::vector<PciPlace> places;
      for (const Nic& n : candidates) places.push_back(devices[n.device].pci);
      const std::vector<std::size_t> near = nearest_nics(places, gpu);
      std::vector<Nic> kept;
      std::string dropped;
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        if (std::find(near.begin(), near.end(), i) != near.end()) kept.push_back(std::move(candidates[i]));
        else dropped += (dropped.empty() ? "" : ", ") + candidates[i].address.label();
      }
      if (!dropped.empty()) {
        WB_LOG(kInfo) << "ibverbs: GPU " << bus_id << " is nearest to " << near.size() << " NIC(s); not using " << dropped
                      << " (WB_IB_NIC_LOCALITY=all uses every NIC)";
      }
      candidates = std::move(kept);
    }
  }

  std::vector<Nic> nics;
  for (Nic& nic : candidates) {
    try {
      open_queues(lib, nic, devices[nic.device], config);
      nics.push_back(std::move(nic));
    } catch (const Error& e) {
      skip(nic.address.label(), e);
    }
    if (nics.size() > kMaxNics)
      throw Error(ErrorCode::kInvalidArgument, "more than " + std::to_string(kMaxNics) + " RDMA ports; choose with WB_IB_DEVICES");
  }
  if (nics.empty()) {
    std::string why;
    for (const std::string& u : skipped) why += (why.empty() ? "" : "; ") + u;
    if (setting_error) throw Error(ErrorCode::kInvalidArgument, "ibverbs: no usable RDMA port: " + why);
    throw Error(ErrorCode::kUnsupported, "no RDMA device: no usable active port (" +
                                             (why.empty() ? "devices " + all_names() + ", none admitted by WB_IB_DEVICES" : why) +
                                             ")");
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
  auto transport = std::make_unique<IbverbsTransport>(lib, rank, config, std::move(used), std::move(nics));
  if (log_level() >= LogLevel::kInfo) {
    std::string text;
    for (std::size_t i = 0; i < transport->nic_count(); ++i) text += (text.empty() ? "" : "; ") + describe_nic(transport->nic(i));
    WB_LOG(kInfo) << "ibverbs: " << transport->nic_count() << " NIC(s): " << text << "; relaxed ordering "
                  << (transport->relaxed_ordering() ? "on" : "off") << "; " << fork_protection();
  }
  return transport;
}

}  // namespace wb
