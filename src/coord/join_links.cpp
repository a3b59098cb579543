#include "coord/join_links.hpp"

#include <algorithm>
#include <array>

#include "comm/collectives.hpp"
#include "coord/fleet_link.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"

namespace wb::coord {

TrainersJoinPort open_join_port(MPI_Comm trainers, const std::string& address, double timeout, const std::string& side) {
  int rank = 0, size = 1;
  WB_CHECK_MPI(MPI_Comm_rank(trainers, &rank));
  WB_CHECK_MPI(MPI_Comm_size(trainers, &size));
  TrainersJoinPort out;
  Status opened;
  if (size < 2) {
    opened = Status(ErrorCode::kUnsupported, "joins by address (" + address + ") need at least two " + side + " ranks: " + side +
                                             " 1 ends " + side + " 0's accept thread at close");
  } else if (rank == 0) {
    try {
      out.port = std::make_unique<comm::JoinPort>(address, timeout);
      out.address = out.port->address();
    } catch (const Error& error) {
      opened = Status(error.code(), side + " 0: opening the join port at " + address + ": " + error.status().message());
    }
  }
  const comm::Waiter waiter{timeout, {}};
  comm::agree(opened, trainers, waiter, "opening the join port");
  // Port and secret, one line each, to every trainer: any of them may knock.
  const std::string text = rank == 0 ? out.address.port + "\n" + out.address.secret : std::string();
  const std::vector<std::byte> bytes = comm::broadcast(
      std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size()),
      0, trainers, waiter, "the join port's address");
  const std::string shared(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  out.address.port = shared.substr(0, shared.find('\n'));
  out.address.secret = shared.substr(shared.find('\n') + 1);
  out.open = true;
  if (rank == 0) {
    WB_LOG(kInfo) << side << "s take joining engines at " << address;
  }
  return out;
}

void close_join_port(TrainersJoinPort& port, MPI_Comm trainers, double timeout, const std::string& side) {
  if (!port.open) return;
  port.open = false;
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(trainers, &rank));
  if (port.port) port.port->stop_accepting();
  if (rank == 1 && !comm::knock(port.address, timeout)) {
    WB_LOG(kWarn) << side << " 1: knocking at the join port to end its accept thread failed or did not complete within "
                  << comm::seconds_text(timeout);
  }
  port.port.reset();  // waits for the accept thread (bounded)
}

namespace {
// A joiner waits for the "take" actively, answers at once and merges the leaders' link right after: one
// that does not answer is gone, and one that dies after its answer never completes the merge. The training
// waits no longer than this for either.
Setting<double> join_answer_setting("join_answer_seconds", 5.0,
                                    "Engines as jobs of their own: how long the trainers wait, at the send_weights "
                                    "that takes an admitted joiner, for its answer to the take, and then trainer "
                                    "rank 0 for merging its link with the joiner's leader (each at most half of "
                                    "timeout_seconds). A joiner that does not answer, or dies before that merge "
                                    "completed, is never widened with.",
                                    0.001, 3600.0);
}  // namespace

double join_answer_seconds(double timeout) { return std::min(*join_answer_setting, 0.5 * timeout); }

std::optional<MPI_Comm> take_joiner(comm::JoinPort* port, comm::Group& trainers, const comm::Waiter& waiter,
                                    MPI_Comm replica, const std::function<bool()>& ask_replica,
                                    const std::function<BeforeTake(MPI_Comm)>& before_take,
                                    const std::function<bool(MPI_Comm&)>& leave_out) {
  const std::optional<MPI_Comm> taken = port != nullptr ? port->take() : std::nullopt;
  MPI_Comm leaders = taken.value_or(MPI_COMM_NULL), bridge = MPI_COMM_NULL;
  const double answer = join_answer_seconds(waiter.timeout);
  const BeforeTake before = leaders != MPI_COMM_NULL && before_take ? before_take(leaders) : BeforeTake::kTake;
  if (before == BeforeTake::kGiveUp) {
    comm::abandon_link(leaders);  // the joiner may be gone: never waited on again
    leaders = MPI_COMM_NULL;
  }
  // Trainer rank 0: the take handshake and the leaders' link.
  const auto take = [&] {
    if (leaders != MPI_COMM_NULL && !comm::confirm_take(leaders, answer)) {
      WB_LOG(kWarn) << "trainer 0: an admitted engine did not answer when taken (gone, or it gave up waiting); the "
                       "training goes on without it";
      comm::abandon_link(leaders);
      leaders = MPI_COMM_NULL;
    }
    // Trainer rank 0 and the joiner's leader only: a joiner that dies between its answer and here leaves
    // trainer rank 0's merging thread in MPI (bounded by the deadline, then left), and no other trainer waits.
    if (leaders != MPI_COMM_NULL) {
      try {
        bridge = comm::bridge_join(leaders, false, answer, "trainer 0: taking a joining engine");
      } catch (const Error& error) {
        WB_LOG(kWarn) << error.status().message() << "; it is never widened with, and the training goes on without it";
      }
    }
  };
  // Trainer rank 0 may have waited for a joiner's answer and the merge (each at most half the timeout)
  // before this step.
  comm::Waiter longer = waiter;
  longer.timeout = 2 * waiter.timeout;
  const auto step = [&](bool leaving_out) {
    // The replica is asked only for a joiner that will be widened with (it then waits in the widening too).
    const bool asked = bridge != MPI_COMM_NULL && replica != MPI_COMM_NULL && ask_replica && ask_replica();
    std::int64_t values[comm::Group::kValues] = {bridge != MPI_COMM_NULL ? 1 : 0, asked ? 1 : 0, leaving_out ? 1 : 0, 0};
    throw_if_error(trainers.step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(values), longer,
                                 "send_weights: whether an engine joined"));
    return std::array<bool, 3>{values[0] != 0, values[1] != 0, values[2] != 0};
  };
  if (before != BeforeTake::kLeaveOutFirst) take();
  std::array<bool, 3> joined = step(before == BeforeTake::kLeaveOutFirst);
  if (joined[2]) {
    // The fleet link's jobs that were silent at the joiner's port are left out on every trainer first; the
    // joiner is then taken over the link that is left, a step more.
    const bool keep = leave_out && leave_out(replica);
    if (!keep && leaders != MPI_COMM_NULL) {
      comm::abandon_link(leaders);
      leaders = MPI_COMM_NULL;
    }
    take();
    joined = step(false);
  }
  if (!joined[0]) return std::nullopt;
  // Every rank of both jobs, once the leaders' link is merged: a joiner that dies in these milliseconds still
  // leaves a thread of every trainer in MPI (MPI cannot cancel a call that makes a communicator).
  const MPI_Comm merged = comm::widen_join(joined[1] ? replica : trainers.comm(), bridge, false, waiter.timeout,
                                           "send_weights: taking a joining engine");
  return cut_widening(merged, JoinSide::kTrainer, waiter.timeout).link;
}

