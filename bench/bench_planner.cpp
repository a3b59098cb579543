// The global planner on the paper's deployments at full scale, from described source maps as wb-plan
// builds them (no parameter memory), and on the Figure 12 replica sweep (one trainer node of
// Qwen3-30B-A3B, n one-node engines: "replicas-N"). Per deployment: plan_transfer alone (with its choice
// among exchange shapes); building and serializing every rank's round schedule on one thread (what rank 0
// scatters at connect); and simulating the plan's traffic on the network model. The maps, the
// correspondence and one validated plan are built once per deployment, outside the timed loops; only the
// one being measured is kept in memory. Counters: segments, rounds, relay depth, serialized schedule
// bytes, simulated EWTT and T_min.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/described_map.hpp"
#include "emu/models/presets.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace {

using namespace wb;
using namespace wb::emu;

struct PresetPlan {
  std::string name;
  std::string error;  // set when building or validating failed: every benchmark of the preset skips
  Correspondence correspondence;
  Topology topology;
  PlanOptions options;  // the defaults wb-plan uses (1 GiB of buffers per worker, double buffering)
  TransferPlan plan;    // validated: one copy out, one copy in per node
};

// Every worker's described source map (one engine's maps reused), as wb-plan builds them.
Correspondence describe(const PresetInstance& instance) {
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  DescribedDeployment described = describe_deployment(instance.model, instance.deployment, tensors);
  return build_correspondence(tensors, std::move(described.maps), std::move(described.sides));
}

// The checks a plan must pass before it is timed: trainers together send M, each rollout node takes in M_v.
std::string validate(const PresetPlan& p) {
  std::int64_t trainer_egress = 0;
  for (std::size_t w = 0; w < p.correspondence.sides.size(); ++w)
    if (p.correspondence.sides[w] == Side::kTrainer) trainer_egress += p.plan.worker_send_bytes[w];
  if (trainer_egress != p.plan.bound.model_bytes)
    return "trainers send " + std::to_string(trainer_egress) + " bytes, the model is " + std::to_string(p.plan.bound.model_bytes);
  for (const auto& node : p.plan.bound.rollout_nodes)
    if (p.plan.node_ingress_bytes[static_cast<std::size_t>(node.node)] != node.need_bytes)
      return "rollout node " + std::to_string(node.node) + " takes in " +
             std::to_string(p.plan.node_ingress_bytes[static_cast<std::size_t>(node.node)]) + " bytes, needs " +
             std::to_string(node.need_bytes);
  if (p.plan.rounds < 1 || p.plan.segments.empty()) return "empty plan";
  return {};
}

// The preset's maps, correspondence and validated plan. One preset at a time: kimi-k2's take gigabytes.
const PresetPlan& preset_plan(const std::string& name) {
  static std::unique_ptr<PresetPlan> cached;
  if (cached && cached->name == name) return *cached;
  cached.reset();
  auto p = std::make_unique<PresetPlan>();
  p->name = name;
  try {
    PresetInstance instance;
    if (name.rfind("replicas-", 0) == 0) {
      instance.model = load_named_model_config("qwen3-30b-a3b");
      instance.deployment.trainer = TrainerSpec::parse("tp=4,ep=8,dp=2");
      instance.deployment.rollout = RolloutSpec::parse("engines=" + name.substr(9) + ",tp=8,ep=8");
      instance.deployment.gpus_per_node = 8;
    } else {
      instance = instantiate_preset(find_preset(name), ModelScale::kFull);
    }
    p->correspondence = describe(instance);
    p->topology = Topology::uniform(instance.deployment.world_size(), instance.deployment.gpus_per_node, 400e9, 900e9);
    p->plan = plan_transfer(p->correspondence, p->topology, p->options);
    p->error = validate(*p);
  } catch (const std::exception& e) {
    p->error = e.what();
  }
  cached = std::move(p);
  return *cached;
}

