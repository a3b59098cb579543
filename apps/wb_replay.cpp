// wb-replay: a whole weight transfer, end to end, verified bit for bit.
//
//   mpirun -np N wb-replay (--checkpoint FILE | --model NAME_OR_CONFIG [--scale tiny] | --preset NAME)
//          --trainer SPEC --rollout SPEC [--gpus-per-node G]
//          --mode sync|sender-staged|receiver-staged|async --steps K [--json FILE]
//
// Every rank builds its emulated worker (trainers first, then rollout engines), loads version 0 through
// its own load_weights and checks it against the file (rank 0 also checks that the trainers together and
// every engine hold every element). Then the trainers connect a SenderAdapter and the rollouts serve a
// ReceiverAdapter: each step the trainers load version k (the checkpoint changed element by element) and
// send it; every rollout checks what it installed against its own load_weights of version k, checks at
// every step that its parameters are one complete version and that its engine agrees on which. Exit 0
// only when every rollout worker verified every version. Rank 0 prints EWTT and AGST per step (the paper's
// definitions, from every worker's stall intervals on a common clock) and writes the JSON.
//
// After a failure every rank exits non-zero within a bounded time whether or not the launcher tears the job
// down: the adapters fail within about one timeout (WB_TIMEOUT_SECONDS), wb-replay's own waits after them
// are bounded by the same timeout, and the ending is emu/process/bounded_exit's: the reports reach rank 0 point to
// point, rank 0's verdict says whether to call MPI_Finalize, and after a failure no rank calls it.
#include <mpi.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "comm/deadline.hpp"
#include "comm/group.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "emu/check/checkpoint_check.hpp"
#include "emu/check/preflight.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/faults/fault_injection.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/frameworks/worker_parameters.hpp"
#include "emu/models/presets.hpp"
#include "emu/options/deployment_options.hpp"
#include "emu/options/run_options.hpp"
#include "emu/process/bounded_exit.hpp"
#include "emu/process/mpi_main.hpp"
#include "emu/reports/network_report.hpp"
#include "emu/reports/trace_file.hpp"
#include "emu/setup/engine_job.hpp"
#include "emu/setup/run_setup.hpp"
#include "emu/setup/update_mark.hpp"
#include "transport/transport.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/job_clock.hpp"
#include "weightbridge/plan.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

constexpr double kMaxStepMs = 3600e3;  // an hour: an emulated step longer than that is a typo

struct Options : RunOptions {
  int steps = 3;
  double step_ms = 2;
  std::string mode = "sync";
  std::string fault;
  // Engines as jobs of their own (README, "Engines as jobs of their own").
  std::string join_address;  // the join_address setting: the trainer job publishes it, an engine job joins it
  bool engine_job = false;   // this job is one rollout engine that joins the trainers at join_address
  int joiners = 0;           // trainer job: engine jobs to wait for (training on) before the --steps versions
  double join_wait_s = 120;  // trainer job: how long it waits for them
  std::string engine_name = "engine job";
  std::string update_mark;   // a bench's knob: the trainers write it, an engine job places its join or fault by it
  double knock_at_ms = -1;   // engine job: start the join this far into the trainers' next update
};

// What wb-replay's options shared with wb-bench mean here.
const RunOptionDocs kRunOptionDocs = {
    "Checkpoint file: .h5/.hdf5, .safetensors, a model.safetensors.index.json or a directory. Without it a synthetic checkpoint of --model is generated in memory.",
    "Where the emulated workers keep their parameters: host, or cuda (the GPU of index local rank modulo the visible devices; several ranks may share one). The parameters are loaded, sent, received and verified there.",
    "Write every rank's timeline as Chrome trace-event JSON to this file (rank 0; open it in Perfetto): per round pack, write, credit wait, forward and assemble spans, and the rollouts' stalls."};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Returns false when --help was asked for.
