#include "plan/round_schedule_scatter.hpp"

#include "core/checks.hpp"

namespace wb {

RoundSchedule scatter_round_schedules(const std::vector<std::vector<std::byte>>& serialized, int root, MPI_Comm comm,
                                      const comm::Call& call, const Status& root_failure) {
  const std::vector<std::byte> mine =
      comm::scatter(serialized, root, comm, call.waiter, call.context + "the round schedules", root_failure);
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  RoundSchedule schedule;
  Status decoded;
  try {
    schedule = deserialize_round_schedule(mine);
  } catch (const Error& e) {
    decoded = Status(e.code(), call.context + "round schedule received by " + call.rank_name(rank) + ": " + e.status().message());
  }
  comm::agree(decoded, comm, call.waiter, call.context + "decoding the round schedules");
  return schedule;
}

}  // namespace wb