void plan_counters(benchmark::State& state, const PresetPlan& p) {
  state.counters["workers"] = static_cast<double>(p.correspondence.sides.size());
  state.counters["atoms"] = static_cast<double>(p.correspondence.atoms.size());
  state.counters["segments"] = static_cast<double>(p.plan.segments.size());
  state.counters["rounds"] = p.plan.rounds;
  int height = 1;
  for (const RelayTree& tree : p.plan.relay_trees) height = std::max(height, tree.height);
  state.counters["relay_height"] = height;
  state.counters["model_GiB"] = static_cast<double>(p.plan.bound.model_bytes) / (1 << 30);
}

void BM_PlanTransfer(benchmark::State& state, const std::string& name) {
  const PresetPlan& p = preset_plan(name);
  if (!p.error.empty()) return state.SkipWithError(p.error.c_str());
  for (auto _ : state) {
    TransferPlan plan = plan_transfer(p.correspondence, p.topology, p.options);
    if (plan.segments.size() != p.plan.segments.size() || plan.rounds != p.plan.rounds)
      return state.SkipWithError("planning the same input twice gave different plans");
    benchmark::DoNotOptimize(plan);
  }
  plan_counters(state, p);
}

void BM_BuildAndSerializeSchedules(benchmark::State& state, const std::string& name) {
  const PresetPlan& p = preset_plan(name);
  if (!p.error.empty()) return state.SkipWithError(p.error.c_str());
  const int workers = static_cast<int>(p.correspondence.sides.size());
  std::size_t bytes = 0, largest = 0;
  for (auto _ : state) {
    bytes = largest = 0;
    const RoundScheduleBuilder builder(p.correspondence, p.plan);
    int misfits = 0;
    const std::vector<std::vector<std::byte>> serialized =
        serialize_round_schedules(builder, workers, 1, [&](const RoundSchedule& schedule) {
          misfits += static_cast<int>(schedule.rounds.size()) != p.plan.rounds;
        });
    if (misfits > 0) return state.SkipWithError((std::to_string(misfits) + " schedules do not fit the plan").c_str());
    for (const std::vector<std::byte>& one : serialized) {
      bytes += one.size();
      largest = std::max(largest, one.size());
    }
    benchmark::DoNotOptimize(serialized.data());
  }
  plan_counters(state, p);
  state.counters["schedule_bytes"] = static_cast<double>(bytes);
  state.counters["largest_schedule_bytes"] = static_cast<double>(largest);
}

void BM_SimulatePlan(benchmark::State& state, const std::string& name) {
  const PresetPlan& p = preset_plan(name);
  if (!p.error.empty()) return state.SkipWithError(p.error.c_str());
  double ewtt = 0;
  for (auto _ : state) {
    const SimulationResult result = simulate(traffic_of(p.correspondence, p.plan), p.topology);
    ewtt = result.ewtt_seconds;
    if (ewtt < p.plan.bound.t_min_seconds * (1 - 1e-9))
      return state.SkipWithError("simulated EWTT below the lower bound T_min");
    benchmark::DoNotOptimize(result);
  }
  plan_counters(state, p);
  state.counters["sim_ewtt_s"] = ewtt;
  state.counters["t_min_s"] = p.plan.bound.t_min_seconds;
  state.counters["ewtt_over_t_min"] = ewtt / p.plan.bound.t_min_seconds;
}

}  // namespace

int main(int argc, char** argv) {
  // Deployment by deployment, so that only one correspondence is in memory at a time.
  std::vector<std::string> names;
  for (const Preset& preset : presets()) names.push_back(preset.name);
  for (const char* replicas : {"replicas-8", "replicas-32", "replicas-64"}) names.emplace_back(replicas);
  for (const std::string& name : names) {
    for (auto [label, fn] : {std::pair{"BM_PlanTransfer/", &BM_PlanTransfer},
                             std::pair{"BM_BuildAndSerializeSchedules/", &BM_BuildAndSerializeSchedules},
                             std::pair{"BM_SimulatePlan/", &BM_SimulatePlan}}) {
      benchmark::internal::Benchmark* b =
          benchmark::RegisterBenchmark((label + name).c_str(), [fn = fn, name](benchmark::State& state) { fn(state, name); });
      b->Unit(benchmark::kMillisecond);
      if (name == "kimi-k2") b->Iterations(1);  // 512 workers, a trillion parameters: one run is enough
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