bool parse_options(int argc, char** argv, Options& options, int rank) {
  po::options_description general = run_options_description("wb-replay options", options, kRunOptionDocs);
  general.add_options()
      ("mode", po::value(&options.mode)->default_value(options.mode), "Synchronization mode: sync (no staging), sender-staged, receiver-staged or async (both staged).")
      ("fault", po::value(&options.fault), kFaultOptionHelp)
      ("steps", po::value(&options.steps)->default_value(options.steps), "Versions to send (1..K); version 0 is the checkpoint itself.")
      ("step-ms", po::value(&options.step_ms)->default_value(options.step_ms), "Emulated compute per training step and per inference step, in milliseconds.")
      ("engine-job", po::bool_switch(&options.engine_job), "This job is one rollout engine (--rollout engines=1,tp=<the job's ranks>) that joins the trainers at --join-address and verifies, bit for bit, every version it installs until they shut down; --trainer is not needed. --fault counts the trainers' versions; when=FILE suits a joiner.")
      ("joiners", po::value(&options.joiners)->default_value(options.joiners), "Trainer job: engine jobs to wait for before the --steps versions; the trainers keep sending versions (one per step) while they join.")
      ("join-wait-s", po::value(&options.join_wait_s)->default_value(options.join_wait_s), "Trainer job: seconds to wait for the --joiners before failing.")
      ("engine-name", po::value(&options.engine_name)->default_value(options.engine_name), "Engine job: its name in what it prints and in its JSON.")
      ("update-mark", po::value(&options.update_mark), "For benchmarks, a file on a filesystem both jobs see: trainer rank 0 writes the version and the wall time at which it enters each send_weights; an engine job reads it for --knock-at-ms and --fault ...,when=FILE,at=MS.")
      ("knock-at-ms", po::value(&options.knock_at_ms), "Engine job, with --update-mark: start the join (the probe, then the knock) this many milliseconds into the trainers' next update.");
  if (!parse_run_options(argc, argv, general, options, rank == 0)) return false;
  // The join_address setting (--join-address, WB_JOIN_ADDRESS): the trainer job publishes that address file
  // (its --rollout engines=N, 0 allowed, are the engines of its own world) and each --engine-job joins it.
  options.join_address = find_setting("join_address")->value_text();
  if (options.engine_job && options.join_address.empty()) throw Error(ErrorCode::kInvalidArgument, "--engine-job needs --join-address");
  if (options.joiners < 0 || (options.joiners > 0 && (options.join_address.empty() || options.engine_job)))
    throw Error(ErrorCode::kInvalidArgument, "--joiners is for a trainer job with --join-address");
  if (options.knock_at_ms != -1 && (!(options.knock_at_ms >= 0 && options.knock_at_ms <= kMaxStepMs) || !options.engine_job))
    throw Error(ErrorCode::kInvalidArgument, "--knock-at-ms is for an engine job, from 0 to an hour");
  if (!(options.join_wait_s > 0 && options.join_wait_s <= kMaxStepMs))
    throw Error(ErrorCode::kInvalidArgument, "--join-wait-s must be positive");
  // A trainer job that publishes an address may start with no engine of its own; an engine job needs no trainers' layout.
  options.deployment.engines_may_join = !options.join_address.empty() && !options.engine_job;
  if (options.engine_job && options.deployment.preset.empty() && options.deployment.trainer.empty())
    options.deployment.trainer = "tp=1";  // unused: the trainers' layout is theirs
  if (options.steps < 1) throw Error(ErrorCode::kInvalidArgument, "--steps must be at least 1");
  // nan, inf and 1e300 would pass a "not negative" check and then sleep for no time or for ever.
  const auto text = [](double value) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%g", value);
    return std::string(buffer);
  };
  if (!(options.step_ms >= 0 && options.step_ms <= kMaxStepMs))
    throw Error(ErrorCode::kInvalidArgument,
                "--step-ms " + text(options.step_ms) + " is not in [0, " + text(kMaxStepMs) + "] milliseconds");
  // Each rank waits for its peers' steps within the deadline: a longer step fails in whatever wait it
  // falls on, with a message about that wait rather than the step.
  if (const double timeout = comm::normalize_timeout(comm::timeout_setting());
      timeout != comm::kNoDeadline && options.step_ms * 1e-3 >= timeout)
    throw Error(ErrorCode::kInvalidArgument, "--step-ms " + text(options.step_ms) + " is not shorter than timeout_seconds " +
                                                 text(timeout) + ": every wait for a peer's step would time out");
  return true;
}

using Mode = SyncMode;
using Setup = RunSetup;

// --- the transfers -----------------------------------------------------------------------------------------

// What a worker reports to rank 0 after the transfers.
struct WorkerOutcome {
  std::int64_t verified_versions = 0;  // rollouts: versions installed and equal to their own load_weights
  std::int64_t steps = 0;              // rollouts: inference steps served (polls)
  AdapterStats stats;
  std::string failure;                 // first failure, empty when none
  double failed_at = 0;                // wall clock when it was met
  std::string parameters;              // rollouts: what the parameters hold at the end ("version 2", ...)
  bool mixed = false;                  // rollouts: they hold no single version
  bool reported_intact = true;         // rollouts: what the adapter said of them
  // Trainers with --join-address: every send_weights, on the trainers' clock (trainer rank 0's), and the
  // engines serving before and after it; the versions sent while the --joiners joined.
  nlohmann::json sends = nlohmann::json::array();
  int join_versions = 0;
};

void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

