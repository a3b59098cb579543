// The rollout side of the coordinator. Every poll_requests is one step of the engine (a small all-reduce):
// rank 0 contributes the request it found (if any), every rank whether its staged transfer has finished,
// so that all ranks of the engine take the same decision at the same step.
#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <span>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "comm/span_summary.hpp"
#include "coord/adapter_common.hpp"
#include "coord/catch_up.hpp"
#include "coord/fleet_link.hpp"
#include "coord/join_links.hpp"
#include "coord/messages.hpp"
#include "coord/pending_join.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "weightbridge/adapter.hpp"

namespace wb {

using namespace coord;

namespace {

// Every poll_requests is an MPI step over the engine (an all-reduce, a probe for requests); in a loop with
// nothing between them those calls take the cores and the progress engine from the transfer thread that
// receives in the background (measured on the emulated cluster at 4 replicas: async 7.39 s polling back to
// back against 2.43 s with 2 ms between polls). An engine polls between inference steps of milliseconds and
// never waits here; a busy loop is paced.
Setting<double> poll_interval_setting("poll_interval_us", 1000.0,
                                      "Least time between two poll_requests steps that found nothing new (none, or "
                                      "still receiving), microseconds: a call sooner than that sleeps the rest "
                                      "first. 0 polls back to back.",
                                      0.0, 1e6);
// While a staged version arrives, each poll_requests that is an engine-wide step costs MPI calls (the step,
// the probes) beside the transfer thread, which needs the progress engine for its credits: measured at 4
// replicas on 1 Gbit/s links with 2 ms engine steps, async took 2.08 s against 1.95 s with 20 ms steps. So
// only some polls are steps then, about this far apart; the ranks agree which (by the slowest rank's poll
// interval, carried by the step), so they still take every decision at the same poll.
Setting<double> receiving_step_setting("receiving_step_us", 5000.0,
                                       "While a staged version arrives in the background: least time between two "
                                       "engine-wide poll_requests steps, microseconds (the polls between return at "
                                       "once, with no MPI call); what an install can lag behind its transfer. 0: "
                                       "every poll is a step.",
                                       0.0, 1e6);

}  // namespace

const char* poll_event_name(PollResult::Event event) {
  switch (event) {
    case PollResult::Event::kNone: return "none";
    case PollResult::Event::kConnected: return "connected";
    case PollResult::Event::kReceiving: return "receiving";
    case PollResult::Event::kInstalled: return "installed";
    case PollResult::Event::kShutdown: return "shutdown";
    case PollResult::Event::kFailed: return "failed";
    case PollResult::Event::kAborted: return "aborted";
  }
  return "unknown";
}

struct ReceiverAdapter::State : AdapterBase {
  BeforeUpdateHook hook;
  std::uint64_t receiving = 0;  // version arriving in staging, 0 when none
  bool staged_done = false;     // this rank's part of it has finished, with staged_status
  Status staged_status;
  bool intact = true;           // the parameters hold `version`, complete
  void* cuda_stream = nullptr;  // poll_requests' argument: CUDA parameters are written after its work
  comm::Pace pace{*poll_interval_setting * 1e-6};  // a step that found nothing new waits poll_interval_us for the next
  double receiving_step = *receiving_step_setting * 1e-6;
  double last_poll_at = 0;  // local_seconds() of the previous poll
  int polls_to_skip = 0;    // while receiving: polls before the next engine-wide step (agreed at the last one)
  MPI_Comm catch_up_comm = MPI_COMM_NULL;  // a joiner: the link to the replica its first version comes over
  MPI_Comm replica_leaders = MPI_COMM_NULL;  // or the leaders' link to a joined replica it is made from
  bool from_replica = false;                 // (every rank: the leader has that link)
  bool first_installed = false;            // a joiner: that version is in, kInstalled is the next event
  std::uint64_t joiner_waits = 0;          // the replica: a joiner to serve once this version is installed
  TrainersJoinPort replica_port;           // a joined replica: the port later joiners connect to first
  bool network_links = false;              // a joiner: its links wanted the transport between machines
  MPI_Comm joiner_at_port = MPI_COMM_NULL;  // the fleet link's replica (leader): a joiner taken from its port, linked next
  LinkedCopyPtr joiner_linked;              // (every worker) the catch-up link with it, made while it probed,
  double joiner_linked_at = 0;              // when (the bound on its ask), and (leader) whether it did not ask in time
  bool joiner_late = false;
  std::optional<SourceMap> kept_probe;      // a fleet joiner served before its take: its probe, for the trainers' connect
  std::unique_ptr<Staging> prestaged;       // and its staging, made while it waited (Pending::prestaging)
  AdapterOptions given;                    // what a re-link onto a widened fleet link is constructed with
  MPI_Comm relink_to = MPI_COMM_NULL;      // the fleet link widened with a joiner: re-linked onto at once
  bool rejoin_tried = false;               // the fleet link: this state's failure was offered to the rebuild
  bool leave_out = false;                  // the fleet link: rebuilt without the jobs silent at a joiner's port (W3)
  bool resending = false;                  // the fleet link rebuilt: the trainers may re-send the version held
  std::uint64_t quiet = 0;                 // a version re-sent that this engine holds: installed without an event
  std::uint64_t reported = 0;              // the last version poll_requests reported kInstalled for
  RequestInbox requests;                   // the leader's, from trainer rank 0

