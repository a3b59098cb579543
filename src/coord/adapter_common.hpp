// What the two adapters share: their communicators, roles, clock, failure notices, group steps and the
// checks at construction.
#pragma once

#include <mpi.h>

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coord/binding_checks.hpp"
#include "coord/connection.hpp"
#include "comm/group.hpp"
#include "coord/fault_channel.hpp"
#include "coord/roles.hpp"
#include "coord/transfer_thread.hpp"
#include "exec/transfer_memory.hpp"
#include "transport/spare_transports.hpp"

namespace wb::coord {

/// The adapters' requirement on a worker's parameters: contiguous, all in host memory or all on one CUDA
/// device (a device this process can use). `who` starts the message.
Status check_parameter_memory(const ParameterSet& params, const std::string& who);


struct AdapterBase {
  MPI_Comm world = MPI_COMM_NULL;       // duplicates: the adapters' messages never meet the application's
  MPI_Comm group_comm = MPI_COMM_NULL;
  MPI_Comm link = MPI_COMM_NULL;        // a joined engine job's link: the merged world of both jobs
  MPI_Comm replica_comm = MPI_COMM_NULL;  // the world's trainers and engine 0, which feeds joiners (coord/catch_up.hpp)
  bool left = false;                    // the link ended by an engine's leave(): its communicators are freed
  std::string announce_prefix;          // starts what fail() tells the peers (a joined link: that it was dropped)
  Roles roles;
  ResolvedOptions options;
  ParameterSet params;
  LoadWeightsFn load_weights;
  ParameterWatch watch;          // a binding's, over parameters its framework may move (empty: none)
  bool watched_job = false;      // some rank of the job has one: every update is entered together
  bool trainers_multithreaded = false;  // every trainer has MPI_THREAD_MULTIPLE (joined links served at once)
  double clock_offset = 0;
  std::unique_ptr<FaultChannel> faults;
  std::unique_ptr<comm::Group> group;          // the trainers, or this rank's engine
  std::optional<Connection> connection;
  Status failure;  // once set, every call returns it
  bool shut_down = false;
  std::vector<StallInterval> stalls;
  std::vector<UpdateRecord> history;
  std::uint64_t version = 0;
  ExecutorStats executor_stats;  // copied from the executor whenever no transfer runs (stats() reads it)
  std::vector<TraceSpan> trace;  // options.trace: the executor's spans on the common clock, with versions
  bool warned_trace_dropped = false;
  std::uint64_t background_version = 0;   // the transfer on the background thread
  std::int64_t background_bytes_before = 0;
  TransferThread thread;
  /// The transports of this adapter's links opened ahead of need, where it takes part in joins (trainers
  /// taking them, a joiner, a replica): shared with its joined and catch-up links.
  std::shared_ptr<SpareTransports> spares;
  bool stage_whole = false;  // ConnectInput::stage_whole (a trainers' fleet link with sender staging)
  /// The fleet's replica: the transfer buffers of its catch-up links, allocated once it is appointed and
  /// kept from one joiner to the next (coord/catch_up.hpp, prepare_catch_up_buffers).
  std::shared_future<std::shared_ptr<const exec::TransferBuffers>> catch_up_buffers;
  /// Transfer buffers allocated ahead for this link's connect (a catch-up link's), taken there where
  /// large enough; null: it allocates its own.
  std::shared_ptr<const exec::TransferBuffers> prepared_buffers;

  /// Collective over world.
  AdapterBase(MPI_Comm world, MPI_Comm group, bool trainer, ParameterSet params, LoadWeightsFn load_weights,
              const AdapterOptions& options);
  /// A link ends (the destructor): after a clean shutdown, every communicator of it that spans the two jobs
  /// is parted (comm::part); after a leave they are freed (nothing travels on them after the engine's
  /// announcement); after a failure they are abandoned.
  ~AdapterBase();

