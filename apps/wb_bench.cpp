// wb-bench: WeightBridge next to the paper's two baselines (and the broadcast NCCL would run), measured in
// one job on one layout.
//
//   mpirun -np N wb-bench (--model NAME [--scale tiny] | --preset NAME | --checkpoint FILE --model NAME)
//          --trainer SPEC --rollout SPEC [--gpus-per-node G] [--modes sync,async] [--methods ...]
//          [--reps 5] [--warmup 1] [--json FILE] [--csv FILE]
//
// Every method moves the same versions of the same checkpoint between the same emulated workers: the
// trainers load version v through their own load_weights, the method runs, and every rollout worker
// checks its parameters against its own load_weights of v, bit for bit. Methods run interleaved
// (A B C A B C ...) after a warm-up, so that a slow patch of a shared machine hits all of them alike.
// Rank 0 prints per method the median and spread of EWTT and AGST, the bytes per update that crossed
// between machines and within one, T_min for the link rates given (--node-gbps), and each method's ratio
// to WeightBridge (the stronger broadcast of the two named in the JSON); --json and --csv write the same. Exit 0 only when every update of every method verified.
//
// After a failure every rank exits non-zero within a bounded time, whether or not the launcher tears the job
// down, as wb-replay does: every update starts with a barrier bounded by the timeout (WB_TIMEOUT_SECONDS;
// the rollouts keep serving in it, so that they hear the trainers give up), a rank whose part failed runs
// no further update and no further collective, the samples travel to rank 0 in one report per rank at the
// end, and the ending is emu/process/bounded_exit's (reports point to point, rank 0's verdict, MPI_Finalize only
// after a run that succeeded everywhere).
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "baselines/baselines.hpp"
#include "comm/backoff.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/faults/fault_injection.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/frameworks/worker_parameters.hpp"
#include "emu/options/deployment_options.hpp"
#include "emu/options/run_options.hpp"
#include "emu/process/bounded_exit.hpp"
#include "emu/process/mpi_main.hpp"
#include "emu/process/start_line.hpp"
#include "emu/setup/engine_job.hpp"
#include "emu/reports/trace_file.hpp"
#include "emu/setup/run_setup.hpp"
#include "transport/transport.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/job_clock.hpp"
#include "weightbridge/plan.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

struct Options : RunOptions {
  std::string modes = "sync";
  std::string methods = "weightbridge,broadcast,ring-broadcast,p2p";
  int reps = 5;
  int warmup = 1;
  std::int64_t bucket_mib = 512;
  std::int64_t ring_segment_kib = 1024;
  double step_ms = 2;
  std::string csv;
  std::string fault;
  // Engines as jobs of their own (README, "Engines as jobs of their own"), as wb-replay takes them.
  std::string join_address;  // the join_address setting: the trainer job publishes it, an engine job joins it
  bool engine_job = false;
  int joiners = 0;
  double join_wait_s = 120;
  std::string engine_name = "engine job";
};

// What wb-bench's options shared with wb-replay mean here.
const RunOptionDocs kRunOptionDocs = {
    "Checkpoint file or directory; without it the weights are generated in memory.",
    "Where the emulated workers keep their parameters: host, or cuda (the GPU of index local rank modulo the visible devices). The baselines move host memory only: with cuda, --methods weightbridge.",
    "Write every rank's timeline as Chrome trace-event JSON (rank 0; open it in Perfetto): WeightBridge's per-round pack, write, credit wait, forward and assemble spans, and every method's update interval per rank."};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

using Mode = SyncMode;

