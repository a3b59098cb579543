#include "coord/fleet_link.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "comm/deadline.hpp"
#include "comm/max_reduce.hpp"
#include "comm/operation.hpp"
#include "coord/adapter_common.hpp"
#include "coord/join_links.hpp"
#include "coord/messages.hpp"
#include "core/checks.hpp"
#include "core/laps.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"

namespace wb::coord {
namespace {

// On by default: the one plan over every joined engine meets issue 31's measured goals, per-job links do not
// (the figures in the doc; docs/architecture.md, "Relays across engine jobs").
Setting<bool> fleet_link_setting("fleet_link", true,
                                 "Engines as jobs of their own: the joined engine jobs share one link with the trainers, "
                                 "planned as one plan (the trainers write one model copy per update whatever the number of "
                                 "joined jobs; relay trees run across jobs); a job lost in an update is left out by "
                                 "rebuilding the link from the survivors, and the version re-sent. On the emulated cluster: "
                                 "joins 1.12/1.17 x T_min after the probe, updates after a loss 1.079 x (per-job links: "
                                 "a copy per job, 2.44 x with two). A joiner's first version is the fleet's replica's, "
                                 "before the take (fleet_replica), else the trainers' next. 0: a "
                                 "link per joined job, a joiner's first version from a replica that holds the latest. Set "
                                 "it alike on the trainers and every engine job. With sender staging a trainer on the fleet "
                                 "link stages all of its parameters.");

// W4 of docs/architecture.md: what a joiner gains is serving from its arrival, not from the trainers' next
// send_weights; what it costs is the replica's engine answering no request while it writes. On by default
// since that cost came down to the one plan's own cost of a join (emulated cluster, 208 MB, 1 Gbit/s, sync:
// the copy 2.5-3.0 s, a joiner's probe no longer on it and its link's transports opened ahead; an update
// meeting it +1.9-2.6 s, the take +1.2-1.9 s, against +2.3-4.3 s for the take without a replica; figures
// in the README).
Setting<bool> fleet_replica_setting("fleet_replica", true,
                                    "Engines as jobs of their own, on the fleet link (trainers' setting): 1: the link's first "
                                    "engine job of two workers or more is its replica, and writes a joiner the version it "
                                    "holds before the trainers take it, so the joiner serves at once (the replica's engine "
                                    "answers no request while it writes: the trainers' next update may wait up to that copy). "
                                    "0: no replica; a joiner's first version is the trainers' next, within the send_weights "
                                    "that takes it.");

// Where the mode does not stage (sync, sender-staged) the replica's update is written into its parameters,
// so a joiner that knocked during it waited for its end (up to a T_min; with updates back to back nearly
// every knock) before the copy. Staged, the parameters hold the version before, whole, while the next one
// arrives, and the copy of that version starts at once (the joiner then skips the version in flight and
// gets the trainers' next, as every joiner served before its take). The trainers' sync call still waits for
// the replica's install, which is acknowledged after the copy from staging.
Setting<bool> replica_staging_setting("replica_staging", true,
                                      "Engines as jobs of their own, on the fleet link (engines' setting): 1: the fleet's "
                                      "replica engine receives every update into host staging, whatever the mode (a host "
                                      "copy of its parameters), so that a joiner that knocks during an update is written the "
                                      "version before at once. 0: it "
                                      "receives as the mode says, and such a joiner waits for the update's end.");

// On the leaders' intercommunicator of a join (rank 0 on either side); comm/join.cpp's are 31001-31006.
constexpr int kOfferTag = 31010, kFleetAnswerTag = 31011;

Status send_count(MPI_Comm comm, int to, int tag, std::int64_t value) {
  comm::OperationPtr out = comm::make_operation(sizeof value);
  std::memcpy(out->out.data(), &value, sizeof value);
  WB_TRY_MPI(MPI_Isend(out->out.data(), 1, MPI_INT64_T, to, tag, comm, &out->request));
  comm::abandon(std::move(out));  // small, sent eagerly; a peer that is gone never takes it
  return Status::ok();
}

Status receive_count(MPI_Comm comm, int from, int tag, const comm::Waiter& waiter, const std::string& what, std::int64_t& value) {
  comm::OperationPtr in = comm::make_operation(0, sizeof value);
  WB_TRY_MPI(MPI_Irecv(in->in.data(), 1, MPI_INT64_T, from, tag, comm, &in->request));
  WB_RETURN_IF_ERROR(comm::wait_for(in, waiter, false, what));
  std::memcpy(&value, in->in.data(), sizeof value);
  return Status::ok();
}

}  // namespace

bool fleet_link_enabled() { return *fleet_link_setting; }
bool fleet_replica_enabled() { return *fleet_replica_setting; }
int fleet_replica_candidate(const Roles& roles) {
  if (!fleet_replica_enabled()) return -1;
  for (std::size_t e = 0; e < roles.engines.size(); ++e)
    if (roles.engines[e].size() >= 2) return static_cast<int>(e);
  return -1;
}

bool stages_as_fleet_replica(const Roles& roles) {
  if (roles.trainer || roles.engine < 0 || !fleet_link_enabled() || !*replica_staging_setting) return false;
  int level = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&level) != MPI_SUCCESS || level < MPI_THREAD_MULTIPLE) return false;
  return fleet_replica_candidate(roles) == roles.engine;
}