  void part_link(MPI_Comm executor_comm);
  /// A joined link given up on and kept (never destroyed): its communicators are abandoned now
  /// (comm::abandon_link), and nothing uses them afterwards.
  void abandon_link_comms();
  /// A link given up on after a loss and kept: its staging (as large as what it stages) released now, unless
  /// its background transfer still runs past its deadline and may read or write it (then kept with it).
  void release_staging_if_idle();
  double now() const { return comm::local_seconds() + clock_offset; }
  std::string who() const { return describe_worker(roles, roles.world_rank); }
  /// Every wait of this adapter: the timeout, and the fault channel served while waiting.
  comm::Waiter waiter() const;
  /// Answers queries and takes notices; the first failure a peer announced, when `interruptible`.
  Status service(bool interruptible);
  /// A failure this rank met in its own work (a transfer, a hook, a wait): it gives up. When a peer's
  /// failure is already known, that one is the cause and is recorded instead (a peer that gave up makes
  /// local operations fail too: timeouts, writes into memory it released); otherwise `context` ("version
  /// 3: ") prefixes this rank's message. A rank that gives up takes no further step of its group: fail()
  /// announces the first step it did not complete, which ends that step on the others at once.
  Status give_up(Status status, const std::string& context);
  /// Records the failure (the first one wins), tells the neighbours (announce_failure), and returns it.
  Status fail(Status status);
  /// What fail() does besides recording: the peer a write failed to noted gone, the neighbours told, and a
  /// transfer still running on the background thread stopped. The fleet link's transfer thread calls it
  /// itself (SenderAdapter::State::rebuild_behind); the next call records the failure.
  void announce_failure(const Status& status);
  /// When this adapter goes away without the orderly end (an exception unwinds past it, or a rollout
  /// stops serving before the trainers shut down), its peers learn it at once instead of after a timeout.
  void announce_departure(const std::string& why);
  /// Before an update touches the parameters: runs the watch (when there is one) and follows the
  /// parameters it reports as rebound (follow()). A refusal, or a rebound parameter that now overlaps
  /// another, is returned as a failure (kInvalidArgument) naming this rank and the parameter; the caller
  /// gives up on the update, and its peers, waiting to enter it together, fail with nothing written.
  /// `when`: "version 3", "connect" (the message's words).
  Status check_parameters(std::vector<MovedParameter>& moved, const std::string& when);
  /// Points this adapter at the parameters' new memory: its ParameterSet, and the executor where it
  /// addresses the parameters themselves (no staging on this side). Not while a transfer runs on them.
  Status follow(const std::vector<MovedParameter>& moved);
  /// Runs one transfer on this thread and records it (history, statistics). CUDA parameters moved in place:
  /// ordered after the work on `cuda_stream` (a cudaStream_t; null: the legacy default stream).
  Status run_transfer(std::uint64_t v, void* cuda_stream = nullptr);
  /// Starts one transfer on the background thread (staged sides); `packable` as for RoundExecutor::run_update.
  /// `then`, on the same thread, takes the transfer's outcome and returns the job's (the fleet link's
  /// trainers answer a loss there at once: SenderAdapter::State::rebuild_behind).
  void start_background(std::uint64_t v, const std::atomic<int>* packable = nullptr, std::function<Status(Status)> then = {});
  /// Waits for the background transfer and records it; returns early with the failure a peer announced or
  /// a timeout (the transfer, watching the same notices and deadline, then ends on its own).
  Status claim_background(const std::string& what);
  /// Connects this worker (establish_connection, collective over world) and keeps what that established; its
  /// transfer peers hear of this rank's failure first. `checkpoint_tensors`: the trainers' (null on rollouts).
  /// Parameters moved since construction are followed first (the probe reads them); a refusal fails connect
  /// here and, through its notice, on every rank. `probed`: this worker's load_weights probed before (a
  /// trainer connecting a joined link), not probed again. `widened`: the connection of the link this one
  /// widens (a re-link with a joiner, every update of it ended): its transfer buffers serve again.
  /// `share_staging`: the staging of the link this one replaces (widened, or rebuilt after a loss), whose
  /// memory the new link's staging shares (ConnectInput::share_staging): only where no transfer of the old
  /// link can write it any more (a rollout's transfer thread idle; a trainer's only ever reads it).
  void connect(const std::vector<TensorInfo>* checkpoint_tensors, const SourceMap* probed = nullptr,
               const Connection* widened = nullptr, const Staging* share_staging = nullptr);
  /// The executor's figures, refreshed when no transfer runs.
  void refresh_stats();
  AdapterStats stats() const;
};

}  // namespace wb::coord
