// The worker coordinator (docs/architecture.md, component 4): the whole API a trainer and an inference server need.
//
//   trainer (every rank of trainer_comm)              rollout (every rank of every engine)
//   ------------------------------------              ------------------------------------
//   SenderAdapter sender(world, trainer_comm,         ReceiverAdapter receiver(world, engine_comm,
//       params, checkpoint_tensors, load_weights);        params, load_weights, {}, before_update_hook);
//   sender.connect();                                 while (serving) {
//   for (step = 1; ...; ++step) {                       receiver.poll_requests();   // between steps
//     train_step();                                      generate_step();
//     sender.send_weights(step);                      }
//   }
//   sender.shutdown();
//
// Both constructors are collective over `world` (every trainer and rollout rank). A world of trainers only
// is a trainer job with no engine yet: connect probes the trainers' load_weights, and send_weights returns
// at once, sending nothing. Trainer rank 0 sends
// each request (connect, update, shutdown) to rank 0 of every engine, which relays it inside its engine at
// its next poll_requests, so that every rank of an engine acts at the same step. MPI carries the control
// messages only; the weight bytes travel over the transports (ibverbs, cma, cuda_ipc).
//
// Two switches give the four synchronization modes (docs/architecture.md, "Synchronization modes"):
//   sender staging   off: send_weights returns when the trainer's writes are done (and, with receiver
//                         staging off too, when every rollout installed the version);
//                    on:  send_weights returns once the parameters are copied to host staging; the
//                         transfer continues on a background thread.
//   receiver staging off: the rollout stalls inside poll_requests while the version is written into its
//                         parameters;
//                    on:  the rollout keeps generating with the previous version while the new one
//                         arrives in host staging, and installs it, engine-wide, at one later step.
// A staged side runs the transfer on a background thread, so its process needs MPI_THREAD_MULTIPLE.
//
// Lifetime of the parameters: the adapters keep the views they are given (raw addresses, shapes, strides),
// never copies. The memory each parameter views must stay valid and in place, with the same size, from the
// constructor until shutdown() (trainers) or the end of serving, and in any case until the adapter is
// destroyed: a tensor that is freed, resized or moved by its framework (resize_, a rebound storage) after
// construction is written into (rollouts) or read from (trainers) where it was. Keep such tensors out of
// the ParameterSet, or construct the adapter after the framework has finished moving them. (The Python
// adapters, whose tensors their framework may move, check every parameter before each update: one rebound
// to new memory of the same form is followed, any other change refused on every rank; README, "When
// things go wrong".)
// Two parameters may be one memory (tied weights under two names: probed once, updated under each name);
// one that views part of another's memory is refused at connect, naming both.
//
// Error convention (status.hpp): constructors and connect throw wb::Error; send_weights, wait and
// poll_requests return a Status. After a failed update an adapter stays failed: every later call returns
// the same error. A failure anywhere reaches every adapter of the job within about one timeout (twice at
// worst): the rank that gives up tells its peers at once, and messages name the rank (trainer r, engine e
// worker w, world rank), what it was doing, and the cause.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb {

/// The worker's own weight loader: fills `params` (or the model tensors they view) from `checkpoint`,
/// by copying, as frameworks' load_weights do. Called a few times at connect on a probe checkpoint.
using LoadWeightsFn = std::function<void(const CheckpointReader& checkpoint, const ParameterSet& params)>;

/// A rollout engine that loads the FP8 form of the checkpoint (config.json's quantization_config): each
/// converted weight in float8_e4m3fn with a float32 `<name>_scale_inv` of one scale per block. The
/// trainers quantize their BF16 parameters on the way, by the rule, and the engine's load_weights is probed
/// against that form's tensor list. Every engine of a job gives the same (mixed fleets: a later step).
struct Fp8Engine {
  std::int64_t block_rows = 128, block_cols = 128;  // weight_block_size
  /// "plain" (s = amax/448, q = x/s), "per-block-cast" (SGLang/DeepGEMM), "ue8m0" (power-of-two scales).
  std::string scale_rule = "per-block-cast";
  std::vector<std::string> modules_to_not_convert;  // a tensor whose name contains one stays unconverted
  std::vector<std::string> ignored_layers;          // a tensor of one of these modules stays unconverted
};