  State(JoinedComms joined, MPI_Comm engine, ParameterSet params, LoadWeightsFn load, const AdapterOptions& options,
        BeforeUpdateHook before_update_hook)
      : AdapterBase(joined.link, engine, false, std::move(params), std::move(load), options),
        hook(std::move(before_update_hook)), catch_up_comm(joined.catch_up), replica_leaders(joined.replica_leaders),
        from_replica(joined.from_replica), given(options) {
    if (!this->options.join_address.empty()) link = joined.link;  // the merged world join_trainers returned
    this->options.replica_stages = link != MPI_COMM_NULL && stages_as_fleet_replica(roles);
    // Trainer rank 0 asks a joined replica to serve this engine only when it connected there first (on the
    // fleet link there is none).
    if (link != MPI_COMM_NULL && roles.leader && !fleet_link_enabled()) {
      comm::OperationPtr note = comm::make_operation(sizeof(std::int64_t));
      const std::int64_t connected = from_replica ? 1 : 0;
      std::memcpy(note->out.data(), &connected, sizeof connected);
      WB_CHECK_MPI(MPI_Isend(note->out.data(), 1, MPI_INT64_T, roles.trainer_leader, kReplicaTag, world, &note->request));
      comm::abandon(std::move(note));
    }
  }

  ~State() {
    if (joiner_linked) drop_linked_joiner(*this, std::move(joiner_linked), LetGo::kQuietly);
    if (replica_port.port) std::remove(replica_tensors_path(options.join_address).c_str());  // the address goes with the port
    try {
      close_join_port(replica_port, group_comm, options.timeout_seconds, "engine worker");
    } catch (const Error& error) {
      WB_LOG(kWarn) << who() << ": closing the replica's port: " << error.status().message();
    }
  }

  // The fleet link re-linked: the replica's port (and a joiner taken from it) stay this engine's.
  void take_replica_port(State& old) {
    replica_port = std::move(old.replica_port);
    old.replica_port.open = false;
    joiner_at_port = std::exchange(old.joiner_at_port, MPI_COMM_NULL);
    joiner_linked = std::move(old.joiner_linked);
    joiner_linked_at = old.joiner_linked_at;
    catch_up_buffers = std::move(old.catch_up_buffers);
  }

  // A joined engine the trainers appointed: later joiners connect to its port before they join.
  void open_replica_port() {
    try {
      replica_port = open_join_port(group_comm, replica_address(options.join_address), options.timeout_seconds, "engine worker");
      if (replica_port.port) {
        if (connection && !options.fp8) write_replica_tensors(options.join_address, connection->tensors);
        keep_replica_fresh(*replica_port.port);
      }
    } catch (const Error& error) {
      if (roles.leader) {
        WB_LOG(kWarn) << who() << ": cannot serve joiners their first version (later joiners get the trainers' next): "
                      << error.status().message();
      }
    }
  }

  // A joiner, right after its link's connect (the replica waits for it meanwhile): the version the replica
  // holds, before the trainers' next; kInstalled at the poll after kConnected. One that does not come is no
  // failure of this engine: the trainers' next version is then its first.
  void first_version() {
    const MPI_Comm comm = catch_up_comm;
    catch_up_comm = MPI_COMM_NULL;
    const bool joined_replica = from_replica;
    from_replica = false;
    const double began = now();
    std::uint64_t v = 0;
    if (Status caught = joined_replica ? catch_up_from_port(*this, replica_leaders, hook, v) : catch_up(*this, comm, hook, v); !caught) {
      if (roles.leader) {
        WB_LOG(kWarn) << who() << ": no first version from the trainers' replica engine (the trainers' next one comes "
                         "instead): " << caught.message();
      }
      return;
    }
    stalls.push_back({v, began, now()});
    history.push_back({v, 0, true, {}, {}});
    version = v;
    first_installed = true;
    if (roles.leader) {
      WB_LOG(kInfo) << who() << ": installed version " << v << " from the trainers' replica engine before serving ("
                    << comm::seconds_text(now() - began) << ")";
    }
  }

