// The trainers' side of the fleet link (coord/fleet_link.hpp; docs/architecture.md, "Relays across engine
// jobs"): the re-link onto the fleet link widened with a joiner, and onto the one rebuilt after a loss.
#include <algorithm>

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
  link->connect(&checkpoint_tensors, &connection->probed, widened ? &*widened->connection : nullptr);
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
                  << link->connection->summary.connect_seconds << " s)";
  }
  if (widened) {
    widened->shut_down = true;  // its end parts its communicators with the fleet's engines, which re-linked too
    joined.back() = std::move(link);
  } else {
    joined.push_back(std::move(link));
  }
}

// The fleet link failed an update (L3-L7 of docs/architecture.md): the survivors' link is rebuilt and
// re-connected with the kept maps, and the version that failed (the old link's) is re-sent to the engines
// that do not hold it (resend_fleet). `target`: the version of the call that met the loss (0: wait or
// shutdown). Not ok when the link was dropped instead (no engine alive, or the rebuild failed).
Status SenderAdapter::State::recover_fleet(std::size_t k, const Status& cause, std::uint64_t target) {
  State& old = *joined[k];
  const std::uint64_t v = old.version;  // in flight, or the last one sent
  std::unique_ptr<State> link;
  FleetVerdict verdict;
  try {
    verdict = rebuild_fleet(old, group_comm, ++fleet_rebuilds, join_answer_seconds(options.timeout_seconds));
    if (verdict.rebuilt == MPI_COMM_NULL) {
      drop(k, cause);
      return cause;
    }
    link = std::make_unique<State>(verdict.rebuilt, group_comm, params, checkpoint_tensors, load_weights, given);
    link->link = verdict.rebuilt;
    link->stage_whole = true;
    link->spares = spares;  // the network transport kept opened for the next link
    link->connect(&checkpoint_tensors, &connection->probed);
  } catch (const Error& error) {
    drop(k, error.status());
    return error.status();
  }
  link->announce_prefix = old.announce_prefix;
  carry_over(old, *link);
  std::erase_if(link->history, [v](const UpdateRecord& r) { return r.version == v; });
  std::string why = cause.message();
  if (why.starts_with(old.announce_prefix)) why.erase(0, old.announce_prefix.size());
  std::uint64_t held = v;
  for (std::size_t e = 0; e < verdict.held.size(); ++e) {
    const JoinedEngine& r = old.fleet_records[e];
    const std::string name = fleet_name(r, old.roles.engines[e].size());
    if (verdict.held[e] >= 0) {
      link->fleet_records.push_back(r);
      held = std::min(held, static_cast<std::uint64_t>(verdict.held[e]));
      continue;
    }
    // An engine that left (ReceiverAdapter::leave) sends no note either: it is left out the same way.
    const bool left = is_leave(cause);
    fleet_lost.push_back({name, left ? "left" : "dropped", old.acknowledged, why, r.connect_seconds, r.probe_seconds,
                          r.first_install_seconds});
    if (roles.leader && left) {
      WB_LOG(kInfo) << name << " left the fleet link after version " << old.acknowledged
                    << "; the link is rebuilt from the others, and the training goes on without it";
    } else if (roles.leader) {
      WB_LOG(kWarn) << who() << ": " << name << " was lost in version " << v
                    << "; the fleet link is rebuilt from the survivors, and the training goes on without it: " << why;
    }
  }
  link->version = link->acknowledged = held;
  link->joined_after = old.joined_after;
  std::shared_ptr<State> lost(joined[k].release());  // read by the resend (its staging), then kept alive
  joined[k] = std::move(link);
  const Status resent = held < v ? resend_fleet(*joined[k], *lost, v, target) : Status::ok();
  lost->abandon_link_comms();  // it spans the lost job: never waited on again, kept with its buffers
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
