#include "coord/catch_up.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "comm/join.hpp"
#include "comm/operation.hpp"
#include "coord/adapter_common.hpp"
#include "coord/binding_checks.hpp"
#include "coord/connection.hpp"
#include "coord/join_links.hpp"
#include "core/checks.hpp"
#include "core/laps.hpp"
#include "core/log.hpp"

namespace wb::coord {

JoinedComms cut_widening(MPI_Comm merged, JoinSide mine, double timeout) {
  JoinedComms out;
  try {
    const auto side = static_cast<std::int32_t>(mine);
    const std::vector<std::byte> all = comm::allgather_fixed(std::as_bytes(std::span(&side, 1)), merged, comm::Waiter{timeout, {}},
                                                             "a join: who took part in its widening");
    std::vector<std::int32_t> sides(all.size() / sizeof(std::int32_t));
    std::memcpy(sides.data(), all.data(), all.size());
    bool replica = false;
    for (std::int32_t s : sides) replica = replica || s == static_cast<std::int32_t>(JoinSide::kReplica);
    if (!replica) {
      out.link = merged;
      return out;
    }
    int rank = 0;
    WB_CHECK_MPI(MPI_Comm_rank(merged, &rank));
    out.link = comm::split(merged, mine != JoinSide::kReplica, rank, timeout, "a join: the trainers' link");
    out.catch_up = comm::split(merged, mine != JoinSide::kTrainer, rank, timeout, "a join: the replica's catch-up link");
  } catch (const Error&) {
    comm::abandon_link(merged);
    throw;
  }
  MPI_Comm_free(&merged);  // nothing is pending on it: the two cut from it are what lives on
  return out;
}

MPI_Comm make_replica_comm(MPI_Comm world, const Roles& roles, bool joins, double timeout) {
  if (roles.engine_leaders.empty() || roles.trainers.size() < 2 || comm::spans_jobs(world)) return MPI_COMM_NULL;
  int level = MPI_THREAD_SINGLE;
  WB_CHECK_MPI(MPI_Query_thread(&level));
  // Bit 0: MPI_THREAD_MULTIPLE here; bit 1: a trainer that takes joins (the engines do not know otherwise).
  const std::int32_t mine = (level == MPI_THREAD_MULTIPLE ? 1 : 0) | (joins ? 2 : 0);
  const std::vector<std::byte> all = comm::allgather_fixed(std::as_bytes(std::span(&mine, 1)), world, comm::Waiter{timeout, {}},
                                                           "connect: whether the trainers take joins, and the replica's thread level");
  std::vector<std::int32_t> bits(all.size() / sizeof(std::int32_t));
  std::memcpy(bits.data(), all.data(), all.size());
  bool taken = false;
  for (std::size_t r = 0; r < bits.size(); ++r) {
    taken = taken || (bits[r] & 2) != 0;
    if (roles.engine_of_rank[r] <= 0 && (bits[r] & 1) == 0) return MPI_COMM_NULL;  // a trainer or engine 0
  }
  if (!taken) return MPI_COMM_NULL;
  const bool member = roles.trainer || roles.engine == 0;
  // Trainer rank 0 is rank 0 of it: it holds the joiner's bridge in the widening.
  const int key = roles.trainer ? roles.group_rank : static_cast<int>(roles.trainers.size()) + roles.group_rank;
  return comm::split(world, member, key, timeout, "connect: the trainers and their replica engine");
}

namespace {

// The catch-up link's options: nothing staged on either side (the replica writes between its own
// installs, the joiner serves nothing yet), no joins, the rest as this worker's own, but the transfer
// buffers: an eighth of this worker's parameters (at least 16 MiB, at most its own), so that the plan has
// about 32 rounds. One stream between two engines fills and drains its pipeline once: with the whole 2 GiB
// the plan of the 208 MB variant had 8 rounds, and the catch-up took 3.07 s on the emulated cluster (1.8 x
// the link's T_min, the joiner installing each 26 MB round after it arrived); with 28 rounds 2.24 s.
std::int64_t catch_up_buffer_bytes(const ResolvedOptions& o, std::size_t parameter_bytes) {
  return std::clamp(static_cast<std::int64_t>(parameter_bytes / 8), std::min(o.buffer_bytes, std::int64_t{16} << 20), o.buffer_bytes);
}

AdapterOptions catch_up_options(const ResolvedOptions& o, std::size_t parameter_bytes) {
  AdapterOptions a;
  a.sender_staging = false;
  a.receiver_staging = false;
  a.buffer_bytes = catch_up_buffer_bytes(o, parameter_bytes);
  a.pipeline_depth = o.pipeline_depth;
  if (!o.transport.empty()) a.transport = o.transport;
  a.timeout_seconds = o.timeout_seconds;
  a.verify = o.verify;
  a.node = o.node;
  a.trace = false;
  a.not_loaded = o.not_loaded;
  a.join_address = std::string();
  return a;
}

// What one side of a catch-up brings: an adapter's, or a joiner's before the trainers took it (no link yet).
struct Side {
  MPI_Comm engine = MPI_COMM_NULL;
  bool leader = false;
  std::string who;
  ParameterSet params;
  LoadWeightsFn load_weights;
  ResolvedOptions options;
  std::shared_ptr<SpareTransports> spares;
  const SourceMap* probed = nullptr;                   // null: a joiner that probes on the catch-up link
  const std::vector<TensorInfo>* tensors = nullptr;  // the replica's: the checkpoint's tensor list
  // A joiner that probed before it connected: the list it probed against (the replica's file), which must
  // be the one the replica's workers bring to the link.
  const std::vector<TensorInfo>* probed_against = nullptr;
  // The fleet link's copy before the trainers take the joiner: the trainers wait for neither side, so the
  // joiner waits for the replica (which takes it between its own updates) as long as the timeout, and
  // each step of the copy, the joiner's probe included, as long as a join's answer.
  bool before_take = false;
  PreparedBuffers buffers{};  // the link's transfer buffers, allocated ahead (invalid: none)
};

Side side_of(AdapterBase& self, bool replica) {
  return {self.group_comm, self.roles.leader, self.who(), self.params, self.load_weights, self.options, self.spares,
          self.connection ? &self.connection->probed : nullptr, replica && self.connection ? &self.connection->tensors : nullptr,
          nullptr, false, replica ? self.catch_up_buffers : PreparedBuffers{}};
}

}  // namespace

struct LinkedCopy {
  MPI_Comm engine = MPI_COMM_NULL;       // this side's engine, duplicated for the copy's steps
  std::unique_ptr<AdapterBase> adapter;  // over the link (its `link`); none once the copy parted
  std::uint64_t version = 0;             // the replica's, when the link was made
};

void AbandonUnused::operator()(LinkedCopy* copy) const noexcept {
  if (copy->adapter) {
    copy->adapter->abandon_link_comms();
    try {
      comm::keep_alive(std::shared_ptr<AdapterBase>(copy->adapter.release()));
    } catch (const std::exception&) {  // no memory for the keeper: the adapter's memory goes with the process
    }
  }
  delete copy;
}

MPI_Comm link_of(const LinkedCopy& copy) { return copy.adapter->link; }

PreparedBuffers prepare_catch_up_buffers(const ParameterSet& params, const ResolvedOptions& options) {
  if (!params.empty() && params[0].view.memory != MemoryKind::kHost) return {};
  const std::int64_t bytes = catch_up_buffer_bytes(options, params.total_bytes());
  // One slot each way of the whole budget: a plan's slots, send or receive, fit in it.
  return std::async(std::launch::async, [bytes]() -> std::shared_ptr<const exec::TransferBuffers> {
           return std::make_shared<const exec::TransferBuffers>(
               exec::allocate_transfer_buffers(MemoryKind::kHost, MemoryKind::kHost, 0, 1, bytes, bytes));
         }).share();
}

namespace {

// Both sides, collective over `comm` (taken over): the link's adapter constructed over it (the replica's
// workers as its trainers), and whether both sides can copy and the forms they load checked; the replica's
// version learnt (given on its side). Null where that failed (`status`: why; the link abandoned).
LinkedCopyPtr make_copy_link(const Side& self, MPI_Comm comm, bool replica, std::uint64_t version, Status& status) {
  LinkedCopyPtr made(new LinkedCopy);
  Laps laps;
  // The copy's steps over the engine run on a duplicate of its own: one given up on halfway (a peer that
  // died or was slow) is never met by a later collective of the engine's own communicator.
  try {
    made->engine = comm::duplicate(self.engine);
    made->adapter = std::make_unique<AdapterBase>(comm, made->engine, replica, self.params, self.load_weights,
                                                  catch_up_options(self.options, self.params.total_bytes()));
  } catch (const Error& error) {
    comm::abandon_link(comm);
    status = error.status();
    return nullptr;
  }
  AdapterBase& link = *made->adapter;
  link.link = comm;  // parted with the joiner at the end (abandoned after a failure)
  // Made: the joiner came straight from its own link's connect (or its admission), which the trainers
  // waited for meanwhile (the whole timeout). From here neither side serves: the replica's own engine and
  // the joiner have the trainers' next version waiting, under their deadline. A peer that dies in it must
  // cost much less, so every step waits for progress at most half the deadline of a join's answer (itself
  // at most half the timeout: set it alike in every job); before the take (the fleet's replica) the whole
  // of it, since only the replica's engine waits.
  link.options.timeout_seconds = (self.before_take ? 1.0 : 0.5) * join_answer_seconds(self.options.timeout_seconds);
  try {
    // Both sides kept their probe, each in the form it loads (a joiner not yet taken probes in the copy's
    // connect), and both load one form (the checkpoint's, or FP8 of one quantization config: the replica's
    // codes and scales are then copied as they are).
    const bool probes_here = !replica && self.probed == nullptr;
    Status usable = probes_here || (self.probed != nullptr && !self.probed->parameters.empty())
                        ? Status::ok()
                        : Status(ErrorCode::kUnsupported, self.who + ": no source map of its own kept (its probe failed)");
    // One all-gather says all three (whether every worker can, the form each loads, the replica's version:
    // its rank 0's): as three collectives they took 35-75 ms of every copy on the emulated cluster, now 15-40.
    const std::string form = self.options.fp8 ? "FP8 (" + self.options.fp8->to_string() + ")" : "the checkpoint's own form";
    std::vector<std::byte> mine(sizeof version + form.size());
    std::memcpy(mine.data(), &version, sizeof version);
    std::memcpy(mine.data() + sizeof version, form.data(), form.size());
    const auto all = comm::allgather(mine, link.world, link.waiter(), "a joiner's catch-up: whether both sides can, and "
                                     "the forms they load", usable);
    for (const std::vector<std::byte>& other : all) {
      const std::string_view theirs(reinterpret_cast<const char*>(other.data()) + sizeof version, other.size() - sizeof version);
      if (theirs != form)
        throw_if_error(Status(ErrorCode::kUnsupported, self.who + ": the replica and the joiner load different forms (this "
                                                       "worker " + form + ", another " + std::string(theirs) + ")"));
    }
    std::memcpy(&made->version, all.front().data(), sizeof version);  // the replica's rank 0 is rank 0 of the link
  } catch (const Error& error) {
    status = link.fail(error.status());
    return nullptr;  // abandoned
  }
  laps("the link's adapter and checks");
  WB_LOG(kDebug) << self.who << ": the catch-up's set-up: " << laps.text();
  return made;
}

// Then, collective over the link: planned from the maps both sides probed (a joiner not yet taken probes
// here), one update of version `v` (the replica's); then parted. `probed_here`: a joiner that probed here,
// its map (kept for its link with the trainers).
Status copy_over(const Side& self, LinkedCopyPtr made, const BeforeUpdateHook* hook, std::uint64_t v, std::int64_t& bytes,
                 SourceMap* probed_here = nullptr) {
  AdapterBase& link = *made->adapter;
  link.spares = self.spares;  // transports opened ahead, taken by the connect
  if (self.buffers.valid()) {
    try {
      link.prepared_buffers = self.buffers.get();  // allocated while the joiner probed, or kept by the replica
    } catch (const std::exception&) {
      // The link allocates its own, and says why where it cannot either.
    }
  }
  Laps laps;
  Status status;
  try {
    link.connect(self.tensors, self.probed);
    laps("connect");
    const bool same = self.probed_against == nullptr || *self.probed_against == link.connection->tensors;
    Status listed = same ? Status::ok()
                         : Status(ErrorCode::kCorruptData, self.who + ": the tensor list beside the replica's address is not the "
                                                                      "one its workers hold (an older job's file?)");
    comm::agree(listed, link.world, link.waiter(), "a joiner's catch-up: the tensor list the joiner probed against");
    if (self.probed == nullptr && probed_here != nullptr) *probed_here = link.connection->probed;
    if (hook != nullptr && *hook) {
      try {
        (*hook)(v);
      } catch (const std::exception& error) {
        status = Status(ErrorCode::kInvalidArgument, self.who + ": before_update_hook(" + std::to_string(v) + ") threw: " + error.what());
      }
    }
    if (status) status = link.run_transfer(v);
    laps("transfer");
    bytes = link.executor_stats.bytes_written;
    if (status) {
      comm::agree(Status::ok(), link.world, link.waiter(), "a joiner's catch-up: version " + std::to_string(v));
      laps("agree");
      WB_LOG(kDebug) << self.who << ": the catch-up's steps: " << laps.text();
    } else status = link.give_up(status, "a joiner's catch-up of version " + std::to_string(v) + " (its link names the replica's "
                                              "workers trainers): ");
  } catch (const Error& error) {
    status = link.fail(error.status());
  }
  if (status) {
    link.shut_down = true;
    made->adapter.reset();  // the link goes: parted with the other side
    MPI_Comm_free(&made->engine);
  }
  // Given up on: nothing of it is waited for again (its executor's teardown would wait for the peers'
  // grants): `made` abandons its communicators, and keeps it with its buffers to the end of the process.
  return status;
}

// Both steps at once, where nobody waits between them: `v` given on the replica's side, learnt on the joiner's.
Status run_catch_up(const Side& self, MPI_Comm comm, bool replica, const BeforeUpdateHook* hook, std::uint64_t& v,
                    std::int64_t& bytes) {
  Status status;
  LinkedCopyPtr made = make_copy_link(self, comm, replica, v, status);
  if (!made) return status;
  v = made->version;
  return copy_over(self, std::move(made), hook, v, bytes);
}

// A joiner not taken yet waits for the fleet's replica (which takes it between its own updates) as long as
// the timeout, and no longer than the replica's port lives.
template <typename Body>
Status until_replica_takes(const Side& self, Body body) {
  comm::AddressWatch watch(replica_address(self.options.join_address), self.options.timeout_seconds);
  const comm::Waiter waiter{self.options.timeout_seconds, [&](bool) {
                              return watch.look() != comm::AddressWatch::Verdict::kGone
                                         ? Status::ok()
                                         : Status(ErrorCode::kNotFound, self.who + ": the replica engine closed its port before it "
                                                                                   "took this engine");
                            }};
  const Status taken = body(waiter);
  return taken || taken.code() != ErrorCode::kTimeout
             ? taken
             : Status(ErrorCode::kTimeout, self.who + ": the replica engine did not take this engine within " +
                                               comm::seconds_text(self.options.timeout_seconds));
}

// Both sides of a joined replica, collective over each side's engine: the leaders merge the link that the
// joiner's connection to the replica's port made, and both jobs widen it (the replica's workers first).
// Everything bounded by parts of the join's answer time: the replica serves its own engine no more meanwhile.
// The joiner comes straight from its own connect and may wait for the replica (which enters once the
// version is installed) as long as a join's answer; the replica, once there, finds it waiting.
MPI_Comm link_leaders(const Side& self, MPI_Comm leaders, bool joiner) {
  const double answer = join_answer_seconds(self.options.timeout_seconds);
  const double wait = joiner ? answer : 0.25 * answer;
  MPI_Comm bridge = MPI_COMM_NULL;
  Status bridged;
  Laps laps;
  if (self.leader) {
    // Before the take the replica takes the joiner between its own updates and copies: a joiner may wait
    // for it as long as the timeout, but never inside the merge (a merge given up on stays in MPI and held
    // the joiner's next calls, its join at the trainers' port included: measured with two joiners close
    // together). So the two say "ready" and "take" first (point to point, bounded): the joiner says
    // "ready" as it comes (it connects while it probes), and the replica takes only a joiner that did.
    // The joiner's wait for the take ends early where the replica's port closed meanwhile.
    if (self.before_take) {
      const Status taken =
          joiner ? until_replica_takes(self, [&](const comm::Waiter& until) { return comm::say_ready(leaders, until); })
                 : (comm::confirm_take(leaders, wait) ? Status::ok()
                                                      : Status(ErrorCode::kTimeout, self.who + ": the joiner at this engine's port "
                                                                                               "did not answer (it gave up waiting, "
                                                                                               "or is gone)"));
      if (!taken) {
        comm::abandon_link(leaders);
        bridged = taken;
      }
      laps(joiner ? "until taken" : "the take");
    }
    try {
      if (bridged) bridge = comm::bridge_join(leaders, joiner, wait, self.who + ": a joiner's catch-up");
    } catch (const Error& error) {
      bridged = error.status();
    }
    laps("the leaders' bridge");
  }
  // The other ranks wait for the leader's waits, and a margin more.
  comm::agree(bridged, self.engine, comm::Waiter{(self.before_take && joiner ? self.options.timeout_seconds : 0) + 2 * wait, {}},
              "a joiner's catch-up: the leaders' link");
  laps("agreed");
  const MPI_Comm widened =
      comm::widen_join(self.engine, bridge, joiner, (self.before_take ? 1.0 : 0.5) * answer, self.who + ": a joiner's catch-up");
  laps("widened");
  WB_LOG(kDebug) << self.who << ": the catch-up link's making: " << laps.text();
  return widened;
}

}  // namespace

namespace {
// The replica's side of the leaders' link with a joiner taken at its port (`taken`; the leader waits a
// little for one at `port` otherwise), widened over both jobs.
MPI_Comm link_at_port(const Side& self, AdapterBase& replica, comm::JoinPort* port, MPI_Comm taken) {
  MPI_Comm leaders = taken;
  if (port != nullptr && leaders == MPI_COMM_NULL) {
    comm::Backoff backoff;
    const double until = comm::local_seconds() + 0.25 * join_answer_seconds(replica.options.timeout_seconds);
    for (std::optional<MPI_Comm> peer; leaders == MPI_COMM_NULL && comm::local_seconds() < until; backoff.pause())
      if ((peer = port->take())) leaders = *peer;
  }
  comm::agree(replica.roles.leader && leaders == MPI_COMM_NULL
                  ? Status(ErrorCode::kTimeout, replica.who() + ": no joiner connected at this engine's port")
                  : Status::ok(),
              replica.group_comm, replica.waiter(), "a joiner's catch-up: the joiner at the port");
  return link_leaders(self, leaders, false);
}

// A copy given up on may still have writes in flight from its buffers (its link abandoned, kept with
// them): the next joiner's get buffers of their own.
Status renewing_buffers(AdapterBase& replica, Status served) {
  if (!served && replica.catch_up_buffers.valid()) replica.catch_up_buffers = prepare_catch_up_buffers(replica.params, replica.options);
  return served;
}

Status copy_to_joiner(const Side& self, AdapterBase& replica, MPI_Comm comm, std::int64_t& bytes) {
  std::uint64_t v = replica.version;
  return renewing_buffers(replica, run_catch_up(self, comm, true, nullptr, v, bytes));
}

Side before_take_side(AdapterBase& replica) {
  Side self = side_of(replica, true);
  self.before_take = true;
  return self;
}

// The replica's leader's answer to the joiner's leader (the replica's workers first on the link): the
// version it copies, or 0 where it lets the joiner go. Never throws: a State's destructor lets a linked
// joiner go.
void answer_joiner(const AdapterBase& replica, const LinkedCopy& linked, std::uint64_t version) {
  int size = 0;
  if (replica.roles.leader && MPI_Comm_size(replica.group_comm, &size) == MPI_SUCCESS) comm::answer_copy(link_of(linked), size, version);
}
}  // namespace

Status serve_joiner_at_port(AdapterBase& replica, comm::JoinPort* port, std::int64_t& bytes, MPI_Comm taken) {
  const Side self = side_of(replica, true);
  MPI_Comm comm = MPI_COMM_NULL;
  try {
    comm = link_at_port(self, replica, port, taken);
  } catch (const Error& error) {
    return error.status();
  }
  return copy_to_joiner(self, replica, comm, bytes);
}

LinkedCopyPtr link_joiner_at_port(AdapterBase& replica, MPI_Comm taken) {
  const double began = comm::local_seconds();
  const Side self = before_take_side(replica);
  Status status;
  LinkedCopyPtr linked;
  try {
    linked = make_copy_link(self, link_at_port(self, replica, nullptr, taken), true, replica.version, status);
  } catch (const Error& error) {
    status = error.status();
  }
  if (replica.roles.leader && linked) {
    WB_LOG(kDebug) << replica.who() << ": linked a joining engine (" << comm::seconds_text(comm::local_seconds() - began)
                   << "); it is copied to once its probe is done";
  } else if (replica.roles.leader) {
    WB_LOG(kWarn) << replica.who() << ": linking a joining engine failed (it gets the trainers' next version; this engine "
                                      "serves on): " << status.message();
  }
  return linked;
}

Status serve_linked_joiner(AdapterBase& replica, LinkedCopyPtr linked, std::int64_t& bytes) {
  // A worker whose part of the link failed where its leader's did not: the others' copy times out.
  if (!linked) return Status(ErrorCode::kInternal, replica.who() + ": no catch-up link with the joiner on this worker");
  answer_joiner(replica, *linked, replica.version);
  return renewing_buffers(replica, copy_over(before_take_side(replica), std::move(linked), nullptr, replica.version, bytes));
}

void drop_linked_joiner(AdapterBase& replica, LinkedCopyPtr linked, LetGo why) {
  if (linked) answer_joiner(replica, *linked, 0);
  linked.reset();  // abandoned: the joiner may be gone
  if (replica.roles.leader && why != LetGo::kQuietly) {
    WB_LOG(kWarn) << replica.who() << ": let a joining engine go without its first version (it gets the trainers' next one): "
                  << (why == LetGo::kLate ? "it did not finish its probe within " + comm::seconds_text(replica.options.timeout_seconds)
                                          : std::string("its probe failed"));
  }
}

void prepare_for_joiners(AdapterBase& replica, bool network_links) {
  if (network_links && !replica.spares) {
    replica.spares = std::make_shared<SpareTransports>(replica.options.transport);
    replica.spares->keep(1, 1);
  }
  if (!replica.catch_up_buffers.valid()) replica.catch_up_buffers = prepare_catch_up_buffers(replica.params, replica.options);
}

Status catch_up_from_port(AdapterBase& joiner, MPI_Comm replica_leaders, const BeforeUpdateHook& hook, std::uint64_t& installed) {
  const Side self = side_of(joiner, false);
  MPI_Comm comm = MPI_COMM_NULL;
  try {
    comm = link_leaders(self, replica_leaders, true);  // on every worker, until the replica takes the joiner
  } catch (const Error& error) {
    return error.status();
  }
  std::uint64_t v = 0;
  std::int64_t bytes = 0;
  const Status status = run_catch_up(self, comm, false, &hook, v, bytes);
  if (status) installed = v;
  return status;
}

EarlyCatchUpLink start_catch_up_link(MPI_Comm engine, const ParameterSet& params, const LoadWeightsFn& load_weights,
                                     const ResolvedOptions& options) {
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  // Said before any MPI call on a thread (the join's own check comes later, at the trainers' port).
  comm::require_thread_multiple("engine worker " + std::to_string(rank) + ": an engine that joins by address",
                                "makes its links on threads beside its probe");
  EarlyCatchUpLink early;
  // The threads' own duplicate, made before the leader's connect is in flight (Open MPI 4.1 makes no
  // communicator over a parent of a higher context id while another one's making is in flight in the
  // process: the duplicate would wait for the connect).
  early.engine = comm::duplicate(engine, comm::Waiter{options.timeout_seconds, {}}, "joining the trainers: the catch-up link");
  ReplicaAdmission admission = start_replica_admission(engine, options.join_address, options.timeout_seconds);
  Side self;
  self.engine = early.engine;
  self.leader = rank == 0;
  self.who = "joining engine worker " + std::to_string(rank);
  self.params = params;
  self.load_weights = load_weights;
  self.options = options;
  self.before_take = true;
  // The link's adapter takes what a language binding handed this thread's constructions (its caller's
  // failure, its watch over the parameters: binding_checks.hpp), as the copy on this thread would.
  early.linked = std::async(std::launch::async, [self = std::move(self), admission = std::move(admission),
                                                 found = BindingChecks::current(), watch = BindingChecks::current_watch()]() mutable {
    const BindingChecks scope(found, watch);
    EarlyCatchUpLink::Linked out;
    try {
      JoinedComms comms;
      settle_replica_admission(self.engine, std::move(admission), self.options.timeout_seconds, comms);
      out.admitted = comms.from_replica;
      if (out.admitted) out.link = make_copy_link(self, link_leaders(self, comms.replica_leaders, true), false, 0, out.status);
      // Then its transfer buffers (60-90 ms here): after the replica's answer they were on the copy's path.
      if (out.link) out.buffers = prepare_catch_up_buffers(self.params, self.options);
    } catch (const Error& error) {
      out.status = error.status();
    }
    return out;
  });
  return early;
}

Status catch_up_before_take(MPI_Comm engine, const ParameterSet& params, const LoadWeightsFn& load_weights, const AdapterOptions& options,
                            std::shared_ptr<SpareTransports> spares, const BeforeUpdateHook& hook, EarlyCatchUpLink early,
                            bool copy, bool& from_replica, std::uint64_t& installed, SourceMap& probed,
                            const std::vector<TensorInfo>& probed_against, double& waited) {
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  const double began = comm::local_seconds();
  EarlyCatchUpLink::Linked linked = early.linked.get();  // bounded: the thread's every wait is
  const bool ahead = !probed.parameters.empty();  // probed before it connected (probe_before_replica)
  const Side self{engine, rank == 0, "joining engine worker " + std::to_string(rank), params, load_weights, resolve_options(options),
                  std::move(spares), ahead ? &probed : nullptr, nullptr, ahead ? &probed_against : nullptr, true, linked.buffers};
  std::uint64_t v = 0;  // the replica's, from its answer
  from_replica = linked.admitted;  // alike on every worker (broadcast)
  Status status = linked.status;
  bool asked_copy = false;
  if (from_replica) {
    // Every worker has the link, or none copies; then the leader asks, and waits for the replica's answer
    // as long as for its take (the others as long, and a margin more).
    try {
      comm::agree(linked.link ? Status::ok()
                  : status      ? Status(ErrorCode::kInternal, self.who + ": no catch-up link")
                                : status,
                  early.engine, comm::Waiter{self.options.timeout_seconds, {}}, "joining the trainers: the catch-up link");
      status = copy ? Status::ok() : Status(ErrorCode::kInvalidArgument, self.who + ": its probe failed");
      if (copy) {
        // The replica answers with the version it copies: the leader broadcasts it with the answer.
        Status asked;
        if (self.leader) {
          asked_copy = true;
          asked = until_replica_takes(self, [&](const comm::Waiter& until) { return comm::ask_copy(link_of(*linked.link), until, v); });
        }
        std::vector<std::byte> answer(sizeof v);
        std::memcpy(answer.data(), &v, sizeof v);
        answer = comm::broadcast(std::move(answer), 0, early.engine,
                                 comm::Waiter{self.options.timeout_seconds + join_answer_seconds(self.options.timeout_seconds), {}},
                                 "joining the trainers: the replica's answer to the copy", asked);
        std::memcpy(&v, answer.data(), sizeof v);
      }
    } catch (const Error& error) {
      status = error.status();
    }
    // The replica holds the link until this engine's word (or its own bound): "no copy" lets it go at once.
    if (!status && self.leader && linked.link && !asked_copy) comm::decline_copy(link_of(*linked.link));
  }
  // A wait given up on may have left a thread in MPI over the duplicate: abandoned then, not freed.
  if (status) MPI_Comm_free(&early.engine);
  else comm::abandon_link(early.engine);
  waited = comm::local_seconds() - began;
  if (!from_replica || !status) return status;  // the link, if any, abandoned with `linked`
  std::int64_t bytes = 0;
  status = copy_over(self, std::move(linked.link), &hook, v, bytes, ahead ? nullptr : &probed);
  if (status) installed = v;
  return status;
}

Status serve_joiner(AdapterBase& replica, MPI_Comm replica_comm, std::int64_t& bytes) {
  const double timeout = replica.options.timeout_seconds;
  JoinedComms comms;
  try {
    const MPI_Comm merged = comm::widen_join(replica_comm, MPI_COMM_NULL, false, timeout, replica.who() + ": serving a joiner");
    comms = cut_widening(merged, JoinSide::kReplica, timeout);
  } catch (const Error& error) {
    return error.status();
  }
  std::uint64_t v = replica.version;
  return run_catch_up(side_of(replica, true), comms.catch_up, true, nullptr, v, bytes);
}

Status catch_up(AdapterBase& joiner, MPI_Comm catch_up_comm, const BeforeUpdateHook& hook, std::uint64_t& installed) {
  std::uint64_t v = 0;
  std::int64_t bytes = 0;
  const Status status = run_catch_up(side_of(joiner, false), catch_up_comm, false, &hook, v, bytes);
  if (status) installed = v;
  return status;
}

}  // namespace wb::coord
