// The trainers' adapter state (SenderAdapter::State): trainer rank 0 speaks for the trainers: it sends the
// requests to every engine's rank 0 and collects their acknowledgements; the other trainers learn the
// outcome through a step of the trainer group, so every trainer returns the same status. Its joined links
// (one per engine job, or the one fleet link) are states of the same kind. sender_adapter.cpp runs it,
// sender_fleet.cpp re-links the fleet link.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <utility>

#include "comm/backoff.hpp"
#include "comm/max_reduce.hpp"
#include "comm/span_summary.hpp"
#include "coord/adapter_common.hpp"
#include "coord/catch_up.hpp"
#include "coord/fleet_link.hpp"
#include "coord/join_links.hpp"
#include "coord/messages.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "weightbridge/adapter.hpp"

namespace wb {

using namespace coord;

// How long, in timeouts, the trainers wait for a fleet link's background job to end, a rebuild behind
// send_weights included (its agreement, verdict, connect and resend each end within their deadlines): past
// it the link is given up on (dropped) rather than rebuilt a second time beside it.
inline constexpr double kSettleTimeouts = 10;

struct SenderAdapter::State : AdapterBase {
  std::vector<TensorInfo> checkpoint_tensors;
  bool in_flight = false;              // `version` was sent and not yet acknowledged by every engine
  std::vector<std::uint64_t> started;  // trainer rank 0: last update each engine said it took
  double requested_at = 0;             // when the version in flight was requested
  std::optional<StallInterval> open_stall;  // send_weights' stall, while it lasts
  comm::SpanSummary rollout_stalls;    // trainer rank 0: the engines' stalls for the version in flight
  std::atomic<int> staged_rounds{0};   // sender staging by round: rounds whose sources are staged (run_update's gate)

  AdapterOptions given;                      // what a joined engine's link is constructed with (no port)
  TrainersJoinPort port;                     // when joins by address are taken
  std::vector<std::unique_ptr<State>> joined;  // one link per engine job that joined, in join order
  // A joined link's own record: when it joined, the last version every engine of it acknowledged, and,
  // once it left or failed, why (it is then skipped: the training never fails for a joined engine).
  std::uint64_t joined_after = 0, acknowledged = 0;
  double taken_at = 0;         // when the send_weights that took it began (local clock)
  double connect_seconds = 0, first_install_seconds = 0;  // after taken_at
  bool dropped = false;
  bool replica = false;  // appointed (RequestKind::kBeReplica): later joiners get their first version from it
  std::string why;
  std::unique_ptr<TransferThread> server;  // a joined link's: serves it while the others are served (serve())
  // The fleet link (coord/fleet_link.hpp): `joined` holds one link whose engines are every joined job, and
  // each engine's own record, by engine index (the link's own fields above are then the latest join's).
  struct JoinedEngine {
    std::uint64_t after = 0;
    double connect_seconds = 0, probe_seconds = 0, first_install_seconds = 0;
    int id = 0;  // in join order on the trainers (an engine keeps its name when others are lost)
  };
  std::vector<JoinedEngine> fleet_records;
  std::vector<EngineRecord> fleet_lost;  // the fleet link's engines lost in an update, in order
  int fleet_rebuilds = 0, fleet_joins = 0;
  int fleet_replica = -1;  // trainer 0: the id (JoinedEngine::id) of the fleet link's replica engine, -1: none
  /// The name of a fleet link's engine in warnings and stats().engines.
  static std::string fleet_name(const JoinedEngine& r, std::size_t workers) {
    return "joined engine " + std::to_string(r.id) + " on the fleet link (" + std::to_string(workers) + " worker" +
           (workers == 1 ? "" : "s") + ", after version " + std::to_string(r.after) + ")";
  }

  State(MPI_Comm world, MPI_Comm trainers, ParameterSet params, std::vector<TensorInfo> tensors, LoadWeightsFn load,
        const AdapterOptions& options)
      : AdapterBase(world, trainers, true, std::move(params), std::move(load), options),
        checkpoint_tensors(std::move(tensors)), given(options) {
    given.join_address = std::string();
    if (!this->options.join_address.empty()) {
      // A joined replica's address file beside ours is only ever one of this job's.
      if (roles.leader) remove_replica_address(this->options.join_address);
      port = open_join_port(group_comm, this->options.join_address, this->options.timeout_seconds);
      // Joiners admitted at it wait for the next send_weights while the file is fresh (comm::AddressWatch).
      if (port.port) port.port->keep_fresh(comm::kAddressTouchSeconds);
      // Once a link wanted the network transport, one is kept opened for the next joiner's link.
      spares = std::make_shared<SpareTransports>(this->options.transport);
      spares->keep(0, 1);
    }
  }