Status fleet_link_differs(bool offered) {
  return Status(ErrorCode::kInvalidArgument, offered ? "the trainers offered their fleet link, which this engine job does not "
                                                       "take: set fleet_link alike on every job"
                                                     : "the trainers took this engine without offering their fleet link: set "
                                                       "fleet_link alike on every job");
}

std::string fleet_address(const std::string& join_address) { return join_address + ".fleet"; }

bool offer_fleet(MPI_Comm leaders, std::int64_t jobs, double seconds) {
  std::int64_t opened = 0;
  if (!send_count(leaders, 0, kOfferTag, jobs)) return false;
  const Status answered =
      receive_count(leaders, 0, kFleetAnswerTag, comm::Waiter{seconds, {}}, "a joiner's answer to the fleet link's offer", opened);
  if (!answered || opened != 1) {
    // Unanswered: the joiner died since its admission (the vanish of a per-job take, worded alike), or it
    // does not run the fleet link.
    WB_LOG(kWarn) << "trainer 0: an admitted engine " << (answered ? "could not open its port for the joined jobs"
                                                                 : "did not answer when taken (the fleet link's offer, within " +
                                                                       comm::seconds_text(seconds) +
                                                                       ": gone, or fleet_link not set alike on both jobs)")
                  << "; it is not taken, and the training goes on without it";
    return false;
  }
  return true;
}

Status answer_fleet(MPI_Comm leaders, const std::string& join_address, double seconds, comm::AddressWatch& watch,
                    std::unique_ptr<comm::JoinPort>& port, std::int64_t& jobs) {
  // However long the trainers' training step: while their port lives, and they did not take this engine
  // without an offer (fleet_link not set on them).
  const comm::Waiter until_offered{comm::kNoDeadline, [&](bool) {
                                     return comm::take_began(leaders) ? fleet_link_differs(false) : watch.check();
                                   }};
  const Status offered = receive_count(leaders, 0, kOfferTag, until_offered, "the trainers' offer of the fleet link", jobs);
  if (!offered) return Status(offered.code(), "waiting for the trainers to take this engine onto their fleet link: " + offered.message());
  Status opened;
  if (jobs > 0) {
    const std::string path = fleet_address(join_address);
    std::remove(path.c_str());  // a joiner that died before closing its port left it; only one joiner holds it at a time
    try {
      port = std::make_unique<comm::JoinPort>(path, seconds, jobs);
    } catch (const Error& error) {
      opened = Status(error.code(), "opening a port for the joined engine jobs at " + path + ": " + error.status().message());
    }
  }
  WB_RETURN_IF_ERROR(send_count(leaders, 0, kFleetAnswerTag, opened ? 1 : 0));
  return opened;
}

bool fleet_offer_arrived(MPI_Comm leaders) {
  int found = 0;
  return MPI_Iprobe(0, kOfferTag, leaders, &found, MPI_STATUS_IGNORE) == MPI_SUCCESS && found != 0;
}

void close_fleet_port(std::unique_ptr<comm::JoinPort>& port, std::int64_t jobs, double seconds) {
  if (!port) return;
  comm::Backoff backoff;
  const double start = comm::local_seconds();
  for (std::int64_t taken = 0; taken < jobs && comm::local_seconds() - start < seconds;) {
    // Its accept thread ended early when a trainer knocked (a joined job left out before the take, W3):
    // what it admitted before is all there is.
    const bool ended = port->stopped();
    if (std::optional<MPI_Comm> peer = port->take()) {
      comm::abandon_link(*peer);
      ++taken;
      backoff.progressed();
    } else if (ended) {
      break;
    } else {
      backoff.pause();
    }
  }
  port.reset();  // its accept thread ended after the last admission (bounded wait otherwise)
}

