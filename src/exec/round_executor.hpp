// The round executor (docs/architecture.md, component 3): replays a rank's round schedule every update over the
// transports. Per round: one pack, one batch of one-sided writes per peer and stage, forwarding straight
// from the receive buffer, one assemble; rounds pipelined over `pipeline_depth` buffer slots, a slot reused
// only after its receiver released it (credits over MPI, the control plane). Everything is allocated,
// registered and connected at construction; an update allocates nothing and registers nothing.
//
// Parameters in host memory are packed and assembled by the CPU (exec/pack.hpp). Parameters in CUDA memory
// are packed and assembled by the copy kernel (exec/device_copy_program.hpp) on a stream of the executor's,
// with the transfer buffers in device memory when every transport the rank uses can register it (cuda_ipc,
// ibverbs), else in pinned host memory mapped into the device; a kernel's completion is polled, never
// waited for, before its writes are posted or its slot released.
//
// The code, by lifecycle phase: transfer-buffer memory (exec/transfer_memory.*), the connect handshake
// (exec/connect_handshake.*), per-round work (exec/round_work.*), the progress loop
// (exec/progress_loop.cpp), pack and assemble behind one interface (exec/copy_engine.hpp); construction
// and teardown in exec/round_executor.cpp.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/deadline.hpp"
#include "plan/round_schedule.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb {

class SpareTransports;

namespace exec {
class QuantizedPack;
struct TransferBuffers;
}

/// A rank's parameters as its source map lists them: base address and size in bytes of each, all in
/// host memory, or all in the memory of CUDA device `device` (builds with CUDA only). The caller makes
/// sure its own work on the parameters is finished before run_update (a trainer's last write, a rollout's
/// last read); run_update returns with the executor's own work on them finished.
struct ParameterMemory {
  std::vector<std::byte*> data;
  std::vector<std::size_t> bytes;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;
  /// A trainer sending to FP8 engines whose packs cast the codes straight from its parameters
  /// (QuantizedPack::cast_in_pack; host parameters, not staged, not verifying); null otherwise.
  exec::QuantizedPack* fp8_casts = nullptr;
};

/// CUDA parameters: how an update orders itself after the caller's own work on the device, so that the
/// caller need not synchronize its whole device first. The update's kernels start after the event (a
/// trainer's last write of its parameters, a rollout's last read) and after everything enqueued on the
/// stream so far. Both optional; for host parameters both must be null.
struct DeviceOrdering {
  void* wait_event = nullptr;   // a cudaEvent_t
  void* wait_stream = nullptr;  // a cudaStream_t of the parameters' device
};

/// What an update waits for: a sentence ("external-exchange writes from rank 4") and those peers' ranks.
using WaitState = std::pair<std::string, std::vector<int>>;

namespace exec {
/// The executor's settings (exec/executor_settings.cpp): each one's value (environment or flag) and its
/// declared default, which ExecutorOptions and the coordinator's options start from: verify (WB_VERIFY)
/// and timeline (WB_TIMELINE). The deadline of every wait, timeout_seconds, is the control plane's
/// (comm/deadline.hpp).
bool verify_setting_value();
bool default_verify();
bool timeline_setting_value();
bool default_timeline();
/// WB_SEND_ROUNDS_IN_FLIGHT: rounds whose receive-stage writes a trainer may have unfinished (default 2;
/// 0: no limit below the pipeline's depth).
std::int64_t send_rounds_in_flight_setting();
}  // namespace exec

