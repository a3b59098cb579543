// The exchange of source maps over MPI (layout/source_map_exchange.cpp): kept out of source_map.hpp, so that
// the data types need no MPI.
#pragma once

#include <mpi.h>

#include <vector>

#include "weightbridge/source_map.hpp"

namespace wb {

/// Every rank's source map, in rank order of `comm`: each rank serializes its own map and the bytes are
/// exchanged with one MPI_Allgatherv (plus the MPI_Allgather of the sizes). Collective over `comm`.
std::vector<SourceMap> allgather_source_maps(const SourceMap& mine, MPI_Comm comm);

}  // namespace wb