Status meet_joiner(MPI_Comm world, int trainer_leader, const std::string& join_address, double seconds) {
  Status met;
  try {
    // Half of trainer 0's wait for this note: a joiner that died after it answered the offer leaves
    // MPI_Comm_connect waiting at its port (Open MPI 4.1: to the bound), and a note that came after trainer 0's
    // wait ended would have this live engine left out (W3) for the joiner's death, with trainer 1's knock
    // at the dead port spending the whole timeout (measured: elastic.fleet_ghost_engine.*). In time, it gives
    // up on the joiner instead. The other half covers the poll that takes the request and the note's way.
    comm::abandon_link(comm::join_by_address(fleet_address(join_address), 0.5 * seconds));
  } catch (const Error& error) {
    met = Status(error.code(), "meeting a joiner's port: " + error.status().message());
  }
  WB_RETURN_IF_ERROR(send_count(world, trainer_leader, kMetTag, met ? 1 : 0));
  return met;
}

Met joiner_met(MPI_Comm world, int leader, double seconds) {
  std::int64_t met = 0;
  if (!receive_count(world, leader, kMetTag, comm::Waiter{seconds, {}}, "a joined engine's note that it met the joiner", met))
    return Met::kSilent;
  return met == 1 ? Met::kMet : Met::kFailed;
}

bool meet_fleet(MPI_Comm leaders, const AdapterBase* fleet, double seconds, std::vector<std::uint32_t>& silent) {
  const std::vector<int> fleet_leaders = fleet ? fleet->roles.engine_leaders : std::vector<int>{};
  silent.assign(fleet_leaders.size(), 0);
  if (!offer_fleet(leaders, static_cast<std::int64_t>(fleet_leaders.size()), seconds)) return false;
  for (std::size_t e = 0; e < fleet_leaders.size(); ++e) {
    const int leader = fleet_leaders[e];
    // A request that cannot even be posted: that job is gone.
    const Met met = send_request(fleet->world, leader, RequestKind::kMeetJoiner, 0).is_ok() ? joiner_met(fleet->world, leader, seconds)
                                                                                           : Met::kSilent;
    if (met == Met::kFailed) {
      WB_LOG(kWarn) << "trainer 0: " << describe_worker(fleet->roles, leader)
                    << " could not meet the joiner's port; the joiner is not taken, and the training goes on without it";
      return false;
    }
    // A job silent between updates (stopped, or dead and not yet noticed) is left out first (W3); the
    // warning that names it comes with the rebuild.
    if (met == Met::kSilent) {
      silent[e] = 1;
      WB_LOG(kInfo) << "trainer 0: " << describe_worker(fleet->roles, leader) << " did not meet the joiner's port within "
                    << comm::seconds_text(seconds) << "; its job is left out of the fleet link before the joiner is taken";
    }
  }
  return true;
}

namespace {

// The verdict's bytes: the tag, then the survivors.
std::vector<std::int32_t> verdict_words(const FleetVerdict& verdict) {
  std::vector<std::int32_t> words = {verdict.tag};
  words.insert(words.end(), verdict.survivors.begin(), verdict.survivors.end());
  return words;
}

void send_words(MPI_Comm world, int to, const std::vector<std::int32_t>& words, int tag = kVerdictTag) {
  comm::OperationPtr op = comm::make_operation(words.size() * sizeof(std::int32_t));
  std::memcpy(op->out.data(), words.data(), op->out.size());
  if (MPI_Isend(op->out.data(), static_cast<int>(words.size()), MPI_INT32_T, to, tag, world, &op->request) == MPI_SUCCESS)
    comm::abandon(std::move(op));  // small, sent eagerly; a peer that is gone never takes it
}

// The verdict (or the go, `tag`) from `from`, within `seconds`; empty when none came.
std::vector<std::int32_t> receive_words(MPI_Comm world, int from, double seconds, int tag = kVerdictTag) {
  comm::Backoff backoff;
  for (const double start = comm::local_seconds(); comm::local_seconds() - start < seconds; backoff.pause()) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(from, tag, world, &found, &message, &status) != MPI_SUCCESS) return {};
    if (!found) continue;
    int count = 0;
    MPI_Get_count(&status, MPI_INT32_T, &count);
    std::vector<std::int32_t> words(static_cast<std::size_t>(std::max(count, 0)));
    if (MPI_Mrecv(words.data(), count, MPI_INT32_T, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) return {};
    return words;
  }
  return {};
}

