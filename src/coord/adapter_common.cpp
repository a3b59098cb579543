#include "coord/adapter_common.hpp"

#include <algorithm>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "comm/interrupt.hpp"
#include "comm/join.hpp"
#include "coord/binding_checks.hpp"
#include "coord/catch_up.hpp"
#include "coord/clock_offset.hpp"
#include "coord/element_accounting.hpp"
#include "coord/group_check.hpp"
#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"

namespace wb::coord {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

std::string memory_name(const TensorView& view) {
  return view.memory == MemoryKind::kCuda ? "the memory of CUDA device " + std::to_string(view.device) : "host memory";
}

}  // namespace

Status check_parameter_memory(const ParameterSet& params, const std::string& who) {
  for (const Parameter& p : params) {
    if (!p.view.is_contiguous())
      return Status(ErrorCode::kUnsupported, who + ": parameter " + p.name + " " + shape_to_string(p.view.shape) +
                                                 " is not contiguous (strides " + shape_to_string(p.view.strides) +
                                                 "), which the adapters need: pass the tensor it views");
    const TensorView& first = params[0].view;
    if (p.view.memory != first.memory || (first.memory == MemoryKind::kCuda && p.view.device != first.device))
      return Status(ErrorCode::kInvalidArgument, who + ": parameter " + p.name + " is in " + memory_name(p.view) +
                                                     ", parameter " + params[0].name + " in " + memory_name(first) +
                                                     ": a worker's parameters are all in host memory or all on one CUDA device");
  }
  if (!params.empty() && params[0].view.memory == MemoryKind::kCuda && cuda_device_count() == 0)
    return Status(ErrorCode::kUnsupported, who + ": the parameters are in CUDA memory, but this process has no CUDA device (" +
                                               cuda_unavailable_reason() + ")");
  return Status::ok();
}

AdapterBase::AdapterBase(MPI_Comm world_comm, MPI_Comm group_comm_in, bool trainer, ParameterSet parameters,
                         LoadWeightsFn load, const AdapterOptions& adapter_options)
    : params(std::move(parameters)), load_weights(std::move(load)), watch(BindingChecks::current_watch()) {
  options = resolve_options(adapter_options);
  const bool stages = trainer ? options.sender_staging : options.receiver_staging;
  int level = MPI_THREAD_SINGLE;
  WB_CHECK_MPI(MPI_Query_thread(&level));
  // A typo'd WB_* variable would be ignored silently; said first, since a failure below may come from it.
  if (int rank = -1; world_comm != MPI_COMM_NULL && MPI_Comm_rank(world_comm, &rank) == MPI_SUCCESS && rank == 0)
    warn_unknown_environment();
  // Under the deadline, and the groups compared before their duplication: a rank that passed another
  // communicator (MPI_COMM_SELF as engine_comm, the world as trainer_comm) is named instead of waited for.
  const comm::Waiter setup{options.timeout_seconds, {}};
  world = comm::duplicate(world_comm, setup,
                          "constructing the adapter: duplicating the world communicator (some rank did not "
                          "construct its adapter, or passed another world communicator)");
  // A joined engine's link (the world spans two jobs) that fails here: the duplicate is abandoned, since
  // MPI_Finalize would otherwise synchronize over it with the other job, which may be gone.
  try {
    // The first exchange over the world also carries what a language binding found wrong with its caller's
    // arguments, so that C++ and Python ranks of one job run the same collectives from the first one on.
    check_groups(world, group_comm_in, trainer, setup, BindingChecks::current());
    group_comm = comm::duplicate(group_comm_in, setup,
                                 std::string("constructing the adapter: duplicating the ") +
                                     (trainer ? "trainer_comm" : "engine_comm"));
    roles = exchange_roles(world, group_comm, trainer, options.timeout_seconds);
    faults = std::make_unique<FaultChannel>(world, roles);
    group = std::make_unique<comm::Group>(group_comm, trainer ? "the trainers" : "engine " + std::to_string(roles.engine),
                                          faults.get(), roles.group(), roles.world_rank);
    // Agreed, so that every rank fails alike instead of some waiting for the others.
    Status usable = check_parameter_memory(params, who());
    if (usable && options.verify && !stages && !params.empty() && params[0].view.memory == MemoryKind::kCuda)
      usable = Status(ErrorCode::kUnsupported, who() + ": verify digests host transfer buffers, and these parameters are in "
                                                       "CUDA memory: turn on " + (trainer ? "sender" : "receiver") +
                                                       " staging on this side, or verify off");
    if (usable && !load_weights) usable = Status(ErrorCode::kInvalidArgument, who() + ": load_weights is empty");
    if (const std::string unknown = unknown_not_loaded(params, options.not_loaded); usable && !unknown.empty())
      usable = Status(ErrorCode::kInvalidArgument, who() + ": not_loaded names " + unknown + ", which " +
                                                       "this worker's parameters do not have");
    if (usable && stages && level < MPI_THREAD_MULTIPLE)
      usable = Status(ErrorCode::kUnsupported,
                      who() + ": " + (trainer ? "sender" : "receiver") +
                          " staging runs the transfer on a background thread and needs MPI_THREAD_MULTIPLE, but MPI "
                          "was initialized with " + thread_level_name(level) + " (use MPI_Init_thread)");
    comm::Group job(world, "the job", faults.get());
    std::int64_t values[comm::Group::kValues] = {watch ? 1 : 0, trainer && level < MPI_THREAD_MULTIPLE ? 1 : 0, 0, 0};
    throw_if_error(job.step(usable, std::span<std::int64_t, comm::Group::kValues>(values), waiter(), "constructing the adapters"));
    watched_job = values[0] != 0;
    trainers_multithreaded = values[1] == 0;
    clock_offset = measure_clock_offset(world, roles, options.timeout_seconds);
    group->set_clock_offset(clock_offset);
  } catch (...) {
    if (comm::spans_jobs(world)) comm::abandon_link(world);
    world = MPI_COMM_NULL;
    throw;
  }
}