WorkerOutcome run_trainer(const Setup& setup, EmulatedWorker& worker, const WorkerParameters& stored, MPI_Comm trainers,
                          const Options& options, const Mode& mode, const Fault& fault, const std::string& who,
                          TransferSummary& summary) {
  AdapterOptions adapter;
  adapter.sender_staging = mode.sender_staging;
  adapter.node = setup.deployment.node_of(process_rank());
  if (!options.trace.empty()) adapter.trace = true;
  if (!options.join_address.empty()) adapter.join_address = options.join_address;
  const ParameterSet& params = stored.parameters();
  SenderAdapter sender(MPI_COMM_WORLD, trainers, params, setup.checkpoint->tensors(), stored.loader(worker), adapter);
  sender.connect();
  summary = sender.summary();
  // Trainer rank 0's clock, on which the adapters (and every joined link) put their stalls.
  const JobClock clock(trainers);
  comm::Group agree(trainers, "the trainers' steps", nullptr);  // the wait for engine jobs, the end of each training step
  const int wanted = setup.deployment.rollout.engines + options.joiners;
  const double join_began = wall_seconds();
  WorkerOutcome outcome;
  int counted = 0;
  for (std::uint64_t v = 1; counted < options.steps; ++v) {
    // While engine jobs join, the trainers train on: these versions count apart (join_versions). Whether
    // time is up is agreed (one step of the trainers); engines() is the same on every trainer already.
    const bool joining = counted == 0 && sender.engines() < wanted;
    if (joining) {
      std::int64_t late[comm::Group::kValues] = {wall_seconds() - join_began > options.join_wait_s ? 1 : 0, 0, 0, 0};
      if (Status agreed = agree.step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(late),
                                     comm::Waiter{job_timeout(), {}}, "the trainers' wait for engine jobs");
          !agreed || late[0] != 0) {
        outcome.failure = !agreed ? agreed.to_string()
                                  : who + ": " + std::to_string(sender.engines()) + " of " + std::to_string(wanted) +
                                        " engines serve after " + std::to_string(options.join_wait_s) + " s (--joiners " +
                                        std::to_string(options.joiners) + ")";
        outcome.failed_at = wall_seconds();
        break;
      }
    }
    // The training step: this trainer's parameters become version v.
    if (fault.due(process_rank(), v) && fault.kind == "throw") inject(fault, "wb-replay", who);
    stored.load(worker, VersionedCheckpoint(*setup.checkpoint, v));
    if (fault.due(process_rank(), v)) inject(fault, "wb-replay", who);
    sleep_ms(options.step_ms);
    // A trainer job that takes engine jobs ends each training step together, as a real one's collectives
    // (the optimizer's all-reduce) end it: unheld, the trainers' steps here (each loading the next version)
    // ended up to 0.45 s apart on the loaded emulated cluster, which counted in the EWTT (from the first
    // trainer's send_weights). The fault suite's jobs (a trainer stopped inside its step) take no joins.
    if (!options.join_address.empty())
      if (Status together = agree.step(Status::ok(), comm::Waiter{job_timeout(), {}}, "the end of the trainers' training step");
          !together) {
        outcome.failure = together.to_string();
        outcome.failed_at = wall_seconds();
        break;
      }
    const int before = sender.engines();
    if (!options.update_mark.empty() && process_rank() == 0) UpdateMark{v, wall_seconds()}.write(options.update_mark);
    const double began = clock.now();
    const Status status = sender.send_weights(v);
    if (!options.join_address.empty())
      outcome.sends.push_back({{"version", v}, {"begin_s", began}, {"end_s", clock.now()}, {"engines_before", before},
                               {"engines_after", sender.engines()}, {"counted", !joining}});
    if (joining) ++outcome.join_versions;
    else ++counted;
    if (!status) {
      outcome.failure = status.to_string();
      outcome.failed_at = wall_seconds();
      break;
    }
    // Staged: the trainer moves on at once; what it does to its parameters must not reach version v.
    if (mode.sender_staging)
      stored.fill(std::byte{0xA5});
  }
  const Status closed = sender.shutdown();
  if (!closed && outcome.failure.empty()) outcome.failure = closed.to_string();
  outcome.stats = sender.stats();
  return outcome;
}

