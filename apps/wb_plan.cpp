// wb-plan: plans a deployment at any scale in one process and judges the plan on a network model. From
// the emulated backends' described source maps (no parameter memory), it builds the correspondence, the
// lower bound T_min, WeightBridge's plan and every rank's round schedule, and simulates the plan and the
// paper's two baselines (broadcast, single-source P2P) on the same topology.
//
//   wb-plan --preset kimi-k2
//   wb-plan --model CONFIG.json --trainer SPEC --rollout SPEC [--gpus-per-node 8] [--strategy weightbridge]
//           [--node-gbps 400] [--intra-gbps 900] [--buffer-mib 1024] [--json FILE]
//   wb-plan --scaling 16      # the paper's Figure 12: 1 trainer node, 1..16 rollout replicas of Qwen3-30B-A3B
//
// The planner chooses the external exchange (all-to-all or relay trees) by simulating candidates; the
// result names the shape it chose and what it tried. Planning time is reported as wall and CPU time (the
// latter is what a loaded machine does not inflate), with the peak RSS and the planner's own estimate of
// its memory, which it checks before planning against plan_memory_mib (or the memory available).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <new>
#include <string>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/parallel.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/described_map.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/models/presets.hpp"
#include "emu/options/deployment_options.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string digest_text(std::uint64_t digest) {
  char text[20];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

// The process's peak resident set since start or since the last reset_peak_rss (Linux: VmHWM).
std::int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      std::int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

// Starts a new peak-RSS measurement (Linux: writing 5 to clear_refs resets VmHWM), so that each row of
// --scaling reports its own; where that is not possible the peak stays the process's.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// User and system CPU seconds of this process so far.
double cpu_seconds() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

struct Network {
  double node_gbps = 0, intra_gbps = 0, message_us = 0;  // from the settings, as connect reads them (run)
  PlanOptions plan;  // from the planner's settings (--buffer-mib, --pipeline-depth, --relay-fan-out, ...)
};

// Every row of --scaling plans a deployment of its own; this many rollout nodes at most keeps a run to
// minutes and its memory to what one machine has.
constexpr int kMaxScalingNodes = 256;

Topology make_topology(const Deployment& deployment, const Network& network) {
  Topology topology = Topology::uniform(deployment.world_size(), deployment.gpus_per_node, network.node_gbps * 1e9,
                                        network.intra_gbps * 1e9);
  topology.message_latency = network.message_us * 1e-6;
  return topology;
}

// The largest round's bytes (over every link, all stages) over the mean round's: 1 when rounds are equal.
double round_max_over_mean(const TransferPlan& plan) {
  std::int64_t most = 0, sum = 0;
  for (std::int64_t bytes : plan.round_bytes) most = std::max(most, bytes), sum += bytes;
  return sum > 0 ? static_cast<double>(most) * static_cast<double>(plan.round_bytes.size()) / static_cast<double>(sum) : 1.0;
}

struct StrategyResult {
  std::string strategy;
  SimulationResult simulation;
  int rounds = 0;
};

struct Evaluation {
  LowerBound bound;
  TransferPlan plan;
  std::uint64_t schedule_digest = 0;  // round_schedules_digest: equal for equal plans
  std::size_t atoms = 0, schedule_bytes = 0, largest_schedule_bytes = 0, schedule_entries = 0;
  std::size_t most_writes_per_round = 0;   // one-sided writes of one rank in one round, the most of any
  std::size_t most_peers_per_round = 0;    // distinct peers one rank writes to in one round, the most of any
  double correspondence_seconds = 0, routing_seconds = 0, plan_seconds = 0, simulate_seconds = 0;
  double plan_cpu_seconds = 0;
  std::int64_t memory_estimate = 0;
  std::vector<StrategyResult> strategies;  // weightbridge, broadcast, p2p

