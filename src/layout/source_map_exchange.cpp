#include "layout/source_map_exchange.hpp"

namespace wb {

std::vector<SourceMap> allgather_source_maps(const SourceMap& mine, MPI_Comm comm, const comm::Call& call,
                                             const Status& my_failure) {
  const std::vector<std::byte> bytes = my_failure.is_ok() ? serialize_source_map(mine) : std::vector<std::byte>{};
  const std::vector<std::vector<std::byte>> all =
      comm::allgather(bytes, comm, call.waiter, call.context + "the source maps", my_failure);
  std::vector<SourceMap> maps;
  maps.reserve(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    try {
      maps.push_back(deserialize_source_map(all[r]));
    } catch (const Error& e) {
      throw Error(e.code(), call.context + "source map received from " + call.rank_name(static_cast<int>(r)) + ": " +
                                e.status().message());
    }
  }
  return maps;
}

}  // namespace wb