AdapterBase::~AdapterBase() {
  thread.join();  // a background transfer still uses the executor
  // After a failure the executor's teardown waits for its peers no longer than after a failed update: the
  // failure may have come from elsewhere (a peer that gave up, a control message), not from its own update.
  if (connection && connection->executor && !failure.is_ok()) connection->executor->note_peer_failure();
  const MPI_Comm executor_comm = connection && connection->executor ? connection->executor->communicator() : MPI_COMM_NULL;
  connection.reset();
  if (link != MPI_COMM_NULL) part_link(executor_comm);
  // The communicators are not freed: Open MPI hands a freed context id to the next communicator, and a
  // message still in flight for this one (a failed update leaves some: a shutdown request, an
  // acknowledgement nobody waits for) would then be delivered to that communicator's receives.
}

void AdapterBase::part_link(MPI_Comm executor_comm) {
  if (left) {
    // The engine announced its leave and sends nothing after it; the trainers saw the announcement before
    // they got here. Freeing is local: neither side waits for the other.
    for (MPI_Comm comm : {executor_comm, world, link})
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    return;
  }
  // Both jobs part the same communicators in the same order, each within the timeout. After a failure the
  // other job may be gone or stopped: nothing is waited for, the communicators are abandoned
  // (comm::abandon_link: their context ids stay taken, MPI_Finalize does not wait for that job).
  bool parting = shut_down && failure.is_ok();
  for (MPI_Comm comm : {executor_comm, world, link}) {
    if (!parting) {
      comm::abandon_link(comm);
    } else if (!comm::part(comm, options.timeout_seconds)) {
      WB_LOG(kWarn) << who() << ": the other job did not end the link within " << comm::seconds_text(options.timeout_seconds)
                    << "; its communicators are abandoned";
      parting = false;
    }
  }
}

void AdapterBase::abandon_link_comms() {
  if (link == MPI_COMM_NULL) return;
  const MPI_Comm executor_comm = connection && connection->executor ? connection->executor->communicator() : MPI_COMM_NULL;
  for (MPI_Comm comm : {executor_comm, world, link}) comm::abandon_link(comm);
  link = MPI_COMM_NULL;
}

void AdapterBase::release_staging_if_idle() {
  // Only the executor's copies read or write the staging (never a peer: their writes land in the transfer
  // buffers, kept with the link), and this link's executor runs no update again.
  if (connection && thread.idle()) connection->staging = Staging();
}