  // A joiner's spares (opened while it joined) are not kept once its links are made: a replica opens its own.
  // On the fleet link, whose every join and loss re-links this engine too, one is kept opened for the next
  // re-link where its links want the network transport: opening a libfabric transport there took 130-290
  // ms of every rank's connect at a join (each engine job as a machine of its own on one host, 8 ranks on
  // 2 cores: the others wait for the slowest in the executor's first step), the trainers' and the joiner's
  // being opened ahead already.
  void release_join_spares() {
    if (link == MPI_COMM_NULL || !spares) return;
    network_links = spares->wanted();
    if (fleet_link_enabled() && network_links) spares->keep(1, 1);
    else spares.reset();  // closes those never taken
  }

  // The replica, once the version a joiner is to get is installed here: every worker writes its part. The
  // fleet link's replica links a joiner its leader took, then copies once it asked, or lets it go (`drop`).
  PollResult serve(bool drop = false) {
    joiner_waits = 0;
    const double began = comm::local_seconds();
    const bool fleet = fleet_link_enabled() && replica_comm == MPI_COMM_NULL && replica_port.open;
    if (fleet && !joiner_linked) {
      joiner_linked = link_joiner_at_port(*this, std::exchange(joiner_at_port, MPI_COMM_NULL));
      joiner_linked_at = comm::local_seconds();
      return {PollResult::Event::kNone, version, Status::ok()};
    }
    if (fleet && drop) {
      drop_linked_joiner(*this, std::move(joiner_linked), joiner_late ? LetGo::kLate : LetGo::kProbeFailed);
      return {PollResult::Event::kNone, version, Status::ok()};
    }
    std::int64_t bytes = 0;
    const Status served = fleet                        ? serve_linked_joiner(*this, std::move(joiner_linked), bytes)
                          : replica_comm != MPI_COMM_NULL ? serve_joiner(*this, replica_comm, bytes)
                          : replica_port.open           ? serve_joiner_at_port(*this, replica_port.port.get(), bytes)
                              : Status(ErrorCode::kInternal, who() + ": asked to serve a joiner, but this engine is no replica");
    if (roles.leader && served) {
      WB_LOG(kInfo) << who() << ": wrote version " << version << " to a joining engine (" << bytes << " bytes from this worker, "
                    << comm::seconds_text(comm::local_seconds() - began) << ")";
    } else if (roles.leader) {
      WB_LOG(kWarn) << who() << ": serving a joining engine its first version failed (it gets the trainers' next one; this "
                       "engine serves on): " << served.message();
    }
    return {PollResult::Event::kNone, version, Status::ok()};
  }

  PollResult failed(const Status& status) {
    PollResult result{PollResult::Event::kFailed, version, fail(status)};
    result.parameters_intact = intact;
    return result;
  }

  // Engine rank 0 tells trainer rank 0 that version v is installed on the whole engine, with the engine's
  // stalls for it, or why not.
  Status acknowledge(std::uint64_t v, const Status& outcome, const comm::SpanSummary& engine_stalls = {}) {
    if (!roles.leader) return Status::ok();
    comm::OperationPtr op = comm::make_operation();
    op->out = encode_acknowledgement({v, outcome, engine_stalls});
    WB_TRY_MPI(MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, roles.trainer_leader, kAckTag, world,
                         &op->request));
    // Not waited for: trainer rank 0 waits for it (with its deadline), or is gone and never will.
    comm::abandon(std::move(op));
    return Status::ok();
  }

