// Private to src/transport/ibverbs/: the transport class and the RAII owners of verbs objects.
//
// Resources (one set per process):
//   Device   one opened device: context and protection domain (memory regions are per device)
//   Nic      one active port of a device: its completion queue (sends and receives of every queue pair on
//            the port) and its shared receive queue (zero-length receives that WRITE_WITH_IMM consumes)
//   Peer     a world rank this rank connects to: one RC queue pair per NIC, created by endpoint(peer);
//            once connected, its rails (rail i = local NIC i <-> the peer's NIC i), send-queue accounting,
//            the batches in flight and the arrivals not yet matched across rails
//
// Several NICs: a batch's bytes are striped over the peer's rails in about equal shares (plan_stripes),
// or carried by one rail, rotating, when a share would be under WB_IB_STRIPE_MIN_BYTES; either way every
// rail ends its part of every batch with a WRITE_WITH_IMM carrying the batch's immediate (zero-length
// when the rail carries no bytes). A rail's part is complete at the sender when its one signalled work
// request completes; the batch (one kWritesDone) when all rails have. The receiver matches the immediates
// of the rails in order and reports one kArrival when the batch has arrived on every rail (RC orders
// each rail, not the rails among each other).
//
// Completion queue room: each NIC's CQ holds the SRQ's receives plus `send_credits` signalled writes; a
// batch takes one credit per rail until its completion, and post_writes answers kRetryLater without one.
//
// A failed completion or post marks the peer failed: poll returns the error once, later completions of
// that peer (flushes) are dropped, and post_writes to it returns the same error.
//
// Teardown order (members are destroyed in reverse order of declaration): queue pairs, memory regions,
// shared receive queues, completion queues, protection domains, contexts.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/ibverbs/ibverbs_logic.hpp"
#include "transport/traffic_counter.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/transport.hpp"

namespace wb::ibv {

/// The WB_IB_* settings, read and validated once per transport (see ibverbs_device.cpp).
struct Config {
  std::vector<DeviceSpec> devices;
  std::int64_t gid_index = -1;
  std::uint32_t sq_depth = 0;
  std::uint32_t srq_depth = 0;
  std::uint32_t cq_depth = 0;
  std::uint8_t timeout = 0;
  std::uint8_t retry_count = 0;
  std::uint8_t service_level = 0;
  std::uint8_t traffic_class = 0;
  std::uint64_t stripe_min_bytes = 0;
  bool relaxed_ordering = false;
};
/// Throws kInvalidArgument naming the WB_IB_* variable that is out of range.
Config read_config();

/// wr_id of every receive work request (a send's wr_id is its batch token).
inline constexpr std::uint64_t kReceiveWrId = ~std::uint64_t{0};
inline constexpr int kPollBatch = 64;

struct ContextCloser {
  void operator()(ibv_context* p) const noexcept { (void)ibv_close_device(p); }
};
struct PdDeallocator {
  void operator()(ibv_pd* p) const noexcept { (void)ibv_dealloc_pd(p); }
};
struct CqDestroyer {
  void operator()(ibv_cq* p) const noexcept { (void)ibv_destroy_cq(p); }
};
struct SrqDestroyer {
  void operator()(ibv_srq* p) const noexcept { (void)ibv_destroy_srq(p); }
};
struct QpDestroyer {
  void operator()(ibv_qp* p) const noexcept { (void)ibv_destroy_qp(p); }
};
struct MrDeregisterer {
  void operator()(ibv_mr* p) const noexcept { (void)ibv_dereg_mr(p); }
};
using ContextPtr = std::unique_ptr<ibv_context, ContextCloser>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeallocator>;
using CqPtr = std::unique_ptr<ibv_cq, CqDestroyer>;
using SrqPtr = std::unique_ptr<ibv_srq, SrqDestroyer>;
using QpPtr = std::unique_ptr<ibv_qp, QpDestroyer>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeregisterer>;

struct Device {
  std::string name;
  ContextPtr context;  // declared before pd: the protection domain is freed first
  PdPtr pd;
  ibv_device_attr attr{};
};

struct Peer;
struct QpOwner {
  Peer* peer = nullptr;
  int rail = 0;
};

struct Nic {
  std::size_t device = 0;  // index into the transport's devices
  NicAddress address;      // what the endpoint record says about this NIC
  CqPtr cq;                // declared before srq: the shared receive queue is destroyed first
  SrqPtr srq;
  std::uint32_t srq_depth = 0;
  std::uint32_t to_repost = 0;     // receives consumed since the last repost
  std::uint32_t send_credits = 0;  // completion queue entries left for signalled writes
  std::unordered_map<std::uint32_t, QpOwner> owners;  // qp_num -> (peer, rail)
  std::vector<ibv_recv_wr> recv_wrs;                  // scratch for reposting
};

struct Rail {
  ibv_qp* qp = nullptr;  // owned by Peer::qps
  SendQueue sq;
  std::vector<ibv_send_wr> wrs;  // scratch: one batch's chain
  std::vector<ibv_sge> sges;
};

struct RemoteRegion {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::vector<std::uint32_t> rkeys;  // per NIC of the peer
};

struct Peer {
  int rank = -1;
  std::vector<QpPtr> qps;                  // per local NIC, created by endpoint(peer)
  std::unique_ptr<EndpointRecord> record;  // what endpoint(peer) returned
  bool connected = false;
  Status failure;  // the first failed completion or post; later posts return it
  int rails = 0;
  std::size_t remote_nics = 0;
  std::uint64_t max_message = 0;  // the smaller port limit of both sides
  int next_rail = 0;              // a batch too small to stripe goes here (rotates)
  std::vector<Rail> rail;
  BatchTracker batches;
  ArrivalMatcher arrivals;
  std::vector<RemoteRegion> regions;       // by import id
  std::vector<std::uint64_t> region_sizes;  // by import id (for check_write_ranges)
  std::vector<std::vector<Piece>> plan;    // scratch: one batch's pieces per rail
};

struct LocalRegion {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  std::vector<MrPtr> mrs;            // per Device (none for zero bytes)
  std::vector<std::uint32_t> lkeys;  // per NIC
  std::vector<std::uint32_t> rkeys;  // per NIC
};

class IbverbsTransport final : public Transport {
 public:
  IbverbsTransport(int rank, Config config, std::vector<Device> devices, std::vector<Nic> nics);
  ~IbverbsTransport() override;
  IbverbsTransport(const IbverbsTransport&) = delete;
  IbverbsTransport& operator=(const IbverbsTransport&) = delete;