  ~State() {
    // A dropped link's engine may be gone or stopped: nothing of it is waited for again. It is kept, with
    // its buffers, to the end of the process (a transfer to it may still be pending); its communicators
    // are abandoned (MPI_Finalize would otherwise wait for that job).
    for (std::unique_ptr<State>& link : joined)
      if (link->dropped && !link->left) {
        link->abandon_link_comms();
        comm::keep_alive(std::shared_ptr<State>(link.release()));
      }
  }

  // `probed`: the trainers' load_weights as probed at their own connect (a joined link): only the joiner
  // probes; the trainers' maps are kept.
  void connect_link(const SourceMap* probed = nullptr) {
    throw_if_error(send_request(RequestKind::kConnect, 0));
    connect(&checkpoint_tensors, probed);
  }

  std::string joined_name(std::size_t k) const {
    const State& link = *joined[k];
    if (!link.fleet_records.empty()) {  // the fleet link (dropped whole: its last engine lost or left): as stats() names them
      std::string names;
      for (std::size_t e = 0; e < link.fleet_records.size(); ++e)
        names += (e == 0 ? "" : " and ") + fleet_name(link.fleet_records[e], link.roles.engines[e].size());
      return names;
    }
    const std::size_t workers = link.roles.engines.empty() ? 0 : link.roles.engines.front().size();
    return "joined engine " + std::to_string(k) + " (" + std::to_string(workers) + " worker" + (workers == 1 ? "" : "s") +
           ", after version " + std::to_string(link.joined_after) + ")";
  }

  // A joined link failed or its engine left: the training goes on without it from here (every other
  // engine has a plan of its own, unchanged). Every trainer drops it alike: the link's outcome was agreed
  // over the trainers. Said once, on trainer rank 0.
  void drop(std::size_t k, const Status& cause) {
    State& link = *joined[k];
    link.dropped = true;
    link.release_staging_if_idle();  // skipped from here on: its staging is not kept for the rest of the process
    link.left = is_leave(cause);
    link.why = cause.message();
    // A trainer's notice of the failure carries what the engine is told: the cause is what follows.
    if (link.why.starts_with(link.announce_prefix)) link.why.erase(0, link.announce_prefix.size());
    // A dropped replica's port is gone with it: later joiners must not connect there (one that left closed it).
    if (link.replica && !link.left && roles.leader) remove_replica_address(options.join_address);
    link.replica = false;
    if (!link.fleet_records.empty() && fleet_replica >= 0 && roles.leader) {  // the fleet link dropped whole: its replica too
      remove_replica_address(options.join_address);
      fleet_replica = -1;
    }
    if (!roles.leader) return;
    if (link.left) {
      WB_LOG(kInfo) << joined_name(k) << " left after version " << link.acknowledged << "; the training goes on without it";
    } else {
      WB_LOG(kWarn) << who() << ": " << joined_name(k) << " was dropped after version " << link.acknowledged
                    << " (the training goes on without it): " << link.why;
    }
  }