std::vector<int> survivors_of(const Roles& roles, const std::vector<std::int64_t>& held) {
  std::vector<int> survivors = roles.trainers;
  for (std::size_t e = 0; e < held.size(); ++e)
    if (held[e] >= 0) survivors.insert(survivors.end(), roles.engines[e].begin(), roles.engines[e].end());
  return survivors;
}

// Trainers, after the verdict went out: every rank of the engines in it says it has it and enters the
// rebuild (kEnterTag), within `seconds` of trainer 0's first look; an engine one of whose ranks does not is
// left out, and the survivors that did are told who (kGoTag) and agreed over `trainers`. MPI_Comm_create_group
// waits for every member: one that never comes (a leader wedged inside MPI: Open MPI 4.1's TCP transport
// spinning in libevent after a write to the killed relay failed, on the emulated cluster) held every
// survivor's call to its bound, and a call given up on stays inside MPI, where it holds every later
// communicator made over a parent of a higher context id (Open MPI 4.1 makes one only while no creation
// over a lower parent is in flight).
void settle_survivors(const AdapterBase& old, MPI_Comm trainers, FleetVerdict& verdict, double seconds) {
  const Roles& roles = old.roles;
  if (roles.leader) {
    std::vector<std::vector<comm::OperationPtr>> enters(verdict.held.size());
    for (std::size_t e = 0; e < verdict.held.size(); ++e) {
      if (verdict.held[e] < 0) continue;
      for (int r : roles.engines[e]) {
        comm::OperationPtr in = comm::make_operation(0, sizeof(std::int64_t));
        WB_CHECK_MPI(MPI_Irecv(in->in.data(), 1, MPI_INT64_T, r, kEnterTag, old.world, &in->request));
        enters[e].push_back(std::move(in));
      }
    }
    const double start = comm::local_seconds();
    for (std::size_t e = 0; e < enters.size(); ++e)
      for (comm::OperationPtr& in : enters[e]) {
        const double left = std::max(0.0, seconds - (comm::local_seconds() - start));
        std::int64_t tag = -1;
        if (verdict.held[e] >= 0 && comm::wait_for(in, comm::Waiter{left, {}}, false, "an engine rank entering the rebuild").is_ok())
          std::memcpy(&tag, in->in.data(), sizeof tag);
        if (tag == verdict.tag) continue;
        if (verdict.held[e] >= 0) {
          verdict.held[e] = -1;
          WB_LOG(kWarn) << "trainer 0: " << describe_worker(roles, roles.engines[e].front())
                        << " answered after the loss but did not enter the fleet link's rebuild within "
                        << comm::seconds_text(seconds) << " (a rank of it stuck or gone); the link is rebuilt without it";
        }
        comm::abandon(std::move(in));  // never waited on again
      }
  }
  const comm::Waiter waiter{seconds + old.options.timeout_seconds, {}};
  comm::broadcast_fixed(std::as_writable_bytes(std::span(verdict.held)), 0, trainers, waiter, "the fleet link's survivors, entering");
  verdict.survivors = survivors_of(roles, verdict.held);
  // Only to the engines that came: a rank that did not may be dead, and a write to a killed process is what
  // wedged that leader (a left-out rank's own wait for this ends at its bound, and its failure stands).
  if (roles.leader)
    for (std::size_t e = 0; e < verdict.held.size(); ++e)
      if (verdict.held[e] >= 0)
        for (int r : roles.engines[e]) send_words(old.world, r, verdict_words(verdict), kGoTag);
}

}  // namespace

namespace {

// Per engine of `old`: 1 when this trainer learned in the failed update that it is lost: a rank of it did
// not answer a trace at a deadline (stopped or dead), a write to it failed, or it announced its own leave
// (the others pass it on). Then per engine again: 1 when it is sent nothing more: a write to one of its
// ranks failed (dead), or it left.
std::vector<std::uint32_t> found_lost(const AdapterBase& old) {
  const Roles& roles = old.roles;
  const FaultChannel::Heard heard = old.faults->heard();
  const std::size_t engines = roles.engines.size();
  std::vector<std::uint32_t> lost(2 * engines, 0);
  for (std::size_t e = 0; e < engines; ++e)
    for (int r : roles.engines[e]) {
      const auto w = static_cast<std::size_t>(r);
      if (w >= heard.silent.size()) continue;
      const bool left = heard.own[w] && is_leave(Status(ErrorCode::kInternal, heard.notice[w]));
      if (heard.silent[w] || left) lost[e] = 1;
      if (heard.write_failed[w] || left) lost[engines + e] = 1;  // sent nothing more (FaultChannel::note_job_gone)
    }
  return lost;
}

}  // namespace

