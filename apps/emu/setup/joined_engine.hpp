// A rollout engine that is an MPI job of its own and joins a running trainer job by its address file
// (issue 31): what wb-elastic's engine role and wb-replay --engine-job run. One engine per job: the job's
// world is the engine. Every version it installs is checked on every rank against the engine's own
// load_weights of that version, bit for bit, and the engine's ranks agree on it (one step of the job, within
// the timeout); the join is timed with its probe apart (the load_weights calls before kConnected).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weightbridge/adapter.hpp"

namespace wb::emu {

struct JoinedEngineRun {
  std::string name = "engine";  // in the lines rank 0 prints
  double step_ms = 2;           // the inference step between two polls
  double timeout = 10;          // how long the engine's ranks wait for one another at a check
  /// Told the version the engine expects next after each install (e.g. to prepare its check); optional.
  std::function<void(std::uint64_t version)> expect_next;
  /// One inference step of at least `ms` milliseconds (e.g. ReferenceAhead::inference_step); default: a sleep.
  std::function<void(double ms)> inference_step;
  /// Called on every rank before the join; the join begins when the last rank returns (e.g. rank 0 waits
  /// for a chosen point of the trainers' update); optional.
  std::function<void()> before_join;
};

/// "" when the parameters hold exactly `version` (the engine's own load_weights of it), else what differs.
using VersionCheck = std::function<std::string(std::uint64_t version)>;

/// One rank's view of the engine's run. Times are seconds on this machine's steady clock.
struct JoinedEngineOutcome {
  std::vector<std::uint64_t> installed;  // every version installed, in order
  std::int64_t verified = 0;             // of them, equal to the engine's own load_weights on every rank
  std::string failure;                   // the first failure met (this rank's, or the engine's); "" when none
  bool shut_down = false;                // the trainers shut down (the run's normal end)
  double join_began = 0;                 // the engine's last worker came to the join (a step of them all),
                                         // and the adapter's construction began: the job knocks at the port
  double taken = 0;                      // the trainers took the joiner at a send_weights (the adapter's
                                         // construction returned; served by a replica first: its link's
                                         // plan at hand after a poll)
  bool from_replica = false;             // its first version came from the fleet link's replica, before the
                                         // take (the adapter returned holding it)
  double probe_seconds = 0;              // the probe: the longest worker's (TransferSummary), at least this
                                         // rank's load_weights calls between taken and kConnected
  double replica_wait_seconds = 0;       // of the time to the first install: until the replica took the
                                         // joiner (TransferSummary::replica_wait_seconds)
  double connected = 0;                  // kConnected: the joiner's link is planned and registered
  double first_installed = 0;            // the first kInstalled (0: none)
  TransferSummary summary;               // the joined link's plan: the trainers to this one engine
  AdapterStats stats;                    // at the end; stalls on trainer rank 0's clock (the link's)
};

/// Joins by `options.join_address` with `params` and `load`, serves until the trainers shut down or the
/// engine fails, and returns this rank's outcome (never throws after the join: a failure is in `failure`).
/// Rank 0 prints "NAME: joined ...", "NAME: installed version V, bit for bit" (or that it differs) and the
/// end. `hook` runs before each install (e.g. a fault). Collective over MPI_COMM_WORLD.
JoinedEngineOutcome serve_joined_engine(const ParameterSet& params, const LoadWeightsFn& load, const AdapterOptions& options,
                                        const BeforeUpdateHook& hook, const VersionCheck& differs, const JoinedEngineRun& run);

/// The outcome as a report: versions, the join's timings relative to join_began (taken_after_s,
/// probe_s, connected_after_s, first_install_after_s, join_to_install_s from taken, or from join_began
/// for a first version from the replica, which no wait at the port precedes; after_probe_s =
/// join_to_install_s - probe_s), replica_wait_s (of it, until the replica took the joiner),
/// first_version_from_replica, the link's T_min, the trainers' planned egress per update for the link
/// (link_trainer_egress_bytes) and the stall intervals [version, begin, end].
nlohmann::json joined_engine_json(const JoinedEngineOutcome& outcome);

}  // namespace wb::emu
