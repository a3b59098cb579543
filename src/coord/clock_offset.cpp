#include "coord/clock_offset.hpp"

#include <cstring>
#include <vector>

#include "comm/backoff.hpp"
#include "comm/operation.hpp"
#include "coord/messages.hpp"
#include "core/checks.hpp"

namespace wb::coord {

double measure_clock_offset(MPI_Comm world, const Roles& roles, double timeout) {
  return measure_clock_offset(world, timeout, [&roles](int rank) { return describe_worker(roles, rank); });
}

double measure_clock_offset(MPI_Comm world, double timeout, const std::function<std::string(int)>& name) {
  constexpr int kPings = 4;
  const comm::Waiter waiter{timeout, {}};
  int world_rank = 0, world_size = 0;
  WB_CHECK_MPI(MPI_Comm_rank(world, &world_rank));
  WB_CHECK_MPI(MPI_Comm_size(world, &world_size));
  if (world_rank == 0) {
    // Rank 0 answers every rank's pings as they come, all ranks at once: in turn, each rank's four round
    // trips waited for the ranks before it (12 round trips, 10-25 ms, over a link of two jobs on a loaded
    // machine, traced; twice on a join's way to its first install: its link and the catch-up's).
    std::vector<comm::OperationPtr> pings(static_cast<std::size_t>(world_size));
    std::vector<int> left(static_cast<std::size_t>(world_size), kPings);
    const auto post = [&](int r) {
      comm::OperationPtr& ping = pings[static_cast<std::size_t>(r)];
      ping = comm::make_operation(0, 1);
      WB_CHECK_MPI(MPI_Irecv(ping->in.data(), 1, MPI_BYTE, r, kClockTag, world, &ping->request));
    };
    for (int r = 1; r < world_size; ++r) post(r);
    int pending = (world_size - 1) * kPings;
    const double until = comm::local_seconds() + timeout;
    comm::Backoff backoff;
    while (pending > 0) {
      bool moved = false;
      for (int r = 1; r < world_size; ++r) {
        const auto i = static_cast<std::size_t>(r);
        int done = 0;
        if (left[i] == 0) continue;
        WB_CHECK_MPI(MPI_Test(&pings[i]->request, &done, MPI_STATUS_IGNORE));
        if (!done) continue;
        comm::OperationPtr reply = comm::make_operation(sizeof(double));
        const double now = comm::local_seconds();
        std::memcpy(reply->out.data(), &now, sizeof now);
        WB_CHECK_MPI(MPI_Isend(reply->out.data(), 1, MPI_DOUBLE, r, kClockTag, world, &reply->request));
        comm::abandon(std::move(reply));  // kept until sent: the pinger waits for it, under its own deadline
        --pending;
        if (--left[i] > 0) post(r);
        moved = true;
      }
      if (moved) {
        backoff.progressed();
        continue;
      }
      if (comm::local_seconds() > until) {
        int late = 1;
        while (left[static_cast<std::size_t>(late)] == 0) ++late;
        throw Error(ErrorCode::kTimeout, "measuring the job clock: clock ping from " + name(late) + " did not complete within " +
                                             comm::seconds_text(timeout));
      }
      backoff.pause();
    }
    return 0;
  }
  double best_round_trip = 1e30, offset = 0;
  for (int k = 0; k < kPings; ++k) {
    comm::OperationPtr reply = comm::make_operation(0, sizeof(double)), ping = comm::make_operation(1);
    const double sent = comm::local_seconds();
    WB_CHECK_MPI(MPI_Irecv(reply->in.data(), 1, MPI_DOUBLE, 0, kClockTag, world, &reply->request));
    WB_CHECK_MPI(MPI_Isend(ping->out.data(), 1, MPI_BYTE, 0, kClockTag, world, &ping->request));
    comm::wait_or_throw(ping, waiter, "measuring the job clock: clock ping to " + name(0));
    comm::wait_or_throw(reply, waiter, "measuring the job clock: clock reply from " + name(0));
    const double received = comm::local_seconds();
    double theirs = 0;
    std::memcpy(&theirs, reply->in.data(), sizeof theirs);
    if (received - sent < best_round_trip) {
      best_round_trip = received - sent;
      offset = theirs - (sent + received) / 2;
    }
  }
  return offset;
}

}  // namespace wb::coord
