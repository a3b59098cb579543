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
#include <mpi.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "emu/backend.hpp"
#include "emu/deployment_options.hpp"
#include "emu/network_report.hpp"
#include "emu/presets.hpp"
#include "emu/run_setup.hpp"
#include "emu/synthetic.hpp"
#include "emu/verify.hpp"
#include "emu/versioned_checkpoint.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/settings.hpp"
#include "weightbridge/transport.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

struct Options {
  std::string checkpoint;
  DeploymentOptions deployment;
  std::uint64_t seed = 0;
  std::string json;
  std::string mode = "sync";
  int steps = 3;
  double step_ms = 2;
  po::variables_map variables;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Returns false when --help was asked for.
bool parse_options(int argc, char** argv, Options& options, int rank) {
  po::options_description general("wb-replay options");
  general.add_options()("help,h", "Show this help.")
      ("checkpoint", po::value(&options.checkpoint), "Checkpoint file: .h5/.hdf5, .safetensors, a model.safetensors.index.json or a directory. Without it a synthetic checkpoint of --model is generated in memory.");
  add_deployment_options(general, options.deployment);
  general.add_options()
      ("mode", po::value(&options.mode)->default_value(options.mode), "Synchronization mode: sync (no staging), sender-staged, receiver-staged or async (both staged).")
      ("steps", po::value(&options.steps)->default_value(options.steps), "Versions to send (1..K); version 0 is the checkpoint itself.")
      ("step-ms", po::value(&options.step_ms)->default_value(options.step_ms), "Emulated compute per training step and per inference step, in milliseconds.")
      ("seed", po::value(&options.seed), "Seed of the synthetic checkpoint when no --checkpoint is given.")
      ("json", po::value(&options.json), "Write the result as JSON to this file (rank 0).");
  po::variables_map variables;
  if (!parse_command_line(argc, argv, general, variables, rank == 0)) return false;
  options.variables = std::move(variables);
  if (options.steps < 1) throw Error(ErrorCode::kInvalidArgument, "--steps must be at least 1");
  if (options.step_ms < 0) throw Error(ErrorCode::kInvalidArgument, "--step-ms must not be negative");
  return true;
}

struct Mode {
  bool sender_staging = false, receiver_staging = false;
};

Mode parse_mode(const std::string& text) {
  if (text == "sync") return {false, false};
  if (text == "sender-staged") return {true, false};
  if (text == "receiver-staged") return {false, true};
  if (text == "async") return {true, true};
  throw Error(ErrorCode::kInvalidArgument, "--mode " + text + " is not sync, sender-staged, receiver-staged or async");
}

using Setup = RunSetup;

Setup make_setup(const Options& options) {
  return make_run_setup(options.deployment, options.variables, options.checkpoint, options.seed);
}

// Flattened (tensor index, offset..., extent...) records of the boxes a worker holds, for rank 0.
std::vector<std::int64_t> encode_boxes(const std::vector<CheckpointPiece>& pieces, const CheckpointReader& checkpoint) {
  std::map<std::string_view, std::int64_t> index;
  const auto& tensors = checkpoint.tensors();
  for (std::size_t t = 0; t < tensors.size(); ++t) index[tensors[t].name] = static_cast<std::int64_t>(t);
  std::vector<std::int64_t> out;
  for (const CheckpointPiece& piece : pieces) {
    out.push_back(index.at(piece.tensor));
    out.push_back(piece.box.ndim());
    out.insert(out.end(), piece.box.offset.begin(), piece.box.offset.end());
    out.insert(out.end(), piece.box.extent.begin(), piece.box.extent.end());
  }
  return out;
}


// Version 0 loaded through load_weights and checked against the file; coverage checked on rank 0.
// Returns this rank's verdict; rank 0 fills `report`.
bool preflight(const Setup& setup, const EmulatedWorker& worker, const ParameterSet& params, nlohmann::json& report) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const Deployment& deployment = setup.deployment;
  const auto load_start = std::chrono::steady_clock::now();
  worker.load_weights(*setup.checkpoint, params);
  const double load_seconds = seconds_since(load_start);
  const WorkerVerification verification = verify_worker(worker, params, *setup.checkpoint);
  for (const std::string& failure : verification.failures) WB_LOG(kError) << failure;
  WB_LOG(kInfo) << worker.describe() << ": " << params.total_bytes() << " parameter bytes, " << verification.pieces
                << " pieces verified in " << load_seconds << " s load";

