// bench_executor: the round executor's throughput on one machine over cma, with a plan from the planner.
//
// Every rank builds its emulated worker (trainers first, then rollout workers), connects as a real job
// does (probe load_weights, all-gather the source maps, plan on rank 0, scatter the round schedules,
// RoundExecutor) and runs --updates updates; the first is a warm-up (page faults, first grants) and is
// reported but left out of the summary. An MPI_Barrier precedes each update so that all ranks start it
// together; each rank times its own run_update.
//
// Reading the numbers:
//   delivered/rollout  bytes a rollout worker assembled into its parameters in one update / its run_update
//                      time: the rate at which a receiving worker gets its weights (min/median/max over the
//                      rollout workers).
//   memcpy alone       one-thread memcpy of a --memcpy-mib buffer on rank 0 while every other rank sleeps:
//                      the copy rate of one core with the memory system to itself.
//   memcpy concurrent  the same on every rank at once (median and min over ranks): what each core gets
//                      when all ranks copy, as they do during an update.
//   ratio              median delivered/rollout (median over the measured updates) / memcpy alone. Over cma
//                      the CPUs copy every delivered byte three times: the trainer packs it, the writer's
//                      process_vm_writev moves it into the receive buffer, the rollout assembles it (the
//                      external exchange adds a forwarding write on a rollout). The trainer does its two
//                      copies one after the other, so with one trainer per rollout ~0.5 is the ceiling and
//                      a ratio near it means the executor adds little beyond the copies themselves.
//                      With more ranks than cores every rank gets a time-slice of a core and the executor's
//                      progress loop spins, so the rates are lower bounds: compare against memcpy
//                      concurrent (ratio_vs_concurrent) too, or run as many ranks as cores.
// The rollouts are verified bit for bit after the last update (which moves a different checkpoint
// version into rollout parameters refilled with a pattern); the program exits 1 and reports no rate
// when any byte is wrong.
//
//   mpirun -np 4 bench_executor        # qwen3-30b-a3b tiny, hidden 512: 209 MiB; trainer tp=2,
//                                      # 2 rollout engines of tp=1, one rank per node (external exchange)
//   mpirun -np 2 bench_executor --trainer tp=1 --rollout engines=1,tp=1
//   options: --updates N --buffer-mib M --pipeline-depth D --piece-kib K --memcpy-mib M --json FILE
//            --verify-cost P (P interleaved pairs of updates without and with end-to-end verification;
//            the JSON's verify_cost: every pair's ratio, their median and quartiles, pack and assemble apart)
//            --hidden H --experts E --expert-width W --vocab V (sizes of the tiny variant), plus --preset,
//            --model, --scale, --layers, --trainer, --rollout, --gpus-per-node as wb-replay takes them
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/collectives.hpp"
#include "core/checks.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/models/presets.hpp"
#include "emu/options/deployment_options.hpp"
#include "emu/setup/emulated_connect.hpp"
#include "exec/round_executor.hpp"  // private (wb_private_headers): the bench drives the executor directly
#include "plan/round_schedule.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

using Clock = std::chrono::steady_clock;
using i64 = std::int64_t;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Options {
  DeploymentOptions deployment;
  int updates = 5;
  i64 buffer_mib = 64;
  int pipeline_depth = 2;
  i64 piece_kib = 0;  // 0: the planner chooses
  i64 memcpy_mib = 256;
  int memcpy_repeats = 5;
  // Sizes of the tiny variant: large enough that an update is memory-bound, not overhead-bound.
  double timeout_seconds = 120;
  int verify_pairs = 0;  // --verify-cost: interleaved updates without and with end-to-end verification
  std::string json;
  po::variables_map variables;
};

bool given(const po::variables_map& variables, const char* name) {
  return variables.count(name) && !variables[name].defaulted();
}

