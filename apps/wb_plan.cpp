// wb-plan: plans a deployment at any scale in one process and judges the plan on a network model. From
// the emulated backends' described source maps (no parameter memory), it builds the correspondence, the
// lower bound T_min, WeightBridge's plan and every rank's round schedule, and simulates the plan and the
// paper's two baselines (broadcast, single-source P2P) on the same topology.
//
//   wb-plan --preset kimi-k2
//   wb-plan --model CONFIG.json --trainer SPEC --rollout SPEC [--gpus-per-node 8] [--strategy weightbridge]
//           [--node-gbps 400] [--intra-gbps 900] [--buffer-mib 1024] [--json FILE]
//   wb-plan --scaling 16      # the paper's Figure 12: 1 trainer node, 1..16 rollout replicas of Qwen3-30B-A3B
#include <sys/resource.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emu/backend.hpp"
#include "emu/deployment_options.hpp"
#include "emu/described_map.hpp"
#include "emu/presets.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/round_schedule.hpp"
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

std::int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

struct Network {
  double node_gbps = 400, intra_gbps = 900, message_us = 5;
  std::int64_t buffer_mib = 1024;
  int pipeline_depth = 2;
};

Topology make_topology(const Deployment& deployment, const Network& network) {
  Topology topology = Topology::uniform(deployment.world_size(), deployment.gpus_per_node, network.node_gbps * 1e9,
                                        network.intra_gbps * 1e9);
  topology.message_latency = network.message_us * 1e-6;
  return topology;
}

struct StrategyResult {
  std::string strategy;
  SimulationResult simulation;
  int rounds = 0;
};

struct Evaluation {
  LowerBound bound;
  TransferPlan plan;
  std::size_t atoms = 0, schedule_bytes = 0, largest_schedule_bytes = 0, schedule_entries = 0;
  double correspondence_seconds = 0, routing_seconds = 0, plan_seconds = 0, simulate_seconds = 0;
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
  const std::vector<int> engines = maps.engine_of_worker;
  const Correspondence correspondence = build_correspondence(tensors, std::move(maps.maps), std::move(maps.sides));
  result.correspondence_seconds = seconds_since(start);
  result.atoms = correspondence.atoms.size();
  PlanOptions options;
  options.buffer_bytes_per_worker = network.buffer_mib << 20;
  options.pipeline_depth = network.pipeline_depth;
  result.plan = plan_transfer(correspondence, topology, options);
  result.bound = result.plan.bound;
  result.routing_seconds = seconds_since(start) - result.correspondence_seconds;
  // What rank 0 would scatter: every rank's schedule, serialized (built one at a time).
  const RoundScheduleBuilder builder(correspondence, result.plan);
  for (int rank = 0; rank < static_cast<int>(correspondence.sides.size()); ++rank) {
    const RoundSchedule schedule = builder.build(rank);
    for (const RoundPlan& round : schedule.rounds)
      result.schedule_entries += round.pack.size() + round.assemble.size() + round.writes.size() + round.arrivals.size();
    const std::size_t bytes = serialize_round_schedule(schedule).size();
    result.schedule_bytes += bytes;
    result.largest_schedule_bytes = std::max(result.largest_schedule_bytes, bytes);
  }
  result.plan_seconds = seconds_since(start);