/// Every field left unset takes the value of its setting (WB_<NAME> environment variable or --<name>
/// flag, else the default in parentheses).
struct AdapterOptions {
  /// Trainers: stage parameters in host memory and return early (WB_SENDER_STAGING, false). Costs one
  /// host copy of the parameters the plan sends from.
  std::optional<bool> sender_staging;
  /// Rollouts: receive into host staging and install at one step (WB_RECEIVER_STAGING, false). Costs one
  /// host copy of the parameters the plan writes.
  std::optional<bool> receiver_staging;
  /// Transfer-buffer memory per worker, all pipeline slots, send and receive (WB_BUFFER_MIB, 1024 MiB).
  /// The plan fits the smallest budget any worker gives; fewer bytes mean more rounds.
  std::optional<std::int64_t> buffer_bytes;
  /// Rounds in flight per worker (WB_PIPELINE_DEPTH, 2).
  std::optional<int> pipeline_depth;
  /// auto | cma | cuda_ipc | ibverbs | libfabric for every pair of this worker's ranks (WB_TRANSPORT,
  /// auto: cma / cuda_ipc on one machine; ibverbs between machines, or libfabric without an RDMA device).
  std::optional<std::string> transport;
  /// Deadline of every wait: a peer that does not answer, a rollout that stops polling
  /// (WB_TIMEOUT_SECONDS, 120). 0 or inf: no deadline.
  std::optional<double> timeout_seconds;
  /// Check every update end to end (WB_VERIFY, false): each writer digests the bytes it sends, per planned
  /// segment, and each receiver digests what it installs; a mismatch fails the update naming the parameter
  /// and elements. Costs one extra read of the bytes on both sides and a few control messages per update.
  std::optional<bool> verify;
  /// The node this worker is on, for the planner (WB_NODE, -1: this machine). Workers of one node share
  /// fast links; the trainers and the rollouts of one machine always count as different nodes.
  std::optional<int> node;
  /// Record this worker's timeline of every update into AdapterStats::trace (WB_TIMELINE, false).
  std::optional<bool> trace;
  /// Parameters that load_weights does not fill and that no update writes (no setting): a rotary cache the
  /// engine computes itself, say. Every other rollout parameter that load_weights never writes fails
  /// connect, naming it; a parameter named here that load_weights writes fails it too.
  std::vector<std::string> not_loaded;
  /// Engines started as jobs of their own (WB_JOIN_ADDRESS, none): an address file. Trainers: their rank 0
  /// publishes its port there (mode 0600, with a secret) and a joining engine is taken at the next
  /// send_weights. Rollouts: `world` is the engine job's own, and the engine joins the trainers whose file
  /// it is; its first version is the one the fleet link's replica engine holds, written to it before the
  /// trainers take it (the constructor then returns holding it, and a later poll_requests is taken onto
  /// their link), or, with no replica running, the next version they send. Both jobs need MPI_THREAD_MULTIPLE and
  /// `mpirun --ompi-server file:URI` of one ompi-server, and with Open MPI 4.1 `--mca pmix_server_max_wait 5`
  /// (a job that dies while joining is then given up on) and `--mca btl_tcp_progress_thread 1` (a job
  /// killed mid-update cannot leave a survivor spinning inside MPI; README, "Engines as jobs of their own").
  std::optional<std::string> join_address;
  /// Rollouts: this engine loads the FP8 form (no setting). Trainers leave it unset.
  std::optional<Fp8Engine> fp8;
};

/// A span during which a worker did not compute because of a transfer, on the job's common clock
/// (seconds; world rank 0's steady clock, other ranks' offsets measured at construction).
struct StallInterval {
  std::uint64_t version = 0;
  double begin_seconds = 0;
  double end_seconds = 0;
};