  const StrategyResult& find(const std::string& name) const {
    for (const auto& s : strategies)
      if (s.strategy == name) return s;
    throw Error(ErrorCode::kInvalidArgument, "unknown strategy '" + name + "' (weightbridge, broadcast, p2p)");
  }
};

Evaluation evaluate(const std::vector<TensorInfo>& tensors, DescribedDeployment maps, const Topology& topology,
                    const Network& network) {
  Evaluation result;
  const auto start = Clock::now();
  const double cpu_start = cpu_seconds();
  const std::vector<int> engines = maps.engine_of_worker;
  Correspondence correspondence = build_correspondence(tensors, std::move(maps.maps), std::move(maps.sides));
  result.correspondence_seconds = seconds_since(start);
  result.atoms = correspondence.atoms.size();
  const PlanOptions& options = network.plan;
  result.plan = plan_transfer(correspondence, topology, options);  // refuses what the estimate says will not fit
  result.memory_estimate =
      result.plan.memory_estimate > 0 ? result.plan.memory_estimate : estimate_plan_memory(correspondence, topology, options);
  result.bound = result.plan.bound;
  result.routing_seconds = seconds_since(start) - result.correspondence_seconds;
  {
    // What rank 0 would scatter: every rank's schedule, serialized (built on the machine's cores, one
    // schedule per thread at a time), as connect does. The builder's index and the schedules go before
    // the simulation starts.
    const RoundScheduleBuilder builder(correspondence, result.plan);
    std::vector<int> peers;
    const std::vector<std::vector<std::byte>> serialized = serialize_round_schedules(
        builder, static_cast<int>(correspondence.sides.size()), 0, [&](const RoundSchedule& schedule) {
          for (const RoundPlan& round : schedule.rounds) {
            result.schedule_entries += round.pack.size() + round.assemble.size() + round.writes.size() + round.arrivals.size();
            result.most_writes_per_round = std::max(result.most_writes_per_round, round.writes.size());
            peers.clear();
            for (const Write& w : round.writes) peers.push_back(w.peer);
            std::sort(peers.begin(), peers.end());
            result.most_peers_per_round =
                std::max(result.most_peers_per_round, static_cast<std::size_t>(std::unique(peers.begin(), peers.end()) - peers.begin()));
          }
        });
    result.schedule_digest = round_schedules_digest(serialized);
    for (const std::vector<std::byte>& bytes : serialized) {
      result.schedule_bytes += bytes.size();
      result.largest_schedule_bytes = std::max(result.largest_schedule_bytes, bytes.size());
    }
  }
  result.plan_seconds = seconds_since(start);
  result.plan_cpu_seconds = cpu_seconds() - cpu_start;

  // The three strategies' traffic, each simulated on a thread of its own, and beside them the source maps
  // freed, which only the schedules read (1.4 M slice copies for Kimi-K2: freeing them at the end took
  // about a third of a second on one core).
  const auto simulate_start = Clock::now();
  BaselineTrafficOptions baseline;
  baseline.bucket_bytes = options.buffer_bytes_per_worker / options.pipeline_depth;
  baseline.pipeline_depth = options.pipeline_depth;
  baseline.engine_of_worker = engines;
  result.strategies = {{"weightbridge", {}, result.plan.rounds}, {"broadcast", {}, 0}, {"p2p", {}, 0}};
  for_each_index(result.strategies.size() + 1, 1, [&](std::size_t task) {
    if (task == 0) {
      std::vector<SourceMap>().swap(correspondence.maps);
      malloc_trim(0);  // their pages back to the system: the simulations allocate in other threads' arenas
      return;
    }
    const std::size_t s = task - 1;
    StrategyResult& strategy = result.strategies[s];
    if (s == 0) {
      strategy.simulation = simulate(traffic_of(correspondence, result.plan), topology);
      return;
    }
    const TrafficSchedule traffic = s == 1 ? broadcast_baseline_traffic(correspondence, topology, baseline)
                                           : p2p_baseline_traffic(correspondence, topology, baseline);
    strategy.rounds = static_cast<int>(traffic.rounds.size());
    strategy.simulation = simulate(traffic, topology);
  });
  result.simulate_seconds = seconds_since(simulate_start);
  return result;
}