  // Coverage: rank 0 gathers every worker's boxes. Group 0 = trainers, group 1 + e = rollout engine e.
  const std::vector<std::int64_t> boxes = encode_boxes(worker.export_weights(params), *setup.checkpoint);
  const int count = static_cast<int>(boxes.size());
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  WB_CHECK_MPI(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<std::int64_t> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < world; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  WB_CHECK_MPI(MPI_Gatherv(boxes.data(), count, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, 0,
                           MPI_COMM_WORLD));
  struct Totals {
    std::int64_t failed_ranks, bytes, pieces, unsourced;
  } mine{verification.ok() ? 0 : 1, static_cast<std::int64_t>(verification.bytes_compared),
         static_cast<std::int64_t>(verification.pieces), static_cast<std::int64_t>(verification.unsourced_bytes)},
      sum{};
  WB_CHECK_MPI(MPI_Reduce(&mine, &sum, 4, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD));
  double max_load = 0;
  WB_CHECK_MPI(MPI_Reduce(&load_seconds, &max_load, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
  int ok = verification.ok() ? 1 : 0;
  if (rank == 0) {
    const auto& tensors = setup.checkpoint->tensors();
    const int groups = 1 + deployment.rollout.engines;
    std::vector<std::vector<std::vector<Box>>> group_boxes(static_cast<std::size_t>(groups),
                                                           std::vector<std::vector<Box>>(tensors.size()));
    for (int r = 0; r < world; ++r) {
      const int group = deployment.is_trainer(r) ? 0 : 1 + (r - deployment.trainer.world_size()) / deployment.rollout.tp;
      std::size_t at = static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]);
      const std::size_t end = at + static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
      while (at < end) {
        const auto tensor = static_cast<std::size_t>(all[at]);
        const auto ndim = static_cast<std::size_t>(all[at + 1]);
        Box box{Shape(all.begin() + static_cast<std::ptrdiff_t>(at + 2), all.begin() + static_cast<std::ptrdiff_t>(at + 2 + ndim)),
                Shape(all.begin() + static_cast<std::ptrdiff_t>(at + 2 + ndim), all.begin() + static_cast<std::ptrdiff_t>(at + 2 + 2 * ndim))};
        group_boxes[static_cast<std::size_t>(group)][tensor].push_back(std::move(box));
        at += 2 + 2 * ndim;
      }
    }
    std::vector<std::string> gaps;
    for (int g = 0; g < groups; ++g) {
      const std::string name = g == 0 ? "the trainers" : "rollout engine " + std::to_string(g - 1);
      for (std::string& gap : coverage_gaps(tensors, group_boxes[static_cast<std::size_t>(g)], name)) gaps.push_back(std::move(gap));
    }
    for (std::size_t i = 0; i < gaps.size() && i < 10; ++i) std::cerr << "wb-replay: " << gaps[i] << '\n';
    ok = sum.failed_ranks == 0 && gaps.empty() ? 1 : 0;
    report = {{"verified", ok != 0},
              {"failed_ranks", sum.failed_ranks},
              {"coverage_gaps", gaps.size()},
              {"bytes_verified", sum.bytes},
              {"pieces", sum.pieces},
              {"padding_bytes", sum.unsourced},
              {"load_seconds_max", max_load}};
  }
  WB_CHECK_MPI(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return ok != 0;
}

// What a worker reports to rank 0 after the transfers.
struct WorkerOutcome {
  std::int64_t verified_versions = 0;  // rollouts: versions installed and equal to their own load_weights
  std::int64_t steps = 0;              // rollouts: inference steps served (polls)
  std::int64_t bytes_written = 0;
  std::int64_t staging_bytes = 0;
  std::vector<LinkTraffic> traffic;    // what this worker's writes carried, per transport and peer
  std::string failure;                 // first failure, empty when none
};

void sleep_ms(double ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

WorkerOutcome run_trainer(const Setup& setup, EmulatedWorker& worker, const ParameterSet& params, MPI_Comm trainers,
                          const Options& options, const Mode& mode, std::vector<StallInterval>& stalls,
                          TransferSummary& summary) {
  AdapterOptions adapter;
  adapter.sender_staging = mode.sender_staging;
  adapter.node = setup.deployment.node_of(process_rank());
  const auto load = [&worker](const CheckpointReader& c, const ParameterSet& p) { worker.load_weights(c, p); };
  SenderAdapter sender(MPI_COMM_WORLD, trainers, params, setup.checkpoint->tensors(), load, adapter);
  sender.connect();
  summary = sender.summary();
  WorkerOutcome outcome;
  for (int k = 1; k <= options.steps; ++k) {
    // The training step: this trainer's parameters become version k.
    worker.load_weights(VersionedCheckpoint(*setup.checkpoint, static_cast<std::uint64_t>(k)), params);
    sleep_ms(options.step_ms);
    const Status status = sender.send_weights(static_cast<std::uint64_t>(k));
    if (!status) {
      outcome.failure = status.to_string();
      break;
    }
    // Staged: the trainer moves on at once; what it does to its parameters must not reach version k.
    if (mode.sender_staging)
      for (const Parameter& p : params) std::memset(p.view.data, 0xA5, p.view.nbytes());
  }
  const Status closed = sender.shutdown();
  if (!closed && outcome.failure.empty()) outcome.failure = closed.to_string();
  const AdapterStats stats = sender.stats();
  stalls = stats.stalls;
  outcome.bytes_written = stats.bytes_written;
  outcome.staging_bytes = stats.staging_bytes;
  outcome.traffic = stats.traffic;
  return outcome;
}

WorkerOutcome run_rollout(const Setup& setup, EmulatedWorker& worker, const ParameterSet& params, MPI_Comm engine,
                          const Options& options, const Mode& mode, std::vector<StallInterval>& stalls,
                          TransferSummary& summary) {
  WorkerOutcome outcome;
  const auto note = [&outcome](const std::string& failure) {
    if (outcome.failure.empty()) outcome.failure = failure;
    WB_LOG(kError) << failure;
  };
  // The version the parameters must hold: this worker's own load_weights of it (never the source maps).
  HostParameters expected(worker.parameter_infos());
  std::uint64_t expected_version = 0;
  worker.load_weights(*setup.checkpoint, expected.parameters());
  const auto expect = [&](std::uint64_t v) {
    if (v == expected_version) return;
    for (const Parameter& p : expected.parameters()) std::memset(p.view.data, 0, p.view.nbytes());
    worker.load_weights(VersionedCheckpoint(*setup.checkpoint, v), expected.parameters());
    expected_version = v;
  };
  std::map<std::uint64_t, int> hook_calls;
  std::uint64_t installed = 0;
  const auto hook = [&](std::uint64_t v) {
    ++hook_calls[v];
    // Still the previous version, complete: nothing of v has reached the parameters yet.
    expect(installed);
    const std::string difference = first_difference(params, expected.parameters());
    if (!difference.empty())
      note(worker.describe() + ": before_update_hook(" + std::to_string(v) + "): parameters are not version " +
           std::to_string(installed) + ": " + difference);
  };
  AdapterOptions adapter;
  adapter.receiver_staging = mode.receiver_staging;
  adapter.node = setup.deployment.node_of(process_rank());
  const auto load = [&worker](const CheckpointReader& c, const ParameterSet& p) { worker.load_weights(c, p); };
  ReceiverAdapter receiver(MPI_COMM_WORLD, engine, params, load, adapter, hook);
  for (;;) {
    const PollResult result = receiver.poll_requests();
    ++outcome.steps;
    if (result.event == PollResult::Event::kFailed) {
      note(result.status.to_string());
      break;
    }
    if (result.event == PollResult::Event::kShutdown) break;
    if (result.event == PollResult::Event::kConnected) summary = receiver.summary();
    if (result.event == PollResult::Event::kInstalled) {
      if (result.version != installed + 1)
        note(worker.describe() + ": installed version " + std::to_string(result.version) + " after " + std::to_string(installed));
      installed = result.version;
      expect(installed);
      const std::string difference = first_difference(params, expected.parameters());
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
      const std::string difference = first_difference(params, expected.parameters());
      if (!difference.empty())
        note(worker.describe() + ": step " + std::to_string(outcome.steps) + ": parameters are not version " +
             std::to_string(installed) + ": " + difference);
    }
    const std::int64_t mine[2] = {static_cast<std::int64_t>(installed), -static_cast<std::int64_t>(installed)};
    std::int64_t range[2] = {0, 0};
    WB_CHECK_MPI(MPI_Allreduce(mine, range, 2, MPI_INT64_T, MPI_MAX, engine));
    if (range[0] != -range[1])
      note(worker.describe() + ": step " + std::to_string(outcome.steps) + ": the engine holds versions " +
           std::to_string(-range[1]) + " to " + std::to_string(range[0]) + " at once");
    sleep_ms(options.step_ms);  // the inference step
  }
  const AdapterStats stats = receiver.stats();
  stalls = stats.stalls;
  outcome.bytes_written = stats.bytes_written;
  outcome.staging_bytes = stats.staging_bytes;
  outcome.traffic = stats.traffic;
  return outcome;
}

int run(int argc, char** argv) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options options;
  if (!parse_options(argc, argv, options, rank)) return 0;
  const Mode mode = parse_mode(options.mode);
  log_effective_settings();

  const auto start = std::chrono::steady_clock::now();
  Setup setup = make_setup(options);
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
  std::unique_ptr<EmulatedWorker> worker =
      trainer ? make_trainer_worker(setup.model, deployment.trainer, rank)
              : make_rollout_worker(setup.model, deployment.rollout, rank - deployment.trainer.world_size());
  HostParameters params(worker->parameter_infos());
  nlohmann::json preflight_report;
  const bool layouts_ok = preflight(setup, *worker, params.parameters(), preflight_report);

  // One communicator for the trainers, one per engine.
  MPI_Comm group = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + engine, rank, &group));
  std::vector<StallInterval> stalls;
  TransferSummary summary;
  WorkerOutcome outcome;
  const auto transfer_start = std::chrono::steady_clock::now();
  if (layouts_ok) {
    outcome = trainer ? run_trainer(setup, *worker, params.parameters(), group, options, mode, stalls, summary)
                      : run_rollout(setup, *worker, params.parameters(), group, options, mode, stalls, summary);
  } else {
    outcome.failure = "the layouts did not verify (see above)";
  }
  const double transfer_seconds = seconds_since(transfer_start);
  WB_CHECK_MPI(MPI_Comm_free(&group));
  // What crossed between machines, from the transports' counters, for the plan comparison on rank 0.
  std::vector<std::string> machines;
  std::vector<RankLink> links;
  {
    AdapterStats counted;
    counted.traffic = outcome.traffic;
    gather_traffic(counted, MPI_COMM_WORLD, 0, machines, links);
  }

