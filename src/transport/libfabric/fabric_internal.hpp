// Private to src/transport/libfabric/: the transport class and the owners of libfabric objects.
//
// Objects (one set per process): fabric → domain → completion queue, address vector, endpoint (an
// FI_EP_RDM endpoint: one for every peer, connectionless), and a memory region per registration. Peers are
// entries of the address vector, inserted from their endpoint records at connect.
//
// A batch to one peer is a chain of fi_writemsg calls; its last write carries remote CQ data (the
// executor's immediate and this rank's number), which the peer reads from its completion queue as the
// batch's one arrival. Only that last write asks for a local completion (FI_SELECTIVE_COMPLETION), so a
// batch costs one completion on each side. For the arrival to mean "every byte of the batch landed", the
// last write must be applied after the others: where the provider orders writes to a peer (FI_ORDER_WAW)
// and reports delivery (FI_DELIVERY_COMPLETE), the chain is posted at once and the last write's delivery
// completes the batch ("ordered"); otherwise every other write reports its delivery and the last is posted
// once they all have ("two_phase").
//
// Back-pressure: a batch is posted only when the operations in flight leave room for all of it in the
// provider's transmit queue; otherwise post_writes answers kRetryLater with nothing posted. A provider may
// still answer -FI_EAGAIN mid-chain (its own buffers): the batch is then accepted and the rest of it is
// posted by later post_writes and poll calls, in order; no other batch is accepted until it is all out.
//
// Teardown: the endpoint is closed first (cancelling what is in flight), then memory regions, address
// vector, completion queue, domain, fabric. A peer writing into a closed region gets an error completion,
// never this process's freed memory. After a failure (abandon()) only the memory regions close; the rest is
// kept for the process's life (ofi_rxm faulted closing an endpoint whose peer was killed).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_cm.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/libfabric/fabric_records.hpp"
#include "transport/region_table.hpp"
#include "transport/traffic_counter.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::fabric {

/// The WB_FI_* settings, read and validated once per transport (fabric_setup.cpp).
struct Config {
  std::string provider;          // empty: the best the machine offers
  std::string domain;            // empty: the provider's first domain that is not loopback
  std::string batch_completion;  // auto | ordered | two_phase
  std::uint32_t max_writes_per_batch = 0;
};
Config read_config();
/// The provider parameters this transport sets (the fi_rxm_cm_progress_us and fi_rxm_buffer_bytes
/// settings), once a process, before its first provider query (fabric_setup.cpp).
void apply_provider_defaults();

/// Closes any libfabric object through its fid.
struct FidCloser {
  void operator()(fid* f) const noexcept { (void)fi_close(f); }
};
template <class T>
struct ObjectCloser {
  void operator()(T* object) const noexcept { (void)fi_close(&object->fid); }
};
template <class T>
using FiPtr = std::unique_ptr<T, ObjectCloser<T>>;