comm::Waiter AdapterBase::waiter() const {
  comm::Waiter w;
  w.timeout = options.timeout_seconds;
  AdapterBase* self = const_cast<AdapterBase*>(this);
  w.service = [self](bool interruptible) { return self->service(interruptible); };
  return w;
}

Status AdapterBase::service(bool interruptible) {
  // While a transfer runs on the background thread, it answers queries (it can say what it waits for);
  // called on that thread after the transfer (the acknowledgements taken there), this answers them.
  const bool transferring = thread.active() && !thread.finished() && !thread.is_current();
  Status status = faults->poll(nullptr, !transferring);
  if (!interruptible) return Status::ok();
  if (!status) return status;
  Status stop = comm::poll_interrupt();  // the caller's Ctrl-C (comm/interrupt.hpp)
  return stop ? stop : Status(stop.code(), who() + ": " + stop.message());
}

Status AdapterBase::give_up(Status status, const std::string& context) {
  if (status) return status;
  // A peer that left makes this rank's operations fail too (a write into memory it released, a timeout);
  // its notice, the cause, may be a moment behind: it gets that moment.
  Status known = faults->poll();
  comm::Backoff backoff;
  // A joined engine job's link that timed out has waited a whole deadline with the notices taken all along:
  // no notice is coming (the job is most likely gone), and the grace cost the update it died in 0.2 s more.
  const bool waited = link != MPI_COMM_NULL && status.code() == ErrorCode::kTimeout;
  const double grace = comm::interrupted() || waited ? 0.0 : std::min(0.2, 0.1 * options.timeout_seconds);  // own Ctrl-C: no peer's
  for (const double until = comm::local_seconds() + grace; known && comm::local_seconds() < until;) {
    backoff.pause();
    known = faults->poll();
  }
  if (!known) return fail(known);
  return fail(context.empty() ? status : Status(status.code(), context + status.message()));
}

Status AdapterBase::fail(Status status) {
  if (failure.is_ok()) {
    failure = std::move(status);
    announce_failure(failure);
  }
  return failure;
}

void AdapterBase::announce_failure(const Status& status) {
  // A peer a write of this rank failed to is gone: the notice says so (the fleet link's trainers then do
  // not wait for its engine's note, coord/fleet_link.hpp).
  if (connection && connection->executor) faults->note_gone(connection->executor->failed_write_peer());
  faults->announce(announce_prefix.empty() ? status : Status(status.code(), announce_prefix + status.message()),
                   group->first_incomplete());
  faults->raise(status);  // a transfer still running on the background thread stops too
}

void AdapterBase::announce_departure(const std::string& why) {
  if (!failure.is_ok() || shut_down || !connection) return;
  // A peer's failure already here (its notice taken now, and passed on as every rank does) is what the others
  // must hear: a departure after it is its consequence, and a trainer that took it first would name it
  // instead of the cause (wb-bench: an engine told by trainer 0 that the update failed, destroying its
  // adapter, was named by trainer 1 in place of the stopped engine, once in a CI run).
  if (!faults->poll().is_ok()) return;
  const Status gone(ErrorCode::kInternal, who() + " left: " + why);
  faults->announce(gone, group->first_incomplete());
  faults->raise(gone);  // its own background transfer stops too
  // The notices are eager sends; a moment of progress lets them leave before the process may exit.
  comm::Backoff backoff;
  for (const double until = comm::local_seconds() + 0.05; comm::local_seconds() < until; backoff.pause()) (void)faults->poll();
}

