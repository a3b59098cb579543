#include "coord/adapter_common.hpp"

#include "weightbridge/checks.hpp"

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

}  // namespace

AdapterBase::AdapterBase(MPI_Comm world_comm, MPI_Comm group_comm, bool trainer, ParameterSet parameters,
                         LoadWeightsFn load, const AdapterOptions& adapter_options)
    : params(std::move(parameters)), load_weights(std::move(load)) {
  options = resolve_options(adapter_options);
  const bool stages = trainer ? options.sender_staging : options.receiver_staging;
  int level = MPI_THREAD_SINGLE;
  WB_CHECK_MPI(MPI_Query_thread(&level));
  WB_CHECK_MPI(MPI_Comm_dup(world_comm, &world));
  WB_CHECK_MPI(MPI_Comm_dup(group_comm, &group));
  roles = exchange_roles(world, group, trainer);
  // Agreed, so that every rank fails alike instead of some waiting for the others.
  Status usable;
  const std::string who = describe_worker(roles, roles.world_rank) + ": ";
  for (const Parameter& p : params)
    if (usable && (p.view.memory != MemoryKind::kHost || !p.view.is_contiguous()))
      usable = Status(ErrorCode::kUnsupported, who + "parameter " + p.name +
                                                   " is not contiguous host memory, which the adapters need so far");
  if (usable && !load_weights) usable = Status(ErrorCode::kInvalidArgument, who + "load_weights is empty");
  if (usable && stages && level < MPI_THREAD_MULTIPLE)
    usable = Status(ErrorCode::kUnsupported,
                    who + (trainer ? "sender" : "receiver") +
                        " staging runs the transfer on a background thread and needs MPI_THREAD_MULTIPLE, but MPI "
                        "was initialized with " + thread_level_name(level) + " (use MPI_Init_thread)");
  throw_if_error(agree(usable, world, options.timeout_seconds, "adapter construction"));
  clock_offset = measure_clock_offset(world, options.timeout_seconds);
}

AdapterBase::~AdapterBase() {
  thread.join();  // a background transfer still uses the executor
  connection.reset();
  // The communicators are not freed: Open MPI hands a freed context id to the next communicator, and a
  // message still in flight for this one (a failed update leaves some: a shutdown request, an
  // acknowledgement nobody waits for) would then be delivered to that communicator's receives.
}

Status AdapterBase::fail(Status status) {
  if (failure.is_ok()) failure = std::move(status);
  return failure;
}

AdapterStats AdapterBase::stats() const {
  AdapterStats s;
  s.version = version;
  s.stalls = stalls;
  if (connection) {
    const ExecutorStats& e = connection->executor->stats();
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