bool parse_options(int argc, char** argv, Options& o, int rank) {
  po::options_description general = run_options_description("wb-bench options", o, kRunOptionDocs);
  general.add_options()
      ("modes", po::value(&o.modes)->default_value(o.modes), "WeightBridge modes to run, comma-separated: sync, sender-staged, receiver-staged, async.")
      ("methods", po::value(&o.methods)->default_value(o.methods), "Methods, comma-separated: weightbridge, broadcast (MPI_Bcast), ring-broadcast (pipelined chain, as NCCL's), p2p.")
      ("reps", po::value(&o.reps)->default_value(o.reps), "Measured updates per method.")
      ("warmup", po::value(&o.warmup)->default_value(o.warmup), "Unmeasured updates per method first.")
      ("bucket-mib", po::value(&o.bucket_mib)->default_value(o.bucket_mib), "Baselines: whole tensors per gather and broadcast step, MiB.")
      ("step-ms", po::value(&o.step_ms)->default_value(o.step_ms), "The rollouts' emulated inference step: they call poll_requests once per step, as an engine does between decoding steps, and sleep between (a GPU engine's CPU waits for its kernels), milliseconds; 0 polls back to back.")
      ("ring-segment-kib", po::value(&o.ring_segment_kib)->default_value(o.ring_segment_kib), "ring-broadcast: bytes a worker passes down the chain at once, KiB.")
      ("csv", po::value(&o.csv), "Write one line per method as CSV (rank 0).")
      ("fault", po::value(&o.fault), (std::string(kFaultOptionHelp) + " Versions count every method's updates; a fault is "
                                      "injected only in a WeightBridge update, a trainer's just before send_weights.").c_str())
      ("engine-job", po::bool_switch(&o.engine_job), "This job is one rollout engine (--rollout engines=1,tp=<the job's ranks>, one of --modes) that joins the trainers at --join-address and verifies every version it installs, bit for bit, until they shut down; its JSON has the join's timings and its stalls.")
      ("joiners", po::value(&o.joiners)->default_value(o.joiners), "Trainer job with --join-address (--methods weightbridge, one mode): engine jobs to wait for before the warm-up; the trainers send versions (not measured) while they join.")
      ("join-wait-s", po::value(&o.join_wait_s)->default_value(o.join_wait_s), "Trainer job: seconds to wait for the --joiners before failing.")
      ("engine-name", po::value(&o.engine_name)->default_value(o.engine_name), "Engine job: its name in what it prints and in its JSON.");
  if (!parse_run_options(argc, argv, general, o, rank == 0)) return false;
  o.join_address = find_setting("join_address")->value_text();
  if (o.engine_job && o.join_address.empty()) throw Error(ErrorCode::kInvalidArgument, "--engine-job needs --join-address");
  if (o.joiners < 0 || (o.joiners > 0 && (o.join_address.empty() || o.engine_job)))
    throw Error(ErrorCode::kInvalidArgument, "--joiners is for a trainer job with --join-address");
  if (!(o.join_wait_s > 0 && o.join_wait_s <= 86400)) throw Error(ErrorCode::kInvalidArgument, "--join-wait-s must be in (0, 86400]");
  o.deployment.engines_may_join = !o.join_address.empty() && !o.engine_job;
  if (o.engine_job && o.deployment.preset.empty() && o.deployment.trainer.empty()) o.deployment.trainer = "tp=1";  // unused
  if (o.reps < 1 || o.warmup < 0) throw Error(ErrorCode::kInvalidArgument, "--reps must be at least 1 and --warmup not negative");
  if (o.bucket_mib < 1 || o.bucket_mib > 1024) throw Error(ErrorCode::kInvalidArgument, "--bucket-mib must be in 1..1024");
  if (o.step_ms < 0 || o.step_ms > 1000) throw Error(ErrorCode::kInvalidArgument, "--step-ms must be in 0..1000");
  if (o.ring_segment_kib < 1 || o.ring_segment_kib > 1048576)
    throw Error(ErrorCode::kInvalidArgument, "--ring-segment-kib must be in 1..1048576");
  return true;
}

/// A method of the run: a WeightBridge mode, or a baseline.
struct Method {
  std::string name;  // "weightbridge-sync", "broadcast", "ring-broadcast", "p2p"
  int mode = -1;     // index into the adapters, -1 for a baseline
};

/// One rank's record of one update; begin < 0 when the rank did not stall for it.
struct Sample {
  std::uint64_t version = 0;
  double begin = -1, end = -1;
  std::int64_t between = 0, within = 0;
  std::int64_t ok = 1;
};

