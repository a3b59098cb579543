// The exchange of source maps over MPI (layout/source_map_exchange.cpp): kept out of source_map.hpp, so that
// the data types need no MPI. The one exchange connect, the emulators, the baselines and the tests use.
#pragma once

#include <mpi.h>

#include <vector>

#include "comm/collectives.hpp"
#include "weightbridge/source_map.hpp"

namespace wb {

/// Every rank's source map, in rank order of `comm`: each rank serializes its own map and the bytes are
/// exchanged with comm::allgather (an all-gather of the sizes, then one MPI_Iallgatherv), within the call's
/// deadline. A rank that passes a failure in place of its map (`my_failure`: its probe failed) makes every
/// rank throw it; a map that does not decode throws kCorruptData on every rank ("source map received from
/// <rank>: ..."). Collective over `comm`.
std::vector<SourceMap> allgather_source_maps(const SourceMap& mine, MPI_Comm comm, const comm::Call& call = {},
                                             const Status& my_failure = Status::ok());

}  // namespace wb
