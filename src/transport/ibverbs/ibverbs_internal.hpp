// Private to src/transport/ibverbs/: the transport class and the owners of verbs objects.
//
// Resources (one set per transport):
//   Device   one opened device: context and protection domain (memory regions are per device)
//   Nic      one active port of a device: its completion queue (sends and receives of every queue pair on
//            the port) and its shared receive queue (zero-length receives that WRITE_WITH_IMM consumes)
//   Peer     a world rank this rank connects to: WB_IB_QPS_PER_CONNECTION RC queue pairs per NIC, created
//            by endpoint(peer); once connected, its rails (ibverbs_rails.hpp), send-queue accounting, the
//            batches in flight and the arrivals not yet matched across rails
//
// Memory this rank imported has one id space for the whole transport; each id remembers its owner, and
// a write naming memory of another peer is refused before anything is posted.
//
// Failures after set-up: a failed completion or post, or an asynchronous event of a queue pair, marks its
// peer failed; an event of a completion queue, shared receive queue, port or device marks the NIC (or
// every NIC of the device) failed, and with it every peer that has a rail there. A failed peer's queue
// pairs are moved to the error state and drained (ibverbs_rails.hpp), which returns their completion
// queue entries; poll returns the failure once, post_writes to the peer returns it every time.
//
// Teardown order: queue pairs, memory regions, shared receive queues, completion queues, protection
// domains, contexts.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/ibverbs/ibverbs_config.hpp"
#include "transport/ibverbs/ibverbs_library.hpp"
#include "transport/ibverbs/ibverbs_rails.hpp"
#include "transport/ibverbs/ibverbs_topology.hpp"
#include "transport/ibverbs/ibverbs_wire.hpp"
#include "transport/region_table.hpp"
#include "transport/traffic_counter.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {

inline constexpr int kPollBatch = 64;

// Owners of verbs objects: each releases through the library it came from.
struct ContextCloser {
  const VerbsLibrary* lib = nullptr;
  void operator()(ibv_context* p) const noexcept { (void)lib->close_device(p); }
};
struct PdDeallocator {
  const VerbsLibrary* lib = nullptr;
  void operator()(ibv_pd* p) const noexcept { (void)lib->dealloc_pd(p); }
};
struct CqDestroyer {
  const VerbsLibrary* lib = nullptr;
  void operator()(ibv_cq* p) const noexcept { (void)lib->destroy_cq(p); }
};
struct SrqDestroyer {
  const VerbsLibrary* lib = nullptr;
  void operator()(ibv_srq* p) const noexcept { (void)lib->destroy_srq(p); }
};
struct QpDestroyer {
  const VerbsLibrary* lib = nullptr;
  void operator()(ibv_qp* p) const noexcept { (void)lib->destroy_qp(p); }
};
struct MrDeregisterer {
  const VerbsLibrary* lib = nullptr;
  void operator()(ibv_mr* p) const noexcept { (void)lib->dereg_mr(p); }
};
using ContextPtr = std::unique_ptr<ibv_context, ContextCloser>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeallocator>;
using CqPtr = std::unique_ptr<ibv_cq, CqDestroyer>;
using SrqPtr = std::unique_ptr<ibv_srq, SrqDestroyer>;
using QpPtr = std::unique_ptr<ibv_qp, QpDestroyer>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeregisterer>;

struct Device {
  std::string name;
  std::string path;      // sysfs directory (ibdev_path): GID types, PCI place
  PciPlace pci;          // the device's place in the PCI tree (empty when unknown)
  ContextPtr context;    // declared before pd: the protection domain is freed first
  PdPtr pd;
  ibv_device_attr attr{};
};

struct Peer;
struct QpOwner {
  Peer* peer = nullptr;
  int position = 0;  // index into Peer::qps
};

struct Nic {
  std::size_t device = 0;  // index into the transport's devices
  NicAddress address;      // what the endpoint record says about this NIC
  bool grh_required = false;
  std::uint16_t pkey_index = 0;
  bool adaptive_routing = false;
  CqPtr cq;                // declared before srq: the shared receive queue is destroyed first
  SrqPtr srq;
  std::uint32_t srq_depth = 0;
  std::uint32_t to_repost = 0;     // receives consumed since the last repost
  CompletionCredits credits;       // completion queue entries left for send work requests
  ReceiveBudget receives;          // what the connected writers may have in flight here
  bool warned_receives = false;
  Status failure;                  // CQ, SRQ, port or device failed: its peers fail
  std::unordered_map<std::uint32_t, QpOwner> owners;  // qp_num -> (peer, queue pair)
  std::vector<ibv_recv_wr> recv_wrs;                  // scratch for reposting
};