  // Hook, install, acknowledge, agreed over the engine. `transfer`: receive straight into the parameters
  // (no staging); otherwise the staged version is copied in, once every rank of the engine is ready.
  PollResult install(std::uint64_t v, bool transfer) {
    const double began = now();
    const std::string what = who() + ": installing version " + std::to_string(v);
    faults->set_activity(group->first_incomplete(), what + " (before_update_hook)");
    Status status;
    try {
      if (hook) hook(v);
    } catch (const std::exception& error) {
      status = Status(ErrorCode::kInvalidArgument, who() + ": before_update_hook(" + std::to_string(v) + ") threw: " + error.what());
    } catch (...) {
      status = Status(ErrorCode::kInvalidArgument, who() + ": before_update_hook(" + std::to_string(v) + ") threw");
    }
    // Parameters the framework moved since the last update (a binding's watch, after the hook, which may
    // move them): followed, or the version refused before any byte of it is written here; the peers,
    // entering it together, fail with it.
    if (status) {
      std::vector<MovedParameter> moved;
      status = check_parameters(moved, "version " + std::to_string(v));
      if (status) status = follow(moved);
    }
    const bool own_context = !status;  // the hook's and the watch's failures name the version already
    // A peer that gave up while the hook ran (a trainer's Ctrl-C, a timeout): nothing of v is received, so
    // the parameters keep the previous version whole.
    if (status && transfer) status = service(true);
    if (status && transfer) {
      faults->set_activity(group->first_incomplete(), what + " (receiving)");
      const std::int64_t assembled = connection->executor->stats().bytes_assembled;
      status = run_transfer(v, cuda_stream);
      if (!status) intact = connection->executor->stats().bytes_assembled == assembled;
    }
    // Staged, this step decides the install: all ranks copy the version in, or none does. A rank that gave
    // up does not take it (its announcement ends it on the others).
    if (status) status = group->step(Status::ok(), waiter(), what, !transfer);
    else status = give_up(status, own_context ? "" : "version " + std::to_string(v) + ": ");
    if (status && !transfer) {
      status = connection->staging.copy_to(params, cuda_stream);
      // Some ranks of the engine may have installed: the version is not whole anywhere then.
      if (!status) {
        intact = false;
        status = give_up(status, "version " + std::to_string(v) + ": installing from staging: ");
      }
    }
    stalls.push_back({v, began, now()});
    comm::SpanSummary engine_stalls;
    if (status) {
      // Every rank's stall for v, summed over the engine, travels with the acknowledgement: the trainers
      // compute the update's EWTT and AGST from them. The version is installed whatever happens here.
      engine_stalls.add(began, stalls.back().end_seconds);
      faults->set_activity(group->first_incomplete(), what + " (summing the engine's stalls)");
      if (Status summed = comm::reduce_spans(engine_stalls, group->comm(), waiter(), what + ": summing the engine's stalls");
          !summed) {
        version = v;
        const Status gave_up = give_up(summed, "");
        (void)acknowledge(v, gave_up);
        return failed(gave_up);
      }
    }
    const Status acknowledged = acknowledge(v, status, engine_stalls);
    if (status && !acknowledged) status = acknowledged;
    if (!status) {
      PollResult result = failed(status);
      result.event = PollResult::Event::kAborted;
      result.aborted_version = v;
      return result;
    }
    version = v;
    // A version re-sent after a loss on the fleet link that this engine held already: the same bytes again.
    if (std::exchange(quiet, 0) == v) return {PollResult::Event::kNone, version, Status::ok()};
    return {PollResult::Event::kInstalled, version, Status::ok()};
  }

