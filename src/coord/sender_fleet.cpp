// The trainers' side of the fleet link (coord/fleet_link.hpp; docs/architecture.md, "Relays across engine
// jobs"): the re-link onto the fleet link widened with a joiner, and onto the one rebuilt after a loss.
#include <algorithm>

#include "comm/join.hpp"
#include "comm/max_reduce.hpp"
#include "comm/operation.hpp"
#include "coord/fleet_link.hpp"
#include "coord/sender_state.hpp"
#include "core/log.hpp"

namespace wb {

using namespace coord;

// The fleet link widened with a joiner (`merged`, the fleet's engines in their order, the joiner last), or
// the first joiner's link: the trainers' state re-linked onto it, connected with their kept source map
// (the joiner probes; rank 0 plans one plan for every engine), and the old fleet link parted (W5-W7).
void SenderAdapter::State::relink_fleet(MPI_Comm merged, State* widened, double began) {
  std::unique_ptr<State> link;
  try {
    link = std::make_unique<State>(merged, group_comm, params, checkpoint_tensors, load_weights, given);
  } catch (const Error&) {
    comm::abandon_link(merged);
    throw;
  }
  link->link = merged;
  link->stage_whole = true;  // with sender staging: a resend after a loss reads the version from it
  link->announce_prefix = "the trainers dropped this engine job after a failure (the training goes on without it): ";
  link->spares = spares;
  const std::size_t kept = widened ? widened->roles.engine_leaders.size() : 0;
  if (roles.leader)
    for (std::size_t e = kept; e < link->roles.engine_leaders.size(); ++e)
      throw_if_error(link->send_request_to(link->roles.engine_leaders[e], RequestKind::kConnect, 0));
  // Every update of the widened link ended: the new one takes its transfer buffers and its staging's pages.
  link->connect(&checkpoint_tensors, &connection->probed, widened ? &*widened->connection : nullptr,
                widened ? &widened->connection->staging : nullptr);
  if (widened) {
    carry_over(*widened, *link);
    link->acknowledged = widened->acknowledged;
    link->fleet_records = widened->fleet_records;
  } else {
    link->version = link->acknowledged = version;
  }
  link->taken_at = began;
  link->joined_after = version;
  link->connect_seconds = comm::local_seconds() - began;
  for (std::size_t e = kept; e < link->roles.engine_leaders.size(); ++e)
    link->fleet_records.push_back({version, link->connect_seconds, link->connection->summary.probe_seconds, 0.0, fleet_joins++});
  if (roles.leader) {
    WB_LOG(kInfo) << "an engine job of " << link->roles.engines.back().size() << " worker(s) joined the fleet link after version "
                  << version << " (" << link->roles.engine_leaders.size() << " engines on one plan, connect "
                  << link->connection->summary.connect_seconds << " s"
                  << (left_out_at > 0 ? "; widened and re-connected " + comm::seconds_text(comm::local_seconds() - left_out_at) +
                                            " after the leave-out"
                                      : std::string())
                  << ")";
  }
  left_out_at = 0;
  appoint_fleet_replica(*link);
  if (widened) {
    widened->shut_down = true;  // its end parts its communicators with the fleet's engines, which re-linked too
    joined.back() = std::move(link);
  } else {
    joined.push_back(std::move(link));
  }
}

void SenderAdapter::State::appoint_fleet_replica(State& link) {
  if (!roles.leader || options.join_address.empty()) return;
  const int chosen = fleet_replica_candidate(link.roles);
  const int id = chosen >= 0 ? link.fleet_records[static_cast<std::size_t>(chosen)].id : -1;
  if (id == fleet_replica) return;
  // The last one is gone (lost, left, or left out): a joiner must not find its address.
  if (fleet_replica >= 0) remove_replica_address(options.join_address);
  fleet_replica = -1;
  if (chosen >= 0 &&
      link.send_request_to(link.roles.engine_leaders[static_cast<std::size_t>(chosen)], RequestKind::kBeReplica, 0).is_ok())
    fleet_replica = id;
}

// W3 of docs/architecture.md: fleet jobs silent at a joiner's port (stopped or dead between updates) are
// left out before the joiner is taken. Trainer 0 asks the other engines of the fleet link to rejoin it
// (kLeaveOut; the silent ones are told once the join is over, so that one resumed reads it was left out),
// trainer 1 knocks the joiner's port (its accept thread would wait for the missing leaders to the end of the
// joiner's process: a job of one worker cannot end it itself), and the survivors rebuild the link as after a
// loss (recover_fleet). The knock is bounded by the timeout (2-6 s under load, measured by the relay tests):
// one that fails gives up on the joiner only.
bool SenderAdapter::State::leave_out_fleet(std::vector<std::uint32_t> silent) {
  const double began = comm::local_seconds();
  const std::size_t k = joined.size() - 1;
  if (roles.leader)
    for (std::size_t e = 0; e < silent.size(); ++e)
      if (silent[e] == 0) (void)joined[k]->send_request_to(joined[k]->roles.engine_leaders[e], RequestKind::kLeaveOut, 0);
  bool knocked = true;
  int trainer = 0;
  WB_CHECK_MPI(MPI_Comm_rank(group_comm, &trainer));
  if (trainer == 1) {
    const std::string address = fleet_address(options.join_address);
    try {
      knocked = comm::knock(comm::read_address_file(address), options.timeout_seconds);
    } catch (const Error&) {
      knocked = false;  // the joiner is gone (its port closed)
    }
    if (!knocked) {
      WB_LOG(kWarn) << who() << ": knocking at a joiner's port (" << address << ") failed or did not complete within "
                    << comm::seconds_text(options.timeout_seconds) << "; the joiner is not taken, and the training goes on without it";
    }
  }
  std::int64_t values[comm::Group::kValues] = {knocked ? 0 : 1, 0, 0, 0};
  comm::Waiter longer = waiter();  // trainer 1 may knock up to the timeout before this step
  longer.timeout = 2 * options.timeout_seconds;
  throw_if_error(group->step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(values), longer,
                             "send_weights: whether a joiner's port was knocked"));
  const double knock_seconds = comm::local_seconds() - began;  // trainer 1's knock, as every trainer waited for it
  const Status cause(ErrorCode::kTimeout, "it did not meet a joining engine's port within " +
                                              comm::seconds_text(join_answer_seconds(options.timeout_seconds)) +
                                              " (stopped or gone between updates)");
  const bool rebuilt = recover_fleet(k, cause, 0, &silent).is_ok();
  left_out_at = comm::local_seconds();
  if (roles.leader) {
    WB_LOG(kInfo) << "trainer 0: the fleet link's silent jobs left out before a join in " << comm::seconds_text(left_out_at - began)
                  << " (trainer 1's knock " << comm::seconds_text(knock_seconds) << ", the rebuild and re-connect "
                  << comm::seconds_text(left_out_at - began - knock_seconds) << (rebuilt ? ")" : "; no engine left on it)");
  }
  return values[0] == 0;
}