void AdapterBase::connect(const std::vector<TensorInfo>* checkpoint_tensors, const SourceMap* probed, const Connection* widened,
                          const Staging* share_staging) {
  // A framework that moved its parameters between construction and connect (vLLM's
  // process_weights_after_loading, say): the probe must read where load_weights writes. A joined link's
  // connect (`probed`) probes nothing of this worker: its moves reach the link at each send.
  if (probed == nullptr) {
    std::vector<MovedParameter> moved;
    Status checked = check_parameters(moved, "connect");
    if (checked) checked = follow(moved);
    if (!checked) throw Error(fail(checked));  // announced: the others' waits in connect end on it
  }
  ConnectInput input;
  input.world = world;
  input.roles = &roles;
  input.faults = faults.get();
  input.waiter = waiter();
  input.params = &params;
  input.load_weights = &load_weights;
  input.checkpoint_tensors = checkpoint_tensors;
  input.probed = probed;
  input.options = options;
  input.enter_together = watched_job;
  input.stage_whole = stage_whole;
  if (widened != nullptr && widened->executor) input.reuse_buffers = widened->executor->transfer_buffers();
  else input.reuse_buffers = std::move(prepared_buffers);
  input.share_staging = share_staging;
  // The world's connect (not a joined link's). Engine 0 may become the replica that feeds joiners: its pool
  // learns whether its links want the network transport (a trainer's that takes joins has one already).
  const bool world_connect = link == MPI_COMM_NULL;
  if (world_connect && !roles.trainer && roles.engine == 0 && !spares) {
    spares = std::make_shared<SpareTransports>(options.transport);
    spares->keep(0, 0);
  }
  input.spares = spares.get();
  connection.emplace(establish_connection(input));
  if (connection->executor) faults->add_neighbours(connection->executor->schedule().peers);
  if (world_connect) {
    // The trainers and the replica engine that feeds joiners.
    replica_comm = make_replica_comm(world, roles, roles.trainer && !options.join_address.empty(), options.timeout_seconds);
    if (!roles.trainer && replica_comm == MPI_COMM_NULL) spares.reset();
    else if (!roles.trainer && spares && spares->wanted()) spares->keep(1, 1);  // for the first joiner's catch-up link
  }
  refresh_stats();
}

namespace {
const char* span_kind_name(ExecutorSpan::Kind kind) {
  switch (kind) {
    case ExecutorSpan::kPack: return "pack";
    case ExecutorSpan::kWrite: return "write";
    case ExecutorSpan::kCreditWait: return "credit wait";
    case ExecutorSpan::kForward: return "forward";
    case ExecutorSpan::kAssemble: return "assemble";
  }
  return "?";
}
}  // namespace

void AdapterBase::refresh_stats() {
  if (!connection || !connection->executor || thread.active()) return;
  // Spans since the last refresh belong to the transfer that just ended (history's last entry).
  const std::uint64_t v = history.empty() ? version : history.back().version;
  for (const ExecutorSpan& e : connection->executor->take_trace())
    trace.push_back({span_kind_name(e.kind), v, e.round, e.begin + clock_offset, e.end + clock_offset});
  executor_stats = connection->executor->stats();
  if (executor_stats.trace_dropped > 0 && !warned_trace_dropped) {
    warned_trace_dropped = true;
    WB_LOG(kWarn) << who() << ": the timeline keeps 2^20 spans per update; " << executor_stats.trace_dropped
                  << " more were dropped";
  }
}

Status AdapterBase::check_parameters(std::vector<MovedParameter>& moved, const std::string& when) {
  moved.clear();
  if (!watch) return Status::ok();
  const std::string context = who() + ": " + when + ": ";
  if (Status found = watch(moved); !found) return Status(found.code(), context + found.message());
  if (moved.empty()) return Status::ok();
  // Two parameters in one place would each get the other's bytes: a parameter rebound onto another's
  // memory (tied after loading, say) is refused. Sorted by address, each range is compared with the
  // furthest-reaching one before it.
  std::vector<const void*> now(params.size());
  std::vector<bool> rebound(params.size(), false);
  for (std::size_t p = 0; p < params.size(); ++p) now[p] = params[p].view.data;
  for (const MovedParameter& m : moved) {
    if (m.index >= params.size())
      return Status(ErrorCode::kInternal, context + "the parameter watch reported parameter " + std::to_string(m.index) +
                                              " of " + std::to_string(params.size()));
    now[m.index] = m.data;
    rebound[m.index] = true;
  }
  std::vector<std::size_t> order;
  for (std::size_t p = 0; p < params.size(); ++p)
    if (params[p].view.nbytes() > 0) order.push_back(p);
  const auto begin = [&](std::size_t p) { return reinterpret_cast<std::uintptr_t>(now[p]); };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return begin(a) < begin(b); });
  for (std::size_t k = 1, reach = order.empty() ? 0 : order[0]; k < order.size(); ++k) {
    const std::size_t p = order[k];
    if (begin(p) < begin(reach) + params[reach].view.nbytes() && (rebound[p] || rebound[reach]))
      return Status(ErrorCode::kInvalidArgument,
                    context + "parameter " + params[rebound[p] ? p : reach].name + " was rebound to memory that parameter " +
                        params[rebound[p] ? reach : p].name + " holds too: two parameters in one place would get each "
                        "other's bytes (rebind it to memory of its own)");
    if (begin(p) + params[p].view.nbytes() > begin(reach) + params[reach].view.nbytes()) reach = p;
  }
  return Status::ok();
}

