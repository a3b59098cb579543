// wb-plan: the analysis half of planning, in one process at any scale. From the emulated backends'
// described source maps (no memory for parameters), it builds the correspondence of a deployment and the
// network's lower bound: M, every rollout node's M_v, and T_min = max(M / B_T, max_v M_v / B_v).
//
//   wb-plan --preset kimi-k2
//   wb-plan --model CONFIG.json --trainer SPEC --rollout SPEC [--gpus-per-node 8] [--node-gbps 400] [--json FILE]
//
// The planner and simulator (routing, rounds, simulated EWTT, baselines) come with issue 4.
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
#include "weightbridge/status.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

int run(int argc, char** argv) {
  DeploymentOptions choice;
  std::string json_path;
  double node_gbps = 400, intra_gbps = 900;
  po::options_description options("wb-plan options");
  options.add_options()("help,h", "Show this help.");
  add_deployment_options(options, choice);
  options.add_options()
      ("node-gbps", po::value(&node_gbps), "Inter-node bandwidth per node, GB/s each direction (the paper: 400).")
      ("intra-gbps", po::value(&intra_gbps), "Intra-node bandwidth per node, GB/s.")
      ("json", po::value(&json_path), "Write the result as JSON to this file.");
  po::variables_map variables;
  if (!parse_command_line(argc, argv, options, variables)) return 0;

  const auto start = std::chrono::steady_clock::now();
  const PresetInstance instance = resolve_deployment(choice, variables);
  const ModelConfig& model = instance.model;
  const Deployment& deployment = instance.deployment;
  const std::vector<TensorInfo> tensors = model_tensors(model);
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
  std::size_t copies = 0, map_bytes = 0;
  for (int rank = 0; rank < deployment.world_size(); ++rank) {
    const bool is_trainer = deployment.is_trainer(rank);
    auto worker = is_trainer ? make_trainer_worker(model, deployment.trainer, rank)
                             : make_rollout_worker(model, deployment.rollout, rank - deployment.trainer.world_size());
    maps.push_back(described_source_map(*worker, tensors));
    copies += maps.back().copies.size();
    map_bytes += serialize_source_map(maps.back()).size();
    sides.push_back(is_trainer ? Side::kTrainer : Side::kRollout);
  }
  const Correspondence correspondence = build_correspondence(tensors, std::move(maps), std::move(sides));
  const Topology topology =
      Topology::uniform(deployment.world_size(), deployment.gpus_per_node, node_gbps * 1e9, intra_gbps * 1e9);
  const LowerBound bound = lower_bound(correspondence, topology);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);

  std::printf("%s: trainer %s, rollout %s, %d workers on %d nodes of %d\n", model.name.c_str(),
              deployment.trainer.to_string().c_str(), deployment.rollout.to_string().c_str(), deployment.world_size(),
              topology.num_nodes(), deployment.gpus_per_node);
  std::printf("  source maps: %zu copies, %.1f MiB serialized; correspondence: %zu atoms\n", copies,
              static_cast<double>(map_bytes) / (1 << 20), correspondence.atoms.size());
  std::printf("  M = %s over %zu trainer nodes (B_T = %.0f GB/s): M / B_T = %.3f s\n",
              gib(static_cast<double>(bound.model_bytes)).c_str(), bound.trainer_nodes.size(),
              bound.trainer_egress_bandwidth / 1e9, static_cast<double>(bound.model_bytes) / bound.trainer_egress_bandwidth);
  std::printf("  %-6s %14s %10s\n", "node", "M_v", "M_v / B_v");
  for (const auto& node : bound.rollout_nodes)
    std::printf("  %-6d %14s %9.3fs\n", node.node, gib(static_cast<double>(node.need_bytes)).c_str(),
                static_cast<double>(node.need_bytes) / topology.node_bandwidth);
  std::printf("  T_min = %.3f s   (analysis %.1f s, peak RSS %.0f MiB)\n", bound.t_min_seconds, seconds,
              static_cast<double>(usage.ru_maxrss) / 1024.0);

  nlohmann::json result = {{"model", model.name},
                           {"trainer", deployment.trainer.to_string()},
                           {"rollout", deployment.rollout.to_string()},
                           {"workers", deployment.world_size()},
                           {"model_bytes", bound.model_bytes},
                           {"trainer_nodes", bound.trainer_nodes.size()},
                           {"trainer_egress_bandwidth", bound.trainer_egress_bandwidth},
                           {"t_min_s", bound.t_min_seconds},
                           {"source_map_copies", copies},
                           {"source_map_bytes", map_bytes},
                           {"atoms", correspondence.atoms.size()},
                           {"analysis_seconds", seconds},
                           {"peak_rss_bytes", static_cast<std::int64_t>(usage.ru_maxrss) * 1024}};
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& node : bound.rollout_nodes) nodes.push_back({{"node", node.node}, {"need_bytes", node.need_bytes}});
  result["rollout_nodes"] = nodes;
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << result.dump(2) << '\n';
    if (!out) throw Error(ErrorCode::kSystem, "cannot write " + json_path);
  }
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