  // A joiner admitted at the port since the last send_weights: its link, constructed and connected with
  // the trainers' latest version as the last one sent (the joiner's first update is the next). A join
  // that fails is the joiner's failure, not the training's: a warning, and the link is dropped.
  void take_joins() {
    if (!port.open) return;
    const double began = comm::local_seconds();
    const bool fleet = fleet_link_enabled();
    State* widened = fleet && !joined.empty() && !joined.back()->dropped ? joined.back().get() : nullptr;
    try {
      if (fleet) {  // the fleet link's meeting, then its widening instead of a link of the joiner's own
        std::vector<std::uint32_t> silent;  // trainer 0: the fleet's engines that did not meet the joiner's port
        const auto meet = [this, widened, &silent](MPI_Comm leaders) {
          if (!meet_fleet(leaders, widened, join_answer_seconds(options.timeout_seconds), silent)) return BeforeTake::kGiveUp;
          return std::ranges::any_of(silent, [](std::uint32_t s) { return s != 0; }) ? BeforeTake::kLeaveOutFirst : BeforeTake::kTake;
        };
        // W3: the silent jobs left out (the fleet link rebuilt from the others), then the joiner widens that.
        const auto leave_out = [this, &widened, &silent](MPI_Comm& replica) {
          const bool keep = leave_out_fleet(silent);
          widened = !joined.back()->dropped ? joined.back().get() : nullptr;
          replica = widened ? widened->link : MPI_COMM_NULL;
          return keep;
        };
        const auto widen = [&widened] { return widened->send_request(RequestKind::kWiden, 0).is_ok(); };
        try {
          std::optional<MPI_Comm> merged = take_joiner(port.port.get(), *group, waiter(), widened ? widened->link : MPI_COMM_NULL,
                                                       widened ? std::function<bool()>(widen) : std::function<bool()>(), meet, leave_out);
          if (merged) relink_fleet(*merged, widened, began);
        } catch (const Error&) {
          if (after_join) std::exchange(after_join, {})();
          throw;
        }
        if (after_join) std::exchange(after_join, {})();
        return;
      }
      // Engine 0 of this world holds the latest version (it installed it; a staged one once it has): it
      // writes it to the joiner, which then serves it before the trainers' next (coord/catch_up.hpp).
      const auto ask_replica = [this] {
        if (!connection->executor || version == 0) return false;
        return send_request_to(roles.engine_leaders.front(), RequestKind::kServeJoiner, version).is_ok();
      };
      std::optional<MPI_Comm> merged = take_joiner(port.port.get(), *group, waiter(), replica_comm, ask_replica);
      if (!merged) return;
      std::unique_ptr<State> link;
      try {
        link = std::make_unique<State>(*merged, group_comm, params, checkpoint_tensors, load_weights, given);
      } catch (const Error&) {
        comm::abandon_link(*merged);  // the joiner may be gone: never waited on again
        throw;
      }
      link->link = *merged;
      // A failure of this link drops it, and the engine, once it looks again (a stopped one that resumes),
      // learns that from the notice.
      link->announce_prefix = "the trainers dropped this engine job after a failure (the training goes on without it): ";
      link->spares = spares;
      link->connect_link(&connection->probed);
      serve_from_joined_replica(*link);
      link->taken_at = began;
      link->connect_seconds = comm::local_seconds() - began;
      link->version = version;
      link->joined_after = link->acknowledged = version;
      if (roles.leader) {
        WB_LOG(kInfo) << "an engine job of " << link->roles.engines.front().size() << " worker(s) joined after version "
                      << version << " (link " << joined.size() + 1 << ", connect "
                      << link->connection->summary.connect_seconds << " s)";
      }
      joined.push_back(std::move(link));
    } catch (const Error& error) {
      WB_LOG(kWarn) << who() << ": an engine's join failed; the training goes on without it: " << error.status().message();
    }
  }

  // The fleet link widened with a joiner (`merged`, the fleet's engines in their order, the joiner last), or
  // the first joiner's link: the trainers' state re-linked onto it, connected with their kept source map
  // (the joiner probes; rank 0 plans one plan for every engine), and the old fleet link parted (W5-W7).
  void relink_fleet(MPI_Comm merged, State* widened, double began);
  // Trainer 0, once the fleet link is made anew (a join, a loss): its first engine of two workers or more
  // is its replica, which later joiners connect to before they join (W4); appointed anew only when the
  // last one is gone (its port stays the engine's across re-links).
  void appoint_fleet_replica(State& link);
  // Every trainer, when trainer 0's meeting found fleet jobs silent at a joiner's port (`silent`, per engine
  // of the fleet link; empty on the others): they are left out first (W3). True when the joiner can still
  // be taken.
  bool leave_out_fleet(std::vector<std::uint32_t> silent);
  double left_out_at = 0;  // when the last leave-out before a join ended (its widening is timed from it)
  std::function<void()> after_join;  // the jobs left out told so, once the join is over (tell_left_out)

