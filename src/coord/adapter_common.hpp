// What the two adapters share: their communicators, roles, clock and the checks at construction.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

#include "coord/connection.hpp"
#include "coord/control.hpp"
#include "coord/transfer_thread.hpp"

namespace wb::coord {

struct AdapterBase {
  MPI_Comm world = MPI_COMM_NULL;  // duplicates: the adapters' messages never meet the application's
  MPI_Comm group = MPI_COMM_NULL;
  Roles roles;
  ResolvedOptions options;
  ParameterSet params;
  LoadWeightsFn load_weights;
  double clock_offset = 0;
  std::optional<Connection> connection;
  Status failure;  // once set, every call returns it
  bool shut_down = false;
  std::vector<StallInterval> stalls;
  std::uint64_t version = 0;
  TransferThread thread;

  /// Collective over world. `stages` says whether this side runs transfers on the background thread.
  AdapterBase(MPI_Comm world, MPI_Comm group, bool trainer, ParameterSet params, LoadWeightsFn load_weights,
              const AdapterOptions& options);
  ~AdapterBase();

  double now() const { return local_seconds() + clock_offset; }
  /// Records the failure (the first one wins) and returns it.
  Status fail(Status status);
  AdapterStats stats() const;
};

}  // namespace wb::coord