SenderAdapter::State::Rebuilt SenderAdapter::State::rebuild_survivors(const State& base, const State& old, int tag,
                                                                     const std::vector<std::uint32_t>* silent) {
  Rebuilt r;
  r.verdict = rebuild_fleet(old, base.group_comm, tag, join_answer_seconds(base.options.timeout_seconds),
                            silent ? *silent : std::vector<std::uint32_t>{});
  if (r.verdict.rebuilt == MPI_COMM_NULL) return r;  // no engine left on it
  r.link = std::make_unique<State>(r.verdict.rebuilt, base.group_comm, base.params, base.checkpoint_tensors, base.load_weights,
                                   base.given);
  State& link = *r.link;
  link.link = r.verdict.rebuilt;
  link.stage_whole = true;
  link.spares = base.spares;  // the network transport kept opened for the next link
  // On the lost link's staging pages (no new ones faulted in), which keep the version a resend reads: a
  // transfer of the lost link still running only reads them, and sends over a link nobody installs from.
  link.connect(&base.checkpoint_tensors, &base.connection->probed, nullptr, &old.connection->staging);
  link.announce_prefix = old.announce_prefix;
  carry_over(old, link);
  const std::uint64_t v = old.version;  // in flight, or the last one sent
  if (silent == nullptr) std::erase_if(link.history, [v](const UpdateRecord& record) { return record.version == v; });
  r.held = v;
  for (std::size_t e = 0; e < r.verdict.held.size(); ++e)
    if (r.verdict.held[e] >= 0) {
      link.fleet_records.push_back(old.fleet_records[e]);
      r.held = std::min(r.held, static_cast<std::uint64_t>(r.verdict.held[e]));
    }
  link.version = link.acknowledged = r.held;
  link.joined_after = old.joined_after;
  link.rebuild_tag = tag + 1;  // a loss of its resend behind send_weights: the rebuild after this one
  return r;
}