WorkerOutcome run_rollout(const Setup& setup, EmulatedWorker& worker, const WorkerParameters& stored, MPI_Comm engine,
                          const Options& options, const Mode& mode, const Fault& fault, const std::string& who,
                          double timeout, TransferSummary& summary) {
  WorkerOutcome outcome;
  const auto note = [&outcome](const std::string& failure) {
    if (outcome.failure.empty()) {
      outcome.failure = failure;
      outcome.failed_at = wall_seconds();
    }
    WB_LOG(kError) << failure;
  };
  // The version the parameters must hold: this worker's own load_weights of it (never the source maps).
  HostParameters expected(worker.parameter_infos());
  std::uint64_t expected_version = 0;
  // (An FP8 engine's: of the FP8 form of that version, quantized by its own rule.)
  worker.load_weights(EngineVersion(setup, 0, worker.loads_fp8_form()).reader(), expected.parameters());
  const auto expect = [&](std::uint64_t v) {
    if (v == expected_version) return;
    for (const Parameter& p : expected.parameters()) std::memset(p.view.data, 0, p.view.nbytes());
    worker.load_weights(EngineVersion(setup, v, worker.loads_fp8_form()).reader(), expected.parameters());
    expected_version = v;
  };
  std::map<std::uint64_t, int> hook_calls;
  std::uint64_t installed = 0, aborted = 0;
  const auto hook = [&](std::uint64_t v) {
    ++hook_calls[v];
    if (fault.due(process_rank(), v)) inject(fault, "wb-replay", who);
    // Still the previous version, complete: nothing of v has reached the parameters yet.
    expect(installed);
    const std::string difference = first_difference(stored.read(), expected.parameters());
    if (!difference.empty())
      note(worker.describe() + ": before_update_hook(" + std::to_string(v) + "): parameters are not version " +
           std::to_string(installed) + ": " + difference);
  };
  AdapterOptions adapter;
  adapter.receiver_staging = mode.receiver_staging;
  adapter.node = setup.deployment.node_of(process_rank());
  adapter.join_address = std::string();  // an engine of the trainers' own world (the trainers' address is theirs)
  if (worker.loads_fp8_form()) adapter.fp8 = fp8_engine_option(setup.engine_form->config);
  if (!options.trace.empty()) adapter.trace = true;
  ReceiverAdapter receiver(MPI_COMM_WORLD, engine, stored.parameters(), stored.loader(worker), adapter, hook);
  // The engine's own check of which version it holds: a step of the engine's group (comm/group.hpp).
  comm::Group versions(engine, "the engine's version check", nullptr);
  for (;;) {
    const PollResult result = receiver.poll_requests();
    ++outcome.steps;
    if (result.event == PollResult::Event::kFailed || result.event == PollResult::Event::kAborted) {
      note(result.status.to_string());
      outcome.reported_intact = result.parameters_intact;
      if (result.event == PollResult::Event::kAborted) aborted = result.aborted_version;
      // `version` is what the parameters hold: an update can fail after it was installed (its stalls'
      // sum over the engine did not complete), and then holds the new version.
      if (result.version > installed) installed = result.version;
      break;
    }
    if (result.event == PollResult::Event::kShutdown) break;
    if (result.event == PollResult::Event::kConnected) summary = receiver.summary();
    if (result.event == PollResult::Event::kInstalled) {
      if (result.version != installed + 1)
        note(worker.describe() + ": installed version " + std::to_string(result.version) + " after " + std::to_string(installed));
      installed = result.version;
      expect(installed);
      const std::string difference = first_difference(stored.read(), expected.parameters());
      if (difference.empty() && hook_calls[installed] == 1)
        ++outcome.verified_versions;
      else if (!difference.empty())
        note(worker.describe() + ": version " + std::to_string(installed) + ": " + difference);
      else
        note(worker.describe() + ": before_update_hook ran " + std::to_string(hook_calls[installed]) + " times for version " +
             std::to_string(installed));
    }
    // Every step: the parameters are one complete version, and the whole engine holds the same one.
    if (result.event != PollResult::Event::kInstalled) {
      expect(installed);
      const std::string difference = first_difference(stored.read(), expected.parameters());
      if (!difference.empty())
        note(worker.describe() + ": step " + std::to_string(outcome.steps) + ": parameters are not version " +
             std::to_string(installed) + ": " + difference);
    }
    // Within the adapters' timeout: a rank of the engine that stopped must not hold this one here for good.
    std::int64_t range[comm::Group::kValues] = {static_cast<std::int64_t>(installed), -static_cast<std::int64_t>(installed)};
    if (!versions.step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(range), comm::Waiter{timeout, {}},
                       "the engine's version check")) {
      note(worker.describe() + ": step " + std::to_string(outcome.steps) + ": the engine's version check did not complete within " +
           std::to_string(timeout) + " s (a rank of the engine stopped serving)");
      break;
    }
    if (range[0] != -range[1])
      note(worker.describe() + ": step " + std::to_string(outcome.steps) + ": the engine holds versions " +
           std::to_string(-range[1]) + " to " + std::to_string(range[0]) + " at once");
    sleep_ms(options.step_ms);  // the inference step
  }
  // What the parameters hold now, compared byte for byte: one whole version, or a mix.
  expect(installed);
  if (first_difference(stored.read(), expected.parameters()).empty()) {
    outcome.parameters = "version " + std::to_string(installed);
  } else if (aborted != 0 && (expect(aborted), first_difference(stored.read(), expected.parameters()).empty())) {
    outcome.parameters = "version " + std::to_string(aborted);
  } else {
    outcome.mixed = true;
    outcome.parameters = "a mix of versions " + std::to_string(installed) + (aborted ? " and " + std::to_string(aborted) : "");
  }
  if (outcome.mixed && outcome.reported_intact)
    note(worker.describe() + ": the adapter says the parameters hold version " + std::to_string(installed) +
         ", but they hold " + outcome.parameters);
  outcome.stats = receiver.stats();
  return outcome;
}