  TransportKind kind() const override { return TransportKind::kIbverbs; }
  TransportCapabilities capabilities() const override;

  MemoryRegistration register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) override;
  std::vector<std::byte> endpoint(int peer) override;
  void connect(int peer, std::span<const std::byte> peer_endpoint) override;
  std::uint32_t import_memory(int peer, std::span<const std::byte> remote_key) override;

  Status post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                     std::uint64_t token) override;
  Status poll(std::vector<Completion>& completions) override;
  std::vector<PeerTraffic> traffic() const override { return traffic_.snapshot(); }

 private:
  // ibverbs_memory.cpp
  void register_host(LocalRegion& region, int access);
  void register_cuda(LocalRegion& region, int access);
  // ibverbs_connect.cpp
  void create_queue_pairs(Peer& peer);
  void bring_up(Peer& peer, int rail, const NicAddress& remote, const QueuePairAddress& remote_qp);
  Peer& peer_entry(int peer);  // created on first use
  // ibverbs_data.cpp
  Status post_rail(Peer& peer, int rail, std::span<const WriteRequest> writes, std::uint32_t immediate,
                   std::uint64_t token, std::size_t work_requests);
  Status handle_completion(Nic& nic, const ibv_wc& wc, std::vector<Completion>& completions, bool& arrived);
  Status repost_receives(Nic& nic);
  Status fail_peer(Peer& peer, Status status);
  Status flush_gpu_writes();

  std::string nic_label(std::size_t nic) const { return nics_[nic].address.label(); }

  int rank_;
  Config config_;
  // Destroyed in reverse order: queue pairs, memory regions, SRQs and CQs, protection domains, contexts.
  std::vector<Device> devices_;
  std::vector<Nic> nics_;
  std::vector<LocalRegion> local_;
  std::vector<std::uint64_t> local_sizes_;   // by registration id (for check_write_ranges)
  std::unordered_map<int, std::unique_ptr<Peer>> peers_;  // by world rank; holds the queue pairs
  std::vector<int> gpu_flush_devices_;       // CUDA devices whose RDMA writes need a flush before use
  std::array<ibv_wc, kPollBatch> wcs_{};
  TrafficCounter traffic_;
};

}  // namespace wb::ibv