struct InfoFreer {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoFreer>;

/// The context of one posted write. FI_CONTEXT / FI_CONTEXT2 providers use the first bytes as their own
/// scratch until the operation completes, so it lives in its batch until the batch is done.
struct OpContext {
  fi_context2 provider_scratch;
  std::uint32_t batch = 0;
  bool last = false;  // the write with remote CQ data
};

struct Local {
  std::byte* address = nullptr;
  std::size_t bytes = 0;
  FiPtr<fid_mr> mr;
  void* desc = nullptr;  // fi_mr_desc: passed with every write from this region (FI_MR_LOCAL needs it)
};

struct Remote {
  int peer = -1;
  std::uint64_t target_base = 0;  // added to offsets: the region's address (FI_MR_VIRT_ADDR) or 0
  std::uint64_t bytes = 0;
  std::uint64_t key = 0;
  bool mapped_raw = false;        // fi_mr_map_raw made `key`: fi_mr_unmap_key at teardown
};

struct PeerState {
  fi_addr_t address = FI_ADDR_UNSPEC;
  Status failed;  // the first error of a write to it: later posts return it
};

/// One batch from post_writes until its last write completes.
struct Batch {
  int peer = -1;
  std::uint64_t token = 0;
  std::uint64_t cq_data = 0;
  std::uint64_t bytes = 0;
  std::vector<fi_msg_rma> messages;  // one per write; messages.back() is the last (with CQ data)
  std::vector<iovec> local;
  std::vector<fi_rma_iov> remote;
  std::vector<void*> descs;
  std::vector<OpContext> contexts;
  std::size_t next = 0;               // first message not yet handed to the provider
  std::size_t awaiting_delivery = 0;  // two_phase: earlier writes whose delivery is not yet reported
  bool in_use = false;
};

class FabricTransport final : public Transport {
 public:
  /// `rank` -1: a spare (open_libfabric_spare), given its rank by adopt() before any other call.
  explicit FabricTransport(int rank);
  ~FabricTransport() override;
  /// A spare becomes the transport of `rank`; false when it is no unused spare.
  bool adopt(int rank);

  TransportKind kind() const override { return TransportKind::kLibfabric; }
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
    for (const auto& [peer, state] : peers_)
      if (!state.failed.is_ok()) out.push_back(peer);
    return out;
  }
  std::vector<int> awaited_peers() const override;
  void abandon() override { abandoned_ = true; }

 private:
  // fabric_setup.cpp
  void open(const Config& config);
  // fabric_data.cpp
  Status push(Batch& batch);                  // hands the batch's messages to the provider, as far as it takes
  Status push_backlog();                      // the batch cut short by -FI_EAGAIN, if any
  Status read_error();
  Status complete(OpContext& op, std::vector<Completion>& completions);
  Status fail_peer(int peer, Status status);
  std::uint32_t take_batch();
  int writer_of(fi_addr_t source) const;

  int rank_;
  Config config_;
  InfoPtr info_;
  std::string provider_;
  BatchCompletion completion_mode_ = BatchCompletion::kOrdered;
  bool rank_in_cq_data_ = true;
  bool virtual_addresses_ = false;  // FI_MR_VIRT_ADDR
  bool provider_keys_ = false;      // FI_MR_PROV_KEY
  bool local_descriptors_ = false;  // FI_MR_LOCAL
  bool endpoint_bound_mr_ = false;  // FI_MR_ENDPOINT
  bool raw_keys_ = false;           // FI_MR_RAW or keys longer than 8 bytes
  bool device_memory_ = false;      // FI_HMEM with CUDA
  std::size_t transmit_depth_ = 0;  // the provider's transmit queue
  std::size_t in_flight_ops_ = 0;   // writes handed to the provider whose batch is not done

  // Declared in creation order; destroyed in reverse (endpoint first, fabric last).
  FiPtr<fid_fabric> fabric_;
  FiPtr<fid_domain> domain_;
  FiPtr<fid_cq> cq_;
  FiPtr<fid_av> av_;
  std::vector<Local> local_;  // memory regions: closed after the endpoint (see the destructor)
  FiPtr<fid_ep> ep_;

  std::vector<std::byte> my_address_;
  std::vector<Remote> remote_;
  RegionTable regions_{"libfabric"};  // sizes and owners under the ids of local_ and remote_: the batch check
  std::unordered_map<int, PeerState> peers_;
  std::unordered_map<fi_addr_t, int> rank_of_address_;  // FI_SOURCE arrivals
  std::vector<Batch> batches_;
  std::vector<std::uint32_t> free_batches_;
  std::deque<std::uint32_t> backlog_;   // batches with messages not yet handed to the provider, in order
  std::uint64_t next_requested_key_ = 1;
  TrafficCounter traffic_;
  bool abandoned_ = false;  // abandon(): the endpoint and what it uses are kept open, never closed
};

}  // namespace wb::fabric
