#include "plan/round_schedule_scatter.hpp"

#include <climits>
#include <cstdint>
#include <string>

#include "core/checks.hpp"

namespace wb {

RoundSchedule scatter_round_schedules(const std::vector<std::vector<std::byte>>& serialized, int root, MPI_Comm comm) {
  int size = 0, rank = 0;
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  WB_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  if (root < 0 || root >= size)  // every rank sees the same root, so every rank throws: no hang
    throw Error(ErrorCode::kInvalidArgument, "scatter_round_schedules: root " + std::to_string(root) +
                                                 " is not a rank of a communicator of " + std::to_string(size));

  // The root checks its input first. A problem there must not leave the other ranks waiting in a
  // collective: the root still scatters the sizes, each a negative code, and every rank throws.
  std::vector<int> counts, displacements;
  std::vector<std::byte> all;
  Status root_problem;
  if (rank == root) {
    if (serialized.size() != static_cast<std::size_t>(size)) {
      root_problem = Status(ErrorCode::kInvalidArgument,
                            "scatter_round_schedules: " + std::to_string(serialized.size()) + " schedules given for a communicator of " +
                                std::to_string(size) + " ranks");
    } else {
      long long total = 0;
      for (int r = 0; r < size && root_problem.is_ok(); ++r) {
        const std::size_t bytes = serialized[static_cast<std::size_t>(r)].size();
        if (bytes > static_cast<std::size_t>(INT_MAX))
          root_problem = Status(ErrorCode::kUnsupported, "scatter_round_schedules: the schedule of rank " + std::to_string(r) +
                                                             " takes " + std::to_string(bytes) + " bytes, more than an MPI count");
        else if ((total += static_cast<long long>(bytes)) > INT_MAX)
          root_problem = Status(ErrorCode::kUnsupported,
                                "scatter_round_schedules: the schedules of ranks 0 to " + std::to_string(r) + " take " +
                                    std::to_string(total) + " bytes, more than one MPI_Scatterv addresses (rank " +
                                    std::to_string(r) + "'s takes " + std::to_string(bytes) + ")");
      }
    }
    if (!root_problem.is_ok()) {
      counts.assign(static_cast<std::size_t>(size), -1 - static_cast<int>(root_problem.code()));
    } else {
      counts.resize(static_cast<std::size_t>(size));
      displacements.resize(static_cast<std::size_t>(size));
      std::size_t total = 0;
      for (const auto& one : serialized) total += one.size();
      all.reserve(total);
      for (int r = 0; r < size; ++r) {
        const auto& one = serialized[static_cast<std::size_t>(r)];
        counts[static_cast<std::size_t>(r)] = static_cast<int>(one.size());
        displacements[static_cast<std::size_t>(r)] = static_cast<int>(all.size());
        all.insert(all.end(), one.begin(), one.end());
      }
    }
  }

  int count = 0;
  WB_CHECK_MPI(MPI_Scatter(counts.data(), 1, MPI_INT, &count, 1, MPI_INT, root, comm));
  if (count < 0) {
    if (rank == root) throw Error(root_problem);
    const int code = -1 - count;
    throw Error(code > 0 && code <= static_cast<int>(ErrorCode::kInternal) ? static_cast<ErrorCode>(code) : ErrorCode::kInternal,
                "round schedule for rank " + std::to_string(rank) + ": the root rank " + std::to_string(root) +
                    " could not scatter the schedules (its error names the cause)");
  }
  std::vector<std::byte> mine(static_cast<std::size_t>(count));
  WB_CHECK_MPI(MPI_Scatterv(all.data(), counts.data(), displacements.data(), MPI_BYTE, mine.data(), count, MPI_BYTE,
                            root, comm));
  try {
    return deserialize_round_schedule(mine);
  } catch (const Error& e) {
    throw Error(e.code(), "round schedule received by rank " + std::to_string(rank) + ": " + e.status().message());
  }
}

}  // namespace wb