Status SenderAdapter::State::rebuild_behind(Status done) {
  const std::uint64_t v = background_version;
  // The transfer's own failure is named by its version, as the next call's claim names it.
  const std::string context = done ? std::string() : "version " + std::to_string(v) + ": ";
  // Trainer 0 takes the engines' acknowledgements here too: a loss that only they show (an engine's own
  // exchange with a dead one, once the trainers' writes were done) is answered at once as well.
  if (done && roles.leader) {
    done = collect_acknowledgements(v);
    acknowledged_behind = done.is_ok();
  }
  if (!done) {
    // Now, not at the next call (the channel takes both threads): the engines and the other trainers hear
    // of it, and the rebuild does not wait for the note of a peer a write found gone.
    announce_failure(Status(done.code(), context + done.message()));
  }
  // Every trainer, whatever its own transfer did (one may complete while another meets the loss). Over this
  // link's communicator of the trainers: the trainers' own may be in a step of the next call meanwhile.
  std::uint32_t outcome[2] = {done ? 0u : 1u, is_leave(done) ? 1u : 0u};
  const Status agreed = comm::reduce_max(outcome, group_comm, comm::Waiter{4 * options.timeout_seconds, {}},
                                         about(v) + ": whether the fleet link failed (behind send_weights)");
  if (!agreed || outcome[0] == 0) return done;  // no agreement: the next call answers it as before
  const double began = comm::local_seconds();
  Rebuilt r;
  try {
    r = rebuild_survivors(*this, *this, rebuild_tag, nullptr);
    if (r.link && r.held < v) r.resent = resend_fleet(*r.link, *this, v, 0);
  } catch (const Error& error) {
    r.error = error.status();
  }
  const Status agreed_cause = done ? Status(ErrorCode::kInternal, about(v) + ": another trainer met the fleet link's failure") : done;
  if (r.link) {
    // Said when it happens (the records in stats() follow at the next call, which adopts the link: that
    // one does not say it again).
    const bool resent = r.resent && r.resent->is_ok();
    say_lost(*this, r.verdict, agreed_cause, false,
             " behind send_weights (in " + comm::seconds_text(comm::local_seconds() - began) + (resent ? ", the version re-sent" : "") + ")");
  }
  rebuilt_behind = std::move(r);
  return agreed_cause;
}

std::string SenderAdapter::State::lost_cause(const State& old, const Status& cause) {
  std::string why = cause.message();
  if (why.starts_with(old.announce_prefix)) why.erase(0, old.announce_prefix.size());
  return why;
}

void SenderAdapter::State::say_lost(const State& old, const FleetVerdict& verdict, const Status& cause, bool at_join,
                                    const std::string& rebuilt) const {
  if (!roles.leader) return;
  const std::string why = lost_cause(old, cause);
  for (std::size_t e = 0; e < verdict.held.size(); ++e) {
    if (verdict.held[e] >= 0) continue;
    const std::string name = fleet_name(old.fleet_records[e], old.roles.engines[e].size());
    if (is_leave(cause)) {
      WB_LOG(kInfo) << name << " left the fleet link after version " << old.acknowledged
                    << "; the link is rebuilt from the others" << rebuilt << ", and the training goes on without it";
    } else if (at_join) {
      WB_LOG(kWarn) << who() << ": " << name << " was left out of the fleet link after version " << old.version
                    << " before a join (the link is rebuilt from the others, and the training goes on without it): " << why;
    } else {
      WB_LOG(kWarn) << who() << ": " << name << " was lost in version " << old.version << "; the fleet link is rebuilt from the survivors"
                    << rebuilt << ", and the training goes on without it: " << why;
    }
  }
}

