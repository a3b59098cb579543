// Settings, the choice of provider and domain, the fabric objects, capabilities and teardown.
#include <rdma/fi_errno.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "transport/libfabric/fabric_internal.hpp"
#include "transport/libfabric/libfabric_transport.hpp"

namespace wb {
namespace fabric {
namespace {

Setting<std::string> provider_setting(
    "fi_provider", "",
    "libfabric provider of the libfabric transport as fi_info names it (cxi, efa, verbs;ofi_rxm, tcp;ofi_rxm, "
    "tcp). Empty: the best the machine offers, in that order.");
Setting<std::string> domain_setting(
    "fi_domain", "",
    "libfabric domain (NIC or network interface: cxi0, rdmap16s27, eth0). Empty: the chosen provider's first "
    "domain that is not loopback.");
Setting<std::string> batch_completion_setting(
    "fi_batch_completion", "auto",
    "How a batch's last write (the one the receiver is notified of) follows the others: auto (ordered where "
    "the provider orders writes to a peer and reports delivery, else two_phase), ordered (one completion a "
    "batch), two_phase (the last write is posted once the others are delivered).");

Setting<std::int64_t> rxm_cm_progress_setting(
    "fi_rxm_cm_progress_us", 100,
    "libfabric's ofi_rxm (tcp;ofi_rxm, verbs;ofi_rxm) makes a connection at a pair's first write and progresses "
    "it only every this many microseconds of completion polling: sets FI_OFI_RXM_CM_PROGRESS_INTERVAL before "
    "the process's first provider query, unless that variable is set already; 0: libfabric's own (10000).",
    0, 10000000);
Setting<std::int64_t> rxm_buffer_setting(
    "fi_rxm_buffer_bytes", 1024,
    "Size of ofi_rxm's bounce buffers (tcp;ofi_rxm, verbs;ofi_rxm), which carry messages and small injected "
    "writes: this transport sends neither, only RMA writes. Sets FI_OFI_RXM_BUFFER_SIZE before the process's "
    "first provider query, unless that variable is set already; 0: libfabric's own (16384), rxm's floor 104. "
    "At 16384 opening an endpoint zeroes its pools: 190-220 ms and 71 MB, at 1024 24-37 ms and 9 MB (tcp;ofi_rxm).",
    0, 16 << 20);

// The libfabric API version this code is written against: FI_HMEM and fi_mr_attr::iface need 1.10.
constexpr std::uint32_t kApiVersion = FI_VERSION(1, 10);
// Longest chain of writes in one batch: a batch must fit the transmit queue at once (see post_writes).
constexpr std::size_t kMaxWritesPerBatch = 4096;

struct Found {
  InfoPtr info;  // one fi_info (duplicated from fi_getinfo's list)
  bool ordered = false;  // came from the query asking for write-after-write ordering
};

/// Every (provider, domain) pair that offers reliable-datagram endpoints with RMA writes and delivery
/// completion, from the richest query that returns it: with CUDA memory and ordering first.
std::vector<Found> query_providers(const std::string& provider, std::string& reasons) {
  std::vector<Found> found;
  std::map<std::tuple<std::string, std::string, std::string>, bool> seen;
#ifdef WB_HAVE_CUDA
  const bool try_hmem = true;
#else
  const bool try_hmem = false;
#endif
  for (const bool hmem : {true, false}) {
    if (hmem && !try_hmem) continue;
    for (const bool ordered : {true, false}) {
      InfoPtr hints(fi_allocinfo());
      if (!hints) throw Error(ErrorCode::kSystem, "fi_allocinfo: out of memory");
      hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
      hints->mode = FI_CONTEXT | FI_CONTEXT2;
      hints->ep_attr->type = FI_EP_RDM;
      // The memory-registration modes this transport honours (fabric_memory.cpp).
      hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                    FI_MR_ENDPOINT | FI_MR_RAW | FI_MR_HMEM;
      hints->domain_attr->threading = FI_THREAD_DOMAIN;
      hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
      hints->tx_attr->msg_order = ordered ? FI_ORDER_WAW : 0;
      if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
      fi_info* list = nullptr;
      const int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
      if (rc != 0) {
        if (reasons.empty()) reasons = std::string("fi_getinfo: ") + fi_strerror(-rc);
        continue;
      }
      for (fi_info* i = list; i != nullptr; i = i->next) {
        const auto key = std::make_tuple(std::string(i->fabric_attr->prov_name), std::string(i->domain_attr->name),
                                         std::string(i->fabric_attr->name));
        if (seen.count(key)) continue;
        if (i->domain_attr->cq_data_size < 4) continue;  // cannot carry the 32-bit immediate
        seen[key] = true;
        fi_info* copy = fi_dupinfo(i);
        if (copy == nullptr) continue;
        found.push_back({InfoPtr(copy), ordered});
      }
      fi_freeinfo(list);
    }
  }
  return found;
}

/// The chosen info again, asking for FI_SOURCE: its CQ data is too short to carry the writer's rank.
InfoPtr with_source(const fi_info& chosen) {
  InfoPtr hints(fi_dupinfo(&chosen));
  if (!hints) throw Error(ErrorCode::kSystem, "fi_dupinfo: out of memory");
  hints->caps |= FI_SOURCE;
  fi_info* list = nullptr;
  const int rc = fi_getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
  if (rc != 0 || list == nullptr)
    throw Error(ErrorCode::kUnsupported, std::string("libfabric provider '") + chosen.fabric_attr->prov_name +
                                             "' carries " + std::to_string(chosen.domain_attr->cq_data_size) +
                                             " bytes of CQ data and offers no FI_SOURCE to name a writer: " +
                                             (rc != 0 ? fi_strerror(-rc) : "no result"));
  InfoPtr out(fi_dupinfo(list));
  fi_freeinfo(list);
  return out;
}

}  // namespace

void apply_provider_defaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Read by the provider when libfabric initializes, at the process's first fi_getinfo: set before it.
    // The first write of a pair over tcp;ofi_rxm took 30-65 ms at libfabric's 10 ms, 12-16 ms at 100 us
    // (measured here: a fresh transport's first 1 MiB batch; the later ones 0.2-0.5 ms).
    if (const std::int64_t us = *rxm_cm_progress_setting; us > 0)
      (void)::setenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL", std::to_string(us).c_str(), 0);
    // Joins, re-links and the spares kept for them open endpoints while other ranks transfer: on the
    // emulated cluster (8 ranks on 2 cores) a spare took 0.5-2.6 s to open at 16384 and a replica's copy
    // beside such openings 1.15-1.21 x T_min; at 1024 0.01-0.9 s and 1.00-1.04 x.
    if (const std::int64_t bytes = *rxm_buffer_setting; bytes > 0)
      (void)::setenv("FI_OFI_RXM_BUFFER_SIZE", std::to_string(bytes).c_str(), 0);
  });
}