  // A joiner just connected: with no replica of this job, the joined replica (if one was appointed) writes it
  // the latest version (it connected to that replica's port before it joined; trainer rank 0 tells the
  // replica now). Otherwise this one is appointed, when it has two workers (its port needs a knocker).
  void serve_from_joined_replica(State& link) {
    const bool connected = link.connected_to_replica();  // taken whatever follows: nothing is left pending
    if (replica_comm != MPI_COMM_NULL || connection->quantized) return;
    for (const std::unique_ptr<State>& other : joined)
      if (other->replica && !other->dropped) {
        if (version > 0 && connected) (void)other->send_request(RequestKind::kServeJoiner, version);
        return;
      }
    if (link.roles.engines.front().size() < 2) return;
    link.replica = link.send_request(RequestKind::kBeReplica, 0).is_ok();
  }

  // Trainer rank 0, on a joined link: whether its engine connected to the joined replica before it joined
  // (its note was sent when the link was made, before its connect).
  bool connected_to_replica() {
    if (!roles.leader) return false;
    comm::OperationPtr note = comm::make_operation(0, sizeof(std::int64_t));
    if (MPI_Irecv(note->in.data(), 1, MPI_INT64_T, roles.engine_leaders.front(), kReplicaTag, world, &note->request) != MPI_SUCCESS)
      return false;
    try {
      comm::wait_or_throw(note, comm::Waiter{join_answer_seconds(options.timeout_seconds), {}}, "a joiner's note on the replica");
    } catch (const Error&) {
      comm::abandon(std::move(note));
      return false;
    }
    std::int64_t connected = 0;
    std::memcpy(&connected, note->in.data(), sizeof connected);
    return connected != 0;
  }

  // No more joins (shutdown, or the adapter's end on any path); each trainer on its own.
  void close_port() noexcept {
    if (!port.open) return;
    try {
      close_join_port(port, group_comm, options.timeout_seconds);
    } catch (const Error& error) {
      WB_LOG(kWarn) << who() << ": closing the join port: " << error.status().message();
    }
  }

  // `work` on every joined link still served while `own` (this link's) runs on this thread; then each link
  // whose work failed is dropped, in join order. Every link has communicators, a fault channel and an
  // executor of its own, so where every trainer may call MPI from several threads the joined links run at
  // once, each on a thread of its own: a link whose engine died waits its deadline alone, and every other
  // engine installs the version as soon as its own bytes are written (served one after another, every link
  // after a dead one in join order waited its whole deadline: 6.2 s at a 5 s deadline, measured). The
  // waits here have no deadline of their own: each link's work ends within its own deadlines. Ctrl-C
  // (comm/interrupt.hpp) reaches this thread's work only; a link's ends by its deadlines.
  // The fleet link failed an update (L3-L7 of docs/architecture.md): the survivors' link is rebuilt and
  // re-connected with the kept maps, and the trainers re-send version `v` (0: none) to the engines that do
  // not hold it. With no engine alive, or when that fails too, the link is dropped as a per-job one is.
  /// `silent` (every trainer; its content trainer 0's): the engines left out at a joiner's port instead (W3;
  /// no update failed).
  Status recover_fleet(std::size_t k, const Status& cause, std::uint64_t target, const std::vector<std::uint32_t>* silent = nullptr);
  // The fleet link rebuilt after a loss: the verdict, and the survivors' link (connected, with their
  // records and the version they all hold); made behind send_weights, the resend's start too.
  struct Rebuilt {
    FleetVerdict verdict;
    std::unique_ptr<State> link;
    std::uint64_t held = 0;
    Status error;                  // the rebuild or its connect failed: the link is dropped
    std::optional<Status> resent;  // behind send_weights: the lost version's resend, started
  };
  /// Trainer 0: each engine of `old` the verdict left out, named once with the cause; `rebuilt` says how.
  void say_lost(const State& old, const FleetVerdict& verdict, const Status& cause, bool at_join, const std::string& rebuilt) const;
  static std::string lost_cause(const State& old, const Status& cause);  // without the notice's prefix
  /// The survivors' link after a loss on `old`, from `base`'s parameters, tensors, options and trainers'
  /// communicator. It touches nothing of the trainers' own state: behind send_weights it runs on the lost
  /// link's thread with `base` the lost link itself (which holds the same). Throws when a step fails.
  static Rebuilt rebuild_survivors(const State& base, const State& old, int tag, const std::vector<std::uint32_t>* silent);
  /// A fleet link's background transfer, once it ended, on its thread (sender staging; every trainer): the
  /// trainers agree whether it failed and answer a loss at once, the link rebuilt and the version re-sent
  /// (rebuilt_behind, which recover_fleet adopts at the next call), so that the survivors, whose
  /// poll_requests waits for the verdict, are not held for the rest of the training step. Returns the
  /// transfer's outcome as every trainer agreed it.
  Status rebuild_behind(Status done);
  std::optional<Rebuilt> rebuilt_behind;
  /// Whether a background transfer of this link is followed by rebuild_behind on its thread: the fleet
  /// link, where every trainer may call MPI from several threads.
  bool rebuilds_behind() const { return recoverable(*this) && trainers_multithreaded; }
  std::function<Status(Status)> behind() {
    if (!rebuilds_behind()) return {};
    return [this](Status done) { return rebuild_behind(std::move(done)); };
  }
  int rebuild_tag = 0;  // a fleet link's: the trainers' number of its rebuild behind send_weights
  bool acknowledged_behind = false;  // trainer 0: the version in flight's acknowledgements were taken there
  /// The trainers agree whether the fleet link failed in this call, and whether by a leave (one trainer may
  /// meet the failure while another's work on the link succeeded): its rebuild is collective over them.
  Status agreed_outcome(const Status& done) {
    std::int64_t values[comm::Group::kValues] = {done ? 0 : 1, is_leave(done) ? 1 : 0, 0, 0};
    if (Status stepped = group->step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(values), waiter(),
                                     "whether the fleet link failed");
        !stepped)
      return stepped;
    if (values[0] == 0) return Status::ok();
    if (!done && is_leave(done) == (values[1] != 0)) return done;
    return Status(ErrorCode::kInternal, std::string("another trainer met the fleet link's failure") +
                                            (values[1] != 0 ? std::string(": its engine ") + kLeftBetweenUpdates : std::string()));
  }
  /// A failure of `link` that the fleet link's rebuild answers, a leave of one of its engines too.
  static bool recoverable(const State& link) { return !link.fleet_records.empty() && link.connection.has_value(); }
  Status resend_fleet(State& link, const State& old, std::uint64_t v, std::uint64_t target);

