#include "emu/setup/joined_engine.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "comm/deadline.hpp"
#include "comm/group.hpp"

namespace wb::emu {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

JoinedEngineOutcome serve_joined_engine(const ParameterSet& params, const LoadWeightsFn& load, const AdapterOptions& options,
                                        const BeforeUpdateHook& hook, const VersionCheck& differs, const JoinedEngineRun& run) {
  const int rank = world_rank();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  JoinedEngineOutcome out;
  const auto fail = [&out](const std::string& why) {
    if (out.failure.empty()) out.failure = why;
  };
  // The probe: the joiner's load_weights calls after the take and before kConnected (none after); at
  // kConnected the library's time of the whole probe, where longer.
  bool probing = true;
  const LoadWeightsFn timed = [&](const CheckpointReader& checkpoint, const ParameterSet& into) {
    const double began = comm::local_seconds();
    load(checkpoint, into);
    if (probing) out.probe_seconds += comm::local_seconds() - began;
  };
  // The engine's own check of each install: every rank verified it, and all hold the same version.
  comm::Group engine(MPI_COMM_WORLD, run.name + "'s install check", nullptr);
  // The join begins once the engine's last worker is at it: a worker still setting up its model holds the
  // others at the join's first collective, which is not the join's time (the ranks of an engine job arrived
  // up to 0.8 s apart on the loaded emulated cluster, and a rank 0 that came first counted that wait as the
  // join's, up to 0.45 x T_min of one replica).
  // Bounded as generously as a model's set-up may differ between ranks; the join itself keeps the timeout.
  if (run.before_join) run.before_join();
  if (const Status together = engine.step(Status::ok(), comm::Waiter{std::max(run.timeout, 60.0), {}}, run.name + ": every worker at the join");
      !together) {
    out.failure = together.to_string();
    return out;
  }
  out.join_began = comm::local_seconds();
  ReceiverAdapter receiver(MPI_COMM_WORLD, MPI_COMM_WORLD, params, timed, options, hook);
  out.taken = comm::local_seconds();
  out.from_replica = receiver.installed_version() > 0;  // not taken yet: the plan comes with the take
  bool planned = !out.from_replica;
  while (out.failure.empty()) {
    const PollResult r = receiver.poll_requests();
    if (!planned && receiver.summary().t_min_seconds > 0) {  // taken and connected within this poll
      planned = true;
      out.taken = comm::local_seconds();
      out.summary = receiver.summary();
      out.probe_seconds = std::max(out.probe_seconds, out.summary.longest_probe_seconds);
    }
    if (r.event == PollResult::Event::kShutdown) {
      out.shut_down = true;
      break;
    }
    if (r.event == PollResult::Event::kConnected) {
      probing = false;
      out.connected = comm::local_seconds();
      out.summary = receiver.summary();
      // The whole probe, as the library timed it (codes, passes, decode, checks, the parameters saved and
      // restored), not only the load_weights calls inside it.
      out.probe_seconds = std::max(out.probe_seconds, out.summary.longest_probe_seconds);
      out.replica_wait_seconds = out.summary.replica_wait_seconds;  // the take's summary has none
      if (rank == 0) std::printf("%s: joined (%d worker%s)\n", run.name.c_str(), size, size == 1 ? "" : "s");
    } else if (r.event == PollResult::Event::kInstalled) {
      if (out.first_installed == 0) {
        out.first_installed = comm::local_seconds();
        if (out.from_replica && rank == 0)
          std::printf("%s: version %llu from the fleet's replica engine, before the trainers took it\n", run.name.c_str(),
                      static_cast<unsigned long long>(r.version));
      }
      out.installed.push_back(r.version);
      const std::string wrong = differs(r.version);
      if (!wrong.empty())
        std::fprintf(stderr, "%s worker %d: version %llu: %s differs\n", run.name.c_str(), rank,
                     static_cast<unsigned long long>(r.version), wrong.c_str());
      std::int64_t values[comm::Group::kValues] = {wrong.empty() ? 0 : 1, static_cast<std::int64_t>(r.version),
                                                   -static_cast<std::int64_t>(r.version), 0};
      const Status agreed = engine.step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(values),
                                        comm::Waiter{run.timeout, {}}, run.name + ": the check of version " + std::to_string(r.version));
      const bool whole = agreed && values[0] == 0 && values[1] == -values[2];
      if (!agreed) fail(agreed.to_string());
      else if (!whole) fail(run.name + ": version " + std::to_string(r.version) + " is not the engine's own load_weights of it on every worker");
      else ++out.verified;
      if (rank == 0)
        std::printf("%s: installed version %llu%s\n", run.name.c_str(), static_cast<unsigned long long>(r.version),
                    whole ? ", bit for bit" : ", NOT as its own load_weights of it");
      if (run.expect_next) run.expect_next(r.version + 1);
    } else if (r.event == PollResult::Event::kFailed || r.event == PollResult::Event::kAborted) {
      std::fprintf(stderr, "%s worker %d: %s: %s\n", run.name.c_str(), rank, poll_event_name(r.event), r.status.to_string().c_str());
      fail(r.status.to_string());
    }
    std::fflush(stdout);
    if (run.inference_step) run.inference_step(run.step_ms);
    else std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(run.step_ms));  // one inference step
  }
  if (rank == 0 && out.failure.empty())
    std::printf("%s: shut down at version %llu\n", run.name.c_str(), static_cast<unsigned long long>(receiver.installed_version()));
  out.stats = receiver.stats();
  return out;
}

nlohmann::json joined_engine_json(const JoinedEngineOutcome& o) {
  const auto after = [&o](double t) { return t > 0 ? nlohmann::json(t - o.join_began) : nlohmann::json(nullptr); };
  nlohmann::json stalls = nlohmann::json::array();
  for (const StallInterval& s : o.stats.stalls) stalls.push_back({s.version, s.begin_seconds, s.end_seconds});
  const bool installed = o.first_installed > 0;
  const double began = o.from_replica ? o.join_began : o.taken;  // what the first install waited from
  // The trainers' planned egress for this link per update: what leaves their nodes (need 0: trainer nodes).
  std::int64_t trainer_egress = 0;
  for (std::size_t n = 0; n < o.summary.node_egress_bytes.size() && n < o.summary.node_need_bytes.size(); ++n)
    if (o.summary.node_need_bytes[n] == 0) trainer_egress += o.summary.node_egress_bytes[n];
  return {{"installed", o.installed},
          {"verified_versions", o.verified},
          {"failure", o.failure},
          {"shut_down", o.shut_down},
          {"taken_after_s", after(o.taken)},
          {"probe_s", o.probe_seconds},
          {"connected_after_s", after(o.connected)},
          {"first_install_after_s", after(o.first_installed)},
          {"first_version_from_replica", o.from_replica},
          {"join_to_install_s", installed ? nlohmann::json(o.first_installed - began) : nlohmann::json(nullptr)},
          {"after_probe_s", installed ? nlohmann::json(o.first_installed - began - o.probe_seconds) : nlohmann::json(nullptr)},
          {"replica_wait_s", o.replica_wait_seconds},
          {"t_min_s", o.summary.t_min_seconds},
          {"model_bytes", o.summary.model_bytes},
          {"link_trainer_egress_bytes", trainer_egress},
          {"connect_seconds", o.summary.connect_seconds},
          {"stalls", stalls}};
}

}  // namespace wb::emu