FleetVerdict rebuild_fleet(const AdapterBase& old, MPI_Comm trainers, int tag, double seconds, std::vector<std::uint32_t> lost) {
  const Roles& roles = old.roles;
  Laps laps;
  FleetVerdict verdict;
  verdict.tag = tag;
  verdict.held.assign(roles.engine_leaders.size(), -1);
  // The engines the failed update found lost, on any trainer (its deadline's trace, or a leave announced),
  // or silent at a joiner's port (trainer 0's `lost`): their notes are not waited for, since a dead
  // engine's never comes. The others' are, each up to the end of `seconds`: the wait ends as soon as every
  // engine not found lost has answered.
  const std::size_t engines = roles.engines.size();
  lost.resize(engines, 0);
  const bool at_join = std::ranges::any_of(lost, [](std::uint32_t l) { return l != 0; });
  lost.resize(2 * engines, 0);
  const std::vector<std::uint32_t> heard = found_lost(old);
  for (std::size_t e = 0; e < lost.size(); ++e) lost[e] |= heard[e];
  throw_if_error(comm::reduce_max(lost, trainers, comm::Waiter{old.options.timeout_seconds, {}},
                                  old.who() + ": the engines the fleet link lost"));
  laps("agreeing the lost");
  // A job a write of any trainer found dead, or that left, is sent nothing more, the verdict included
  // (FaultChannel::note_job_gone); one only silent may be stopped, and reads the verdict once resumed.
  std::vector<bool> dead(engines, false);
  for (std::size_t e = 0; e < engines; ++e)
    if (lost[engines + e] != 0) {
      dead[e] = true;
      old.faults->note_job_gone(roles.engine_leaders[e]);
    }
  lost.resize(engines);
  if (roles.leader) {
    std::vector<comm::OperationPtr> notes(roles.engine_leaders.size());
    for (std::size_t e = 0; e < notes.size(); ++e) {
      if (lost[e] != 0) continue;
      notes[e] = comm::make_operation(0, sizeof(std::int64_t));
      WB_CHECK_MPI(MPI_Irecv(notes[e]->in.data(), 1, MPI_INT64_T, roles.engine_leaders[e], kAliveTag, old.world, &notes[e]->request));
    }
    const double start = comm::local_seconds();
    for (std::size_t e = 0; e < notes.size(); ++e) {
      if (!notes[e]) {
        ++verdict.found_lost;
        continue;
      }
      const double left = std::max(0.0, seconds - (comm::local_seconds() - start));
      if (comm::wait_for(notes[e], comm::Waiter{left, {}}, false, "an engine's note after a loss").is_ok()) {
        std::memcpy(&verdict.held[e], notes[e]->in.data(), sizeof(std::int64_t));
        ++verdict.answered;
      } else {
        comm::abandon(std::move(notes[e]));  // never waited on again: that engine is gone
        ++verdict.silent;
      }
    }
    verdict.wait_seconds = comm::local_seconds() - start;
    WB_LOG(kInfo) << "trainer 0: the fleet link's notes after a loss: " << verdict.answered << " engine(s) answered, "
                  << verdict.found_lost << (at_join ? " silent at a joiner's port" : " found lost by the failed update")
                  << " (not waited for), " << verdict.silent
                  << " silent past " << comm::seconds_text(seconds) << "; the wait took "
                  << comm::seconds_text(verdict.wait_seconds)
                  << (verdict.silent == 0 ? " (ended on every answer)" : "");
  }
  // Trainer 0 waited up to `seconds` before it broadcasts; the others wait as long, and the timeout more.
  const comm::Waiter waiter{seconds + old.options.timeout_seconds, {}};
  laps("the engines' notes");
  comm::broadcast_fixed(std::as_writable_bytes(std::span(verdict.held)), 0, trainers, waiter, "the fleet link's survivors");
  laps("the verdict's broadcast");
  verdict.survivors = survivors_of(roles, verdict.held);
  // The lost are told too: one that was only stopped reads, once resumed, that it was left out (a dead
  // one never takes it); those left out at a join once it is over (tell_left_out).
  if (roles.leader)
    for (std::size_t e = 0; e < roles.engine_leaders.size(); ++e)
      if ((!at_join || verdict.held[e] >= 0) && !dead[e]) send_words(old.world, roles.engine_leaders[e], verdict_words(verdict));
  laps("the verdict sent");
  if (verdict.survivors.size() > roles.trainers.size()) {
    settle_survivors(old, trainers, verdict, seconds);
    laps("the survivors entering");
  }
  // Said before the rebuild, which throws when a survivor does not come: how late each side got there.
  WB_LOG(kDebug) << old.who() << ": the fleet link's verdict after a loss (" << verdict.survivors.size() << " survivors): "
                 << laps.text();
  if (verdict.survivors.size() == roles.trainers.size()) return verdict;  // no engine left: nothing to rebuild
  verdict.rebuilt = comm::rebuild_link(old.link, verdict.survivors, 2 * tag, old.options.timeout_seconds,
                                       old.who() + ": the fleet link after a loss");
  laps("the rebuild");
  WB_LOG(kDebug) << old.who() << ": the fleet link rebuilt after a loss: " << laps.text();
  return verdict;
}

