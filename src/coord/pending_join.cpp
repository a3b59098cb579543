#include "coord/pending_join.hpp"

#include <chrono>
#include <span>
#include <utility>

#include "comm/collectives.hpp"
#include "comm/join.hpp"
#include "coord/catch_up.hpp"
#include "coord/fleet_link.hpp"
#include "coord/join_links.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"

namespace wb {

using namespace coord;

PollResult ReceiverAdapter::Pending::failed(Status status) {
  if (failure.is_ok()) failure = std::move(status);
  let_go();
  return {PollResult::Event::kFailed, version, failure};
}

void ReceiverAdapter::Pending::let_go() {
  try {
    settle_admission(true);  // bounded by the join's timeout
  } catch (const Error&) {  // not admitted: nothing to let go
  }
  if (leaders != MPI_COMM_NULL) comm::abandon_link(std::exchange(leaders, MPI_COMM_NULL));
}

void ReceiverAdapter::Pending::begin(MPI_Comm engine_comm, ParameterSet parameters, LoadWeightsFn load, AdapterOptions adapter_options,
                                     BeforeUpdateHook before_update_hook, std::shared_ptr<SpareTransports> transports,
                                     const ResolvedOptions& resolved, double poll_interval_seconds) {
  engine = engine_comm;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  params = std::move(parameters);
  load_weights = std::move(load);
  options = std::move(adapter_options);
  hook = std::move(before_update_hook);
  spares = std::move(transports);
  address = resolved.join_address;
  timeout = resolved.timeout_seconds;
  pace = comm::Pace(poll_interval_seconds);
  if (resolved.receiver_staging && !params.empty() && params[0].view.memory == MemoryKind::kHost)
    prestaging = std::async(std::launch::async, [params = params] {
      std::vector<ByteRanges> whole(params.size());
      for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].view.nbytes() > 0) whole[i] = {{0, static_cast<std::int64_t>(params[i].view.nbytes())}};
      auto staging = std::make_unique<Staging>(params, std::move(whole));
      staging->touch_at_connect(params, nullptr);  // every page faulted in now, not at the take
      return staging;
    });
  admit();
}

void ReceiverAdapter::Pending::admit() {
  if (rank == 0)
    admitting = std::async(std::launch::async, [address = address, timeout = timeout] { return comm::join_by_address(address, timeout); });
}