// What the planner chose for the external exchange, and what it simulated to choose it.
nlohmann::json exchange_json(const Evaluation& e) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const ExchangeCandidate& c : e.plan.candidates)
    candidates.push_back({{"shape", c.shape}, {"fan_out", c.fan_out}, {"height", c.height}, {"rounds", c.rounds},
                          {"sim_ewtt_s", c.simulated_seconds}, {"chosen", c.chosen}});
  return {{"shape", e.plan.exchange},
          {"most_writes_per_rank_round", e.most_writes_per_round},
          {"most_peers_per_rank_round", e.most_peers_per_round},
          {"candidates", candidates}};
}

void print_strategy(const StrategyResult& s, double t_min) {
  std::printf("  %s: %d rounds, simulated EWTT %.3f s = %.2f x T_min\n", s.strategy.c_str(), s.rounds,
              s.simulation.ewtt_seconds, s.simulation.ewtt_seconds / t_min);
  std::printf("    %-20s %12s  %-28s %12s %9s\n", "stage", "bytes", "busiest link", "its bytes", "time");
  for (const auto& stage : s.simulation.stages)
    std::printf("    %-20s %12s  %-28s %12s %8.3fs\n", stage.name.c_str(), gib(static_cast<double>(stage.bytes)).c_str(),
                stage.busiest_link.c_str(), gib(static_cast<double>(stage.busiest_link_bytes)).c_str(), stage.seconds);
}

nlohmann::json strategy_json(const Evaluation& e, const StrategyResult& s) {
  // Inter-node traffic per node as the simulator counted it, for any strategy.
  std::int64_t trainer_egress = 0;
  for (int node : e.bound.trainer_nodes) trainer_egress += s.simulation.node_egress_bytes[static_cast<std::size_t>(node)];
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& node : e.bound.rollout_nodes) {
    const auto v = static_cast<std::size_t>(node.node);
    nodes.push_back({{"node", node.node},
                     {"need_bytes", node.need_bytes},
                     {"ingress_bytes", s.simulation.node_ingress_bytes[v]},
                     {"egress_bytes", s.simulation.node_egress_bytes[v]}});
  }
  return {{"strategy", s.strategy},
          {"model_bytes", e.bound.model_bytes},
          {"trainer_egress_bytes", trainer_egress},
          {"rollout_nodes", nodes},
          {"rounds", s.rounds},
          {"t_min_s", e.bound.t_min_seconds},
          {"sim_ewtt_s", s.simulation.ewtt_seconds},
          {"sim_ewtt_over_t_min", s.simulation.ewtt_seconds / e.bound.t_min_seconds}};
}

void write_json(const std::string& path, const nlohmann::json& result) {
  if (path.empty()) return;
  std::ofstream out(path);
  out << result.dump(2) << '\n';
  if (!out) throw Error(ErrorCode::kSystem, "cannot write " + path);
}

