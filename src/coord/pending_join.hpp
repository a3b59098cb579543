// A fleet link's joiner that the fleet's replica engine served before the trainers took it (issue 31, W4
// of docs/architecture.md): its first version comes from a replica that holds it, at once, and the engine
// serves it from its first poll_requests; it waits, admitted at the trainers' port, for their next
// send_weights, whose take it answers within a poll_requests (ReceiverAdapter::poll_pending), and goes onto
// their fleet link from there with the map it probed on the catch-up link.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "comm/backoff.hpp"
#include "comm/join.hpp"
#include "coord/connection.hpp"
#include "coord/staging.hpp"
#include "transport/spare_transports.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/source_map.hpp"

namespace wb {

struct ReceiverAdapter::Pending {
  MPI_Comm engine = MPI_COMM_NULL;
  MPI_Comm leaders = MPI_COMM_NULL;  // rank 0: the admission's link to trainer 0
  // Rank 0: the admission at the trainers' port, on a thread from the end of the copy, so that the engine
  // serves the replica's version at once (it took 0.13-0.18 s of every such join on the emulated cluster);
  // taken at a later poll. `admitted`: every rank, agreed at a poll.
  std::future<MPI_Comm> admitting;
  bool admitted = false;
  int rank = 0;
  ParameterSet params;
  LoadWeightsFn load_weights;
  AdapterOptions options;
  BeforeUpdateHook hook;
  std::shared_ptr<SpareTransports> spares;
  std::string address;
  double timeout = 0;
  std::uint64_t version = 0;  // from the replica
  SourceMap probed;           // probed before or on the catch-up link: the trainers' connect takes it as it is
  TransferSummary summary;    // until the take: longest_probe_seconds (the probe before the copy), replica_wait_seconds
  StallInterval stall;
  // A receiver that stages: its staging, made and faulted in on a thread while it waits to be taken, which
  // the connect at the take then shares (a fresh one was 0.5-0.6 s of that connect on the emulated cluster,
  // which every rank of the fleet link, the trainers', waits for). Null, or failed: the connect makes its own.
  std::future<std::unique_ptr<coord::Staging>> prestaging;
  std::optional<comm::AddressWatch> watch;  // rank 0: the trainers' port, while this engine waits to be taken
  int said = 0;  // 1: kConnected said, 2: kInstalled too
  bool left = false;
  Status failure;
  comm::Pace pace{0};  // the engine's poll_interval_us, set by the constructor

  std::string who() const { return "joined engine worker " + std::to_string(rank); }
  /// The replica's version installed: the engine serves it from its first poll_requests and waits to be
  /// taken, the arguments kept for the take; rank 0's admission at the trainers' port starts (admit), and
  /// an engine that stages starts making its staging (prestaging).
  void begin(MPI_Comm engine_comm, ParameterSet parameters, LoadWeightsFn load, AdapterOptions adapter_options,
             BeforeUpdateHook before_update_hook, std::shared_ptr<SpareTransports> transports, const coord::ResolvedOptions& resolved,
             double poll_interval_seconds);
  /// Failed for good: every later poll says so; the admission is let go (the trainers' take finds it gone).
  PollResult failed(Status status);
  /// Rank 0 starts its admission at the trainers' port (`address`) on a thread; the others nothing.
  void admit();
  /// Rank 0: the admission's link, once made (waits for it with `wait`); throws wb::Error when it failed.
  void settle_admission(bool wait);
  /// The admission let go (waited for when under way): the trainers' take finds it gone.
  void let_go();
};

namespace coord {

/// A fleet link's joiner, collective over `engine`, before it knocks at the trainers' port: the version the
/// trainers' replica engine holds, when its address file is there and touched (the process runs), written
/// into `params` (its `load_weights` probed before it connected where the replica's tensor list is there,
/// taking `probe_seconds` (left as given otherwise), else on that link; `probed`). False, with one warning
/// on a failure after the connect, when none came. `replica_wait_seconds`: how long the replica took to
/// take it (TransferSummary::replica_wait_seconds).
bool caught_up_before_take(MPI_Comm engine, const ParameterSet& params, const LoadWeightsFn& load, const AdapterOptions& options,
                           const BeforeUpdateHook& hook, const ResolvedOptions& resolved,
                           const std::shared_ptr<SpareTransports>& spares, std::uint64_t& version, SourceMap& probed,
                           StallInterval& stall, double& probe_seconds, double& replica_wait_seconds);

}  // namespace coord
}  // namespace wb
