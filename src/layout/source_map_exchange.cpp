#include <mpi.h>

#include <climits>

#include "core/checks.hpp"
#include "layout/source_map_exchange.hpp"

namespace wb {

std::vector<SourceMap> allgather_source_maps(const SourceMap& mine, MPI_Comm comm) {
  int size = 0;
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  const std::vector<std::byte> bytes = serialize_source_map(mine);
  if (bytes.size() > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::kUnsupported, "source map of " + std::to_string(bytes.size()) + " bytes exceeds an MPI count");
  const int count = static_cast<int>(bytes.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displacements(static_cast<std::size_t>(size));
  WB_CHECK_MPI(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm));
  long long total = 0;
  for (int r = 0; r < size; ++r) {
    displacements[static_cast<std::size_t>(r)] = static_cast<int>(total);
    total += counts[static_cast<std::size_t>(r)];
  }
  if (total > INT_MAX)
    throw Error(ErrorCode::kUnsupported, "all source maps together take " + std::to_string(total) +
                                             " bytes, more than one MPI_Allgatherv carries");
  std::vector<std::byte> all(static_cast<std::size_t>(total));
  WB_CHECK_MPI(MPI_Allgatherv(bytes.data(), count, MPI_BYTE, all.data(), counts.data(), displacements.data(), MPI_BYTE,
                              comm));
  std::vector<SourceMap> maps;
  maps.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    try {
      maps.push_back(deserialize_source_map(
          std::span(all).subspan(static_cast<std::size_t>(displacements[static_cast<std::size_t>(r)]),
                                 static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]))));
    } catch (const Error& e) {
      throw Error(e.code(), "source map received from rank " + std::to_string(r) + ": " + e.status().message());
    }
  }
  return maps;
}

}  // namespace wb
