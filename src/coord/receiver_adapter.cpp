// The rollout side of the coordinator. Every poll_requests is one small all-reduce over the engine: rank 0
// contributes the request it found (if any), every rank whether its staged transfer has finished or
// failed, so that all ranks of the engine take the same decision at the same step.
#include <cstring>

#include "coord/adapter_common.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"

namespace wb {

using namespace coord;

const char* poll_event_name(PollResult::Event event) {
  switch (event) {
    case PollResult::Event::kNone: return "none";
    case PollResult::Event::kConnected: return "connected";
    case PollResult::Event::kReceiving: return "receiving";
    case PollResult::Event::kInstalled: return "installed";
    case PollResult::Event::kShutdown: return "shutdown";
    case PollResult::Event::kFailed: return "failed";
  }
  return "unknown";
}

struct ReceiverAdapter::State : AdapterBase {
  BeforeUpdateHook hook;
  std::uint64_t receiving = 0;  // version arriving in staging, 0 when none
  bool staged_done = false;     // this rank's part of it has finished, with staged_status
  Status staged_status;

  State(MPI_Comm world, MPI_Comm engine, ParameterSet params, LoadWeightsFn load, const AdapterOptions& options,
        BeforeUpdateHook before_update_hook)
      : AdapterBase(world, engine, false, std::move(params), std::move(load), options),
        hook(std::move(before_update_hook)) {}

  std::string who() const { return describe_worker(roles, roles.world_rank); }

  // Engine rank 0 tells trainer rank 0 that version v is installed on the whole engine, or why not.
  Status acknowledge(std::uint64_t v, const Status& outcome) {
    if (!roles.leader) return Status::ok();
    Acknowledgement ack;
    ack.version = static_cast<std::int64_t>(v);
    ack.code = static_cast<std::int32_t>(outcome.code());
    std::strncpy(ack.message, outcome.message().c_str(), sizeof ack.message - 1);
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(&ack, sizeof ack, MPI_BYTE, roles.trainer_leader, kAckTag, world, &request) != MPI_SUCCESS)
      return Status(ErrorCode::kMpi, who() + ": MPI_Isend of the acknowledgement failed");
    return wait_for(request, options.timeout_seconds, who() + ": the acknowledgement of version " + std::to_string(v));
  }

  // Hook, install, acknowledge, agreed over the engine. `transfer` writes straight into the parameters
  // (no staging) or is null (staging: copy the staged version in).
  PollResult install(std::uint64_t v, RoundExecutor* transfer) {
    const double began = now();
    Status status;
    try {
      if (hook) hook(v);
    } catch (const std::exception& error) {
      status = Status(ErrorCode::kInvalidArgument, who() + ": before_update_hook(" + std::to_string(v) + ") threw: " + error.what());
    }
    if (status) {
      if (transfer != nullptr)
        status = transfer->run_update();
      else
        connection->staging.copy_to(params);
    }
    status = agree(status, group, options.timeout_seconds, who() + ": installing version " + std::to_string(v));
    const Status acknowledged = acknowledge(v, status);
    stalls.push_back({v, began, now()});
    if (status && !acknowledged) status = acknowledged;
    if (!status) return {PollResult::Event::kFailed, version, fail(status)};
    version = v;
    return {PollResult::Event::kInstalled, version, Status::ok()};
  }