  PollResult poll() {
    if (shut_down) return {PollResult::Event::kShutdown, version, Status::ok()};
    if (!failure.is_ok()) return failed(failure);
    const double polled_at = comm::local_seconds();
    const double interval = last_poll_at > 0 ? polled_at - last_poll_at : 0;
    last_poll_at = polled_at;
    if (receiving != 0 && polls_to_skip > 0) {
      // Every rank of the engine skips this poll (agreed at the last step); the transfer thread watches the
      // peers' notices meanwhile.
      --polls_to_skip;
      return {PollResult::Event::kReceiving, version, Status::ok()};
    }
    // A peer that gave up: this rank stops here (its engine's next step then ends at once on the others).
    if (Status noticed = service(true); !noticed) return failed(noticed);
    if (first_installed) {
      first_installed = false;
      return {PollResult::Event::kInstalled, version, Status::ok()};
    }
    // Every worker of the engine agreed on both at earlier steps.
    if (joiner_waits != 0 && receiving == 0 && version >= joiner_waits) return serve();

    // Rank 0 looks for a request; every rank reports its staged transfer.
    std::int64_t values[comm::Group::kValues] = {0, 0, 0, 0};  // request kind, request version, still arriving
    if (receiving != 0 && !staged_done && thread.finished()) {
      staged_status = claim_background(who() + ": receiving version " + std::to_string(receiving));
      staged_done = true;
      if (!staged_status) {
        const Status gave_up = give_up(staged_status, "version " + std::to_string(receiving) + ": ");
        (void)acknowledge(receiving, gave_up);
        return failed(gave_up);
      }
    }
    if (receiving != 0) values[2] = staged_done ? 0 : 1;
    values[3] = static_cast<std::int64_t>(std::min(interval, 1.0) * 1e6);  // this rank's poll interval, us
    if (roles.leader) {
      // The fleet link's replica serves a joiner waiting at its port first: the version installed here (a
      // staged one still arriving does not touch the parameters it reads). A request that came meanwhile
      // stays queued for the next step: taken first, a joiner starved while the trainers' updates came back
      // to back (every FP8 joiner of elastic.fleet_kill_engine_fp8 waited its 5 s out, then was taken by the
      // trainers and got their next version).
      if (fleet_link_enabled() && replica_port.port && connection && version > 0) {
        if (joiner_linked) {  // linked: the copy once it asks, or let go (said so, or late)
          const std::optional<bool> ask = comm::copy_asked(link_of(*joiner_linked));
          const bool late = !ask && comm::local_seconds() - joiner_linked_at > options.timeout_seconds;
          if (ask || late) {  // the step takes the maximum: 0 (let go) is the leader's as any version is
            values[0] = static_cast<std::int64_t>(RequestKind::kServeJoiner);
            values[1] = ask == std::optional<bool>(true) ? static_cast<std::int64_t>(version) : 0;
            joiner_late = late;
          }
        } else if (std::optional<MPI_Comm> joiner = replica_port.port->take(comm::said_ready)) {
          joiner_at_port = *joiner;
          values[0] = static_cast<std::int64_t>(RequestKind::kServeJoiner);
          values[1] = static_cast<std::int64_t>(version);
        }
      }
      if (values[0] == 0) {
        std::int64_t request[2] = {0, 0};
        const Status taken = requests.take(world, roles.trainer_leader, request);
        if (!taken) return failed(give_up(taken, ""));
        values[0] = request[0];
        values[1] = request[1];
      }
    }
    Status status = group->step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(values), waiter(),
                                who() + ": the engine's poll_requests step");
    if (!status) {
      if (receiving != 0) (void)acknowledge(receiving, status);
      return failed(status);
    }

    // A staged version that every rank has complete is installed first.
    if (receiving != 0 && values[2] == 0) {
      // A request to serve a joiner (the only one that comes while a version arrives) waits for this install.
      if (static_cast<RequestKind>(values[0]) == RequestKind::kServeJoiner) {
        if (values[1] == 0) (void)serve(true);  // a linked joiner let go (nothing waits for the install)
        else joiner_waits = static_cast<std::uint64_t>(values[1]);
      }
      const std::uint64_t v = receiving;
      receiving = 0;
      staged_done = false;
      return install(v, false);
    }

