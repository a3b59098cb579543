#include "coord/control.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "weightbridge/checks.hpp"

namespace wb::coord {

const char* request_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::kNone: return "none";
    case RequestKind::kConnect: return "connect";
    case RequestKind::kUpdate: return "update";
    case RequestKind::kShutdown: return "shutdown";
  }
  return "unknown";
}

double local_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status wait_for(MPI_Request& request, double timeout_seconds, const std::string& what) {
  const double start = local_seconds();
  for (int polls = 0;; ++polls) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return Status(ErrorCode::kMpi, "MPI_Test failed while waiting for " + what);
    if (done) return Status::ok();
    const double waited = local_seconds() - start;
    if (waited > timeout_seconds)
      // The request stays pending (a collective cannot be cancelled); the caller's object is failed from
      // now on and never waits on it again.
      return Status(ErrorCode::kTimeout, what + " did not complete within " + std::to_string(timeout_seconds) + " s");
    // Spin first (answers usually come within microseconds), then yield the core.
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.1 ? 500 : 50));
  }
}

namespace {
struct StatusRecord {
  std::int32_t code = 0;
  char message[252] = {};
};
}  // namespace

Status agree(const Status& mine, MPI_Comm comm, double timeout_seconds, const std::string& what) {
  int size = 0;
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  StatusRecord record;
  record.code = static_cast<std::int32_t>(mine.code());
  std::strncpy(record.message, mine.message().c_str(), sizeof record.message - 1);
  std::vector<StatusRecord> all(static_cast<std::size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Iallgather(&record, sizeof record, MPI_BYTE, all.data(), sizeof record, MPI_BYTE, comm, &request) !=
      MPI_SUCCESS)
    return Status(ErrorCode::kMpi, "MPI_Iallgather failed while agreeing on " + what);
  Status status = wait_for(request, timeout_seconds, "agreement on " + what + " (some rank did not get there)");
  if (!status) return status;
  for (const StatusRecord& r : all)
    if (r.code != 0) return Status(static_cast<ErrorCode>(r.code), std::string(r.message, strnlen(r.message, sizeof r.message)));
  return Status::ok();
}

Roles exchange_roles(MPI_Comm world, MPI_Comm group, bool trainer) {
  Roles roles;
  WB_CHECK_MPI(MPI_Comm_rank(world, &roles.world_rank));
  WB_CHECK_MPI(MPI_Comm_size(world, &roles.world_size));
  roles.trainer = trainer;
  int group_rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(group, &group_rank));
  roles.leader = group_rank == 0;
  int leader = roles.world_rank;
  WB_CHECK_MPI(MPI_Bcast(&leader, 1, MPI_INT, 0, group));
  const int mine[2] = {trainer ? 1 : 0, leader};
  std::vector<int> all(2 * static_cast<std::size_t>(roles.world_size));
  WB_CHECK_MPI(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, world));
  for (int r = 0; r < roles.world_size; ++r) {
    const bool is_trainer = all[2 * static_cast<std::size_t>(r)] != 0;
    const int its_leader = all[2 * static_cast<std::size_t>(r) + 1];
    if (is_trainer) {
      if (roles.trainer_leader >= 0 && roles.trainer_leader != its_leader)
        throw Error(ErrorCode::kInvalidArgument, "world ranks " + std::to_string(roles.trainer_leader) + " and " +
                                                     std::to_string(its_leader) +
                                                     " both lead a trainer group: all trainers must share one trainer_comm");
      roles.trainer_leader = its_leader;
    } else if (std::find(roles.engine_leaders.begin(), roles.engine_leaders.end(), its_leader) ==
               roles.engine_leaders.end()) {
      roles.engine_leaders.push_back(its_leader);
    }
  }
  if (roles.trainer_leader < 0) throw Error(ErrorCode::kInvalidArgument, "no SenderAdapter in the world communicator");
  if (roles.engine_leaders.empty()) throw Error(ErrorCode::kInvalidArgument, "no ReceiverAdapter in the world communicator");
  std::sort(roles.engine_leaders.begin(), roles.engine_leaders.end());
  roles.engine_of_rank.assign(static_cast<std::size_t>(roles.world_size), -1);
  for (int r = 0; r < roles.world_size; ++r) {
    if (all[2 * static_cast<std::size_t>(r)] != 0) continue;
    const int its_leader = all[2 * static_cast<std::size_t>(r) + 1];
    roles.engine_of_rank[static_cast<std::size_t>(r)] = static_cast<int>(
        std::lower_bound(roles.engine_leaders.begin(), roles.engine_leaders.end(), its_leader) - roles.engine_leaders.begin());
  }
  roles.engine = roles.engine_of_rank[static_cast<std::size_t>(roles.world_rank)];
  return roles;
}

double measure_clock_offset(MPI_Comm world, double timeout_seconds) {
  constexpr int kPings = 4;
  int rank = 0, size = 0;
  WB_CHECK_MPI(MPI_Comm_rank(world, &rank));
  WB_CHECK_MPI(MPI_Comm_size(world, &size));
  if (rank == 0) {
    // Rank 0 answers every rank in turn: each ping gets rank 0's time back.
    for (int r = 1; r < size; ++r)
      for (int k = 0; k < kPings; ++k) {
        char ping = 0;
        MPI_Request request = MPI_REQUEST_NULL;
        WB_CHECK_MPI(MPI_Irecv(&ping, 1, MPI_CHAR, r, kClockTag, world, &request));
        throw_if_error(wait_for(request, timeout_seconds, "clock ping from world rank " + std::to_string(r)));
        const double now = local_seconds();
        WB_CHECK_MPI(MPI_Send(&now, 1, MPI_DOUBLE, r, kClockTag, world));
      }
    return 0;
  }
  double best_round_trip = 1e30, offset = 0;
  for (int k = 0; k < kPings; ++k) {
    const char ping = 1;
    double theirs = 0;
    MPI_Request requests[2];
    const double sent = local_seconds();
    WB_CHECK_MPI(MPI_Irecv(&theirs, 1, MPI_DOUBLE, 0, kClockTag, world, &requests[1]));
    WB_CHECK_MPI(MPI_Isend(&ping, 1, MPI_CHAR, 0, kClockTag, world, &requests[0]));
    for (MPI_Request& request : requests)
      throw_if_error(wait_for(request, timeout_seconds, "clock reply from world rank 0"));
    const double received = local_seconds();
    if (received - sent < best_round_trip) {
      best_round_trip = received - sent;
      offset = theirs - (sent + received) / 2;
    }
  }
  return offset;
}

}  // namespace wb::coord