MPI_Comm admit_at_trainers(MPI_Comm engine, const std::string& address, double timeout) {
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  MPI_Comm leaders = MPI_COMM_NULL;
  Status joined;
  if (rank == 0) {
    try {
      leaders = comm::join_by_address(address, timeout);
    } catch (const Error& error) {
      joined = Status(error.code(), "engine worker 0: " + error.status().message());
    }
  }
  comm::agree(joined, engine, comm::Waiter{timeout, {}}, "joining the trainers");
  if (rank == 0) {
    WB_LOG(kInfo) << "engine worker 0: admitted at " << address << "; waiting to be taken at the trainers' next send_weights";
  }
  return leaders;
}

JoinedComms taken_by_trainers(MPI_Comm engine, MPI_Comm leaders, const std::string& address, double timeout) {
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  MPI_Comm bridge = MPI_COMM_NULL;
  // Admitted: the trainers take this engine at their next send_weights; rank 0 answers their take and
  // merges the leaders' link with trainer 0 at once, and every rank goes into the widening only then.
  // On the fleet link (coord/fleet_link.hpp) the joiner's leader first opens a port for the joined jobs'
  // leaders, which trainer 0 asks to connect there before it takes this engine.
  // That send_weights may come after a training step of any length: rank 0 waits for it while the
  // trainers' port lives (AddressWatch), the others for rank 0 while the port is not silent to them either.
  std::unique_ptr<comm::JoinPort> fleet_port;
  std::int64_t fleet_jobs = 0;
  comm::AddressWatch watch(address, timeout);
  Status taken = rank == 0 && fleet_link_enabled() ? answer_fleet(leaders, address, timeout, watch, fleet_port, fleet_jobs) : Status::ok();
  if (taken && rank == 0) {
    // After the fleet link's offer, the take follows within that send_weights.
    taken = fleet_link_enabled() ? comm::answer_take(leaders, timeout)
                                 : comm::answer_take(leaders, comm::Waiter{comm::kNoDeadline, [&](bool) {
                                                       return fleet_offer_arrived(leaders) ? fleet_link_differs(true) : watch.check();
                                                     }});
  }
  if (!taken) {
    comm::abandon_link(leaders);
    taken = Status(taken.code(), "engine worker 0: joining by " + address + ": " + taken.message());
  } else if (rank == 0) {
    try {
      bridge = comm::bridge_join(leaders, true, timeout, "engine worker 0: joining by " + address);
    } catch (const Error& error) {
      taken = error.status();
    }
  }
  const comm::Waiter for_rank0{comm::kNoDeadline, [&](bool) {
                                 return rank == 0 || watch.look() != comm::AddressWatch::Verdict::kSilent
                                            ? Status::ok()
                                            : watch.why(comm::AddressWatch::Verdict::kSilent);
                               }};
  comm::agree(taken, engine, for_rank0, "joining the trainers: waiting to be taken");
  JoinedComms out = cut_widening(comm::widen_join(engine, bridge, true, timeout, "joining the trainers at " + address),
                                 JoinSide::kJoiner, timeout);
  close_fleet_port(fleet_port, fleet_jobs, timeout);  // the joined jobs' connections were made before the take
  return out;
}

JoinedComms join_trainers(MPI_Comm engine, const std::string& address, double timeout) {
  // A joined replica first (where the trainers appointed one): its connection is what the catch-up link is
  // made from once the trainers took this engine. Not used, it is abandoned (it spans two jobs).
  JoinedComms replica;
  connect_replica(engine, address, timeout, replica);
  JoinedComms out;
  try {
    out = taken_by_trainers(engine, admit_at_trainers(engine, address, timeout), address, timeout);
  } catch (...) {
    comm::abandon_link(replica.replica_leaders);
    throw;
  }
  out.from_replica = replica.from_replica && out.catch_up == MPI_COMM_NULL;
  if (out.from_replica) out.replica_leaders = replica.replica_leaders;
  else comm::abandon_link(replica.replica_leaders);
  return out;
}

}  // namespace wb::coord
