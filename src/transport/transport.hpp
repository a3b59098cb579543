// Transports: one-sided writes into registered memory of another rank. One small interface, four
// implementations: ibverbs (between machines over RDMA NICs), libfabric (between machines on EFA,
// Slingshot or plain TCP), cma (host memory on one machine, process_vm_writev), cuda_ipc (GPU memory on
// one machine). MPI carries only the records that connect
// them (endpoints, memory keys); never the weight bytes.
//
// Errors: registering, connecting and importing are set-up and throw wb::Error; posting and polling are
// the update path and return Status. Back-pressure (no room in a send queue) is ErrorCode::kRetryLater
// with nothing posted: poll, then post again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb {

enum class TransportKind : std::uint8_t { kIbverbs, kCma, kCudaIpc, kLibfabric };
const char* transport_name(TransportKind kind);  // "ibverbs", "cma", "cuda_ipc", "libfabric"
/// Parses "ibverbs", "cma", "cuda_ipc", "libfabric"; throws kInvalidArgument otherwise.
TransportKind parse_transport_kind(std::string_view name);

struct TransportCapabilities {
  bool host_memory = false;     // can register host memory
  bool cuda_memory = false;     // can register CUDA device memory
  bool between_machines = false;
  std::size_t max_writes_per_batch = 0;  // post_writes takes at most this many writes at once
};

/// Memory this rank registered: `id` names it in its own writes, `remote_key` is what a peer imports to
/// write into it (an address and an rkey, a process id, an IPC handle: opaque bytes to the caller).
struct MemoryRegistration {
  std::uint32_t id = 0;
  std::vector<std::byte> remote_key;
};

/// One one-sided write: bytes from local registered memory into a peer's imported memory.
struct WriteRequest {
  std::uint32_t local_memory = 0;   // MemoryRegistration::id
  std::uint64_t local_offset = 0;
  std::uint32_t remote_memory = 0;  // id returned by import_memory for that peer
  std::uint64_t remote_offset = 0;
  std::uint64_t bytes = 0;
};

/// What poll reports. kWritesDone: every write of the batch posted with `token` has completed here (its
/// source bytes may be reused). kArrival: a batch a peer posted to this rank has fully landed; `immediate`
/// is the value the peer gave (the executor encodes round and slot in it).
struct Completion {
  enum class Kind : std::uint8_t { kWritesDone, kArrival };
  Kind kind = Kind::kWritesDone;
  int peer = 0;
  std::uint64_t token = 0;
  std::uint32_t immediate = 0;
};

/// What this rank's batches carried to one peer, from the transport's own counters.
struct PeerTraffic {
  int peer = 0;
  std::uint64_t bytes = 0;    // payload of the writes
  std::uint64_t batches = 0;  // batches (kWritesDone)
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual TransportKind kind() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  // Set-up (throws). Memory is registered once, at connect; never on the update path.
  virtual MemoryRegistration register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) = 0;
  /// This rank's connection record for `peer` (a world rank), sent to it over MPI. Per peer, because a
  /// connection may have per-peer state (ibverbs: one RC queue pair per peer, created here).
  virtual std::vector<std::byte> endpoint(int peer) = 0;
  /// Connects to `peer` (a world rank) from the peer's endpoint record. Both sides call it.
  virtual void connect(int peer, std::span<const std::byte> peer_endpoint) = 0;
  /// Makes a peer's registered memory writable from here; returns the id to use as remote_memory.
  virtual std::uint32_t import_memory(int peer, std::span<const std::byte> remote_key) = 0;

  // Update path (Status, never throws).
  /// Posts `writes` to `peer` as one batch. The peer sees one kArrival carrying `immediate` once all of
  /// them have landed; this rank sees one kWritesDone carrying `token`. kRetryLater: nothing was posted.
  virtual Status post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                             std::uint64_t token) = 0;
  /// Appends what has completed since the last call; never blocks.
  virtual Status poll(std::vector<Completion>& completions) = 0;

  /// Bytes and batches this rank's posts carried to each peer since creation (a batch counts once
  /// post_writes accepted it), by peer: what a run measures crossing a link, next to what its plan says.
  virtual std::vector<PeerTraffic> traffic() const = 0;
  /// The peers a write to which failed after its post (a completion error, an unreachable peer: most
  /// likely gone), for the coordinator to name; empty where failures come back from post_writes only.
  virtual std::vector<int> failed_peers() const { return {}; }
  /// The peers with writes posted from here whose completion has not come back (an update that stalls
  /// names them); empty where writes complete within post_writes.
  virtual std::vector<int> awaited_peers() const { return {}; }
  /// Called before destruction after a failed update, when a peer may be dead: the transport may keep
  /// what talks to the peers open for the rest of the process instead of closing it (libfabric 1.17's
  /// ofi_rxm faults closing an endpoint whose connection to a killed peer broke). Memory registrations
  /// are still closed, so no write lands in memory freed after it.
  virtual void abandon() {}
};

/// This machine's identity (host name and boot id): ranks with equal ids can share memory (cma, cuda_ipc).
std::string machine_id();

/// The transport for this rank's writes to a peer: `forced` when it names one (an adapter's option), else
/// the WB_TRANSPORT setting when it names one; with "auto" (the default) cma for host memory and cuda_ipc
/// for device memory on the same machine, and between machines ibverbs where this machine has an RDMA
/// device, else libfabric. The first choice of each kind is logged once per rank.
TransportKind choose_transport(bool same_machine, MemoryKind memory, std::string_view forced = {});

/// The transport between machines with "auto": ibverbs when an RDMA device is present, else libfabric
/// (when built with it), else ibverbs (whose creation then says why it cannot run). Decided once a process.
TransportKind network_transport_kind();

/// Creates a transport of this kind for world rank `rank`. Throws wb::Error (kUnsupported) with the
/// reason when it cannot run here (no RDMA device, no libfabric provider, no CUDA device, not built with
/// CUDA or libfabric).
std::unique_ptr<Transport> make_transport(TransportKind kind, int rank);

}  // namespace wb