void tell_left_out(const AdapterBase& old, const FleetVerdict& verdict) {
  for (std::size_t e = 0; e < verdict.held.size(); ++e)
    if (verdict.held[e] < 0) {
      (void)send_request(old.world, old.roles.engine_leaders[e], RequestKind::kLeaveOut, 0);
      send_words(old.world, old.roles.engine_leaders[e], verdict_words(verdict));
    }
}

EngineRebuild rejoin_fleet(const AdapterBase& old, std::uint64_t held) {
  const Roles& roles = old.roles;
  const std::vector<int>& mine = roles.engines[static_cast<std::size_t>(roles.engine)];
  const double timeout = old.options.timeout_seconds;
  Laps laps;
  std::vector<std::int32_t> words;
  if (roles.leader) {
    (void)send_count(old.world, roles.trainer_leader, kAliveTag, static_cast<std::int64_t>(held));
    laps("its note");
    words = receive_words(old.world, roles.trainer_leader, 2 * timeout + join_answer_seconds(timeout));
    laps("the verdict");
    for (std::size_t r = 1; r < mine.size(); ++r) send_words(old.world, mine[r], words);
    laps("passing it on");
  } else {
    words = receive_words(old.world, mine.front(), 3 * timeout + join_answer_seconds(timeout));
    laps("the verdict from its leader");
  }
  EngineRebuild out;
  const auto in_it = [&](const std::vector<std::int32_t>& w) {
    return !w.empty() && std::find(w.begin() + 1, w.end(), roles.world_rank) != w.end();
  };
  if (!in_it(words)) {
    WB_LOG(kDebug) << old.who() << ": rejoining the fleet link after a loss, " << (words.empty() ? "no verdict" : "left out")
                   << ": " << laps.text();
    return out;
  }
  // Entering the rebuild is said first, and made only with those trainer 0 heard it from (settle_survivors).
  (void)send_count(old.world, roles.trainer_leader, kEnterTag, words.front());
  const std::vector<std::int32_t> go =
      receive_words(old.world, roles.trainer_leader, join_answer_seconds(timeout) + timeout, kGoTag);
  laps("the survivors entering");
  WB_LOG(kDebug) << old.who() << ": rejoining the fleet link after a loss, " << (in_it(go) ? "entering" : "left out at the end")
                 << ": " << laps.text();
  if (!in_it(go) || go.front() != words.front()) return out;
  const std::vector<int> survivors(go.begin() + 1, go.end());
  out.rebuilt = comm::rebuild_link(old.link, survivors, 2 * words.front(), timeout, old.who() + ": the fleet link after a loss");
  laps("the rebuild");
  // Made by this engine's workers alone, on a tag of their own (the survivors' rebuild may still run elsewhere).
  try {
    out.engine = comm::rebuild_link(old.link, mine, 2 * words.front() + 1, timeout, old.who() + ": its engine after a loss");
  } catch (...) {
    comm::abandon_link(out.rebuilt);  // made, but this engine cannot go on without its own communicator
    throw;
  }
  laps("its engine's");
  WB_LOG(kDebug) << old.who() << ": rejoined the fleet link after a loss: " << laps.text();
  return out;
}

void carry_over(const AdapterBase& from, AdapterBase& to) {
  to.version = from.version;
  to.history = from.history;
  to.stalls = from.stalls;
}

}  // namespace wb::coord