Config read_config() {
  Config config;
  config.provider = *provider_setting;
  config.domain = *domain_setting;
  config.batch_completion = *batch_completion_setting;
  // Validates the name now, before any fabric is opened.
  (void)choose_batch_completion(config.batch_completion, true, true, "");
  config.max_writes_per_batch = static_cast<std::uint32_t>(kMaxWritesPerBatch);
  return config;
}

FabricTransport::FabricTransport(int rank) : rank_(rank), config_(read_config()) { open(config_); }

void FabricTransport::open(const Config& config) {
  apply_provider_defaults();
  std::string reasons;
  std::vector<Found> found = query_providers(config.provider, reasons);
  std::vector<Candidate> candidates;
  for (const Found& f : found)
    candidates.push_back({f.info->fabric_attr->prov_name, f.info->domain_attr->name, f.info->fabric_attr->name,
                          f.info->addr_format == FI_SOCKADDR_IN6});
  const std::vector<std::size_t> order = rank_candidates(candidates, config.provider, config.domain);
  if (order.empty()) {
    std::string offered;
    for (const Candidate& c : candidates) offered += (offered.empty() ? "" : ", ") + c.provider + " on " + c.domain;
    throw Error(ErrorCode::kUnsupported,
                "no libfabric provider offers reliable-datagram endpoints with RMA writes and delivery completion" +
                    (config.provider.empty() ? std::string() : " for WB_FI_PROVIDER='" + config.provider + "'") +
                    (config.domain.empty() ? std::string() : " on WB_FI_DOMAIN='" + config.domain + "'") +
                    (offered.empty() ? (reasons.empty() ? std::string() : " (" + reasons + ")")
                                     : " (offered: " + offered + ")"));
  }
  Found& chosen = found[order.front()];
  info_ = std::move(chosen.info);
  provider_ = info_->fabric_attr->prov_name;
  if (info_->domain_attr->cq_data_size < 8) {
    info_ = with_source(*info_);
    rank_in_cq_data_ = false;
  }
  const std::uint64_t mr_mode = static_cast<std::uint64_t>(info_->domain_attr->mr_mode);
  virtual_addresses_ = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  provider_keys_ = (mr_mode & FI_MR_PROV_KEY) != 0;
  local_descriptors_ = (mr_mode & FI_MR_LOCAL) != 0;
  endpoint_bound_mr_ = (mr_mode & FI_MR_ENDPOINT) != 0;
  raw_keys_ = (mr_mode & FI_MR_RAW) != 0 || info_->domain_attr->mr_key_size > sizeof(std::uint64_t);
  device_memory_ = (info_->caps & FI_HMEM) != 0;
  transmit_depth_ = std::max<std::size_t>(1, info_->tx_attr->size);
  completion_mode_ = choose_batch_completion(config.batch_completion, chosen.ordered, true, provider_);

  fid_fabric* fabric = nullptr;
  WB_CHECK_FI(fi_fabric(info_->fabric_attr, &fabric, nullptr));
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  WB_CHECK_FI(fi_domain(fabric_.get(), info_.get(), &domain, nullptr));
  domain_.reset(domain);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;  // polled by the executor's progress loop, never waited on
  cq_attr.size = info_->tx_attr->size + info_->rx_attr->size;
  fid_cq* cq = nullptr;
  WB_CHECK_FI(fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr));
  cq_.reset(cq);

  fi_av_attr av_attr{};
  av_attr.type = info_->domain_attr->av_type;
  fid_av* av = nullptr;
  WB_CHECK_FI(fi_av_open(domain_.get(), &av_attr, &av, nullptr));
  av_.reset(av);

  fid_ep* ep = nullptr;
  WB_CHECK_FI(fi_endpoint(domain_.get(), info_.get(), &ep, nullptr));
  ep_.reset(ep);
  WB_CHECK_FI(fi_ep_bind(ep_.get(), &av_->fid, 0));
  // Only writes posted with FI_COMPLETION report locally: one completion a batch (two_phase: a write).
  WB_CHECK_FI(fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION));
  WB_CHECK_FI(fi_enable(ep_.get()));

  std::size_t length = 0;
  const int rc = fi_getname(&ep_->fid, nullptr, &length);
  if (rc != -FI_ETOOSMALL && rc != 0) WB_CHECK_FI(rc);
  my_address_.resize(length);
  WB_CHECK_FI(fi_getname(&ep_->fid, my_address_.data(), &length));
  my_address_.resize(length);

  // One batch per transmit-queue entry at most: a batch holds at least one write.
  const std::size_t pool = std::min<std::size_t>(transmit_depth_, 1024);
  batches_.resize(pool);
  for (std::size_t b = pool; b-- > 0;) free_batches_.push_back(static_cast<std::uint32_t>(b));

  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    WB_LOG(kInfo) << "libfabric: provider " << provider_ << " on domain " << info_->domain_attr->name << " ("
                  << info_->fabric_attr->name << "), batches " << batch_completion_name(completion_mode_)
                  << ", transmit queue " << transmit_depth_ << ", memory registration mode 0x" << std::hex << mr_mode
                  << std::dec << ", CQ data " << info_->domain_attr->cq_data_size << " bytes"
                  << (rank_in_cq_data_ ? "" : " (writers named by FI_SOURCE)") << ", CUDA memory "
                  << (device_memory_ ? "through FI_HMEM" : "not registrable (pinned host buffers)")
                  << (config.provider.empty() ? " (chosen automatically)" : " (WB_FI_PROVIDER)");
  }
}