Status AdapterBase::follow(const std::vector<MovedParameter>& moved) {
  if (moved.empty()) return Status::ok();
  // Where this side stages, the executor reads or writes the staging, and only the copies to and from it
  // touch the parameters (through this ParameterSet).
  const bool staged = stages(options, roles.trainer);
  std::vector<void*> now(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) now[p] = params[p].view.data;
  for (const MovedParameter& m : moved) {
    if (connection && connection->executor && !staged) {
      try {
        connection->executor->rebind_parameter(m.index, static_cast<const std::byte*>(now[m.index]),
                                               static_cast<std::byte*>(m.data));
      } catch (const Error& error) {
        return Status(error.status().code(), who() + ": following parameter " + params[m.index].name +
                                                 " to its new memory: " + error.status().message());
      }
    }
    now[m.index] = m.data;
  }
  ParameterSet followed;
  for (std::size_t p = 0; p < params.size(); ++p) {
    TensorView view = params[p].view;
    view.data = now[p];
    followed.add(params[p].name, std::move(view));
  }
  params = std::move(followed);
  WB_LOG(kInfo) << who() << ": followed " << moved.size() << " parameter(s) rebound to new memory since the last update ("
                << params[moved.front().index].name << (moved.size() > 1 ? ", ..." : "") << ")";
  return Status::ok();
}

Status AdapterBase::run_transfer(std::uint64_t v, void* cuda_stream) {
  RoundExecutor& executor = *connection->executor;
  const std::int64_t before = executor.stats().bytes_written;
  // CUDA parameters moved in place: the update's kernels start after the caller's work on them.
  DeviceOrdering after;
  if (!params.empty() && params[0].view.memory == MemoryKind::kCuda)
    after.wait_stream = cuda_stream != nullptr ? cuda_stream : cuda_legacy_stream();
  const Status status = executor.run_update(after);
  history.push_back({v, executor.stats().bytes_written - before, status.is_ok(), {}, {}});
  refresh_stats();
  return status;
}

void AdapterBase::start_background(std::uint64_t v, const std::atomic<int>* packable, std::function<Status(Status)> then) {
  RoundExecutor& executor = *connection->executor;
  background_version = v;
  background_bytes_before = executor.stats().bytes_written;  // read while no transfer runs
  thread.start([&executor, packable, then = std::move(then)] {
    Status done = executor.run_update({}, packable);
    return then ? then(std::move(done)) : done;
  });
}

Status AdapterBase::claim_background(const std::string& what) {
  if (!thread.active()) return Status::ok();
  // No deadline of its own: the transfer ends within the timeout of its last progress (the executor's
  // deadline), and this wait ends at once on a peer's failure.
  comm::Waiter w = waiter();
  w.timeout = comm::kNoDeadline;
  const Status status = thread.wait(w, what);
  if (thread.active()) {
    // Still running: its figures cannot be read now; the update counts as failed.
    history.push_back({background_version, 0, false, {}, {}});
    return status;
  }
  history.push_back({background_version, connection->executor->stats().bytes_written - background_bytes_before,
                     status.is_ok(), {}, {}});
  refresh_stats();
  return status;
}

AdapterStats AdapterBase::stats() const {
  AdapterStats s;
  s.version = version;
  s.stalls = stalls;
  s.history = history;
  s.trace = trace;
  if (connection) {
    const ExecutorStats& e = executor_stats;
    s.updates = e.updates;
    s.bytes_written = e.bytes_written;
    s.bytes_assembled = e.bytes_assembled;
    s.registrations = e.registrations;
    s.staging_bytes = connection->staging.bytes();
    for (const auto& [kind, link] : e.traffic)
      s.traffic.push_back({transport_name(kind), link.peer, static_cast<std::int64_t>(link.bytes),
                           static_cast<std::int64_t>(link.batches)});
  }
  return s;
}

}  // namespace wb::coord
