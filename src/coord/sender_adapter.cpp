// The trainer side of the coordinator. Trainer rank 0 speaks for the trainers: it sends the requests to
// every engine's rank 0 and collects their acknowledgements; the other trainers learn the outcome through
// an agreement over trainer_comm, so every trainer returns the same status.
#include <cstring>

#include "coord/adapter_common.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"

namespace wb {

using namespace coord;

struct SenderAdapter::State : AdapterBase {
  std::vector<TensorInfo> checkpoint_tensors;
  bool in_flight = false;           // `version` was sent and not yet acknowledged by every engine
  std::vector<std::uint64_t> started;  // trainer rank 0: last update each engine said it took
  double requested_at = 0;             // when the version in flight was requested

  State(MPI_Comm world, MPI_Comm trainers, ParameterSet params, std::vector<TensorInfo> tensors, LoadWeightsFn load,
        const AdapterOptions& options)
      : AdapterBase(world, trainers, true, std::move(params), std::move(load), options),
        checkpoint_tensors(std::move(tensors)) {}

  // Trainer rank 0: one request to every engine's rank 0. Small messages, sent eagerly.
  Status send_request(RequestKind kind, std::uint64_t v) {
    if (!roles.leader) return Status::ok();
    const std::int64_t message[2] = {static_cast<std::int64_t>(kind), static_cast<std::int64_t>(v)};
    std::vector<MPI_Request> requests(roles.engine_leaders.size(), MPI_REQUEST_NULL);
    for (std::size_t e = 0; e < requests.size(); ++e)
      if (MPI_Isend(message, 2, MPI_INT64_T, roles.engine_leaders[e], kRequestTag, world, &requests[e]) != MPI_SUCCESS)
        return Status(ErrorCode::kMpi, std::string("MPI_Isend of the ") + request_name(kind) + " request to " +
                                           describe_worker(roles, roles.engine_leaders[e]) + " failed");
    for (std::size_t e = 0; e < requests.size(); ++e) {
      Status status = wait_for(requests[e], options.timeout_seconds,
                               std::string("the ") + request_name(kind) + " request to " +
                                   describe_worker(roles, roles.engine_leaders[e]));
      if (!status) return status;
    }
    return Status::ok();
  }