bool FabricTransport::adopt(int rank) {
  if (rank_ >= 0 || !peers_.empty() || !local_.empty()) return false;
  rank_ = rank;
  return true;
}

FabricTransport::~FabricTransport() {
  if (abandoned_) {
    // After a failure a peer may be dead: ofi_rxm (libfabric 1.17) reads the cancelled operations of its
    // broken connection when the endpoint closes and faults on one that carries no context (SIGSEGV at
    // +0xb83f9, in engine processes dropped after a relay was killed, on the emulated cluster). The
    // endpoint and everything it uses are kept, never progressed again; the memory regions (local_) still
    // close after this body, so a peer's late write cannot land in memory freed after it.
    for (const Remote& r : remote_)
      if (r.mapped_raw) (void)fi_mr_unmap_key(domain_.get(), r.key);
    (void)ep_.release();
    (void)av_.release();
    (void)cq_.release();
    (void)domain_.release();
    (void)fabric_.release();
    return;
  }
  // The endpoint first: it cancels what is in flight and stops peers' writes from landing anywhere.
  ep_.reset();
  for (const Remote& r : remote_)
    if (r.mapped_raw) (void)fi_mr_unmap_key(domain_.get(), r.key);
}

TransportCapabilities FabricTransport::capabilities() const {
  TransportCapabilities caps;
  caps.host_memory = true;
  caps.cuda_memory = device_memory_;
  caps.between_machines = true;
  caps.max_writes_per_batch = std::min<std::size_t>(transmit_depth_, config_.max_writes_per_batch);
  return caps;
}

}  // namespace fabric

std::unique_ptr<Transport> make_libfabric_transport(int rank) { return std::make_unique<fabric::FabricTransport>(rank); }

void prepare_libfabric_environment() { fabric::apply_provider_defaults(); }

std::unique_ptr<Transport> open_libfabric_spare() { return std::make_unique<fabric::FabricTransport>(-1); }

std::unique_ptr<Transport> adopt_libfabric_spare(std::unique_ptr<Transport> spare, int rank) {
  auto* fabric = dynamic_cast<fabric::FabricTransport*>(spare.get());
  if (fabric == nullptr || rank < 0 || !fabric->adopt(rank))
    throw Error(ErrorCode::kInvalidArgument, "libfabric: rank " + std::to_string(rank) + " given a transport that is no unused spare");
  return spare;
}

}  // namespace wb