struct ExecutorOptions {
  /// An update that makes no progress for this long fails, naming what it waits for (infinite: no deadline).
  double timeout_seconds = comm::default_timeout_seconds();
  std::string transport;         // forces the transport of every pair (an adapter's option); empty: WB_TRANSPORT
  /// Check every update end to end (exec/verify.hpp): digests of the segments each writer sent, compared
  /// with what each receiver assembles. Host buffers only.
  bool verify = exec::default_verify();
  /// Called at the start of an update and about every millisecond while it waits; a non-ok status ends the
  /// update with it (the coordinator's way to stop at once when a peer gave up). `waiting`, when given,
  /// says what the update waits for (for a peer that asks).
  std::function<Status(const std::function<WaitState()>& waiting)> interrupt;
  /// At a timeout, with the peers the update waits on: a text to append (the coordinator asks them in turn
  /// what they wait for, to name the rank that holds everything up).
  std::function<std::string(const std::vector<int>& peers)> explain;
  /// How long explain may take: it is asked that long before the timeout, so that a silent peer costs the
  /// timeout, its diagnosis included (progress meanwhile voids the text).
  double explain_seconds = 0;
  /// Names a rank of the communicator in messages ("engine 1 worker 0 (world rank 4)"); "rank N" if empty.
  std::function<std::string(int)> describe_rank;
  /// Names an element of a parameter in messages ("model.norm.weight[12]"); "parameter P element E" if empty.
  std::function<std::string(std::uint32_t parameter, std::int64_t element)> describe_element;
  /// Record ExecutorStats::trace: pack, write, credit-wait, forward and assemble spans per round.
  bool trace = exec::default_timeline();
  /// Every rank enters an update before any byte of it moves (a barrier under the deadline, the interrupt
  /// served), where some rank may refuse an update before it: a rank whose parameters moved fails instead
  /// of entering, and its notice ends the others' wait with nothing written or assembled. Every rank of
  /// the plan gives the same value.
  bool enter_together = false;
  /// Transports opened ahead of need (a join's link: transport/spare_transports.hpp), taken before any
  /// is opened here; null: every transport is opened here.
  SpareTransports* spares = nullptr;
  /// An earlier executor's transfer buffers on this rank (RoundExecutor::transfer_buffers), every update of
  /// which has ended and no peer of which writes again (a re-link onto a widened link, never one after a
  /// failure): used again where large enough (exec::allocate_transfer_buffers), instead of new ones.
  std::shared_ptr<const exec::TransferBuffers> reuse_buffers;
};

/// One interval of a rank's timeline (ExecutorOptions::trace), in seconds of the steady clock.
struct ExecutorSpan {
  enum Kind : std::uint8_t {
    kPack,        // packing the round's send slot
    kWrite,       // the round's receive-stage writes: first post to last completion
    kCreditWait,  // a batch ready to post while the receiver's slot was not free yet
    kForward,     // writes of received bytes to other rollouts (exchange stages, relays)
    kAssemble,    // copying the round's receive slot into the parameters
  };
  Kind kind = kPack;
  std::int64_t update = 0;  // the executor's update count when it happened
  int round = 0;            // in the schedule
  double begin = 0, end = 0;
};

struct ExecutorStats {
  std::int64_t updates = 0;
  std::int64_t registrations = 0;      // memory registrations, all made at construction
  std::int64_t bytes_written = 0;      // by this rank's one-sided writes, all updates
  std::int64_t bytes_assembled = 0;    // into this rank's parameters, all updates
  std::int64_t split_batches = 0;      // batches longer than one post takes: sent in several posts each
  double last_update_seconds = 0;
  double pack_seconds = 0, assemble_seconds = 0;  // all updates (CUDA parameters: kernel time)
  MemoryKind buffer_memory = MemoryKind::kHost;    // where the transfer buffers are (choose_buffer_memory)
  /// What this rank's writes carried per transport and peer, all updates (Transport::traffic), refreshed
  /// at the end of every update on the executor's thread.
  std::vector<std::pair<TransportKind, PeerTraffic>> traffic;
  std::vector<ExecutorSpan> trace;  // options.trace: since the last take_trace(), up to 2^20 spans
  std::int64_t trace_dropped = 0;   // spans past that cap, all updates
};

/// Where a rank's transfer buffers go, given its parameters' memory and the transports it uses: host
/// memory for host parameters; for CUDA parameters, device memory when every transport can register it,
/// else host memory (pinned and mapped into the device, so the kernels reach it) when every transport can
/// register that. Throws wb::Error (kUnsupported) naming the transports when neither holds.
MemoryKind choose_buffer_memory(MemoryKind parameters,
                                std::span<const std::pair<TransportKind, TransportCapabilities>> transports);