// The paper's Figure 12: one trainer node, 1..max rollout nodes each holding one Qwen3-30B-A3B replica.
// Per row also the exchange the planner chose, its planning time (wall and CPU), the row's peak RSS and
// the serialized schedules' size.
int run_scaling(int max_nodes, const Network& network, const std::string& json_path) {
  if (max_nodes > kMaxScalingNodes)
    throw Error(ErrorCode::kInvalidArgument, "--scaling " + std::to_string(max_nodes) + ": at most " +
                                                 std::to_string(kMaxScalingNodes) + " rollout nodes (each row plans a "
                                                 "deployment of its own; plan one size with --rollout engines=N)");
  const ModelConfig model = load_named_model_config("qwen3-30b-a3b");
  const std::vector<TensorInfo> tensors = model_tensors(model);
  std::printf("Figure 12: %s, trainer 1 node (tp=4,ep=8,dp=2), n one-node rollout replicas (tp=8,ep=8)\n",
              model.name.c_str());
  std::printf("%6s %8s %12s %8s %9s  %-28s %7s %7s %8s %9s\n", "nodes", "T_min", "weightbridge", "p2p", "broadcast",
              "exchange", "plan s", "cpu s", "RSS MiB", "sched MiB");
  nlohmann::json rows = nlohmann::json::array();
  for (int n = 1; n <= max_nodes; ++n) {
    reset_peak_rss();
    Deployment deployment;
    deployment.trainer = TrainerSpec::parse("tp=4,ep=8,dp=2");
    deployment.rollout = RolloutSpec::parse("engines=" + std::to_string(n) + ",tp=8,ep=8");
    deployment.gpus_per_node = 8;
    const Topology topology = make_topology(deployment, network);
    const Evaluation e = evaluate(tensors, describe_deployment(model, deployment, tensors), topology, network);
    const double t = e.bound.t_min_seconds;
    const double wb = e.find("weightbridge").simulation.ewtt_seconds;
    const double p2p = e.find("p2p").simulation.ewtt_seconds;
    const double bc = e.find("broadcast").simulation.ewtt_seconds;
    const std::int64_t rss = peak_rss_bytes();
    std::printf("%6d %7.3fs %11.3fx %7.2fx %8.3fx  %-28s %7.2f %7.2f %8.0f %9.1f\n", n, t, wb / t, p2p / t, bc / t,
                e.plan.exchange.c_str(), e.plan_seconds, e.plan_cpu_seconds, static_cast<double>(rss) / (1 << 20),
                static_cast<double>(e.schedule_bytes) / (1 << 20));
    std::fflush(stdout);
    rows.push_back({{"rollout_nodes", n}, {"workers", deployment.world_size()}, {"t_min_s", t},
                    {"weightbridge_sim_ewtt_s", wb}, {"p2p_sim_ewtt_s", p2p}, {"broadcast_sim_ewtt_s", bc},
                    {"rounds", e.plan.rounds}, {"exchange", exchange_json(e)}, {"plan_seconds", e.plan_seconds},
                    {"plan_cpu_seconds", e.plan_cpu_seconds}, {"peak_rss_bytes", rss},
                    {"memory_estimate_bytes", e.memory_estimate}, {"schedule_bytes", e.schedule_bytes},
                    {"schedule_entries", e.schedule_entries}});
  }
  write_json(json_path, {{"figure", 12}, {"model", model.name}, {"rows", rows}});
  return 0;
}