void ReceiverAdapter::Pending::settle_admission(bool wait) {
  if (!admitting.valid()) return;
  if (!wait && admitting.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  try {
    leaders = admitting.get();
  } catch (const Error& error) {
    throw Error(error.code(), "engine worker 0: " + error.status().message());
  }
  WB_LOG(kInfo) << "engine worker 0: admitted at " << address << "; waiting to be taken at the trainers' next send_weights";
}

namespace coord {

bool caught_up_before_take(MPI_Comm engine, const ParameterSet& params, const LoadWeightsFn& load, const AdapterOptions& options,
                           const BeforeUpdateHook& hook, const ResolvedOptions& resolved,
                           const std::shared_ptr<SpareTransports>& spares, std::uint64_t& version, SourceMap& probed,
                           StallInterval& stall, double& probe_seconds, double& replica_wait_seconds) {
  // The probe first, where the replica left its tensor list: the replica then waits for no probe. Meanwhile
  // the leader connects to the replica's port, and every worker makes the catch-up link with the replica,
  // its adapter and its buffers (threads); the copy begins once the probe is done.
  EarlyCatchUpLink link = start_catch_up_link(engine, params, load, resolved);
  std::vector<TensorInfo> tensors;
  const EarlyProbe early = probe_before_replica(engine, resolved.join_address, params, load, resolved, tensors, probed, probe_seconds);
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  const double began = comm::local_seconds();
  bool from_replica = false;
  // A failed probe copies nothing: the replica is told, and the trainers' connect probes again and says why.
  const Status caught = catch_up_before_take(engine, params, load, options, spares, hook, std::move(link), early != EarlyProbe::kFailed,
                                             from_replica, version, probed, tensors, replica_wait_seconds);
  if (!caught || !from_replica) {
    probed = SourceMap{};  // the trainers' connect probes (against their list)
    if (rank == 0 && !caught && early != EarlyProbe::kFailed) {
      WB_LOG(kWarn) << "engine worker 0: no first version from the trainers' replica engine (the trainers' next one comes "
                       "instead): " << caught.message();
    }
    return false;
  }
  stall = {version, began, comm::local_seconds()};
  if (rank == 0) {
    WB_LOG(kInfo) << "engine worker 0: installed version " << version << " from the trainers' replica engine before joining ("
                  << comm::seconds_text(stall.end_seconds - began) << ", of which " << comm::seconds_text(replica_wait_seconds)
                  << " until the replica took it); it serves that until the trainers take it";
  }
  return true;
}

}  // namespace coord

PollResult ReceiverAdapter::poll_pending() {
  Pending& p = *pending_;
  if (p.left) return {PollResult::Event::kShutdown, p.version, Status::ok()};
  if (!p.failure.is_ok()) return {PollResult::Event::kFailed, p.version, p.failure};
  // The replica's version is this engine's first: kConnected, then kInstalled of it (it serves from here).
  if (p.said < 2) {
    ++p.said;
    return {p.said == 1 ? PollResult::Event::kConnected : PollResult::Event::kInstalled, p.version, Status::ok()};
  }
  p.pace.before_step();
  // Rank 0 looks (never waiting) whether trainer 0 began to take this engine, else whether the trainers'
  // port still lives (their next send_weights may be a training step of any length away); every rank
  // decides alike.
  // 1: taken now; 2: their port is gone; 3: silent; 4: taken without the fleet link's offer; 5: the admission
  // failed; 6: admitted now (nothing else looked at in that poll)
  std::int32_t word = 0;
  Status admission;
  if (p.rank == 0 && !p.admitted) {
    try {
      p.settle_admission(false);
      if (p.leaders != MPI_COMM_NULL) word = 6;
    } catch (const Error& error) {
      admission = error.status();
      word = 5;
    }
  } else if (p.rank == 0) {
    if (!p.watch) p.watch.emplace(p.address, p.timeout);
    const comm::AddressWatch::Verdict seen = p.watch->look();
    word = fleet_offer_arrived(p.leaders)      ? 1
           : comm::take_began(p.leaders)        ? 4
           : seen == comm::AddressWatch::Verdict::kGone   ? 2
           : seen == comm::AddressWatch::Verdict::kSilent ? 3
                                                          : 0;
  }
  try {
    comm::broadcast_fixed(std::as_writable_bytes(std::span(&word, 1)), 0, p.engine, comm::Waiter{p.timeout, {}},
                          p.who() + ": whether the trainers take this engine");
  } catch (const Error& error) {
    return p.failed(error.status());
  }
  if (word == 5) {  // rank 0's reason, on every rank
    Status agreed = admission;
    try {
      comm::agree(admission, p.engine, comm::Waiter{p.timeout, {}}, "joining the trainers");
    } catch (const Error& error) {
      agreed = error.status();
    }
    return p.failed(agreed.is_ok() ? Status(ErrorCode::kInternal, p.who() + ": engine worker 0's admission at the trainers' port failed")
                                   : agreed);
  }
  if (word == 6) p.admitted = true;
  if (word == 0 || word == 6) {
    p.pace.after_step(true);
    return {PollResult::Event::kNone, p.version, Status::ok()};
  }
  if (word >= 2) {
    const Status why = word == 4 ? fleet_link_differs(false)
                                 : comm::AddressWatch(p.address, p.timeout).why(word == 2 ? comm::AddressWatch::Verdict::kGone
                                                                                          : comm::AddressWatch::Verdict::kSilent);
    return p.failed(Status(why.code(), p.who() + ": " + why.message()));
  }
  JoinedComms joined;
  try {
    joined = taken_by_trainers(p.engine, std::exchange(p.leaders, MPI_COMM_NULL), p.address, p.timeout);
  } catch (const Error& error) {
    return p.failed(error.status());
  }
  return adopt_pending(joined.link);
}

}  // namespace wb