class RoundExecutor {
 public:
  /// Collective over `comm`, whose ranks are the plan's workers. Throws wb::Error on a bad schedule, a
  /// transport that cannot run, or a peer that does not answer within the timeout; for CUDA parameters,
  /// on a parameter that is not device memory of the stated device inside one allocation.
  ///
  /// Destruction waits for the grants this rank sent to complete and, where any rank has CUDA parameters,
  /// is collective: every rank closes what it imported from its peers, and only when all have frees its
  /// own buffers (device memory no peer confirmed closing is left allocated; grant buffers still in flight
  /// are kept). Both waits share one deadline: the timeout, 10 s at most once an update failed or
  /// note_peer_failure() was called.
  RoundExecutor(RoundSchedule schedule, ParameterMemory parameters, MPI_Comm comm, ExecutorOptions options = {});
  ~RoundExecutor();
  RoundExecutor(const RoundExecutor&) = delete;
  RoundExecutor& operator=(const RoundExecutor&) = delete;

  /// One update: every round of the schedule. Returns when this rank's writes have completed and all it
  /// receives is assembled into its parameters. Every rank of the plan runs the same number of updates.
  /// CUDA parameters: ordered after `after` (DeviceOrdering); a lost CUDA context (a kernel faulted) is
  /// one error, "CUDA context lost (a pack/assemble kernel faulted)", from then on.
  ///
  /// `packable`, when given (a trainer whose sources are still being written, such as sender staging
  /// copied while the transfer starts): round r is packed only once it holds more than r (acquire), so
  /// whoever writes the sources stores r + 1 (release) when all that rounds 0..r pack is ready; a negative
  /// value fails the update (the sources could not be made). Host parameters only.
  Status run_update(const DeviceOrdering& after = {}, const std::atomic<int>* packable = nullptr);

  /// Parameter `parameter`, found at `from`, is at `to` from now on (its framework rebound it to new memory
  /// of the same size): the next update packs from or assembles into `to`. False, changing nothing, when
  /// this executor does not address that parameter at `from` (it reads or writes host staging instead).
  /// Not while an update runs. CUDA parameters: `to` is checked as at construction, and the copy programs,
  /// which hold the addresses on the device, are compiled again; throws wb::Error when either fails.
  bool rebind_parameter(std::size_t parameter, const std::byte* from, std::byte* to);

  /// CUDA parameters: a cudaEvent_t recorded on the executor's stream after every update's last kernel,
  /// for the caller's streams to wait on (cudaStreamWaitEvent) instead of synchronizing the device. Null
  /// for host parameters.
  void* completion_event() const;

  /// The caller gave up on the job outside this executor (a peer failed or left between updates): the
  /// destructor then waits for the peers only as long as after a failed update.
  void note_peer_failure();

  /// The executor's own duplicate of `comm`, which it never frees (see the destructor): a caller whose
  /// `comm` spans two jobs lets go of it after destruction (comm::part in comm/join.hpp).
  MPI_Comm communicator() const;

  const ExecutorStats& stats() const;
  /// options.trace: the spans recorded since the last call, moved out (so a long traced run is not copied
  /// with every stats() read). Not while an update runs on another thread.
  std::vector<ExecutorSpan> take_trace();
  const RoundSchedule& schedule() const;
  /// The rank (of the executor's communicator) that a write of this rank failed to in an update, at its
  /// post (cma: the peer process is gone) or after it (Transport::failed_peers), or -1. Any thread.
  int failed_write_peer() const;
  /// This executor's transfer buffers, shared, for a later executor of this rank to take over
  /// (ExecutorOptions::reuse_buffers) once this one's updates have ended.
  std::shared_ptr<const exec::TransferBuffers> transfer_buffers() const;

  /// What the executor holds (exec/executor_state.hpp), shared by the files of its phases.
  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace wb