int run(int argc, char** argv) {
  DeploymentOptions choice;
  std::string json_path, strategy = "weightbridge";
  Network network;
  int scaling = 0;
  po::options_description options("wb-plan options");
  options.add_options()("help,h", "Show this help.");
  add_deployment_options(options, choice);
  options.add_options()
      ("strategy", po::value(&strategy), "Strategy whose figures --json writes: weightbridge, broadcast or p2p (all are printed).")
      ("scaling", po::value(&scaling), "Print the paper's Figure 12 table for 1..N rollout nodes instead.")
      ("json", po::value(&json_path), "Write the result as JSON to this file.");
  po::variables_map variables;
  if (!parse_command_line(argc, argv, options, variables)) return 0;
  if (strategy != "weightbridge" && strategy != "broadcast" && strategy != "p2p")
    throw Error(ErrorCode::kInvalidArgument, "--strategy must be weightbridge, broadcast or p2p, not '" + strategy + "'");
  // The planner's own settings (--buffer-mib, --pipeline-depth, --relay-fan-out, --plan-memory-mib, WB_*
  // variables), as connect reads them, and the network it plans for (--node-gbps, --intra-gbps,
  // --message-us: the same settings connect plans with).
  network.plan = plan_options_from_settings();
  {
    const NetworkSettings links = network_from_settings();
    network.node_gbps = links.node_bandwidth / 1e9;
    network.intra_gbps = links.intra_node_bandwidth / 1e9;
    network.message_us = links.message_latency * 1e6;
  }
  if (variables.count("scaling") && scaling < 1) throw Error(ErrorCode::kInvalidArgument, "--scaling must be at least 1");
  if (scaling > 0) return run_scaling(scaling, network, json_path);

  const auto start = Clock::now();
  const double cpu_start = cpu_seconds();
  PresetInstance instance = resolve_deployment(choice, variables);
  const std::string fp8_layout = choose_fp8_rollout(choice, instance);  // a preset's FP8 engines' own layout
  const ModelConfig& model = instance.model;
  const Deployment& deployment = instance.deployment;
  const std::vector<TensorInfo> tensors = model_tensors(model);
  DescribedDeployment maps = describe_deployment(model, deployment, tensors);
  const std::size_t copies = maps.copies;
  const double describe_seconds = seconds_since(start);
  const Topology topology = make_topology(deployment, network);
  const std::vector<TensorInfo> planned = maps.tensors;  // FP8 engines: the FP8 form's
  const std::int64_t fp8_shared_blocks = maps.fp8_shared_blocks;
  const Evaluation e = evaluate(planned, std::move(maps), topology, network);
  const double t_min = e.bound.t_min_seconds;
  const TransferPlan& plan = e.plan;

  std::printf("%s: trainer %s, rollout %s, %d workers on %d nodes of %d\n", model.name.c_str(),
              deployment.trainer.to_string().c_str(), deployment.rollout.to_string().c_str(), deployment.world_size(),
              topology.num_nodes(), deployment.gpus_per_node);
  if (!fp8_layout.empty()) std::printf("  %s\n", fp8_layout.c_str());
  std::printf("  source maps: %zu copies (described in %.1f s); correspondence: %zu atoms\n", copies, describe_seconds, e.atoms);
  std::int64_t checkpoint_bytes = 0, form_bytes = 0, scale_bytes = 0;
  for (const TensorInfo& t : tensors) checkpoint_bytes += static_cast<std::int64_t>(t.nbytes());
  for (const TensorInfo& t : planned) form_bytes += static_cast<std::int64_t>(t.nbytes());
  if (deployment.rollout.fp8()) {
    const layout::Fp8Form form = engine_form(model, deployment.rollout);
    form_bytes = static_cast<std::int64_t>(form.total_bytes());  // a mixed fleet plans in the union: not `planned`
    for (std::size_t t = 0; t < form.tensors.size(); ++t)
      if (form.sources[t].role == layout::FormRole::kScale) scale_bytes += static_cast<std::int64_t>(form.tensors[t].nbytes());
  }
  if (deployment.rollout.fp8())
    std::printf("  FP8 engines (%s): the FP8 form is %s (%s of it scales), %.3f x the checkpoint's %s; the trainers share "
                "%lld blocks, %lld bytes of amaxes per trainer per update\n",
                engine_quantization(model, deployment.rollout).to_string().c_str(), gib(static_cast<double>(form_bytes)).c_str(),
                gib(static_cast<double>(scale_bytes)).c_str(), static_cast<double>(form_bytes) / static_cast<double>(checkpoint_bytes),
                gib(static_cast<double>(checkpoint_bytes)).c_str(), static_cast<long long>(fp8_shared_blocks),
                static_cast<long long>(4 * fp8_shared_blocks));
  if (deployment.rollout.mixed())
    std::printf("  mixed fleet: %d BF16 and %d FP8 engines in one plan, in the union of both forms (%s: the tensors both "
                "forms hold counted once); each rollout node's M_v is its own form's\n",
                deployment.rollout.bf16_engines, deployment.rollout.engines - deployment.rollout.bf16_engines,
                gib(static_cast<double>(e.bound.model_bytes)).c_str());
  std::printf("  M = %s over %zu trainer nodes (B_T = %.0f GB/s): M / B_T = %.3f s\n",
              gib(static_cast<double>(e.bound.model_bytes)).c_str(), e.bound.trainer_nodes.size(),
              e.bound.trainer_egress_bandwidth / 1e9, static_cast<double>(e.bound.model_bytes) / e.bound.trainer_egress_bandwidth);
  std::int64_t trainer_egress = 0, largest_trainer = 0, trainer_count = 0;
  for (std::size_t w = 0; w < plan.worker_send_bytes.size(); ++w) {
    if (!deployment.is_trainer(static_cast<int>(w))) continue;
    trainer_egress += plan.worker_send_bytes[w];
    largest_trainer = std::max(largest_trainer, plan.worker_send_bytes[w]);
    ++trainer_count;
  }
  std::printf("  plan: %d rounds, %zu segments; trainers send %s (busiest worker %.3fx the mean)\n", plan.rounds,
              plan.segments.size(), gib(static_cast<double>(trainer_egress)).c_str(),
              static_cast<double>(largest_trainer) * static_cast<double>(trainer_count) / static_cast<double>(std::max<std::int64_t>(1, trainer_egress)));
  std::int64_t rollout_received = 0, busiest_rollout = 0, rollout_count = 0;
  for (std::size_t w = 0; w < plan.worker_receive_bytes.size(); ++w) {
    if (deployment.is_trainer(static_cast<int>(w))) continue;
    rollout_received += plan.worker_receive_bytes[w];
    busiest_rollout = std::max(busiest_rollout, plan.worker_receive_bytes[w]);
    ++rollout_count;
  }
  std::printf("        rollout workers receive %s in all stages (busiest worker %.3fx the mean)\n",
              gib(static_cast<double>(rollout_received)).c_str(),
              static_cast<double>(busiest_rollout) * static_cast<double>(rollout_count) /
                  static_cast<double>(std::max<std::int64_t>(1, rollout_received)));
  std::printf("  %-6s %12s %12s %12s %10s\n", "node", "M_v", "ingress", "egress", "M_v / B_v");
  for (const auto& node : e.bound.rollout_nodes) {
    const auto v = static_cast<std::size_t>(node.node);
    std::printf("  %-6d %12s %12s %12s %9.3fs\n", node.node, gib(static_cast<double>(node.need_bytes)).c_str(),
                gib(static_cast<double>(plan.node_ingress_bytes[v])).c_str(),
                gib(static_cast<double>(plan.node_egress_bytes[v])).c_str(),
                static_cast<double>(node.need_bytes) / topology.node_bandwidth);
  }
  std::printf("  round schedules: %zu entries, %.1f MiB serialized (largest rank %.1f MiB); at most %zu writes to %zu peers "
              "per rank and round\n", e.schedule_entries, static_cast<double>(e.schedule_bytes) / (1 << 20),
              static_cast<double>(e.largest_schedule_bytes) / (1 << 20), e.most_writes_per_round, e.most_peers_per_round);
  std::printf("  schedule digest %s\n", digest_text(e.schedule_digest).c_str());
  std::printf("  external exchange: %s", plan.exchange.c_str());
  if (!plan.candidates.empty()) {
    std::printf(", the fastest simulated of");
    for (const ExchangeCandidate& c : plan.candidates)
      std::printf("%s %s/%d rounds %.3fx", &c == &plan.candidates.front() ? "" : ",", c.shape.c_str(), c.rounds,
                  c.simulated_seconds / t_min);
  }
  std::printf("\n  T_min = %.3f s\n", t_min);
  for (const StrategyResult& s : e.strategies) print_strategy(s, t_min);
  const std::int64_t rss = peak_rss_bytes();
  const double total_seconds = seconds_since(start), total_cpu_seconds = cpu_seconds() - cpu_start;
  std::printf("  planning %.1f s, %.1f s CPU (correspondence %.1f s, routing and rounds %.1f s, schedules %.1f s), "
              "simulation %.1f s, peak RSS %.0f MiB (planner's estimate of its own: %.0f MiB, limit %.0f MiB)\n",
              e.plan_seconds, e.plan_cpu_seconds, e.correspondence_seconds, e.routing_seconds,
              e.plan_seconds - e.correspondence_seconds - e.routing_seconds, e.simulate_seconds,
              static_cast<double>(rss) / (1 << 20), static_cast<double>(e.memory_estimate) / (1 << 20),
              static_cast<double>(network.plan.memory_limit_bytes) / (1 << 20));
  std::printf("  whole run %.1f s, %.1f s CPU (describing the deployment %.1f s)\n", total_seconds, total_cpu_seconds,
              describe_seconds);

  nlohmann::json result = strategy_json(e, e.find(strategy));
  result.update({{"model", model.name},
                 {"trainer", deployment.trainer.to_string()},
                 {"rollout", deployment.rollout.to_string()},
                 {"workers", deployment.world_size()},
                 {"trainer_nodes", e.bound.trainer_nodes.size()},
                 {"trainer_egress_bandwidth", e.bound.trainer_egress_bandwidth},
                 {"source_map_copies", copies},
                 {"atoms", e.atoms},
                 {"segments", plan.segments.size()},
                 {"rounds_bytes_max_over_mean", round_max_over_mean(plan)},
                 {"schedule_bytes", e.schedule_bytes},
                 {"schedule_entries", e.schedule_entries},
                 {"schedule_digest", digest_text(e.schedule_digest)},
                 {"buffer_bytes_per_worker", network.plan.buffer_bytes_per_worker},
                 {"exchange", exchange_json(e)},
                 {"plan_cpu_seconds", e.plan_cpu_seconds},
                 {"memory_estimate_bytes", e.memory_estimate},
                 {"memory_limit_bytes", network.plan.memory_limit_bytes},
                 {"describe_seconds", describe_seconds},
                 {"correspondence_seconds", e.correspondence_seconds},
                 {"routing_seconds", e.routing_seconds},
                 {"schedules_seconds", e.plan_seconds - e.correspondence_seconds - e.routing_seconds},
                 {"plan_seconds", e.plan_seconds},
                 {"simulate_seconds", e.simulate_seconds},
                 {"total_seconds", total_seconds},  // the whole run but for writing this JSON
                 {"total_cpu_seconds", total_cpu_seconds},
                 {"peak_rss_bytes", rss}});
  if (deployment.rollout.fp8())
    result["fp8"] = {{"config", engine_quantization(model, deployment.rollout).to_string()},
                     {"form_bytes", form_bytes},
                     {"scale_bytes", scale_bytes},
                     {"checkpoint_bytes", checkpoint_bytes},
                     {"trainer_egress_bytes", trainer_egress},
                     {"layout_note", fp8_layout},
                     {"shared_blocks", fp8_shared_blocks},
                     {"amax_bytes_per_trainer", 4 * fp8_shared_blocks}};
  nlohmann::json all = nlohmann::json::object();
  for (const StrategyResult& s : e.strategies) all[s.strategy] = strategy_json(e, s);
  result["strategies"] = all;
  write_json(json_path, result);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    // The planner refuses what its estimate says will not fit; this is what the estimate does not cover
    // (the source maps, the correspondence, the baselines' simulation).
    std::fprintf(stderr, "wb-plan: out of memory at a peak RSS of %.0f MiB (fewer engines, or larger --buffer-mib for "
                 "fewer pieces and rounds)\n", static_cast<double>(peak_rss_bytes()) / (1 << 20));
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "wb-plan: %s\n", error.what());
    return 1;
  }
}