  Status serve(const std::function<Status(State&)>& work, const std::function<Status()>& own, std::uint64_t resend = 0) {
    std::vector<std::size_t> served;
    for (std::size_t k = 0; k < joined.size(); ++k)
      if (!joined[k]->dropped) served.push_back(k);
    for (std::size_t k : served) joined[k]->rebuild_tag = fleet_rebuilds + 1;
    const bool together = trainers_multithreaded && !served.empty();
    if (together)
      for (std::size_t k : served) {
        State& link = *joined[k];
        if (!link.server) link.server = std::make_unique<TransferThread>();
        link.server->start([&work, &link] { return work(link); });
      }
    comm::Waiter served_here{comm::kNoDeadline, [this](bool) {
                               (void)service(false);  // this link's queries answered meanwhile
                               return Status::ok();
                             }};
    Status status;
    try {
      status = own();
    } catch (...) {
      // The links' threads use this adapter's state: they end before an exception leaves it.
      if (together)
        for (std::size_t k : served) (void)joined[k]->server->wait(served_here, joined_name(k));
      throw;
    }
    for (std::size_t k : served) {
      State& link = *joined[k];
      Status done = together ? link.server->wait(served_here, joined_name(k)) : work(link);
      if (recoverable(link)) done = agreed_outcome(done);
      if (!done && recoverable(link)) {
        // The fleet link's loss: rebuilt and the failed version re-sent; the call's own work then runs on
        // the rebuilt link, unless the resend was it (a synchronous update of `resend`).
        if (recover_fleet(k, done, resend).is_ok() && (resend == 0 || joined[k]->version < resend)) {
          if (const Status again = work(*joined[k]); !again) drop(k, again);
        }
      } else if (!done) {
        drop(k, done);
      }
    }
    return status;
  }

  /// `moved`: the parameters to follow first (check_parameters), once the version in flight has ended (a
  /// background transfer may still read this link's ParameterSet in its messages).
  Status send(std::uint64_t version, void* cuda_stream, const std::vector<MovedParameter>& moved = {});
  Status finish_link() {
    if (!failure.is_ok()) return failure;
    if (Status noticed = service(true); !noticed) return fail(noticed);
    return finish_in_flight();
  }
  Status shutdown_link();