// Returns false when --help was asked for.
bool parse_options(int argc, char** argv, Options& o, int rank) {
  o.deployment.scale = "tiny";
  o.deployment.gpus_per_node = 1;
  // The bench's own sizes of the tiny variant (209 MiB); --hidden, --expert-width, --experts, --vocab change them.
  o.deployment.hidden = 512;
  o.deployment.expert_width = 256;
  o.deployment.vocab = 8100;
  po::options_description general("bench_executor options");
  general.add_options()("help,h", "Show this help.");
  add_deployment_options(general, o.deployment);
  general.add_options()
      ("updates", po::value(&o.updates)->default_value(o.updates), "Updates to run; the first is a warm-up.")
      ("buffer-mib", po::value(&o.buffer_mib)->default_value(o.buffer_mib), "Transfer buffers per worker (MiB, all slots).")
      ("pipeline-depth", po::value(&o.pipeline_depth)->default_value(o.pipeline_depth), "Round buffers in flight per worker.")
      ("piece-kib", po::value(&o.piece_kib)->default_value(o.piece_kib), "Planner piece size (KiB); 0 chooses it.")
      ("memcpy-mib", po::value(&o.memcpy_mib)->default_value(o.memcpy_mib), "Buffer of the memcpy reference (MiB).")
      ("memcpy-repeats", po::value(&o.memcpy_repeats)->default_value(o.memcpy_repeats), "Copies per memcpy measurement (median).")
      ("timeout", po::value(&o.timeout_seconds)->default_value(o.timeout_seconds), "Executor timeout without progress (s).")
      ("verify-cost", po::value(&o.verify_pairs)->default_value(o.verify_pairs), "Also run this many pairs of updates, one without and one with end-to-end verification (ExecutorOptions::verify), interleaved on two executors of the same schedule (which goes first alternates), and report the cost of verifying (median and quartiles of the pairs' ratios; pack and assemble apart).")
      ("json", po::value(&o.json), "Write the result as JSON to this file (rank 0).");
  if (!parse_command_line(argc, argv, general, o.variables, rank == 0)) return false;
  if (o.deployment.scale != "tiny") {
    // The bench's sizes apply to the tiny variant only; sizes given with another scale are refused.
    if (!given(o.variables, "hidden")) o.deployment.hidden = 0;
    if (!given(o.variables, "expert-width")) o.deployment.expert_width = 0;
    if (!given(o.variables, "vocab")) o.deployment.vocab = 0;
  }
  if (o.updates < 1) throw Error(ErrorCode::kInvalidArgument, "--updates must be at least 1");
  if (o.memcpy_mib < 1 || o.memcpy_repeats < 1)
    throw Error(ErrorCode::kInvalidArgument, "--memcpy-mib and --memcpy-repeats must be positive");
  // Without a preset the bench has a deployment of its own (see the top of this file).
  if (o.deployment.preset.empty()) {
    if (o.deployment.model.empty()) o.deployment.model = "qwen3-30b-a3b";
    if (o.deployment.trainer.empty()) o.deployment.trainer = "tp=2";
    if (o.deployment.rollout.empty()) o.deployment.rollout = "engines=2,tp=1";
  }
  return true;
}

// The model and deployment: the tiny variant at the bench's sizes (or as the options widen it).
PresetInstance make_instance(const Options& o) { return resolve_deployment(o.deployment, o.variables); }

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Waits for every rank without spinning, so that ranks that merely wait leave the cores to those that
// measure (MPI_Barrier busy-polls, which would steal the core of a rank timing a memcpy): the control
// plane's barrier pauses through the one wait policy, and a rank that never comes fails it at the deadline.
void sleeping_barrier(MPI_Comm comm) { comm::barrier(comm, comm::Waiter::from_settings(), "bench_executor: a barrier"); }

// One-thread memcpy: the median rate (bytes copied per second) of `repeats` copies.
double memcpy_rate(std::byte* to, const std::byte* from, std::size_t bytes, int repeats) {
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    std::memcpy(to, from, bytes);
    // Keeps the copy from being dropped or moved past the clock.
    asm volatile("" : : "r"(to) : "memory");
    seconds.push_back(seconds_since(start));
  }
  return static_cast<double>(bytes) / median_of(seconds);
}

struct MemcpyRates {
  double alone = 0;                         // rank 0 alone
  std::vector<double> concurrent;           // per rank, all copying at once (rank 0 only)
};