// The fleet link failed an update (L3-L7 of docs/architecture.md): the survivors' link is rebuilt and
// re-connected with the kept maps, and the version that failed (the old link's) is re-sent to the engines
// that do not hold it (resend_fleet); where the link's thread did both behind the last call, that is
// adopted. `target`: the version of the call that met the loss (0: wait or shutdown). Not ok when the link
// was dropped instead (no engine alive, or the rebuild failed).
Status SenderAdapter::State::recover_fleet(std::size_t k, const Status& cause, std::uint64_t target,
                                           const std::vector<std::uint32_t>* silent) {
  State& old = *joined[k];
  const std::uint64_t v = old.version;  // in flight, or the last one sent
  const bool at_join = silent != nullptr;  // W3: no update failed
  if (!old.thread.wait_finished(kSettleTimeouts * options.timeout_seconds)) {
    drop(k, cause);  // a rebuild behind still running: not a second one beside it
    return cause;
  }
  ++fleet_rebuilds;
  Rebuilt r;
  const bool behind = old.rebuilt_behind.has_value();  // its lost engines were named when it was made
  if (behind) {
    r = std::move(*old.rebuilt_behind);
    old.rebuilt_behind.reset();
  } else {
    try {
      r = rebuild_survivors(*this, old, fleet_rebuilds, silent);
    } catch (const Error& error) {
      r.error = error.status();
    }
  }
  if (!r.error.is_ok()) {
    drop(k, r.error);
    return r.error;
  }
  if (r.verdict.rebuilt == MPI_COMM_NULL) {
    drop(k, cause);  // no engine left on it (the joiner then starts a fleet link of its own)
    if (at_join) {
      after_join = [this, &old, verdict = r.verdict] {
        if (roles.leader) tell_left_out(old, verdict);
      };
    }
    return cause;
  }
  const std::string why = lost_cause(old, cause);
  for (std::size_t e = 0; e < r.verdict.held.size(); ++e) {
    if (r.verdict.held[e] >= 0) continue;
    const JoinedEngine& record = old.fleet_records[e];
    // An engine that left (ReceiverAdapter::leave) sends no note either: it is left out the same way.
    fleet_lost.push_back({fleet_name(record, old.roles.engines[e].size()), is_leave(cause) ? "left" : "dropped", old.acknowledged,
                          why, record.connect_seconds, record.probe_seconds, record.first_install_seconds});
  }
  if (!behind) say_lost(old, r.verdict, cause, at_join, "");
  const FleetVerdict verdict = r.verdict;
  std::shared_ptr<State> lost(joined[k].release());  // read by the resend (its staging), then kept alive
  joined[k] = std::move(r.link);
  const Status resent = r.resent ? *r.resent : r.held < v ? resend_fleet(*joined[k], *lost, v, target) : Status::ok();
  if (resent) appoint_fleet_replica(*joined[k]);
  // It spans the lost job: never waited on again, kept with its buffers; left out at a join, that job is
  // told over it once the join is over.
  if (at_join) {
    after_join = [this, lost, verdict] {
      if (roles.leader) tell_left_out(*lost, verdict);
      lost->abandon_link_comms();
    };
  } else {
    lost->abandon_link_comms();
  }
  // The lost link's hold on the staging: the rebuilt link's from here (a trainer kept a staging of every
  // parameter per loss before).
  lost->release_staging_if_idle();
  comm::keep_alive(lost);
  if (!resent) drop(k, resent);
  return resent;
}

// The resend of version v on the rebuilt fleet link: every engine takes part as the new plan routes it, the
// holders install nothing new. The trainers hold v where the call that met the loss is v's own, or where
// they stage (the old link's staging, when it covers every byte the new plan reads, host memory); otherwise
// the engines that miss v get the next version instead (said once).
Status SenderAdapter::State::resend_fleet(State& link, const State& old, std::uint64_t v, std::uint64_t target) {
  const Staging& was = old.connection->staging;
  const bool staged = options.sender_staging && !params.empty() && params[0].view.memory == MemoryKind::kHost &&
                      was.covers(link.connection->staging);
  if (target != v && !staged) {
    if (roles.leader) {
      WB_LOG(kWarn) << who() << ": version " << v << " cannot be re-sent after the loss (the trainers no longer hold it: "
                    << "sender staging keeps it); the fleet link's engines that miss it get the next version";
    }
    link.version = link.acknowledged = v;
    return Status::ok();
  }
  if (target == v) return link.send(v, nullptr);
  ParameterSet held;  // views of the old staging, which still holds v
  const ParameterMemory memory = was.memory(params);
  for (std::size_t p = 0; p < params.size(); ++p) {
    TensorView view = params[p].view;
    view.data = memory.data[p];
    held.add(params[p].name, view);
  }
  std::swap(link.params, held);
  const Status sent = link.send(v, nullptr);  // the staging is copied before it returns
  std::swap(link.params, held);
  return sent;
}

}  // namespace wb