  std::string about(std::uint64_t v) const { return who() + ": version " + std::to_string(v); }

  // Trainer rank 0: one request to every engine's rank 0. Small messages, not waited for: an engine that
  // does not take a request fails the update by its deadline, and one that is gone must not hold this one.
  Status send_request(RequestKind kind, std::uint64_t v) {
    if (!roles.leader) return Status::ok();
    for (int leader : roles.engine_leaders) WB_RETURN_IF_ERROR(send_request_to(leader, kind, v));
    return Status::ok();
  }
  Status send_request_to(int leader, RequestKind kind, std::uint64_t v) { return coord::send_request(world, leader, kind, v); }

  // Trainer rank 0: the "took update v" notes that have arrived.
  Status take_started_notes() {
    started.resize(roles.engine_leaders.size(), 0);
    for (std::size_t e = 0; e < roles.engine_leaders.size(); ++e)
      for (;;) {
        int found = 0;
        MPI_Message message = MPI_MESSAGE_NULL;
        WB_TRY_MPI(MPI_Improbe(roles.engine_leaders[e], kStartedTag, world, &found, &message, MPI_STATUS_IGNORE));
        if (!found) break;
        std::int64_t v = 0;
        WB_TRY_MPI(MPI_Mrecv(&v, 1, MPI_INT64_T, &message, MPI_STATUS_IGNORE));
        started[e] = std::max(started[e], static_cast<std::uint64_t>(v));
      }
    return Status::ok();
  }

  // Trainer rank 0, when an update failed on its side: names the engines that never took it (a rollout
  // that stopped polling shows up as a peer that stopped granting).
  Status diagnose(std::uint64_t v, const Status& cause) {
    if (!roles.leader || cause.is_ok()) return cause;
    if (!take_started_notes()) return cause;
    std::string silent;
    for (std::size_t e = 0; e < roles.engine_leaders.size(); ++e)
      if (started[e] < v) silent += (silent.empty() ? "" : ", ") + engine_name(e);
    if (silent.empty()) return cause;
    return Status(cause.code(), silent + " never took it (no poll_requests in the " +
                                    comm::seconds_text(comm::local_seconds() - requested_at) + " since the request); the first error was: " +
                                    cause.message());
  }