MemcpyRates measure_memcpy(const Options& o, int rank, int world) {
  const auto bytes = static_cast<std::size_t>(o.memcpy_mib) << 20;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> from(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
  std::unique_ptr<std::byte, Free> to(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
  if (!from || !to) throw Error(ErrorCode::kSystem, "cannot allocate the memcpy buffers");
  // Touch every page first: the rates are of copies, not of page faults.
  std::memset(from.get(), 0x5A, bytes);
  std::memset(to.get(), 0, bytes);
  MemcpyRates rates;
  sleeping_barrier(MPI_COMM_WORLD);
  const double concurrent = memcpy_rate(to.get(), from.get(), bytes, o.memcpy_repeats);
  if (rank == 0) rates.concurrent.resize(static_cast<std::size_t>(world));
  WB_CHECK_MPI(MPI_Gather(&concurrent, 1, MPI_DOUBLE, rates.concurrent.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  sleeping_barrier(MPI_COMM_WORLD);
  if (rank == 0) rates.alone = memcpy_rate(to.get(), from.get(), bytes, o.memcpy_repeats);
  sleeping_barrier(MPI_COMM_WORLD);
  return rates;
}

// Per update and rank, what the bench gathers on rank 0.
enum Field { kSeconds, kAssembled, kWritten, kPackSeconds, kAssembleSeconds, kFields };

// Compares the rollout's parameters with its own load_weights of `checkpoint` (after the same fill):
// the first difference, or an empty string.
std::string check_rollout(const EmulatedWorker& worker, const ParameterSet& got, const CheckpointReader& checkpoint,
                           unsigned char fill) {
  HostParameters expected(worker.parameter_infos());
  for (const Parameter& p : expected.parameters()) std::memset(p.view.data, fill, p.view.nbytes());
  worker.load_weights(checkpoint, expected.parameters());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const TensorView& g = got[i].view;
    const TensorView& w = expected.parameters()[i].view;
    if (std::memcmp(g.data, w.data, g.nbytes()) == 0) continue;
    const auto* a = static_cast<const unsigned char*>(g.data);
    const auto* b = static_cast<const unsigned char*>(w.data);
    std::size_t wrong = 0, first = 0;
    for (std::size_t k = 0; k < g.nbytes(); ++k)
      if (a[k] != b[k] && wrong++ == 0) first = k;
    return got[i].name + " differs in " + std::to_string(wrong) + " of " + std::to_string(g.nbytes()) +
           " bytes, first at byte " + std::to_string(first);
  }
  return {};
}

std::string rate(double bytes_per_second) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB/s", bytes_per_second / 1e9);
  return text;
}

int run(int argc, char** argv) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options o;
  if (!parse_options(argc, argv, o, rank)) return 0;
  const PresetInstance instance = make_instance(o);
  const ModelConfig& model = instance.model;
  const Deployment& d = instance.deployment;
  if (world != d.world_size())
    throw Error(ErrorCode::kInvalidArgument,
                "the layouts need " + std::to_string(d.world_size()) + " ranks (" + std::to_string(d.trainer.world_size()) +
                    " trainer + " + std::to_string(d.rollout.world_size()) + " rollout) but mpirun started " +
                    std::to_string(world));
  const std::vector<TensorInfo> tensors = model_tensors(model);
  i64 model_bytes = 0;
  for (const TensorInfo& t : tensors) model_bytes += static_cast<i64>(t.nbytes());

  const bool trainer = d.is_trainer(rank);
  const std::unique_ptr<EmulatedWorker> worker = make_worker(model, d, rank);
  HostParameters host(worker->parameter_infos());

  // Connect, as a job does: probe, all-gather, plan on rank 0, scatter.
  const auto connect_start = Clock::now();
  PlanOptions plan_options;
  plan_options.buffer_bytes_per_worker = o.buffer_mib << 20;
  plan_options.pipeline_depth = o.pipeline_depth;
  plan_options.piece_bytes = o.piece_kib << 10;
  EmulatedConnection connection = emulated_connect(*worker, host.parameters(), tensors, d, plan_options, MPI_COMM_WORLD);
  const i64 needed_bytes = connection.model_bytes;
  RoundSchedule schedule = std::move(connection.schedule);
  const int rounds = static_cast<int>(schedule.rounds.size());

  constexpr unsigned char kFill = 0xEE;  // what rollouts hold before an update reaches them; padding keeps it
  const auto refill = [&] {
    for (const Parameter& p : host.parameters()) std::memset(p.view.data, kFill, p.view.nbytes());
  };
  if (!trainer) refill();
  ParameterMemory memory;
  for (const Parameter& p : host.parameters()) {
    memory.data.push_back(static_cast<std::byte*>(p.view.data));
    memory.bytes.push_back(p.view.nbytes());
  }
  ExecutorOptions executor_options;
  executor_options.timeout_seconds = o.timeout_seconds;
  std::unique_ptr<RoundExecutor> verified;  // --verify-cost: the same schedule, verified
  if (o.verify_pairs > 0) {
    ExecutorOptions verify_options = executor_options;
    verify_options.verify = true;
    verified = std::make_unique<RoundExecutor>(schedule, memory, MPI_COMM_WORLD, verify_options);
  }
  RoundExecutor executor(std::move(schedule), memory, MPI_COMM_WORLD, executor_options);
  const double connect_seconds = seconds_since(connect_start);

  // Updates. Version 1 for all but the last, version 2 for the last, into rollouts refilled with the
  // pattern: the check after it sees only what that one update delivered.
  std::vector<double> mine_per_update(static_cast<std::size_t>(o.updates) * kFields);
  std::unique_ptr<SyntheticCheckpoint> checkpoint;
  for (int u = 0; u < o.updates; ++u) {
    const bool last = u + 1 == o.updates;
    if (u == 0 || last) {
      checkpoint = std::make_unique<SyntheticCheckpoint>(tensors, last ? 2002 : 1001);
      if (trainer) worker->load_weights(*checkpoint, host.parameters());
      if (!trainer && last && u > 0) refill();
    }
    const ExecutorStats before = executor.stats();
    WB_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    const auto start = Clock::now();
    const Status status = executor.run_update();
    const double seconds = seconds_since(start);
    if (!status) throw Error(status);
    const ExecutorStats& after = executor.stats();
    double* row = &mine_per_update[static_cast<std::size_t>(u) * kFields];
    row[kSeconds] = seconds;
    row[kAssembled] = static_cast<double>(after.bytes_assembled - before.bytes_assembled);
    row[kWritten] = static_cast<double>(after.bytes_written - before.bytes_written);
    row[kPackSeconds] = after.pack_seconds - before.pack_seconds;
    row[kAssembleSeconds] = after.assemble_seconds - before.assemble_seconds;
  }

  // Bit-exactness of every rollout; a rate over wrong bytes is no rate.
  std::string failure = trainer ? std::string() : check_rollout(*worker, host.parameters(), *checkpoint, kFill);
  if (!failure.empty()) std::fprintf(stderr, "bench_executor: rank %d: %s\n", rank, failure.c_str());
  const int failed_mine = failure.empty() ? 0 : 1;
  int failed = 0;
  WB_CHECK_MPI(MPI_Allreduce(&failed_mine, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  if (failed) {
    if (rank == 0) std::fprintf(stderr, "bench_executor: %d rollout worker(s) hold wrong bytes; no numbers reported\n", failed);
    return 1;
  }

  std::vector<double> all(rank == 0 ? static_cast<std::size_t>(world) * mine_per_update.size() : 0);
  WB_CHECK_MPI(MPI_Gather(mine_per_update.data(), static_cast<int>(mine_per_update.size()), MPI_DOUBLE, all.data(),
                          static_cast<int>(mine_per_update.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD));
  double connect_max = 0;
  WB_CHECK_MPI(MPI_Reduce(&connect_seconds, &connect_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
  // The cost of verification: pairs of updates, one plain and one verified, in the same run and conditions;
  // which goes first alternates from pair to pair, so that what the first update of a pair gains or loses
  // against the second (caches, a rank that starts late) falls on both alike. An update lasts until its
  // last rank finishes (the maximum over ranks of run_update). Per update also the slowest rank's pack and
  // assemble time (where verifying adds its work).
  std::vector<double> verify_ratios, plain_seconds, verified_seconds, plain_pack, verified_pack, plain_assemble,
      verified_assemble;
  for (int pair = 0; pair < o.verify_pairs; ++pair) {
    RoundExecutor* order[2] = {&executor, verified.get()};
    if (pair % 2 == 1) std::swap(order[0], order[1]);
    for (RoundExecutor* one : order) {
      WB_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
      const ExecutorStats before = one->stats();
      const auto start = Clock::now();
      const Status status = one->run_update();
      if (!status) throw Error(status);
      const double mine[3] = {seconds_since(start), one->stats().pack_seconds - before.pack_seconds,
                              one->stats().assemble_seconds - before.assemble_seconds};
      double slowest[3] = {0, 0, 0};
      WB_CHECK_MPI(MPI_Allreduce(mine, slowest, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
      const bool plain = one == &executor;
      (plain ? plain_seconds : verified_seconds).push_back(slowest[0]);
      (plain ? plain_pack : verified_pack).push_back(slowest[1]);
      (plain ? plain_assemble : verified_assemble).push_back(slowest[2]);
    }
    verify_ratios.push_back(verified_seconds.back() / plain_seconds.back());
  }
  // After the updates, all ranks at once: the load is that of an update.
  const MemcpyRates memcpy_rates = measure_memcpy(o, rank, world);
  if (rank != 0) return 0;

  const auto at = [&](int r, int u, Field f) {
    return all[(static_cast<std::size_t>(r) * static_cast<std::size_t>(o.updates) + static_cast<std::size_t>(u)) * kFields + f];
  };
  nlohmann::json updates = nlohmann::json::array();
  std::vector<double> medians;  // per measured update
  i64 cma_bytes = 0;
  std::printf("bench_executor: %s, trainer %s, rollout %s, %d ranks (%d per node), %d rounds, model %.1f MiB, "
              "connect %.2f s\n",
              model.name.c_str(), d.trainer.to_string().c_str(), d.rollout.to_string().c_str(), world, d.gpus_per_node,
              rounds, static_cast<double>(model_bytes) / (1 << 20), connect_max);
  std::printf("%-8s %10s %14s %14s %14s %12s %12s\n", "update", "seconds", "deliv/roll min", "median", "max", "pack s",
              "assemble s");
  for (int u = 0; u < o.updates; ++u) {
    std::vector<double> delivered;
    double seconds = 0, pack = 0, assemble = 0;
    for (int r = 0; r < world; ++r) {
      seconds = std::max(seconds, at(r, u, kSeconds));
      pack = std::max(pack, at(r, u, kPackSeconds));
      assemble = std::max(assemble, at(r, u, kAssembleSeconds));
      cma_bytes += static_cast<i64>(at(r, u, kWritten));
      if (!d.is_trainer(r)) delivered.push_back(at(r, u, kAssembled) / at(r, u, kSeconds));
    }
    const double lo = *std::min_element(delivered.begin(), delivered.end());
    const double hi = *std::max_element(delivered.begin(), delivered.end());
    const double mid = median_of(delivered);
    if (u > 0 || o.updates == 1) medians.push_back(mid);
    std::printf("%-8s %10.4f %14s %14s %14s %12.4f %12.4f\n", (std::to_string(u) + (u == 0 ? " (w)" : "")).c_str(),
                seconds, rate(lo).c_str(), rate(mid).c_str(), rate(hi).c_str(), pack, assemble);
    updates.push_back({{"seconds", seconds},
                       {"warmup", u == 0},
                       {"delivered_bytes_per_s_per_rollout_min", lo},
                       {"delivered_bytes_per_s_per_rollout_median", mid},
                       {"delivered_bytes_per_s_per_rollout_max", hi},
                       {"pack_seconds_max", pack},
                       {"assemble_seconds_max", assemble}});
  }
  const double delivered = median_of(medians);
  const double concurrent = median_of(memcpy_rates.concurrent);
  const double concurrent_min = *std::min_element(memcpy_rates.concurrent.begin(), memcpy_rates.concurrent.end());
  std::printf("memcpy one thread (%lld MiB): alone %s, all ranks at once median %s (min %s)\n",
              static_cast<long long>(o.memcpy_mib), rate(memcpy_rates.alone).c_str(), rate(concurrent).c_str(),
              rate(concurrent_min).c_str());
  std::printf("delivered per rollout (median of measured updates) %s = %.3f x memcpy alone, %.3f x memcpy concurrent\n",
              rate(delivered).c_str(), delivered / memcpy_rates.alone, delivered / concurrent);
  std::printf("cma bytes written %.1f MiB over %d updates; rollouts verified bit-exact\n",
              static_cast<double>(cma_bytes) / (1 << 20), o.updates);

  nlohmann::json verify_cost = nullptr;
  if (!verify_ratios.empty()) {
    // Quartiles of the pairs' ratios (the spread is the machine's as much as verify's), and the phases'
    // ratios pair by pair.
    const auto quantile = [](std::vector<double> v, double q) {
      std::sort(v.begin(), v.end());
      const double at = q * static_cast<double>(v.size() - 1);
      const auto lo = static_cast<std::size_t>(at);
      const std::size_t hi = std::min(lo + 1, v.size() - 1);
      return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
    };
    const auto ratios = [](const std::vector<double>& verified, const std::vector<double>& plain) {
      std::vector<double> out;
      for (std::size_t i = 0; i < plain.size(); ++i) out.push_back(plain[i] > 0 ? verified[i] / plain[i] : 1);
      return out;
    };
    const double ratio = median_of(verify_ratios), q1 = quantile(verify_ratios, 0.25), q3 = quantile(verify_ratios, 0.75);
    const double pack_ratio = median_of(ratios(verified_pack, plain_pack));
    const double assemble_ratio = median_of(ratios(verified_assemble, plain_assemble));
    std::printf("verify: median update %.4f s plain, %.4f s verified; median ratio of %zu interleaved pairs %.3f "
                "(cost %+.1f %%, quartiles %.3f-%.3f); slowest pack %.4f / %.4f s (ratio %.3f), assemble %.4f / %.4f s "
                "(ratio %.3f)\n",
                median_of(plain_seconds), median_of(verified_seconds), verify_ratios.size(), ratio, 100 * (ratio - 1), q1,
                q3, median_of(plain_pack), median_of(verified_pack), pack_ratio, median_of(plain_assemble),
                median_of(verified_assemble), assemble_ratio);
    verify_cost = {{"pairs", verify_ratios.size()},
                   {"order", "alternating"},
                   {"plain_update_seconds", plain_seconds},
                   {"verified_update_seconds", verified_seconds},
                   {"plain_pack_seconds", plain_pack},
                   {"verified_pack_seconds", verified_pack},
                   {"plain_assemble_seconds", plain_assemble},
                   {"verified_assemble_seconds", verified_assemble},
                   {"ratios", verify_ratios},
                   {"median_ratio", ratio},
                   {"ratio_quartiles", {q1, q3}},
                   {"cost_percent", 100 * (ratio - 1)},
                   {"pack_ratio", pack_ratio},
                   {"assemble_ratio", assemble_ratio}};
  }
  const nlohmann::json result = {
      {"verify_cost", verify_cost},
      {"model", model.name},
      {"trainer", d.trainer.to_string()},
      {"rollout", d.rollout.to_string()},
      {"gpus_per_node", d.gpus_per_node},
      {"ranks", world},
      {"rounds", rounds},
      {"model_bytes", model_bytes},
      {"needed_bytes", needed_bytes},
      {"buffer_bytes_per_worker", plan_options.buffer_bytes_per_worker},
      {"pipeline_depth", plan_options.pipeline_depth},
      {"piece_bytes", plan_options.piece_bytes},
      {"connect_seconds", connect_max},
      {"updates", updates},
      {"delivered_bytes_per_s_per_rollout", delivered},
      {"memcpy_bytes_per_s", {{"alone", memcpy_rates.alone}, {"concurrent_median", concurrent}, {"concurrent_min", concurrent_min},
                              {"buffer_bytes", o.memcpy_mib << 20}}},
      {"ratio", delivered / memcpy_rates.alone},
      {"ratio_vs_concurrent", delivered / concurrent},
      {"cma_bytes_written", cma_bytes},
      {"verified", true},
  };
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << result.dump(2) << '\n';
    if (!out) throw Error(ErrorCode::kSystem, "cannot write " + o.json);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int exit_code = 1;
  try {
    exit_code = run(argc, argv);
  } catch (const std::exception& error) {
    // One line, then the whole job goes down: no rank waits for one that gave up.
    std::fprintf(stderr, "bench_executor: %s\n", error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // Every rank returns the same code (the verification is all-reduced), so no one waits in finalize for
  // a rank that already left.
  MPI_Finalize();
  return exit_code;
}