struct Rail {
  int nic = 0;           // local (and remote) NIC index of its NIC pair
  int position = 0;      // index into Peer::qps (and the peer's record's qps)
  ibv_qp* qp = nullptr;  // owned by Peer::qps
  SendQueue sq;
  bool drained = false;  // the drain marker of a failed peer came back
  std::vector<ibv_send_wr> wrs;  // scratch: one batch's chain
  std::vector<ibv_sge> sges;
};

struct Peer {
  int rank = -1;
  std::vector<QpPtr> qps;                  // qps_per_connection per local NIC (n * k + j), created by endpoint(peer)
  std::unique_ptr<EndpointRecord> record;  // what endpoint(peer) returned
  bool connected = false;
  Status failure;  // the first failure; later posts return it
  Connection connection;
  int rails = 0;
  std::size_t remote_nics = 0;
  std::uint64_t max_message = 0;  // the smaller port limit of both sides
  bool separate_immediate = false;  // adaptive routing: bytes as RDMA_WRITE, then a zero-length WRITE_WITH_IMM
  int next_rail = 0;                // a batch too small to stripe goes here (rotates)
  std::uint64_t next_sequence = 0;  // wr_id of the next batch's work requests
  std::size_t zero_length_target = SIZE_MAX;  // an imported region of this peer, for a rail without bytes
  std::vector<int> rail_of;                   // by position in qps: its rail, or -1 when unused
  std::vector<Rail> rail;
  BatchTracker batches;
  ArrivalMatcher arrivals;
  std::vector<std::vector<Piece>> plan;  // scratch: one batch's pieces per rail
  std::vector<std::uint32_t> needed;     // scratch: work requests per local NIC
};

struct RemoteRegion {
  int owner = -1;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::vector<std::uint32_t> rkeys;  // per NIC of the owner
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
  IbverbsTransport(const VerbsLibrary& lib, int rank, Config config, std::vector<Device> devices, std::vector<Nic> nics);
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
  std::vector<int> failed_peers() const override {
    std::vector<int> out;
    for (const auto& [rank, peer] : peers_)
      if (!peer->failure.is_ok()) out.push_back(rank);
    return out;
  }
  std::vector<int> awaited_peers() const override {
    std::vector<int> out;
    for (const auto& [rank, peer] : peers_)
      if (peer->batches.in_flight() > 0) out.push_back(rank);
    return out;
  }

  // For tests and logs: what was set up.
  std::size_t nic_count() const { return nics_.size(); }
  const Nic& nic(std::size_t i) const { return nics_[i]; }
  const Device& device(std::size_t i) const { return devices_[i]; }
  bool relaxed_ordering() const { return relaxed_ordering_; }

 private:
  // ibverbs_memory.cpp
  void register_host(LocalRegion& region, int access);
  void register_cuda(LocalRegion& region, int access);
  ibv_mr* register_range(const Device& device, void* address, std::size_t bytes, int access) const;
  // ibverbs_connect.cpp
  void create_queue_pairs(Peer& peer);
  void bring_up(Peer& peer, int rail, const EndpointRecord& remote);
  Peer& peer_entry(int peer);  // created on first use
  // ibverbs_data.cpp
  Status post_rail(Peer& peer, int rail, std::span<const WriteRequest> writes, std::uint32_t immediate,
                   std::uint64_t sequence, std::size_t work_requests);
  Status handle_completion(Nic& nic, const ibv_wc& wc, std::vector<Completion>& completions, bool& arrived);
  Status repost_receives(Nic& nic);
  Status fail_peer(Peer& peer, Status status);
  Status flush_gpu_writes();
  // ibverbs_events.cpp
  Status read_async_events();
  Status handle_async_event(std::size_t device, const ibv_async_event& event);
  Status fail_nic(std::size_t nic, const Status& status);

  std::string nic_label(std::size_t nic) const { return nics_[nic].address.label(); }

  const VerbsLibrary& lib_;
  int rank_;
  Config config_;
  bool relaxed_ordering_ = false;
  // Destroyed in reverse order: queue pairs, memory regions, SRQs and CQs, protection domains, contexts.
  std::vector<Device> devices_;
  std::vector<Nic> nics_;
  std::vector<LocalRegion> local_;
  std::vector<RemoteRegion> remote_;          // by import id, for the whole transport
  RegionTable regions_{"ibverbs"};            // sizes and owners by the same ids: the batch check
  std::unordered_map<int, std::unique_ptr<Peer>> peers_;  // by world rank; holds the queue pairs
  std::vector<int> gpu_flush_devices_;        // CUDA devices whose RDMA writes need a flush before use
  std::vector<int> gpu_devices_logged_;       // CUDA devices whose flush decision was logged
  std::chrono::steady_clock::time_point next_event_check_{};
  std::array<ibv_wc, kPollBatch> wcs_{};
  TrafficCounter traffic_;
};

}  // namespace wb::ibv