  // "engine 1 (world rank 3)", "engine 0 (world ranks 4, 5)"
  std::string engine_name(std::size_t e) const {
    const std::vector<int>& ranks = roles.engines[e];
    std::string text = "engine " + std::to_string(e) + (ranks.size() == 1 ? " (world rank " : " (world ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
    return text + ")";
  }

  // Trainer rank 0: every engine's acknowledgement of version v, all within the timeout.
  Status collect_acknowledgements(std::uint64_t v) {
    rollout_stalls = {};
    const std::size_t engines = roles.engine_leaders.size();
    std::vector<bool> acknowledged(engines, false);
    std::size_t pending = engines;
    const double start = comm::local_seconds();
    // Asking the silent engines what they wait on (the diagnosis of a timeout) takes the last trace_seconds
    // of the deadline, and an acknowledgement that arrives meanwhile still counts: a silent engine costs the
    // deadline, diagnosis included (after it, 1 s more of the update a joined engine job died in, measured).
    const double trace_seconds = std::min(1.0, 0.5 * options.timeout_seconds);
    std::optional<std::string> traced;
    const auto silent = [&] {
      std::pair<std::string, std::vector<int>> who;
      for (std::size_t e = 0; e < engines; ++e)
        if (!acknowledged[e]) {
          who.first += (who.first.empty() ? "" : ", ") + engine_name(e);
          who.second.insert(who.second.end(), roles.engines[e].begin(), roles.engines[e].end());
        }
      return who;
    };
    comm::Backoff backoff;
    for (int polls = 0; pending > 0; ++polls) {
      for (std::size_t e = 0; e < engines; ++e) {
        if (acknowledged[e]) continue;
        int found = 0;
        MPI_Message message = MPI_MESSAGE_NULL;
        MPI_Status probe;
        WB_TRY_MPI(MPI_Improbe(roles.engine_leaders[e], kAckTag, world, &found, &message, &probe));
        if (!found) continue;
        int count = 0;
        WB_TRY_MPI(MPI_Get_count(&probe, MPI_BYTE, &count));
        std::vector<std::byte> bytes(static_cast<std::size_t>(std::max(count, 0)));
        WB_TRY_MPI(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
        Acknowledgement ack;
        if (Status decoded = decode_acknowledgement(bytes, ack); !decoded)
          return Status(decoded.code(), describe_worker(roles, roles.engine_leaders[e]) + ": " + decoded.message());
        if (!ack.status) return ack.status;
        if (ack.version != v)
          return Status(ErrorCode::kInternal, describe_worker(roles, roles.engine_leaders[e]) + " acknowledged version " +
                                                  std::to_string(ack.version) + " while " + std::to_string(v) + " was in flight");
        rollout_stalls.merge(ack.stalls);
        acknowledged[e] = true;
        --pending;
        backoff.progressed();
      }
      if (pending == 0) break;
      if (polls % 16 == 0) WB_RETURN_IF_ERROR(service(true));
      const double waited = comm::local_seconds() - start;
      if (!traced && waited > options.timeout_seconds - trace_seconds) {
        const std::vector<int> ranks = silent().second;
        faults->set_waits(ranks);
        traced = faults->trace(ranks, trace_seconds);
        continue;  // what arrived during the trace is taken before the deadline is judged
      }
      if (waited > options.timeout_seconds)
        return Status(ErrorCode::kTimeout, about(v) + ": " + silent().first + " did not install it within " +
                                               comm::seconds_text(options.timeout_seconds) +
                                               " (it stopped calling poll_requests, or its transfer is stuck)" + traced.value_or(""));
      backoff.pause();
    }
    return take_started_notes();
  }

  // Ends the version in flight: the background transfer (sender staging) and every engine's
  // acknowledgement, agreed over the trainers.
  Status finish_in_flight() {
    if (!in_flight) return Status::ok();
    in_flight = false;
    // A rebuild behind the call is waited out, not cut short by the loss's notices (recover_fleet adopts it).
    if (rebuilds_behind()) (void)thread.wait_finished(kSettleTimeouts * options.timeout_seconds);
    Status local = claim_background(about(version) + ": the background transfer");
    if (!local) return give_up(diagnose(version, local), "version " + std::to_string(version) + ": ");
    if (roles.leader && !std::exchange(acknowledged_behind, false)) local = collect_acknowledgements(version);
    if (!local) return give_up(diagnose(version, local), "");
    // Trainer rank 0 may wait up to a whole timeout for the acknowledgements before it takes this step;
    // the others wait for it as long, and a margin more.
    comm::Waiter longer = waiter();
    longer.timeout = 1.5 * options.timeout_seconds;
    const Status agreed = group->step(Status::ok(), longer, about(version) + ": the trainers' outcome");
    if (!agreed) return fail(agreed);
    acknowledged = version;
    if (taken_at > 0 && first_install_seconds == 0) {
      first_install_seconds = comm::local_seconds() - taken_at;
      if (!fleet_records.empty() && fleet_records.back().first_install_seconds == 0)
        fleet_records.back().first_install_seconds = first_install_seconds;
    }
    close_stall(version);  // without staging on either side, send_weights(version) stalled until here
    return record_figures(version);
  }

  void close_stall(std::uint64_t v) {
    if (!open_stall || open_stall->version != v) return;
    open_stall->end_seconds = now();
    stalls.push_back(*open_stall);
    open_stall.reset();
  }

  // Version v's EWTT and AGST into history, on every trainer: the trainers' stalls and (from trainer rank
  // 0) the engines', summed over the trainers.
  Status record_figures(std::uint64_t v) {
    comm::SpanSummary all = roles.leader ? rollout_stalls : comm::SpanSummary{};
    for (auto it = stalls.rbegin(); it != stalls.rend(); ++it)
      if (it->version == v) {
        all.add(it->begin_seconds, it->end_seconds);
        break;
      }
    const Status summed = comm::reduce_spans(all, group->comm(), waiter(), about(v) + ": summing the workers' stalls");
    if (!summed) return give_up(summed, "");
    for (auto it = history.rbegin(); it != history.rend(); ++it)
      if (it->version == v) {
        it->ewtt_seconds = all.extent();
        it->agst_seconds = all.total_seconds / roles.world_size;
        break;
      }
    return Status::ok();
  }
};

}  // namespace wb