  // Trainer rank 0: the "took update v" notes that have arrived.
  void take_started_notes() {
    started.resize(roles.engine_leaders.size(), 0);
    for (std::size_t e = 0; e < roles.engine_leaders.size(); ++e)
      for (;;) {
        int found = 0;
        std::int64_t v = 0;
        if (MPI_Iprobe(roles.engine_leaders[e], kStartedTag, world, &found, MPI_STATUS_IGNORE) != MPI_SUCCESS || !found) break;
        if (MPI_Recv(&v, 1, MPI_INT64_T, roles.engine_leaders[e], kStartedTag, world, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        started[e] = std::max(started[e], static_cast<std::uint64_t>(v));
      }
  }

  // Every trainer, after a failed update: trainer rank 0 names the engines that never took it (a rollout
  // that stopped polling shows up as a peer that stopped granting), and that diagnosis reaches all.
  Status diagnose(std::uint64_t v, const Status& cause) {
    Status diagnosis = cause;
    if (roles.leader) {
      take_started_notes();
      std::string silent;
      for (std::size_t e = 0; e < roles.engine_leaders.size(); ++e)
        if (started[e] < v) silent += (silent.empty() ? "" : ", ") + describe_worker(roles, roles.engine_leaders[e]);
      if (!silent.empty())
        diagnosis = Status(cause.code(), "trainer: version " + std::to_string(v) + " failed: " + silent +
                                             " never took it (no poll_requests in the " +
                                             seconds_text(local_seconds() - requested_at) +
                                             " since the request); the first error was: " + cause.message());
    }
    return agree(diagnosis, group, 2 * options.timeout_seconds + 10, "the diagnosis of version " + std::to_string(v));
  }

  // Trainer rank 0: every engine's acknowledgement of version v, each within the timeout.
  Status collect_acknowledgements(std::uint64_t v) {
    const std::size_t engines = roles.engine_leaders.size();
    std::vector<Acknowledgement> acks(engines);
    std::vector<MPI_Request> requests(engines, MPI_REQUEST_NULL);
    for (std::size_t e = 0; e < engines; ++e)
      if (MPI_Irecv(&acks[e], sizeof(Acknowledgement), MPI_BYTE, roles.engine_leaders[e], kAckTag, world, &requests[e]) !=
          MPI_SUCCESS)
        return Status(ErrorCode::kMpi, "MPI_Irecv of an acknowledgement failed");
    const double deadline = local_seconds() + options.timeout_seconds;
    Status result;
    for (std::size_t e = 0; e < engines; ++e) {
      if (!result) break;
      Status status = wait_for(requests[e], std::max(0.0, deadline - local_seconds()),
                               describe_worker(roles, roles.engine_leaders[e]) + "'s acknowledgement of version " +
                                   std::to_string(v));
      if (!status) {
        result = Status(ErrorCode::kTimeout,
                        "trainer: " + describe_worker(roles, roles.engine_leaders[e]) + " did not install version " +
                            std::to_string(v) + " within " + seconds_text(options.timeout_seconds) +
                            " (it stopped calling poll_requests, or its transfer is stuck)");
        break;
      }
      if (acks[e].code != 0)
        result = Status(static_cast<ErrorCode>(acks[e].code),
                        std::string(acks[e].message, strnlen(acks[e].message, sizeof acks[e].message)));
      else if (acks[e].version != static_cast<std::int64_t>(v))
        result = Status(ErrorCode::kInternal, describe_worker(roles, roles.engine_leaders[e]) + " acknowledged version " +
                                                  std::to_string(acks[e].version) + " while " + std::to_string(v) +
                                                  " was in flight");
    }
    // Receives still pending after a failure are cancelled: nothing will match them any more.
    for (MPI_Request& request : requests)
      if (request != MPI_REQUEST_NULL) {
        MPI_Cancel(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
      }
    take_started_notes();
    return result;
  }

  // Ends the version in flight: the background transfer (sender staging) and every engine's
  // acknowledgement, agreed over the trainers.
  Status finish_in_flight() {
    if (!in_flight) return Status::ok();
    in_flight = false;
    Status local = thread.wait(options.timeout_seconds, "trainer: the background transfer of version " + std::to_string(version));
    if (local && roles.leader) local = collect_acknowledgements(version);
    // Trainer rank 0 may wait up to a whole timeout for the acknowledgements before it agrees.
    Status agreed = agree(local, group, 2 * options.timeout_seconds + 10, "the trainers' outcome of version " + std::to_string(version));
    if (!agreed) return fail(diagnose(version, agreed));
    return agreed;
  }
};

SenderAdapter::SenderAdapter(MPI_Comm world, MPI_Comm trainer_comm, ParameterSet params,
                             std::vector<TensorInfo> checkpoint_tensors, LoadWeightsFn load_weights,
                             AdapterOptions options)
    : state_(std::make_unique<State>(world, trainer_comm, std::move(params), std::move(checkpoint_tensors),
                                     std::move(load_weights), options)) {}

SenderAdapter::~SenderAdapter() {
  if (state_ && state_->connection && !state_->shut_down) {
    const Status status = shutdown();
    if (!status) {
      WB_LOG(kWarn) << "SenderAdapter shutdown: " << status.to_string();
    }
  }
}

void SenderAdapter::connect() {
  State& s = *state_;
  if (s.connection) throw Error(ErrorCode::kInvalidArgument, "SenderAdapter::connect called twice");
  throw_if_error(s.send_request(RequestKind::kConnect, 0));
  ConnectInput input;
  input.world = s.world;
  input.roles = &s.roles;
  input.params = &s.params;
  input.load_weights = &s.load_weights;
  input.checkpoint_tensors = &s.checkpoint_tensors;
  input.options = s.options;
  s.connection.emplace(establish_connection(input));
}

Status SenderAdapter::send_weights(std::uint64_t version) {
  State& s = *state_;
  if (!s.failure.is_ok()) return s.failure;
  if (!s.connection || s.shut_down)
    return Status(ErrorCode::kInvalidArgument, "send_weights before connect or after shutdown");
  if (version <= s.version)
    return Status(ErrorCode::kInvalidArgument, "send_weights(" + std::to_string(version) +
                                                   "): versions must increase, the last one sent was " +
                                                   std::to_string(s.version));
  const double began = s.now();
  Status status = s.finish_in_flight();
  if (!status) return status;
  s.requested_at = local_seconds();
  status = s.send_request(RequestKind::kUpdate, version);
  if (!status) return s.fail(status);
  s.version = version;
  s.in_flight = true;
  RoundExecutor& executor = *s.connection->executor;
  if (s.options.sender_staging) {
    // The staged copy is what the transfer reads: the trainer may change its parameters from here on.
    s.connection->staging.copy_from(s.params);
    s.thread.start([&executor] { return executor.run_update(); });
  } else {
    // Every trainer takes part in the same agreements whatever happened, so a failure on one reaches all.
    status = agree(executor.run_update(), s.group, 2 * s.options.timeout_seconds + 10,
                   "the trainers' writes of version " + std::to_string(version));
    if (!status) {
      s.in_flight = false;
      status = s.fail(s.diagnose(version, status));
    } else if (!s.connection->rollouts_stage) {
      status = s.finish_in_flight();  // synchronous: wait for the installs
    }
  }
  s.stalls.push_back({version, began, s.now()});
  return status;
}

Status SenderAdapter::wait() {
  State& s = *state_;
  if (!s.failure.is_ok()) return s.failure;
  return s.finish_in_flight();
}

Status SenderAdapter::shutdown() {
  State& s = *state_;
  if (!s.connection || s.shut_down) return s.failure;
  Status status = s.failure.is_ok() ? s.finish_in_flight() : s.failure;
  // Sent after a failure too, so that the engines stop polling; the connection itself stays until the
  // adapter is destroyed (its statistics remain readable).
  const Status sent = s.send_request(RequestKind::kShutdown, s.version);
  s.shut_down = true;
  return status ? sent : status;
}

bool SenderAdapter::connected() const { return state_->connection.has_value(); }

const TransferSummary& SenderAdapter::summary() const {
  static const TransferSummary none;
  return state_->connection ? state_->connection->summary : none;
}

AdapterStats SenderAdapter::stats() const { return state_->stats(); }

}  // namespace wb