/// One interval of a worker's timeline (AdapterOptions::trace), on the job's common clock. Per round of
/// the schedule: "pack" (its send slot), "write" (its receive-stage writes, first post to last
/// completion), "credit wait" (a batch ready while the receiver's slot was still taken), "forward" (writes
/// of received bytes on to other rollouts) and "assemble" (into the parameters).
struct TraceSpan {
  const char* kind = "";
  std::uint64_t version = 0;  // the update's version
  int round = 0;
  double begin_seconds = 0, end_seconds = 0;
};

/// What connect planned; the same on every rank.
struct TransferSummary {
  int workers = 0, trainer_nodes = 0, rollout_nodes = 0, rounds = 0;
  std::int64_t model_bytes = 0;            // M: distinct bytes the rollouts need
  std::int64_t max_node_need_bytes = 0;    // max over rollout nodes of M_v
  std::int64_t bytes_per_update = 0;       // all one-sided writes of one update, every stage
  std::int64_t inter_node_bytes = 0;       // of which over the inter-node network
  double t_min_seconds = 0;                // the lower bound on the planned topology
  double simulated_seconds = 0;            // the planner's simulation of the plan it chose (simulator.hpp);
                                           // 0 when it chose none (a relay fan-out given): wb-plan simulates any
  double connect_seconds = 0;              // probe, exchange, plan, scatter, register (world rank 0)
  double probe_seconds = 0;                // of which: to every worker's source map gathered (world rank 0)
  double longest_probe_seconds = 0;        // the longest probe of one worker (its load_weights passes, decode,
                                           // checks, parameters saved and restored); 0 where every map was kept
                                           // and in a trainer job's connect with no engine
  double replica_wait_seconds = 0;         // a joiner served by the fleet's replica before the take: from
                                           // its connect at the replica's port to their link made (the
                                           // replica's update in flight, its own work between polls); else 0
  // FP8 engines: the control bytes each trainer sends per update for the amaxes of the blocks it shares
  // with other trainers (4 per block, one max all-reduce before the rounds); 0 when no block is shared.
  std::int64_t fp8_amax_bytes = 0;
  // Per planned node (trainers and rollouts of one machine are different nodes), per update:
  std::vector<int> node_of_worker;               // by world rank
  std::vector<std::int64_t> node_ingress_bytes;  // planned inter-node bytes in
  std::vector<std::int64_t> node_egress_bytes;   // planned inter-node bytes out
  std::vector<std::int64_t> node_need_bytes;     // M_v of rollout nodes (0 for trainer nodes)
};

/// What a worker's writes carried to one peer over one transport, from the transport's own counters.
struct LinkTraffic {
  std::string transport;     // "cma", "cuda_ipc", "ibverbs", "libfabric"
  int peer = 0;              // world rank
  std::int64_t bytes = 0;    // all updates
  std::int64_t batches = 0;
};

/// One transfer this worker took part in.
struct UpdateRecord {
  std::uint64_t version = 0;
  // By this worker's one-sided writes for this version (a trainer's: to joined engine jobs too), also when
  // it failed.
  std::int64_t bytes_written = 0;
  bool completed = false;          // its part of the transfer finished (false: the update failed)
  /// Trainers, once every engine acknowledged the version (see SenderAdapter::send_weights): the job's
  /// figures for this update from every worker's stall interval, on the common clock. EWTT: from the first
  /// worker's stall begin to the last worker's stall end; AGST: the stalls' total over the number of
  /// workers (trainers and rollouts). The rollouts' stalls travel with their engines' acknowledgements.
  /// Unset on rollouts and for an update that failed.
  std::optional<double> ewtt_seconds;
  std::optional<double> agst_seconds;
};

/// Trainers: one engine updates go to, or went to.
struct EngineRecord {
  std::string name;               // "engine 0 (world ranks 2, 3)", "joined engine 1 (2 workers, after version 3)"
  std::string state;              // "serving", "left" (it left between updates), "dropped" (it failed)
  std::uint64_t installed = 0;    // the last version it acknowledged
  std::string why;                // left or dropped: the cause, as the trainers met it
  // A joined engine (0 for one of the world): seconds from the start of the send_weights that took it to its
  // link connected (the widening and the link's connect, the joiner's probe included), of which its probe
  // (to every source map gathered), and to its first install acknowledged (as trainer rank 0 saw it).
  double connect_seconds = 0, probe_seconds = 0, first_install_seconds = 0;
};