  const auto simulate_start = Clock::now();
  StrategyResult weightbridge{"weightbridge", simulate(traffic_of(correspondence, result.plan), topology), result.plan.rounds};
  result.strategies.push_back(std::move(weightbridge));
  BaselineOptions baseline;
  baseline.bucket_bytes = options.buffer_bytes_per_worker / options.pipeline_depth;
  baseline.pipeline_depth = options.pipeline_depth;
  baseline.engine_of_worker = engines;
  const TrafficSchedule broadcast = broadcast_baseline(correspondence, topology, baseline);
  result.strategies.push_back({"broadcast", simulate(broadcast, topology), static_cast<int>(broadcast.rounds.size())});
  const TrafficSchedule p2p = p2p_baseline(correspondence, topology, baseline);
  result.strategies.push_back({"p2p", simulate(p2p, topology), static_cast<int>(p2p.rounds.size())});
  result.simulate_seconds = seconds_since(simulate_start);
  return result;
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
int run_scaling(int max_nodes, const Network& network, const std::string& json_path) {
  const ModelConfig model = load_named_model_config("qwen3-30b-a3b");
  const std::vector<TensorInfo> tensors = model_tensors(model);
  std::printf("Figure 12: %s, trainer 1 node (tp=4,ep=8,dp=2), n one-node rollout replicas (tp=8,ep=8)\n",
              model.name.c_str());
  std::printf("%6s %9s %12s %9s %12s %9s %12s %9s\n", "nodes", "T_min", "weightbridge", "/T_min", "p2p", "/T_min",
              "broadcast", "/T_min");
  nlohmann::json rows = nlohmann::json::array();
  for (int n = 1; n <= max_nodes; ++n) {
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
    std::printf("%6d %8.3fs %11.3fs %8.2fx %11.3fs %8.2fx %11.3fs %8.2fx\n", n, t, wb, wb / t, p2p, p2p / t, bc, bc / t);
    std::fflush(stdout);
    rows.push_back({{"rollout_nodes", n}, {"t_min_s", t}, {"weightbridge_sim_ewtt_s", wb}, {"p2p_sim_ewtt_s", p2p},
                    {"broadcast_sim_ewtt_s", bc}});
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
  {
    // The planner's own settings (--buffer-mib, --pipeline-depth, WB_* variables), as connect reads them.
    const PlanOptions planned = plan_options_from_settings();
    network.buffer_mib = planned.buffer_bytes_per_worker >> 20;
    network.pipeline_depth = planned.pipeline_depth;
    // --node-gbps, --intra-gbps, --message-us: the same settings connect plans with.
    const NetworkSettings links = network_from_settings();
    network.node_gbps = links.node_bandwidth / 1e9;
    network.intra_gbps = links.intra_node_bandwidth / 1e9;
    network.message_us = links.message_latency * 1e6;
  }
  if (scaling > 0) return run_scaling(scaling, network, json_path);

  const auto start = Clock::now();
  const PresetInstance instance = resolve_deployment(choice, variables);
  const ModelConfig& model = instance.model;
  const Deployment& deployment = instance.deployment;
  const std::vector<TensorInfo> tensors = model_tensors(model);
  DescribedDeployment maps = describe_deployment(model, deployment, tensors);
  const std::size_t copies = maps.copies;
  const double describe_seconds = seconds_since(start);
  const Topology topology = make_topology(deployment, network);
  const Evaluation e = evaluate(tensors, std::move(maps), topology, network);
  const double t_min = e.bound.t_min_seconds;
  const TransferPlan& plan = e.plan;

  std::printf("%s: trainer %s, rollout %s, %d workers on %d nodes of %d\n", model.name.c_str(),
              deployment.trainer.to_string().c_str(), deployment.rollout.to_string().c_str(), deployment.world_size(),
              topology.num_nodes(), deployment.gpus_per_node);
  std::printf("  source maps: %zu copies (described in %.1f s); correspondence: %zu atoms\n", copies, describe_seconds, e.atoms);
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
  std::printf("  round schedules: %zu entries, %.1f MiB serialized (largest rank %.1f MiB)\n", e.schedule_entries,
              static_cast<double>(e.schedule_bytes) / (1 << 20), static_cast<double>(e.largest_schedule_bytes) / (1 << 20));
  std::printf("  T_min = %.3f s\n", t_min);
  for (const StrategyResult& s : e.strategies) print_strategy(s, t_min);
  const std::int64_t rss = peak_rss_bytes();
  std::printf("  planning %.1f s (correspondence %.1f s, routing and rounds %.1f s, schedules %.1f s), simulation %.1f s, "
              "peak RSS %.0f MiB\n", e.plan_seconds, e.correspondence_seconds, e.routing_seconds,
              e.plan_seconds - e.correspondence_seconds - e.routing_seconds, e.simulate_seconds,
              static_cast<double>(rss) / (1 << 20));

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
                 {"schedule_bytes", e.schedule_bytes},
                 {"schedule_entries", e.schedule_entries},
                 {"buffer_bytes_per_worker", network.buffer_mib << 20},
                 {"describe_seconds", describe_seconds},
                 {"correspondence_seconds", e.correspondence_seconds},
                 {"plan_seconds", e.plan_seconds},
                 {"simulate_seconds", e.simulate_seconds},
                 {"peak_rss_bytes", rss}});
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
  } catch (const std::exception& error) {
    std::fprintf(stderr, "wb-plan: %s\n", error.what());
    return 1;
  }
}