// --- the report ------------------------------------------------------------------------------------------

nlohmann::json outcome_json(const WorkerOutcome& o, const std::string& who, const std::string& error) {
  nlohmann::json stalls = nlohmann::json::array(), history = nlohmann::json::array(), traffic = nlohmann::json::array();
  for (const StallInterval& s : o.stats.stalls) stalls.push_back({s.version, s.begin_seconds, s.end_seconds});
  for (const UpdateRecord& u : o.stats.history) history.push_back({u.version, u.bytes_written, u.completed});
  for (const LinkTraffic& l : o.stats.traffic) traffic.push_back({l.transport, l.peer, l.bytes});
  return {{"who", who},        {"verified_versions", o.verified_versions},
          {"steps", o.steps},  {"bytes_written", o.stats.bytes_written},
          {"staging_bytes", o.stats.staging_bytes}, {"stalls", stalls},
          {"history", history}, {"traffic", traffic},
          {"machine", machine_id()}, {"failure", error}, {"failed_at", o.failed_at},
          {"parameters", o.parameters}, {"mixed", o.mixed},
          {"sends", o.sends}, {"join_versions", o.join_versions},
          {"trace", timeline_json(o.stats)}};
}

// Returns the exit code; `ending` says whether to call MPI_Finalize and within what time.
int run(int argc, char** argv, Ending& ending) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options options;
  if (!parse_options(argc, argv, options, rank)) return 0;
  const Mode mode = parse_sync_mode(options.mode, "--mode");
  const Fault fault = Fault::parse(options.fault);
  const double timeout = job_timeout();
  ending.timeout = timeout;
  log_effective_settings();

  const auto start = std::chrono::steady_clock::now();
  Setup setup = make_run_setup(options);
  if (options.engine_job)
    return run_engine_job(options, setup,
                          {"wb-replay", options.engine_name, mode, options.step_ms, fault, options.join_address,
                           options.update_mark, options.knock_at_ms},
                          ending);
  const Deployment& deployment = setup.deployment;
  if (world != deployment.world_size())
    throw Error(ErrorCode::kInvalidArgument,
                "the layouts need " + std::to_string(deployment.world_size()) + " ranks (" +
                    std::to_string(deployment.trainer.world_size()) + " trainer + " +
                    std::to_string(deployment.rollout.world_size()) + " rollout) but mpirun started " +
                    std::to_string(world));

  check_nodes_within_machines(deployment);

  const bool trainer = deployment.is_trainer(rank);
  const int engine = trainer ? -1 : (rank - deployment.trainer.world_size()) / deployment.rollout.tp;
  const std::string who = deployment.worker_name(rank);  // as the library names workers in its messages
  ending.who = who;
  std::unique_ptr<EmulatedWorker> worker = make_worker(setup.model, deployment, rank);
  const WorkerParameters params(worker->parameter_infos(), parse_parameter_place(options.device), default_cuda_device());
  nlohmann::json preflight_report;
  const bool layouts_ok = preflight(setup, *worker, params, preflight_report);

  // One communicator for the trainers, one per engine.
  MPI_Comm group = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + engine, rank, &group));
  TransferSummary summary;
  WorkerOutcome outcome;
  const auto transfer_start = std::chrono::steady_clock::now();
  if (layouts_ok) {
    // From here on every wait is bounded: an exception (a trainer's own step failed) ends this rank's part
    // (its adapter tells the peers), and the report below waits for the others only within the timeout.
    try {
      outcome = trainer ? run_trainer(setup, *worker, params, group, options, mode, fault, who, summary)
                        : run_rollout(setup, *worker, params, group, options, mode, fault, who, timeout, summary);
    } catch (const std::exception& error) {
      outcome.failure = std::string("wb-replay: ") + error.what();
      outcome.failed_at = wall_seconds();
    }
  } else {
    outcome.failure = "the layouts did not verify (see above)";
  }
  const double transfer_seconds = seconds_since(transfer_start);

  // Rank 0 gathers every worker's outcome, stall intervals, transfers and traffic.
  const std::vector<nlohmann::json> reports = gather_reports(outcome_json(outcome, who, outcome.failure), timeout);
  int exit_code = outcome.failure.empty() ? 0 : 1;
  bool everyone = true;
  std::string first_failed;  // rank 0: the first failure, for the verdict
  if (rank == 0) {
    // Versions sent: --steps, and those sent while engine jobs joined (rank 0 is trainer 0).
    const int versions = options.steps + outcome.join_versions;
    std::map<std::uint64_t, std::pair<double, double>> span;    // per version: first begin, last end
    std::map<std::uint64_t, double> total_stall;
    std::map<std::uint64_t, std::int64_t> moved;                // per version: bytes all writes carried
    std::map<std::uint64_t, bool> completed;                    // per version: every worker's part finished
    bool verified = layouts_ok;
    nlohmann::json failed = nlohmann::json::array();
    std::vector<std::string> machines(static_cast<std::size_t>(world));
    std::vector<RankLink> links;
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& report = reports[static_cast<std::size_t>(r)];
      if (report.is_null()) {
        everyone = verified = false;
        failed.push_back({{"rank", r}, {"error", "did not report within " + std::to_string(timeout) + " s (stopped or dead)"}});
        continue;
      }
      for (const auto& s : report["stalls"]) {
        const auto v = s[0].get<std::uint64_t>();
        const double begin = s[1].get<double>(), end = s[2].get<double>();
        auto [it, fresh] = span.emplace(v, std::make_pair(begin, end));
        if (!fresh) it->second = {std::min(it->second.first, begin), std::max(it->second.second, end)};
        total_stall[v] += end - begin;
      }
      for (const auto& h : report["history"]) {
        const auto v = h[0].get<std::uint64_t>();
        moved[v] += h[1].get<std::int64_t>();
        auto [it, fresh] = completed.emplace(v, h[2].get<bool>());
        if (!fresh) it->second = it->second && h[2].get<bool>();
      }
      machines[static_cast<std::size_t>(r)] = report["machine"].get<std::string>();
      for (const auto& l : report["traffic"]) links.push_back({r, l[1].get<int>(), l[0].get<std::string>(), l[2].get<std::int64_t>()});
      const std::string error = report["failure"].get<std::string>();
      if (!error.empty()) {
        verified = false;
        failed.push_back({{"rank", r}, {"error", error}, {"parameters", report["parameters"]}});
      } else if (!deployment.is_trainer(r) && report["verified_versions"].get<std::int64_t>() != versions) {
        verified = false;
        failed.push_back({{"rank", r},
                          {"error", "verified " + std::to_string(report["verified_versions"].get<std::int64_t>()) + " of " +
                                        std::to_string(versions) + " versions"}});
      }
    }
    // Versions every worker finished: the network counters add up over them.
    std::int64_t updates = 0;
    for (int k = 1; k <= versions; ++k) updates += completed.count(static_cast<std::uint64_t>(k)) && completed[static_cast<std::uint64_t>(k)] ? 1 : 0;
    const NetworkReport network = network_report(summary, machines, links, updates);
    if (layouts_ok && everyone && updates == versions)
      for (const std::string& problem : network.failures) {
        verified = false;
        failed.push_back({{"rank", 0}, {"error", "network traffic: " + problem}});
      }
    nlohmann::json steps = nlohmann::json::array();
    // T_min is the bound on the planned topology, whose links run at WB_NODE_GBPS: a ratio to it means
    // something only where writes crossed such links, i.e. between machines. On one host every write is a
    // same-machine copy, and the ratio is said to be none.
    const bool between_hosts = network.json["hosts"].size() > 1;
    std::printf("%-8s %12s %12s %14s %10s\n", "version", "EWTT [ms]", "AGST [ms]", "bytes moved", between_hosts ? "EWTT/Tmin" : "");
    double ewtt_sum = 0, agst_sum = 0;
    std::int64_t moved_sum = 0;
    std::size_t whole = 0;
    for (int k = 1; k <= versions; ++k) {
      const auto v = static_cast<std::uint64_t>(k);
      if (!span.count(v) && !moved.count(v)) continue;  // never sent (an earlier failure)
      const bool done = completed.count(v) && completed[v];
      const double ewtt = span.count(v) ? span[v].second - span[v].first : 0;
      const double agst = total_stall[v] / world;
      const double ratio = summary.t_min_seconds > 0 ? ewtt / summary.t_min_seconds : 0;
      nlohmann::json step = {{"version", k}, {"ewtt_s", ewtt}, {"agst_s", agst}, {"bytes_moved", moved[v]}, {"completed", done}};
      // Rank 0 is trainer rank 0: the library's own figures (from the acknowledgements) must be the gathered ones.
      const UpdateRecord* library = nullptr;
      for (const UpdateRecord& u : outcome.stats.history)
        if (u.version == v) library = &u;
      step["library_ewtt_s"] = library && library->ewtt_seconds ? nlohmann::json(*library->ewtt_seconds) : nlohmann::json(nullptr);
      step["library_agst_s"] = library && library->agst_seconds ? nlohmann::json(*library->agst_seconds) : nlohmann::json(nullptr);
      if (done && everyone) {
        // The same intervals summed in another order: equal but for rounding.
        const auto differs = [](const std::optional<double>& mine, double gathered) {
          return !mine || std::abs(*mine - gathered) > 1e-9 + 1e-9 * std::abs(gathered);
        };
        if (!library || differs(library->ewtt_seconds, ewtt) || differs(library->agst_seconds, agst)) {
          verified = false;
          failed.push_back({{"rank", 0},
                            {"error", "version " + std::to_string(k) + ": the trainers' stats() give EWTT " +
                                          step["library_ewtt_s"].dump() + " s, AGST " + step["library_agst_s"].dump() +
                                          " s; the gathered reports " + std::to_string(ewtt) + " s, " + std::to_string(agst) + " s"}});
        }
      }
      step["ewtt_over_t_min"] = between_hosts ? nlohmann::json(ratio) : nlohmann::json(nullptr);
      steps.push_back(std::move(step));
      char ratio_text[32] = "";
      if (between_hosts) std::snprintf(ratio_text, sizeof ratio_text, "%.3f", ratio);
      std::printf("%-8d %12.3f %12.3f %14lld %10s%s\n", k, ewtt * 1e3, agst * 1e3, static_cast<long long>(moved[v]),
                  ratio_text, done ? "" : "  (failed)");
      if (done) {
        ewtt_sum += ewtt;
        agst_sum += agst;
        moved_sum += moved[v];
        ++whole;
      }
    }
    exit_code = verified ? 0 : 1;
    first_failed = first_failure(reports, timeout);
    if (first_failed.empty() && !failed.empty())
      first_failed = "world rank " + std::to_string(failed[0]["rank"].get<int>()) + ": " + failed[0]["error"].get<std::string>();
    {
      const double sent = static_cast<double>(std::max<std::size_t>(whole, 1));
      for (const std::string& line : network.table) std::printf("%s\n", line.c_str());
      for (const std::string& problem : network.failures) std::fprintf(stderr, "wb-replay: network traffic: %s\n", problem.c_str());
      std::printf("wb-replay summary: mode %s, %s, %zu of %d versions, mean EWTT %.2f ms, mean AGST %.2f ms, T_min %.2f ms "
                  "(at %.3g GB/s per node%s), %lld bytes moved per version\n",
                  options.mode.c_str(), verified ? "verified" : "NOT VERIFIED", whole, versions, 1e3 * ewtt_sum / sent,
                  1e3 * agst_sum / sent, 1e3 * summary.t_min_seconds, network_from_settings().node_bandwidth / 1e9,
                  between_hosts ? "" : "; one host: every write a same-machine copy, so no ratio to it",
                  static_cast<long long>(moved_sum / std::max<std::int64_t>(static_cast<std::int64_t>(whole), 1)));
    }
    nlohmann::json result = {
        {"verified", verified},
        {"mode", options.mode},
        {"steps", steps},
        {"model", setup.model.name},
        {"checkpoint", setup.checkpoint->source()},
        {"trainer", deployment.trainer.to_string()},
        {"rollout", deployment.rollout.to_string()},
        {"ranks", world},
        {"model_bytes", summary.model_bytes},
        {"t_min_s", summary.t_min_seconds},
        {"node_gbps", network_from_settings().node_bandwidth / 1e9},
        {"between_hosts", between_hosts},
        {"network", network.json},
        {"simulated_ewtt_s", summary.simulated_seconds},
        {"max_node_need_bytes", summary.max_node_need_bytes},
        {"planned_bytes_per_update", summary.bytes_per_update},
        {"inter_node_bytes_per_update", summary.inter_node_bytes},
        {"rounds", summary.rounds},
        {"connect_seconds", summary.connect_seconds},
        {"transfer_seconds", transfer_seconds},
        {"preflight", preflight_report},
        {"failures", failed},
        {"seconds", seconds_since(start)},
    };
    // The checkpoint's bytes beside M: an FP8 engine's form is about half of them, plus the scales.
    std::int64_t checkpoint_bytes = 0;
    for (const TensorInfo& t : setup.checkpoint->tensors()) checkpoint_bytes += static_cast<std::int64_t>(t.nbytes());
    result["checkpoint_bytes"] = checkpoint_bytes;
    result["node_of_worker"] = summary.node_of_worker;
    if (setup.engine_form) {
      std::int64_t scale_bytes = 0, copied_bytes = 0;
      for (std::size_t t = 0; t < setup.engine_form->tensors.size(); ++t) {
        const auto bytes = static_cast<std::int64_t>(setup.engine_form->tensors[t].nbytes());
        if (setup.engine_form->sources[t].role == layout::FormRole::kScale) scale_bytes += bytes;
        if (setup.engine_form->sources[t].role == layout::FormRole::kCopied) copied_bytes += bytes;
      }
      // Which engines load which form (a mixed fleet has both).
      nlohmann::json engines = nlohmann::json::array();
      for (int e = 0; e < deployment.rollout.engines; ++e)
        engines.push_back({{"engine", e}, {"fp8", deployment.rollout.fp8_engine(e)},
                           {"first_world_rank", deployment.trainer.world_size() + e * deployment.rollout.tp},
                           {"workers", deployment.rollout.tp}});
      result["fp8"] = {{"config", setup.engine_form->config.to_string()},
                       {"form_bytes", setup.engine_form->total_bytes()},
                       {"scale_bytes", scale_bytes},
                       {"copied_bytes", copied_bytes},  // tensors the form holds as the checkpoint does: in both forms
                       {"engines", engines},
                       {"amax_bytes_per_trainer", summary.fp8_amax_bytes},
                       {"model_bytes_over_checkpoint_bytes",
                        static_cast<double>(summary.model_bytes) / static_cast<double>(std::max<std::int64_t>(checkpoint_bytes, 1))}};
      std::printf("wb-replay fp8: M %lld bytes (%s form: %lld of them scales) against %lld checkpoint bytes: %.4f x; "
                  "amax exchange %lld bytes per trainer per update\n",
                  static_cast<long long>(summary.model_bytes), setup.engine_form->config.to_string().c_str(),
                  static_cast<long long>(scale_bytes), static_cast<long long>(checkpoint_bytes),
                  result["fp8"]["model_bytes_over_checkpoint_bytes"].get<double>(),
                  static_cast<long long>(summary.fp8_amax_bytes));
    }
    if (!options.join_address.empty()) {
      // Each send_weights over every trainer: the first to enter it, the last to enter it (how far apart
      // the trainers' training steps ended: run_trainer ends them together, as a real job's collectives
      // do), the last to leave (trainer 0's clock).
      nlohmann::json sends = outcome.sends;
      for (nlohmann::json& send : sends) send["last_begin_s"] = send["begin_s"];
      for (int r = 1; r < deployment.trainer.world_size(); ++r)
        if (const nlohmann::json& report = reports[static_cast<std::size_t>(r)]; !report.is_null())
          for (std::size_t i = 0; i < sends.size() && i < report["sends"].size(); ++i) {
            sends[i]["begin_s"] = std::min(sends[i]["begin_s"].get<double>(), report["sends"][i]["begin_s"].get<double>());
            sends[i]["last_begin_s"] = std::max(sends[i]["last_begin_s"].get<double>(), report["sends"][i]["begin_s"].get<double>());
            sends[i]["end_s"] = std::max(sends[i]["end_s"].get<double>(), report["sends"][i]["end_s"].get<double>());
          }
      nlohmann::json engines = nlohmann::json::array();
      for (const EngineRecord& e : outcome.stats.engines)
        engines.push_back({{"name", e.name}, {"state", e.state}, {"installed", e.installed}, {"why", e.why}});
      result["join"] = {{"address", options.join_address},      {"joiners", options.joiners},
                        {"join_versions", outcome.join_versions}, {"timeout_s", timeout},
                        {"sends", sends},                          {"engines", engines}};
      // The table above covers the engines of this world; each joined job's installs are in its own JSON.
      std::printf("%-8s %18s %16s\n", "version", "send_weights [ms]", "engines");
      for (const nlohmann::json& send : sends)
        std::printf("%-8llu %18.3f %9d -> %-4d%s\n", static_cast<unsigned long long>(send["version"].get<std::uint64_t>()),
                    1e3 * (send["end_s"].get<double>() - send["begin_s"].get<double>()), send["engines_before"].get<int>(),
                    send["engines_after"].get<int>(), send["counted"].get<bool>() ? "" : "  (while engine jobs join)");
      for (const nlohmann::json& e : engines)
        std::printf("wb-replay: %s: %s, last version %llu%s%s\n", e["name"].get<std::string>().c_str(),
                    e["state"].get<std::string>().c_str(), static_cast<unsigned long long>(e["installed"].get<std::uint64_t>()),
                    e["why"].get<std::string>().empty() ? "" : ": ", e["why"].get<std::string>().c_str());
    }
    write_run_results(options, result, reports);
  }
  const Verdict verdict = exchange_verdict(exit_code, everyone, first_failed, timeout);
  ending.finalize = verdict.finalize;
  const int code = verdict.exit_code != 0 ? verdict.exit_code : (outcome.failure.empty() ? 0 : 1);
  if (code != 0) {
    const std::string own = trainer ? "sent all " + std::to_string(options.steps) + " versions"
                                    : "verified " + std::to_string(outcome.verified_versions) + " of " +
                                          std::to_string(options.steps) + " versions";
    print_exit_line(ending, code, outcome.failed_at,
                    (outcome.failure.empty() ? verdict_text(verdict, timeout, own) : outcome.failure) +
                        (outcome.parameters.empty() ? ""
                                                    : "; parameters: " + outcome.parameters +
                                                          (outcome.reported_intact ? " (reported intact)" : " (reported not intact)")));
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) { return run_mpi_program("wb-replay", argc, argv, run); }