std::int64_t traffic_total(const std::vector<LinkTraffic>& links, const std::vector<std::string>& machines, int rank,
                           bool between) {
  std::int64_t total = 0;
  for (const LinkTraffic& link : links)
    if ((machines[static_cast<std::size_t>(rank)] != machines[static_cast<std::size_t>(link.peer)]) == between) total += link.bytes;
  return total;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n == 0 ? 0 : n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// What the updates need, set up before them (the adapters are made by measure itself).
struct Bench {
  const Options& options;
  const std::vector<Mode>& modes;
  const std::vector<Method>& methods;
  const RunSetup& setup;
  EmulatedWorker& worker;
  const WorkerParameters& params;
  MPI_Comm group;                      // the trainers, or this rollout's engine
  bench::Baselines* baselines;         // null without baselines
  const std::vector<std::string>& machines;
  const Fault& fault;
  std::string who;
  double timeout;
  StartLine& start;
};

/// One rank's part of the run, as it goes (kept as far as it got when it ends early).
struct Outcome {
  std::vector<Sample> samples;     // every update this rank finished, warm-up included
  std::string mismatch;            // rollouts: the first update whose parameters were not that version
  std::string failure;             // what ended this rank's part before the last update; empty when none
  double failed_at = 0;            // wall clock when it was met
  std::uint64_t held = 0;          // rollouts: the last version verified in the parameters
  std::uint64_t attempted = 0;     // the update under way when the part ended
  bool reported_intact = true;     // rollouts: what the adapter said of the parameters then
  std::string parameters;          // rollouts: what the parameters hold at the end ("version 2", ...)
  TransferSummary summary;
  nlohmann::json spans = nlohmann::json::array();   // --trace: the adapters' spans
  nlohmann::json stalls = nlohmann::json::array();  // --trace: every method's update interval here
  int join_versions = 0;                            // updates while engine jobs joined (not measured)
  nlohmann::json engines = nlohmann::json::array(); // trainers with --join-address: stats().engines at the end

  void fail(const std::string& why) {
    if (!failure.empty()) return;
    failure = why;
    failed_at = wall_seconds();
    WB_LOG(kError) << why;
  }
  void fail(const PollResult& result) {
    fail(result.status.to_string());
    reported_intact = result.parameters_intact;
  }
};

bool ended(const PollResult& r) { return r.event == PollResult::Event::kFailed || r.event == PollResult::Event::kAborted; }

/// The adapters, connected, and every update of every method, interleaved. A failure of this rank's part
/// (a failed update, a barrier that did not complete in time) ends it there; an exception ends it too (the
/// adapters, destroyed while it unwinds, tell their peers).
void measure(const Bench& b, Outcome& out) {
  const int rank = process_rank();
  const Deployment& deployment = b.setup.deployment;
  const bool trainer = deployment.is_trainer(rank);
  const LoadWeightsFn load = b.params.loader(b.worker);

  // WeightBridge: one adapter per mode, all connected up front (the rollouts poll until they are).
  const bool wants_weightbridge = std::any_of(b.methods.begin(), b.methods.end(), [](const Method& m) { return m.mode >= 0; });
  std::vector<std::unique_ptr<SenderAdapter>> senders;
  std::vector<std::unique_ptr<ReceiverAdapter>> receivers;
  const BeforeUpdateHook hook = [&b, rank](std::uint64_t v) {
    if (b.fault.due(rank, v)) inject(b.fault, "wb-bench", b.who);
  };
  if (wants_weightbridge)
    for (const Mode& mode : b.modes) {
      AdapterOptions adapter;
      adapter.sender_staging = mode.sender_staging;
      adapter.receiver_staging = mode.receiver_staging;
      adapter.node = deployment.node_of(rank);
      if (!b.options.trace.empty()) adapter.trace = true;
      if (b.worker.loads_fp8_form()) adapter.fp8 = fp8_engine_option(b.setup.engine_form->config);
      // The trainers publish the address (one mode then); an engine of their own world never joins by it.
      adapter.join_address = trainer ? b.options.join_address : std::string();
      if (trainer) {
        senders.push_back(std::make_unique<SenderAdapter>(MPI_COMM_WORLD, b.group, b.params.parameters(),
                                                          b.setup.checkpoint->tensors(), load, adapter));
        senders.back()->connect();
        out.summary = senders.back()->summary();
      } else {
        receivers.push_back(std::make_unique<ReceiverAdapter>(MPI_COMM_WORLD, b.group, b.params.parameters(), load, adapter, hook));
        const double since = wall_seconds();
        comm::Backoff backoff;
        for (;;) {
          const PollResult r = receivers.back()->poll_requests();
          if (ended(r)) throw Error(r.status);
          if (r.event == PollResult::Event::kConnected) break;
          if (wall_seconds() - since > b.timeout)
            throw Error(ErrorCode::kTimeout, b.who + ": the trainers' connect request (mode " + mode.name + ") did not come within " +
                                                 std::to_string(b.timeout) + " s");
          backoff.pause();
        }
        out.summary = receivers.back()->summary();
      }
    }
  VersionReference reference(b.worker, b.setup);

  // The interleaved schedule: warm-up rounds, then measured ones, each method once per round.
  std::uint64_t version = 0;
  const int rounds = b.options.warmup + b.options.reps;
  // --joiners: rank 0 (trainer 0) says at each start whether engine jobs still join; such updates run as
  // any other but are not rounds of the schedule (join mode has one method).
  bool joining = rank == 0 && b.options.joiners > 0;
  const int wanted = deployment.rollout.engines + b.options.joiners;
  const double join_began = wall_seconds();
  for (int round = 0; round < rounds && out.failure.empty(); ++round) {
    bool join_round = false;
    for (const Method& method : b.methods) {
      ++version;
      out.attempted = version;
      // The training step: the trainers' parameters become this version.
      if (trainer) b.params.load(b.worker, VersionedCheckpoint(*b.setup.checkpoint, version));
      const auto k = static_cast<std::size_t>(method.mode);
      std::vector<LinkTraffic> before;
      if (method.mode >= 0) before = trainer ? senders[k]->stats().traffic : receivers[k]->stats().traffic;
      // Every rank ready before the update starts (so that it measures the transfer, not the ranks' skew),
      // within the timeout: a rank whose part failed runs no further update, and says so. A rollout keeps
      // serving meanwhile: a failure of the trainers reaches it there, in the library's own words.
      ReceiverAdapter* serving = !trainer && method.mode >= 0 ? receivers[k].get() : nullptr;
      std::optional<PollResult> heard;
      const auto serve = [&] {
        if (serving == nullptr) return true;
        const PollResult r = serving->poll_requests();
        if (ended(r)) heard = r;
        return !heard;
      };
      std::string note;
      if (joining && senders.front()->engines() >= wanted) joining = false;
      if (joining && wall_seconds() - join_began > b.options.join_wait_s) {
        out.fail(b.who + ": " + std::to_string(senders.front()->engines()) + " of " + std::to_string(wanted) + " engines serve after " +
                 std::to_string(b.options.join_wait_s) + " s (--joiners " + std::to_string(b.options.joiners) + ")");
        break;
      }
      if (joining) note = "joining";
      const std::string not_started = b.start.wait(version, method.name + " version " + std::to_string(version), serve, &note);
      join_round = note == "joining";
      if (join_round) ++out.join_versions;
      if (heard) {
        out.fail(*heard);
        break;
      }
      if (!not_started.empty()) {
        out.fail(b.who + ": " + not_started);
        break;
      }
      Sample sample;
      sample.version = version;
      if (method.mode >= 0) {
        if (trainer) {
          if (b.fault.due(rank, version)) inject(b.fault, "wb-bench", b.who);
          Status status = senders[k]->send_weights(version);
          if (status) status = senders[k]->wait();
          if (!status) {
            out.fail(status.to_string());
            break;
          }
        } else {
          // The trainers ask right after the barrier: a rollout that hears nothing within the timeout gives up.
          const double since = wall_seconds();
          while (receivers[k]->installed_version() < version) {
            const PollResult r = receivers[k]->poll_requests();
            if (ended(r)) {
              out.fail(r);
              break;
            }
            if (r.event == PollResult::Event::kShutdown) {
              out.fail(b.who + ": " + method.name + ": the trainers shut down before version " + std::to_string(version));
              break;
            }
            if (r.event == PollResult::Event::kNone && wall_seconds() - since > b.timeout) {
              out.fail(b.who + ": " + method.name + ": version " + std::to_string(version) + " was not requested within " +
                       std::to_string(b.timeout) + " s of the barrier before it");
              break;
            }
            // The inference step the engine runs before it polls again (a GPU engine's CPU mostly waits for
            // it). Steps end on multiples of the step time of the machine's clock, so that the ranks of an engine
            // poll together, as those of a GPU engine do (each step ends in the engine's own collectives): a
            // rank that came early would spin in the poll's engine-wide step, CPU work no GPU engine does.
            if (b.options.step_ms > 0 && receivers[k]->installed_version() < version) {
              const auto step = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double, std::milli>(b.options.step_ms));
              const auto now = std::chrono::steady_clock::now().time_since_epoch();
              std::this_thread::sleep_until(std::chrono::steady_clock::time_point((now / step + 1) * step));
            }
          }
          if (!out.failure.empty()) break;
        }
        const AdapterStats stats = trainer ? senders[k]->stats() : receivers[k]->stats();
        for (const StallInterval& stall : stats.stalls)
          if (stall.version == version) {
            sample.begin = stall.begin_seconds;
            sample.end = stall.end_seconds;
          }
        sample.between = traffic_total(stats.traffic, b.machines, rank, true) - traffic_total(before, b.machines, rank, true);
        sample.within = traffic_total(stats.traffic, b.machines, rank, false) - traffic_total(before, b.machines, rank, false);
      } else {
        const bench::BaselineUpdate u = method.name == "broadcast"        ? b.baselines->broadcast()
                                        : method.name == "ring-broadcast" ? b.baselines->ring_broadcast()
                                                                          : b.baselines->p2p();
        sample.begin = u.begin;
        sample.end = u.end;
        sample.between = u.between_machines;
        sample.within = u.within_machine;
      }
      if (!b.options.trace.empty()) out.stalls.push_back({version, sample.begin, sample.end, method.name});
      if (!trainer) {
        const std::string difference = reference.difference(b.params.read(), version);
        if (difference.empty()) {
          out.held = version;
        } else {
          sample.ok = 0;
          if (out.mismatch.empty())
            out.mismatch = method.name + " version " + std::to_string(version) + " on " + b.worker.describe() + ": " + difference;
          WB_LOG(kError) << method.name << " version " << version << " on " << b.worker.describe() << ": " << difference;
        }
      }
      out.samples.push_back(sample);
    }
    if (join_round) --round;
  }
  if (!out.failure.empty()) b.start.leave(out.attempted, out.failure);
  // Shutdown: sent after a failure too (then it tells the engines the trainers gave up). The rollouts wait
  // for it, within the timeout, only after a run that went through.
  for (auto& sender : senders) {
    const Status closed = sender->shutdown();
    if (!closed && out.failure.empty()) out.fail(closed.to_string());
  }
  if (!b.options.join_address.empty() && !senders.empty())
    for (const EngineRecord& e : senders.front()->stats().engines)
      out.engines.push_back({{"name", e.name}, {"state", e.state}, {"installed", e.installed}, {"why", e.why}});
  if (out.failure.empty()) {
    const double since = wall_seconds();
    comm::Backoff backoff;
    for (auto& receiver : receivers)
      while (!receiver->closed() && out.failure.empty()) {
        if (ended(receiver->poll_requests())) break;
        if (wall_seconds() - since > b.timeout)
          out.fail(b.who + ": the trainers' shutdown did not come within " + std::to_string(b.timeout) + " s of the last update");
        backoff.pause();
      }
  }
  if (!b.options.trace.empty()) {
    for (const auto& sender : senders)
      for (const nlohmann::json& s : timeline_json(sender->stats())) out.spans.push_back(s);
    for (const auto& receiver : receivers)
      for (const nlohmann::json& s : timeline_json(receiver->stats())) out.spans.push_back(s);
  }
}

