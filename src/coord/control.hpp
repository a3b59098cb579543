// The coordinator's control plane: small MPI messages between trainer rank 0 and the engines' rank 0,
// agreement inside a group, waits with deadlines, and one clock for the stall intervals. MPI only: never
// the training or inference engine's own control plane, never weight bytes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::coord {

// Tags on the adapters' own duplicate of the world communicator.
inline constexpr int kRequestTag = 0x5701;  // trainer rank 0 -> engine rank 0
inline constexpr int kAckTag = 0x5702;      // engine rank 0 -> trainer rank 0
inline constexpr int kClockTag = 0x5703;    // clock offset ping-pong at construction
inline constexpr int kStartedTag = 0x5704;  // engine rank 0 -> trainer rank 0: "took update v" (diagnostics)

enum class RequestKind : std::int64_t { kNone = 0, kConnect = 1, kUpdate = 2, kShutdown = 3 };
const char* request_name(RequestKind kind);

struct Request {
  RequestKind kind = RequestKind::kNone;
  std::int64_t version = 0;
};

/// An engine's answer to an update: installed, or the error that stopped it.
struct Acknowledgement {
  std::int64_t version = 0;
  std::int32_t code = 0;  // ErrorCode
  char message[244] = {};
};

/// Seconds on this process's steady clock.
double local_seconds();

/// Polls `request` until it completes or `timeout_seconds` pass (kTimeout: "<what> did not complete
/// within N s"). Sleeps briefly between polls once the wait gets long, so waiting ranks leave the cores to
/// the ranks that work (CI oversubscribes).
Status wait_for(MPI_Request& request, double timeout_seconds, const std::string& what);

/// Collective over `comm`: every rank gives its status and every rank returns the same one, the failure
/// of the lowest failing rank (its message already names it), or ok.
Status agree(const Status& mine, MPI_Comm comm, double timeout_seconds, const std::string& what);

/// The roles of every world rank, learnt at construction (collective over world).
struct Roles {
  int world_rank = 0, world_size = 0;
  bool trainer = false;
  int trainer_leader = -1;             // world rank of trainer rank 0
  std::vector<int> engine_leaders;     // world rank of each engine's rank 0, ascending
  std::vector<int> engine_of_rank;     // per world rank: engine index, -1 for trainers
  int engine = -1;                     // this rank's engine
  bool leader = false;                 // rank 0 of its group
};

/// Collective over `world`: each rank says whether it trains and which group it belongs to. Throws when
/// the groups do not make one trainer group and at least one engine.
Roles exchange_roles(MPI_Comm world, MPI_Comm group, bool trainer);

/// Collective over `world`: the offset to add to local_seconds() to read world rank 0's clock, from the
/// fastest of a few ping-pongs with rank 0 (Cristian's method; error below half that round trip).
double measure_clock_offset(MPI_Comm world, double timeout_seconds);

}  // namespace wb::coord