struct AdapterStats {
  std::uint64_t version = 0;               // sender: last sent; receiver: installed
  std::vector<EngineRecord> engines;       // trainers: every engine, built-in and joined, in join order
  std::vector<StallInterval> stalls;       // one per update this worker stalled for, in order
  std::vector<UpdateRecord> history;       // one per transfer this worker took part in, in order
  std::int64_t updates = 0;                // transfers this worker took part in
  std::int64_t bytes_written = 0;          // by its one-sided writes, all updates
  std::int64_t bytes_assembled = 0;        // into its parameters (or receiver staging), all updates
  std::int64_t registrations = 0;          // memory registrations: all made at connect
  std::int64_t staging_bytes = 0;          // host staging: the bytes the plan reads (sender) or writes
                                           // (receiver) here, not whole parameters
  std::vector<LinkTraffic> traffic;        // per transport and peer, all updates
  std::vector<TraceSpan> trace;            // AdapterOptions::trace: all updates, in the order they ended
};

/// Trainer side. `params` are the trainer's parameters as its load_weights fills them (contiguous; all in
/// host memory or all in the memory of one CUDA device, which load_weights may fill with device copies);
/// `checkpoint_tensors` the canonical checkpoint's tensor list (names, dtypes, shapes), shared with the
/// rollouts at connect.
class SenderAdapter {
 public:
  SenderAdapter(MPI_Comm world, MPI_Comm trainer_comm, ParameterSet params, std::vector<TensorInfo> checkpoint_tensors,
                LoadWeightsFn load_weights, AdapterOptions options = {});
  /// Shuts down when connected and healthy. Destroyed by an exception unwinding past it, it tells every
  /// peer that this trainer left, so they fail at once (naming it) instead of after a timeout.
  ~SenderAdapter();
  SenderAdapter(const SenderAdapter&) = delete;
  SenderAdapter& operator=(const SenderAdapter&) = delete;

  /// Once, collective over the trainers; the rollouts join at their next poll_requests. Probes every
  /// worker's load_weights, all-gathers the source maps, plans on world rank 0, scatters the round
  /// schedules, registers the buffers and connects the transports. Throws wb::Error naming the rank and
  /// cause (on every rank) when any of it fails.
  void connect();

  /// Sends the parameters as version `version` (greater than the last). Collective over the trainers.
  /// Waits for the previous version to be installed everywhere first (at most one version in flight).
  /// When it returns (see the modes above) the trainer may change its parameters.
  /// CUDA parameters: read after the work enqueued on `cuda_stream` (a cudaStream_t of the parameters'
  /// device, e.g. the optimizer's) so far, so the trainer need not synchronize its device; null: after the
  /// legacy default stream (and every blocking stream), which is PyTorch's default stream.
  /// The version's EWTT and AGST enter stats().history when every engine has acknowledged it: before
  /// send_weights returns without staging on either side, otherwise at the next send_weights, wait or
  /// shutdown.
  Status send_weights(std::uint64_t version, void* cuda_stream = nullptr);

  /// Waits until the version in flight is installed on every rollout (collective over the trainers).
  Status wait();

  /// Waits for the version in flight, then tells every engine to close. Collective over the trainers.
  /// Before connect (or when the adapter is destroyed unconnected) the engines are told too: their
  /// poll_requests fails with "the trainers shut down before connect" instead of waiting for a connect.
  Status shutdown();