    const auto kind = static_cast<RequestKind>(values[0]);
    const auto v = static_cast<std::uint64_t>(values[1]);
    switch (kind) {
      case RequestKind::kNone:
        if (receiving != 0 && values[3] > 0)  // the slowest rank's interval: every rank computes the same count
          polls_to_skip = static_cast<int>(std::clamp(receiving_step / (static_cast<double>(values[3]) * 1e-6) - 1, 0.0, 1000.0));
        return {receiving != 0 ? PollResult::Event::kReceiving : PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kConnect: {
        if (connection) return failed(Status(ErrorCode::kInvalidArgument, who() + ": a second connect request"));
        try {
          connect(nullptr, kept_probe ? &*kept_probe : nullptr, nullptr, prestaged.get());
          prestaged.reset();  // the connect's staging shares its memory, where it stages
        } catch (const Error& error) {
          if (catch_up_comm != MPI_COMM_NULL) comm::abandon_link(catch_up_comm);  // the replica gives up on it
          if (replica_leaders != MPI_COMM_NULL) comm::abandon_link(replica_leaders);
          return failed(error.status());
        }
        if (catch_up_comm != MPI_COMM_NULL || from_replica) first_version();
        release_join_spares();
        // Served by a replica before the take: kConnected and that version were said then.
        if (std::exchange(kept_probe, std::nullopt)) return {PollResult::Event::kNone, version, Status::ok()};
        return {PollResult::Event::kConnected, version, Status::ok()};
      }
      case RequestKind::kUpdate: {
        // After a loss on the fleet link the trainers re-send the version in flight: an engine that holds it
        // takes part as the new plan routes it, and installs nothing new.
        if (std::exchange(resending, false) && v == version && v > 0) quiet = v;
        if (!connection || receiving != 0 || (v <= version && v != quiet)) {
          status = Status(ErrorCode::kInternal, who() + ": update request for version " + std::to_string(v) +
                                                    (connection ? " while at version " + std::to_string(version) : " before connect"));
          (void)acknowledge(v, status);
          return failed(status);
        }
        if (!stages(options, false)) return install(v, true);
        receiving = v;
        staged_done = false;
        polls_to_skip = 0;
        faults->set_activity(group->first_incomplete(), who() + ": receiving version " + std::to_string(v) + " (staged)");
        start_background(v);
        return {PollResult::Event::kReceiving, version, Status::ok()};
      }
      case RequestKind::kBeReplica:
        if (!replica_port.open && link != MPI_COMM_NULL) open_replica_port();
        if (replica_port.open) prepare_for_joiners(*this, network_links);
        return {receiving != 0 ? PollResult::Event::kReceiving : PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kMeetJoiner:  // the fleet link: the leader connects to the joiner's port (W2)
        if (Status met = roles.leader ? meet_joiner(world, roles.trainer_leader, options.join_address,
                                                    join_answer_seconds(options.timeout_seconds))
                                      : Status::ok();
            !met) {
          WB_LOG(kWarn) << who() << ": " << met.message();
        }
        return {PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kLeaveOut:  // every worker: the fleet link rebuilt without a job silent at a joiner's port (W3)
        leave_out = true;
        return {PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kWiden:  // every worker: the fleet link widened with the joiner, re-linked onto (W4-W7)
        try {
          const MPI_Comm merged = comm::widen_join(link, MPI_COMM_NULL, false, options.timeout_seconds,
                                                   who() + ": widening the fleet link with a joiner");
          relink_to = cut_widening(merged, JoinSide::kTrainer, options.timeout_seconds).link;
        } catch (const Error& error) {
          return failed(error.status());
        }
        return {PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kServeJoiner:
        if (fleet_link_enabled()) return serve(values[1] == 0);  // from this engine's own port (above): at once
        joiner_waits = v;
        return {receiving != 0 ? PollResult::Event::kReceiving : PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kShutdown:
        if (!connection)
          return failed(Status(ErrorCode::kInvalidArgument,
                               who() + ": the trainers shut down before connect (SenderAdapter::shutdown or its "
                                       "destruction without connect): this engine never received weights"));
        shut_down = true;
        return {PollResult::Event::kShutdown, version, Status::ok()};
      case RequestKind::kAbort: {
        // The trainers announced why before they sent this; the notice may still be on its way here.
        Status why;
        comm::Backoff backoff;
        for (const double until = comm::local_seconds() + std::min(1.0, 0.5 * options.timeout_seconds);
             (why = faults->poll()).is_ok() && comm::local_seconds() < until;)
          backoff.pause();
        if (why) why = Status(ErrorCode::kInternal, who() + ": the trainers shut down after a failure");
        return failed(why);
      }
    }
    return failed(Status(ErrorCode::kCorruptData, who() + ": unknown request kind " + std::to_string(values[0])));
  }
};

ReceiverAdapter::ReceiverAdapter(MPI_Comm world, MPI_Comm engine_comm, ParameterSet params, LoadWeightsFn load_weights,
                                 AdapterOptions options, BeforeUpdateHook before_update_hook) {
  const ResolvedOptions resolved = resolve_options(options);
  JoinedComms joined{world, MPI_COMM_NULL};
  std::shared_ptr<SpareTransports> spares;
  // An engine job of its own joins the trainers at the address first: its link is its adapter's world. The
  // transports of its two links (with the trainers, and the catch-up from a replica) open meanwhile.
  if (!resolved.join_address.empty()) {
    spares = std::make_shared<SpareTransports>(resolved.transport);
    spares->prepare(2);
    if (!fleet_link_enabled()) {
      joined = join_trainers(engine_comm, resolved.join_address, resolved.timeout_seconds);
    } else {
      // On the fleet link a joiner that a replica served serves that version at once; it is admitted at
      // the trainers' port meanwhile (a thread) and taken at their next send_weights (poll_pending). Any
      // other joiner waits here to be taken, and its first version is the trainers' next.
      auto early = std::make_unique<Pending>();
      double probe_seconds = 0;
      const bool served = caught_up_before_take(engine_comm, params, load_weights, options, before_update_hook, resolved, spares,
                                                early->version, early->probed, early->stall, probe_seconds,
                                                early->summary.replica_wait_seconds);
      early->summary.longest_probe_seconds = probe_seconds;  // the probe before the copy (on its link: 0)
      if (served) {
        early->begin(engine_comm, std::move(params), std::move(load_weights), std::move(options), std::move(before_update_hook),
                     std::move(spares), resolved, *poll_interval_setting * 1e-6);
        pending_ = std::move(early);
        return;
      }
      joined = taken_by_trainers(engine_comm, admit_at_trainers(engine_comm, resolved.join_address, resolved.timeout_seconds),
                                 resolved.join_address, resolved.timeout_seconds);
    }
  }
  state_ = std::make_unique<State>(joined, engine_comm, std::move(params), std::move(load_weights), options,
                                   std::move(before_update_hook));
  state_->spares = std::move(spares);
}

// Taken (poll_pending): this engine's state over the trainers' link, holding the replica's version; it
// connects with the map probed on the catch-up link when trainer 0's kConnect comes.
PollResult ReceiverAdapter::adopt_pending(MPI_Comm link) {
  Pending& p = *pending_;
  std::unique_ptr<State> taken;
  try {
    taken = std::make_unique<State>(JoinedComms{link}, p.engine, p.params, p.load_weights, p.options, p.hook);
  } catch (const Error& error) {
    return p.failed(error.status());
  }
  taken->spares = p.spares;
  taken->version = taken->reported = p.version;
  taken->stalls.push_back(p.stall);
  taken->history.push_back({p.version, 0, true, {}, {}});
  taken->kept_probe = std::move(p.probed);
  if (p.prestaging.valid()) {
    try {
      taken->prestaged = p.prestaging.get();
    } catch (const std::exception&) {  // the connect makes its own, and says why where it cannot either
    }
  }
  state_ = std::move(taken);
  pending_.reset();
  return {PollResult::Event::kNone, state_->version, Status::ok()};
}

ReceiverAdapter::~ReceiverAdapter() {
  if (pending_) {
    leave();  // not taken yet: its admission is let go (the trainers' take then finds it gone)
    return;
  }
  if (state_ && state_->link != MPI_COMM_NULL && std::uncaught_exceptions() == 0) {
    leave();
    return;
  }
  if (state_)
    state_->announce_departure(std::uncaught_exceptions() > 0
                                   ? "its ReceiverAdapter was destroyed by an exception"
                                   : "its ReceiverAdapter was destroyed before the trainers shut down");
}

void ReceiverAdapter::leave() {
  if (pending_) {
    Pending& p = *pending_;
    p.let_go();
    p.left = true;
    return;
  }
  State& s = *state_;
  if (s.link == MPI_COMM_NULL)
    throw Error(ErrorCode::kUnsupported, s.who() + ": leave() is for an engine job that joined by address; an engine "
                                                   "of the trainers' world cannot leave without ending the job");
  if (s.shut_down || !s.failure.is_ok()) return;
  // Together: the poll that returned kInstalled may return on one worker while another still ends that
  // install (the engine's stall sum), and a departure announced then would fail the install there.
  if (Status together = s.group->step(Status::ok(), s.waiter(), s.who() + ": leaving (every worker of the engine calls leave())");
      !together) {
    WB_LOG(kWarn) << s.who() << ": leaving alone: " << together.message();
  }
  s.announce_departure(std::string("its engine ") + kLeftBetweenUpdates + " (ReceiverAdapter::leave or its destruction)");
  s.left = true;
  s.shut_down = true;
}

// The fleet link widened with a joiner (W5-W7 of docs/architecture.md): this engine's state constructed
// over the widened link and connected with its kept source map (rank 0 of the link plans one plan), its
// version, history and stalls carried over; the old link is parted as the trainers part theirs.
PollResult ReceiverAdapter::relink() {
  State& old = *state_;
  const MPI_Comm widened = std::exchange(old.relink_to, MPI_COMM_NULL);
  std::unique_ptr<State> fresh;
  try {
    fresh = std::make_unique<State>(JoinedComms{widened}, old.group_comm, old.params, old.load_weights, old.given, old.hook);
    fresh->spares = old.spares;
    fresh->connect(nullptr, &old.connection->probed, &*old.connection, old.thread.idle() ? &old.connection->staging : nullptr);
  } catch (const Error& error) {
    if (!fresh) comm::abandon_link(widened);
    return old.failed(error.status());
  }
  carry_over(old, *fresh);
  fresh->network_links = old.network_links;
  fresh->take_replica_port(old);
  old.shut_down = true;
  state_ = std::move(fresh);  // the old state's end parts its communicators
  return {PollResult::Event::kNone, state_->version, Status::ok()};
}

// An update that failed on the fleet link (L2-L5 of docs/architecture.md): this engine tells trainer 0 it is
// alive and which version it holds; when the trainers keep it, the survivors' link is rebuilt and this
// engine re-linked onto it with its kept source map (the old state abandoned with the lost job's link). The
// trainers then re-send the version it misses. No verdict (the trainers are gone, or left it out): `failed`.
PollResult ReceiverAdapter::rejoin(const PollResult& failed) {
  State& old = *state_;
  old.rejoin_tried = true;
  EngineRebuild made;
  std::unique_ptr<State> fresh;
  try {
    made = rejoin_fleet(old, old.version);
    if (made.rebuilt == MPI_COMM_NULL) return failed;
    fresh = std::make_unique<State>(JoinedComms{made.rebuilt}, made.engine, old.params, old.load_weights, old.given, old.hook);
    fresh->spares = old.spares;
    // The old link's staging pages, unless its transfer still runs and may assemble into them.
    fresh->connect(nullptr, &old.connection->probed, nullptr, old.thread.idle() ? &old.connection->staging : nullptr);
  } catch (const Error& error) {
    if (!fresh && made.rebuilt != MPI_COMM_NULL) comm::abandon_link(made.rebuilt);
    if (old.roles.leader) {
      WB_LOG(kWarn) << old.who() << ": rejoining the fleet link after a loss failed: " << error.status().message();
    }
    return failed;
  }
  carry_over(old, *fresh);
  fresh->take_replica_port(old);
  fresh->resending = true;
  fresh->reported = old.reported;
  if (old.roles.leader) {
    WB_LOG(kInfo) << old.who() << ": the fleet link lost an engine job; rebuilt from the survivors (holding version "
                  << old.version << "): " << failed.status.message();
  }
  old.abandon_link_comms();  // it spans the lost job: never waited on again, kept with its buffers
  old.release_staging_if_idle();  // its hold on the pages it may share with the rebuilt link's staging
  comm::keep_alive(std::shared_ptr<State>(state_.release()));
  state_ = std::move(fresh);
  // A failure after the install completed (summing the engine's stalls): the version is in, said now.
  if (state_->version > state_->reported) return {PollResult::Event::kInstalled, state_->version, Status::ok()};
  return {PollResult::Event::kNone, state_->version, Status::ok()};
}

PollResult ReceiverAdapter::poll_requests(void* cuda_stream) {
  if (pending_) return poll_pending();
  state_->cuda_stream = cuda_stream;
  state_->pace.before_step();
  PollResult result = state_->poll();
  if (state_->relink_to != MPI_COMM_NULL) result = relink();
  if (std::exchange(state_->leave_out, false)) {
    // W3: a job of the fleet link did not meet a joiner's port; the others rebuild the link without it, as
    // after a loss. Left out itself (stopped past the meeting, and resumed), this engine fails, saying so.
    result = rejoin({PollResult::Event::kFailed, state_->version,
                     Status(ErrorCode::kTimeout, "a job of the fleet link did not meet a joining engine's port (stopped or gone "
                                                 "between updates); the trainers left it out")});
    if (result.event == PollResult::Event::kFailed)
      result = state_->failed(Status(ErrorCode::kTimeout, state_->who() + ": the trainers left this engine job out of the fleet "
                                                                          "link: it did not meet a joining engine's port in time "
                                                                          "(stopped or too slow); the training goes on without it"));
  }
  if ((result.event == PollResult::Event::kFailed || result.event == PollResult::Event::kAborted) && state_->link != MPI_COMM_NULL &&
      fleet_link_enabled() && !state_->left && !state_->rejoin_tried)
    result = rejoin(result);
  if (result.event == PollResult::Event::kInstalled) state_->reported = result.version;
  state_->pace.after_step(result.event == PollResult::Event::kNone || result.event == PollResult::Event::kReceiving);
  return result;
}
std::uint64_t ReceiverAdapter::installed_version() const { return pending_ ? pending_->version : state_->version; }
bool ReceiverAdapter::connected() const { return pending_ ? pending_->said > 0 : state_->connection.has_value(); }
bool ReceiverAdapter::closed() const {
  if (pending_) return pending_->left || !pending_->failure.is_ok();
  return state_->shut_down || !state_->failure.is_ok();
}

const TransferSummary& ReceiverAdapter::summary() const {
  static const TransferSummary none;
  if (pending_) return pending_->summary;
  return state_ && state_->connection ? state_->connection->summary : none;
}

AdapterStats ReceiverAdapter::stats() const {
  if (!pending_) return state_->stats();
  AdapterStats out;
  out.version = pending_->version;
  out.stalls = {pending_->stall};
  out.history = {{pending_->version, 0, true, {}, {}}};
  return out;
}

}  // namespace wb