  // Rank 0 gathers every worker's outcome and stall intervals.
  const std::int64_t numbers[5] = {outcome.verified_versions, outcome.steps, outcome.bytes_written,
                                   outcome.staging_bytes, static_cast<std::int64_t>(stalls.size())};
  std::vector<std::int64_t> all_numbers(static_cast<std::size_t>(world) * 5);
  WB_CHECK_MPI(MPI_Gather(numbers, 5, MPI_INT64_T, all_numbers.data(), 5, MPI_INT64_T, 0, MPI_COMM_WORLD));
  std::vector<double> flat;
  for (const StallInterval& s : stalls) flat.insert(flat.end(), {static_cast<double>(s.version), s.begin_seconds, s.end_seconds});
  const int flat_count = static_cast<int>(flat.size());
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  WB_CHECK_MPI(MPI_Gather(&flat_count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<double> all_flat;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < world; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    all_flat.resize(static_cast<std::size_t>(total));
  }
  WB_CHECK_MPI(MPI_Gatherv(flat.data(), flat_count, MPI_DOUBLE, all_flat.data(), counts.data(), displs.data(),
                           MPI_DOUBLE, 0, MPI_COMM_WORLD));
  // Failures: each rank's first, gathered as fixed-size text.
  char failure[256] = {};
  std::strncpy(failure, outcome.failure.c_str(), sizeof failure - 1);
  std::vector<char> failures(rank == 0 ? static_cast<std::size_t>(world) * sizeof failure : 0);
  WB_CHECK_MPI(MPI_Gather(failure, sizeof failure, MPI_CHAR, failures.data(), sizeof failure, MPI_CHAR, 0, MPI_COMM_WORLD));

  int exit_code = 1;
  if (rank == 0) {
    // Per version: EWTT = last end - first begin over every worker's stall; AGST = total stall / workers.
    std::map<std::uint64_t, std::pair<double, double>> span;
    std::map<std::uint64_t, double> total_stall;
    for (std::size_t i = 0; i + 2 < all_flat.size(); i += 3) {
      const auto v = static_cast<std::uint64_t>(all_flat[i]);
      const double begin = all_flat[i + 1], end = all_flat[i + 2];
      auto [it, fresh] = span.emplace(v, std::make_pair(begin, end));
      if (!fresh) it->second = {std::min(it->second.first, begin), std::max(it->second.second, end)};
      total_stall[v] += end - begin;
    }
    std::int64_t bytes_written = 0;
    bool verified = layouts_ok;
    nlohmann::json failed = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      const std::int64_t* n = &all_numbers[static_cast<std::size_t>(r) * 5];
      bytes_written += n[2];
      const std::string text(&failures[static_cast<std::size_t>(r) * sizeof failure]);
      if (!text.empty()) {
        verified = false;
        failed.push_back({{"rank", r}, {"error", text}});
      } else if (!deployment.is_trainer(r) && n[0] != options.steps) {
        verified = false;
        failed.push_back({{"rank", r}, {"error", "verified " + std::to_string(n[0]) + " of " + std::to_string(options.steps) + " versions"}});
      }
    }
    // Every version that went through: the counters add up over them.
    std::int64_t updates = 0;
    for (int k = 1; k <= options.steps; ++k) updates += span.count(static_cast<std::uint64_t>(k)) ? 1 : 0;
    const NetworkReport network = network_report(summary, machines, links, updates);
    if (layouts_ok && updates == options.steps)
      for (const std::string& problem : network.failures) {
        verified = false;
        failed.push_back({{"rank", 0}, {"error", "network traffic: " + problem}});
      }
    nlohmann::json steps = nlohmann::json::array();
    std::printf("%-8s %12s %12s %14s %10s\n", "version", "EWTT [ms]", "AGST [ms]", "bytes moved", "EWTT/Tmin");
    for (int k = 1; k <= options.steps; ++k) {
      const auto v = static_cast<std::uint64_t>(k);
      const double ewtt = span.count(v) ? span[v].second - span[v].first : 0;
      const double agst = total_stall[v] / world;
      if (!span.count(v)) continue;  // never sent (an earlier failure)
      const std::int64_t moved = bytes_written / std::max<std::int64_t>(updates, 1);  // every update moves the same bytes
      const double ratio = summary.t_min_seconds > 0 ? ewtt / summary.t_min_seconds : 0;
      steps.push_back({{"version", k}, {"ewtt_s", ewtt}, {"agst_s", agst}, {"bytes_moved", moved}, {"ewtt_over_t_min", ratio}});
      std::printf("%-8d %12.3f %12.3f %14lld %10.3f\n", k, ewtt * 1e3, agst * 1e3, static_cast<long long>(moved), ratio);
    }
    exit_code = verified ? 0 : 1;
    {
      double ewtt = 0, agst = 0;
      for (const auto& step : steps) {
        ewtt += step["ewtt_s"].get<double>();
        agst += step["agst_s"].get<double>();
      }
      const double sent = static_cast<double>(std::max<std::size_t>(steps.size(), 1));
      for (const std::string& line : network.table) std::printf("%s\n", line.c_str());
      for (const std::string& problem : network.failures) std::fprintf(stderr, "wb-replay: network traffic: %s\n", problem.c_str());
      std::printf("wb-replay summary: mode %s, %s, %zu of %d versions, mean EWTT %.2f ms, mean AGST %.2f ms, T_min %.2f ms "
                  "(at %.3g GB/s per node), %lld bytes moved per version\n",
                  options.mode.c_str(), verified ? "verified" : "NOT VERIFIED", steps.size(), options.steps,
                  1e3 * ewtt / sent, 1e3 * agst / sent, 1e3 * summary.t_min_seconds, network_from_settings().node_bandwidth / 1e9,
                  static_cast<long long>(bytes_written / std::max<std::int64_t>(updates, 1)));
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
    std::cout << result.dump() << std::endl;
    if (!options.json.empty()) {
      std::ofstream out(options.json);
      out << result.dump(2) << '\n';
      if (!out) throw Error(ErrorCode::kSystem, "cannot write " + options.json);
    }
  }
  WB_CHECK_MPI(MPI_Bcast(&exit_code, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // The staged modes run the transfer on a background thread beside the caller's MPI calls.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  // Failing MPI calls return to the check macros, which name the call and the rank.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int exit_code = 1;
  try {
    exit_code = run(argc, argv);
  } catch (const std::exception& error) {
    // One clear line, then take the whole job down: a rank that gave up must not leave others waiting.
    std::fprintf(stderr, "wb-replay: %s\n", error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return exit_code;
}