int run(int argc, char** argv, Ending& ending) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options o;
  if (!parse_options(argc, argv, o, rank)) return 0;
  std::vector<Mode> modes;
  for (const std::string& m : split_list(o.modes)) modes.push_back(parse_sync_mode(m, "--modes"));
  std::vector<Method> methods;
  for (const std::string& m : split_list(o.methods)) {
    if (m == "weightbridge")
      for (std::size_t k = 0; k < modes.size(); ++k) methods.push_back({"weightbridge-" + modes[k].name, static_cast<int>(k)});
    else if (m == "broadcast" || m == "ring-broadcast" || m == "p2p")
      methods.push_back({m, -1});
    else
      throw Error(ErrorCode::kInvalidArgument, "--methods: '" + m + "' is not weightbridge, broadcast, ring-broadcast or p2p");
  }
  if (methods.empty()) throw Error(ErrorCode::kInvalidArgument, "--methods names nothing to run");
  const ParameterPlace place = parse_parameter_place(o.device);
  if (place == ParameterPlace::kCuda && std::any_of(methods.begin(), methods.end(), [](const Method& m) { return m.mode < 0; }))
    throw Error(ErrorCode::kInvalidArgument, "--device cuda: the baselines (broadcast, ring-broadcast, p2p) move host memory only; run --methods weightbridge");
  const Fault fault = Fault::parse(o.fault);
  const double timeout = job_timeout();
  ending.timeout = timeout;
  log_effective_settings();

  RunSetup setup = make_run_setup(o);
  if (o.engine_job) {
    if (modes.size() != 1) throw Error(ErrorCode::kInvalidArgument, "--engine-job: give one of --modes (the trainers' mode)");
    return run_engine_job(o, setup, {"wb-bench", o.engine_name, modes.front(), o.step_ms, fault, o.join_address, "", -1}, ending);
  }
  if (!o.join_address.empty() && (modes.size() != 1 || methods.size() != 1))
    throw Error(ErrorCode::kInvalidArgument, "--join-address: the trainers publish one adapter's address: --methods weightbridge "
                                             "and one of --modes");
  const Deployment& deployment = setup.deployment;
  if (world != deployment.world_size())
    throw Error(ErrorCode::kInvalidArgument, "the layouts need " + std::to_string(deployment.world_size()) + " ranks but mpirun started " +
                                                 std::to_string(world));
  check_nodes_within_machines(deployment);
  const bool trainer = deployment.is_trainer(rank);
  const int engine = trainer ? -1 : (rank - deployment.trainer.world_size()) / deployment.rollout.tp;
  const std::string who = deployment.worker_name(rank);
  ending.who = who;
  std::unique_ptr<EmulatedWorker> worker = make_worker(setup.model, deployment, rank);
  const WorkerParameters params(worker->parameter_infos(), place, default_cuda_device());
  if (trainer)
    params.load(*worker, *setup.checkpoint);
  else
    params.load(*worker, EngineVersion(setup, 0, worker->loads_fp8_form()).reader());
  MPI_Comm group = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + engine, rank, &group));
  const JobClock clock(MPI_COMM_WORLD);
  std::vector<std::string> machines(static_cast<std::size_t>(world));
  {
    constexpr int kIdBytes = 256;
    char id[kIdBytes] = {};
    std::strncpy(id, machine_id().c_str(), kIdBytes - 1);
    std::vector<char> ids(static_cast<std::size_t>(world) * kIdBytes);
    WB_CHECK_MPI(MPI_Allgather(id, kIdBytes, MPI_CHAR, ids.data(), kIdBytes, MPI_CHAR, MPI_COMM_WORLD));
    for (int r = 0; r < world; ++r) machines[static_cast<std::size_t>(r)] = &ids[static_cast<std::size_t>(r) * kIdBytes];
  }
  // The baselines' set-up (collective, like the rest of the set-up above: an error there takes the job down).
  const bool wants_weightbridge = std::any_of(methods.begin(), methods.end(), [](const Method& m) { return m.mode >= 0; });
  const bool wants_baselines = std::any_of(methods.begin(), methods.end(), [](const Method& m) { return m.mode < 0; });
  if (wants_baselines && setup.engine_form)
    throw Error(ErrorCode::kInvalidArgument, "--rollout " + deployment.rollout.to_string() +
                                                 ": the baselines (broadcast, ring-broadcast, p2p) send the trainers' "
                                                 "BF16 bytes and cannot feed an FP8 engine; run --methods weightbridge");
  std::unique_ptr<bench::Baselines> baselines;
  if (wants_baselines) {
    bench::BaselineOptions baseline_options;
    baseline_options.bucket_bytes = o.bucket_mib << 20;
    baseline_options.timeout_seconds = timeout;
    baseline_options.ring_segment_bytes = o.ring_segment_kib << 10;
    baselines = std::make_unique<bench::Baselines>(MPI_COMM_WORLD, trainer, setup.checkpoint->tensors(), params.parameters(),
                                                   params.loader(*worker), clock, baseline_options);
  }

  // From here on every wait is bounded: a failure ends this rank's part, and the report below waits for the
  // others only within the timeout.
  Outcome out;
  StartLine start(rank, world, timeout, [&deployment](int r) { return deployment.worker_name(r); });
  try {
    measure(Bench{o, modes, methods, setup, *worker, params, group, baselines.get(), machines, fault, who, timeout, start}, out);
  } catch (const std::exception& error) {
    out.fail(std::string("wb-bench: ") + error.what());
    if (!trainer && out.attempted != out.held) out.reported_intact = false;  // not the adapter's word: unknown
    start.leave(out.attempted, out.failure);
  }
  if (!trainer) {
    // What the parameters hold now, compared byte for byte: one whole version, or a mix.
    VersionReference reference(*worker, setup);
    const ParameterSet& now = params.read();
    if (reference.difference(now, out.held).empty())
      out.parameters = "version " + std::to_string(out.held);
    else if (out.attempted != out.held && reference.difference(now, out.attempted).empty())
      out.parameters = "version " + std::to_string(out.attempted);
    else
      out.parameters = "a mix of versions " + std::to_string(out.held) + " and " + std::to_string(out.attempted);
  }

  // Rank 0 gathers every rank's samples and outcome.
  nlohmann::json samples = nlohmann::json::array();
  for (const Sample& s : out.samples) samples.push_back({s.version, s.begin, s.end, s.between, s.within, s.ok});
  nlohmann::json mine = {{"who", who},           {"samples", samples},         {"failure", out.failure},
                         {"failed_at", out.failed_at}, {"mismatch", out.mismatch}, {"parameters", out.parameters}};
  if (!o.trace.empty()) {
    mine["trace"] = out.spans;
    mine["stalls"] = out.stalls;
  }
  const std::vector<nlohmann::json> reports = gather_reports(mine, timeout);
  int exit_code = out.failure.empty() ? 0 : 1;
  bool everyone = true;
  std::string first_failed;
  if (rank == 0) {
    nlohmann::json failed = nlohmann::json::array();
    // Per version, every rank's sample: an update counts only when every rank finished it.
    std::map<std::uint64_t, std::vector<Sample>> updates;
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& report = reports[static_cast<std::size_t>(r)];
      if (report.is_null()) {
        everyone = false;
        failed.push_back({{"rank", r}, {"error", "did not report within " + std::to_string(timeout) + " s (stopped or dead)"}});
        continue;
      }
      for (const char* key : {"failure", "mismatch"})
        if (const std::string error = report.value(key, std::string()); !error.empty()) failed.push_back({{"rank", r}, {"error", error}});
      for (const nlohmann::json& a : report.at("samples"))
        updates[a[0].get<std::uint64_t>()].push_back(
            {a[0].get<std::uint64_t>(), a[1].get<double>(), a[2].get<double>(), a[3].get<std::int64_t>(), a[4].get<std::int64_t>(),
             a[5].get<std::int64_t>()});
    }
    const bool all_ok = everyone && failed.empty();
    exit_code = all_ok ? 0 : 1;
    first_failed = first_failure(reports, timeout);
    if (first_failed.empty() && !failed.empty())
      first_failed = "world rank " + std::to_string(failed[0]["rank"].get<int>()) + ": " + failed[0]["error"].get<std::string>();

    // The measured updates per method (version v is round (v-1)/methods, method (v-1)%methods).
    std::map<std::string, std::vector<std::vector<Sample>>> measured;
    // Updates while engine jobs joined come first and are not measured (rank 0 is trainer 0).
    const auto joined = static_cast<std::uint64_t>(out.join_versions);
    for (auto& [v, samples_of] : updates) {
      if (v <= joined) continue;
      const auto index = static_cast<std::size_t>((v - joined - 1) % methods.size());
      const auto round = static_cast<int>((v - joined - 1) / methods.size());
      if (round < o.warmup || samples_of.size() != static_cast<std::size_t>(world)) continue;
      for (std::size_t r = 0; r < samples_of.size(); ++r)
        WB_LOG(kDebug) << methods[index].name << " version " << v << " rank " << r << ": stall " << samples_of[r].begin << " .. "
                       << samples_of[r].end << " s";
      measured[methods[index].name].push_back(std::move(samples_of));
    }

    // Per method: EWTT = last end - first begin; AGST = total stall / workers; bytes per update.
    nlohmann::json rows = nlohmann::json::array();
    const std::string reference_method = wants_weightbridge ? methods.front().name : "";
    double reference_ewtt = 0, reference_agst = 0;
    std::vector<std::string> csv_lines;
    std::printf("%-26s %10s %18s %10s %16s %16s %8s %8s\n", "method", "EWTT [s]", "EWTT min..max", "AGST [s]", "between hosts [B]",
                "within host [B]", "EWTT/WB", "AGST/WB");
    for (const Method& method : methods) {
      std::vector<double> ewtt, agst;
      std::int64_t between = 0, within = 0, verified = 1;
      for (const std::vector<Sample>& update : measured[method.name]) {
        double first = 1e300, last = -1e300, stall = 0;
        std::int64_t bytes_between = 0, bytes_within = 0;
        for (const Sample& s : update) {
          if (s.begin >= 0) {
            first = std::min(first, s.begin);
            last = std::max(last, s.end);
            stall += s.end - s.begin;
          }
          bytes_between += s.between;
          bytes_within += s.within;
          verified = std::min(verified, s.ok);
        }
        ewtt.push_back(last - first);
        agst.push_back(stall / world);
        between = bytes_between;
        within = bytes_within;
      }
      if (ewtt.size() != static_cast<std::size_t>(o.reps)) verified = 0;  // some updates did not run everywhere
      const double e = median(ewtt), a = median(agst);
      const double e_min = ewtt.empty() ? 0 : *std::min_element(ewtt.begin(), ewtt.end());
      const double e_max = ewtt.empty() ? 0 : *std::max_element(ewtt.begin(), ewtt.end());
      if (method.name == reference_method) {
        reference_ewtt = e;
        reference_agst = a;
      }
      const double e_ratio = reference_ewtt > 0 ? e / reference_ewtt : 0, a_ratio = reference_agst > 0 ? a / reference_agst : 0;
      char spread[64];
      std::snprintf(spread, sizeof spread, "%.3f..%.3f", e_min, e_max);
      std::printf("%-26s %10.3f %18s %10.3f %16lld %16lld %8.2f %8.2f%s\n", method.name.c_str(), e, spread, a,
                  static_cast<long long>(between), static_cast<long long>(within), e_ratio, a_ratio,
                  ewtt.size() == static_cast<std::size_t>(o.reps)
                      ? ""
                      : ("  (" + std::to_string(ewtt.size()) + " of " + std::to_string(o.reps) + " updates)").c_str());
      rows.push_back({{"method", method.name}, {"ewtt_s", ewtt}, {"agst_s", agst}, {"ewtt_median_s", e}, {"agst_median_s", a},
                      {"ewtt_min_s", e_min}, {"ewtt_max_s", e_max},
                      {"between_machines_bytes", between}, {"within_machine_bytes", within}, {"verified", verified == 1},
                      {"ewtt_over_weightbridge", e_ratio}, {"agst_over_weightbridge", a_ratio},
                      {"ewtt_over_t_min", out.summary.t_min_seconds > 0 ? e / out.summary.t_min_seconds : 0}});
      std::ostringstream line;
      line << method.name << ',' << e << ',' << a << ',' << between << ',' << within << ',' << e_ratio << ',' << a_ratio << ','
           << out.summary.t_min_seconds << ',' << (verified == 1 ? 1 : 0);
      csv_lines.push_back(line.str());
    }
    // WeightBridge against the stronger of the two broadcasts (the one RL frameworks would pick).
    nlohmann::json strongest;
    for (const nlohmann::json& row : rows) {
      const std::string name = row["method"].get<std::string>();
      if ((name == "broadcast" || name == "ring-broadcast") &&
          (strongest.is_null() || row["ewtt_median_s"].get<double>() < strongest["ewtt_median_s"].get<double>()))
        strongest = {{"method", name}, {"ewtt_median_s", row["ewtt_median_s"]}};
    }
    for (const nlohmann::json& f : failed)
      std::fprintf(stderr, "wb-bench: world rank %d: %s\n", f["rank"].get<int>(), f["error"].get<std::string>().c_str());
    std::set<std::string> hosts(machines.begin(), machines.end());
    std::printf("wb-bench: %s, %d ranks on %zu machines, M = %lld bytes, T_min %.3f s at %.3g GB/s per node, %d measured updates per "
                "method, %s\n",
                setup.model.name.c_str(), world, hosts.size(), static_cast<long long>(out.summary.model_bytes), out.summary.t_min_seconds,
                network_from_settings().node_bandwidth / 1e9, o.reps, all_ok ? "all verified" : "NOT VERIFIED");
    nlohmann::json result = {{"verified", all_ok},
                             {"model", setup.model.name},
                             {"trainer", deployment.trainer.to_string()},
                             {"rollout", deployment.rollout.to_string()},
                             {"ranks", world},
                             {"machines", hosts.size()},
                             {"rollout_engines", deployment.rollout.engines},
                             {"model_bytes", out.summary.model_bytes},
                             {"max_node_need_bytes", out.summary.max_node_need_bytes},
                             {"t_min_s", out.summary.t_min_seconds},
                             {"simulated_ewtt_s", out.summary.simulated_seconds},
                             {"node_gbps", network_from_settings().node_bandwidth / 1e9},
                             {"reps", o.reps},
                             {"reference", reference_method},
                             {"methods", rows},
                             {"strongest_broadcast", strongest},
                             {"failures", failed}};
    if (!first_failed.empty()) result["failure"] = first_failed;
    if (!o.join_address.empty())
      // EWTT and AGST above are over this world's workers; each engine job's own JSON has its stalls.
      result["join"] = {{"address", o.join_address}, {"joiners", o.joiners}, {"join_versions", out.join_versions},
                        {"engines", out.engines}};
    write_run_results(o, result, reports);
    if (!o.csv.empty()) {
      std::ofstream file(o.csv);
      file << "method,ewtt_median_s,agst_median_s,between_machines_bytes,within_machine_bytes,ewtt_over_weightbridge,"
              "agst_over_weightbridge,t_min_s,verified\n";
      for (const std::string& line : csv_lines) file << line << '\n';
      if (!file) throw Error(ErrorCode::kSystem, "cannot write " + o.csv);
    }
  }
  const Verdict verdict = exchange_verdict(exit_code, everyone, first_failed, timeout);
  ending.finalize = verdict.finalize;
  const int code = verdict.exit_code != 0 ? verdict.exit_code : (out.failure.empty() ? 0 : 1);
  if (code != 0) {
    const std::string own = std::to_string(out.samples.size()) + " updates" +
                            (trainer ? " sent" : ", " + std::to_string(std::count_if(out.samples.begin(), out.samples.end(),
                                                                                  [](const Sample& s) { return s.ok == 1; })) +
                                                     " verified");
    const std::string why = !out.failure.empty() ? out.failure : !out.mismatch.empty() ? out.mismatch : verdict_text(verdict, timeout, own);
    print_exit_line(ending, code, out.failed_at,
                    why + (out.parameters.empty() ? ""
                                                  : "; parameters: " + out.parameters +
                                                        (out.reported_intact ? " (reported intact)" : " (reported not intact)")));
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi_program("wb-bench", argc, argv, run);
}