  bool connected() const;
  /// The engines updates go to: those of the world, and those that joined by address.
  int engines() const;
  /// The plan of the world's engines (the trainers alone when none); each joined engine has its own.
  const TransferSummary& summary() const;
  AdapterStats stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// What poll_requests did.
struct PollResult {
  enum class Event : std::uint8_t {
    kNone,       // nothing pending (or a staged transfer still arriving)
    kConnected,  // took part in connect
    kReceiving,  // a staged transfer started; the parameters still hold the installed version
    kInstalled,  // `version` is now in the parameters
    kShutdown,   // the trainers closed the connection; stop polling
    kFailed,     // `status` says why; the adapter stays failed
    kAborted,    // the update to `aborted_version` failed after before_update_hook(aborted_version) ran:
                 // undo what the hook did (e.g. resume the scheduler); `status` says why. Returned once;
                 // the adapter stays failed (later calls return kFailed).
  };
  Event event = Event::kNone;
  std::uint64_t version = 0;  // the version installed in the parameters after this call
  Status status;
  /// kAborted: the version given up.
  std::uint64_t aborted_version = 0;
  /// kFailed and kAborted: the parameters still hold `version`, complete, and may serve. False only
  /// without receiver staging, when the failed update had already written part of the aborted version
  /// into the parameters: they must be reloaded (e.g. with load_weights from a checkpoint) before use.
  bool parameters_intact = true;
};

const char* poll_event_name(PollResult::Event event);

/// Called on every rollout worker once per version, before that version is installed, with the
/// parameters still holding the previous version (e.g. to flush a KV cache or pause a scheduler). When the
/// update fails after it ran, poll_requests returns kAborted for that version. An exception it throws
/// fails the update on every worker of every engine, naming this worker.
using BeforeUpdateHook = std::function<void(std::uint64_t version)>;

/// Rollout side. `engine_comm` holds the ranks of one engine (one model replica); every rank of the
/// engine calls poll_requests at the same inference steps. `params` as for the trainers: contiguous, all
/// in host memory or all on one CUDA device.
class ReceiverAdapter {
 public:
  ReceiverAdapter(MPI_Comm world, MPI_Comm engine_comm, ParameterSet params, LoadWeightsFn load_weights,
                  AdapterOptions options = {}, BeforeUpdateHook before_update_hook = {});
  /// Destroyed while connected and before the trainers shut down (an exception, or an engine that stops
  /// serving), it tells every peer that this worker left, so they fail at once naming it. An engine that
  /// joined by address leaves instead (leave()), unless an exception unwinds past it.
  ~ReceiverAdapter();
  /// An engine that joined by address leaves the trainers, best between updates: it tells them and lets
  /// go of its link; the trainers go on without it from their next send_weights (the other engines' plans
  /// are their own and unchanged). poll_requests returns kShutdown from then on. Collective over the
  /// engine: every rank calls it after the same poll_requests, and each announces its departure once all
  /// have (after the timeout, alone). Throws kUnsupported on an engine that is a rank of the trainers' world
  /// (its leaving ends the job as before).
  void leave();
  ReceiverAdapter(const ReceiverAdapter&) = delete;
  ReceiverAdapter& operator=(const ReceiverAdapter&) = delete;

  /// Services what the trainers asked for since the last call. Collective over the engine (one small
  /// all-reduce); never waits for the trainers when nothing is pending. Without receiver staging an
  /// update is received and installed inside this call. CUDA parameters: an install writes them after the
  /// work enqueued on `cuda_stream` (a cudaStream_t; null: the legacy default stream) so far, and is complete
  /// on the device when the call returns.
  PollResult poll_requests(void* cuda_stream = nullptr);

  std::uint64_t installed_version() const;
  bool connected() const;
  bool closed() const;  // shut down or failed
  const TransferSummary& summary() const;
  AdapterStats stats() const;

 private:
  struct State;
  struct Pending;  // a fleet link's joiner served by a replica, admitted, not yet taken by the trainers
  PollResult relink();  // onto the fleet link widened with a joiner (src/coord/fleet_link.hpp)
  PollResult rejoin(const PollResult& failed);  // onto the fleet link rebuilt after a loss
  PollResult poll_pending();  // until the trainers take it: onto their fleet link at once
  PollResult adopt_pending(MPI_Comm link);  // taken: the state over the trainers' link
  std::unique_ptr<State> state_;
  std::unique_ptr<Pending> pending_;
};

}  // namespace wb