  PollResult poll() {
    if (shut_down) return {PollResult::Event::kShutdown, version, Status::ok()};
    if (!failure.is_ok()) return {PollResult::Event::kFailed, version, failure};

    // Rank 0 looks for a request; every rank reports its staged transfer.
    std::int64_t values[4] = {0, 0, 0, 0};  // request kind, request version, still arriving, failed
    if (receiving != 0 && !staged_done && thread.finished()) {
      staged_status = thread.wait(options.timeout_seconds, who() + ": the staged transfer");
      staged_done = true;
    }
    if (receiving != 0) {
      values[2] = staged_done ? 0 : 1;
      values[3] = staged_done && !staged_status ? 1 : 0;
    }
    if (roles.leader) {
      int found = 0;
      MPI_Status probe;
      if (MPI_Iprobe(roles.trainer_leader, kRequestTag, world, &found, &probe) != MPI_SUCCESS)
        return {PollResult::Event::kFailed, version, fail(Status(ErrorCode::kMpi, who() + ": MPI_Iprobe failed"))};
      if (found && MPI_Recv(values, 2, MPI_INT64_T, roles.trainer_leader, kRequestTag, world, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return {PollResult::Event::kFailed, version, fail(Status(ErrorCode::kMpi, who() + ": MPI_Recv of a request failed"))};
      if (found && static_cast<RequestKind>(values[0]) == RequestKind::kUpdate) {
        // An update followed by a shutdown was given up by the trainers (they shut down only after every
        // install, or after a failure): taking it would write into peers that may be gone.
        std::int64_t next[2] = {0, 0};
        if (MPI_Iprobe(roles.trainer_leader, kRequestTag, world, &found, &probe) == MPI_SUCCESS && found &&
            MPI_Recv(next, 2, MPI_INT64_T, roles.trainer_leader, kRequestTag, world, MPI_STATUS_IGNORE) == MPI_SUCCESS) {
          values[0] = next[0];
          values[1] = next[1];
        } else {
          // Tell trainer rank 0 that this engine took the update (names silent engines when one fails).
          const std::int64_t taken = values[1];
          MPI_Request note = MPI_REQUEST_NULL;
          if (MPI_Isend(&taken, 1, MPI_INT64_T, roles.trainer_leader, kStartedTag, world, &note) == MPI_SUCCESS)
            (void)wait_for(note, options.timeout_seconds, who() + ": the note that it took an update");
        }
      }
    }
    std::int64_t agreed[4] = {0, 0, 0, 0};
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Iallreduce(values, agreed, 4, MPI_INT64_T, MPI_MAX, group, &request) != MPI_SUCCESS)
      return {PollResult::Event::kFailed, version, fail(Status(ErrorCode::kMpi, who() + ": MPI_Iallreduce failed"))};
    Status status = wait_for(request, options.timeout_seconds, who() + ": the engine's poll_requests step (a rank of the engine stopped polling)");
    if (!status) return {PollResult::Event::kFailed, version, fail(status)};

    // A staged version that every rank has complete (or that failed somewhere) is settled first.
    if (receiving != 0 && agreed[2] == 0) {
      const std::uint64_t v = receiving;
      receiving = 0;
      staged_done = false;
      if (agreed[3] != 0) {
        // Every rank learns the failing rank's reason; rank 0 passes it to the trainers.
        status = agree(staged_status, group, options.timeout_seconds, who() + ": receiving version " + std::to_string(v));
        if (status) status = Status(ErrorCode::kInternal, who() + ": a staged transfer failed without a reason");
        (void)acknowledge(v, status);
        return {PollResult::Event::kFailed, version, fail(status)};
      }
      return install(v, nullptr);
    }

    const auto kind = static_cast<RequestKind>(agreed[0]);
    const auto v = static_cast<std::uint64_t>(agreed[1]);
    switch (kind) {
      case RequestKind::kNone:
        return {receiving != 0 ? PollResult::Event::kReceiving : PollResult::Event::kNone, version, Status::ok()};
      case RequestKind::kConnect: {
        if (connection) return {PollResult::Event::kFailed, version, fail(Status(ErrorCode::kInvalidArgument, who() + ": a second connect request"))};
        ConnectInput input;
        input.world = world;
        input.roles = &roles;
        input.params = &params;
        input.load_weights = &load_weights;
        input.options = options;
        try {
          connection.emplace(establish_connection(input));
        } catch (const Error& error) {
          return {PollResult::Event::kFailed, version, fail(error.status())};
        }
        return {PollResult::Event::kConnected, version, Status::ok()};
      }
      case RequestKind::kUpdate: {
        if (!connection || receiving != 0 || v <= version) {
          status = Status(ErrorCode::kInternal, who() + ": update request for version " + std::to_string(v) +
                                                    (connection ? " while at version " + std::to_string(version) : " before connect"));
          (void)acknowledge(v, status);
          return {PollResult::Event::kFailed, version, fail(status)};
        }
        RoundExecutor& executor = *connection->executor;
        if (!options.receiver_staging) return install(v, &executor);
        receiving = v;
        staged_done = false;
        thread.start([&executor] { return executor.run_update(); });
        return {PollResult::Event::kReceiving, version, Status::ok()};
      }
      case RequestKind::kShutdown:
        shut_down = true;
        return {PollResult::Event::kShutdown, version, Status::ok()};
    }
    return {PollResult::Event::kFailed, version,
            fail(Status(ErrorCode::kCorruptData, who() + ": unknown request kind " + std::to_string(agreed[0])))};
  }
};

ReceiverAdapter::ReceiverAdapter(MPI_Comm world, MPI_Comm engine_comm, ParameterSet params, LoadWeightsFn load_weights,
                                 AdapterOptions options, BeforeUpdateHook before_update_hook)
    : state_(std::make_unique<State>(world, engine_comm, std::move(params), std::move(load_weights), options,
                                     std::move(before_update_hook))) {}

ReceiverAdapter::~ReceiverAdapter() = default;

PollResult ReceiverAdapter::poll_requests() { return state_->poll(); }
std::uint64_t ReceiverAdapter::installed_version() const { return state_->version; }
bool ReceiverAdapter::connected() const { return state_->connection.has_value(); }
bool ReceiverAdapter::closed() const { return state_->shut_down || !state_->failure.is_ok(); }

const TransferSummary& ReceiverAdapter::summary() const {
  static const TransferSummary none;
  return state_->connection ? state_->connection->summary : none;
}

AdapterStats ReceiverAdapter::stats() const { return state_->stats(); }

}  // namespace wb
