// The planner on the paper's deployments. At tiny scale every worker's round schedule is played in one
// process on real parameters and every rollout parameter must equal its own load_weights bit for bit. At
// full scale (described maps) the traffic must be exactly one copy out and one copy in per node, balanced,
// within the buffer budget, and the simulated EWTT within 10 % of T_min.
#include <gtest/gtest.h>

#include <cstring>

#include "../support/plan_checks.hpp"
#include "../support/schedule_replay.hpp"
#include "emu/backend.hpp"
#include "emu/described_map.hpp"
#include "emu/presets.hpp"
#include "emu/synthetic.hpp"
#include "preset_params.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/round_schedule.hpp"
#include "weightbridge/simulator.hpp"

namespace wb::emu {
namespace {

using ::wb::testing_support::Bytes;

struct DeploymentUnderTest {
  PresetInstance instance;
  std::vector<TensorInfo> tensors;
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
};

DeploymentUnderTest describe(const std::string& preset, ModelScale scale) {
  DeploymentUnderTest d{instantiate_preset(find_preset(preset), scale), {}, {}, {}};
  d.tensors = model_tensors(d.instance.model);
  DescribedDeployment described = describe_deployment(d.instance.model, d.instance.deployment, d.tensors);
  d.maps = std::move(described.maps);
  d.sides = std::move(described.sides);
  return d;
}

void expect_exact_traffic(const Correspondence& correspondence, const TransferPlan& plan) {
  std::int64_t trainer_egress = 0;
  for (std::size_t w = 0; w < correspondence.sides.size(); ++w)
    if (correspondence.sides[w] == Side::kTrainer) trainer_egress += plan.worker_send_bytes[w];
  EXPECT_EQ(trainer_egress, plan.bound.model_bytes) << "one copy out";
  for (const auto& node : plan.bound.rollout_nodes)
    EXPECT_EQ(plan.node_ingress_bytes[static_cast<std::size_t>(node.node)], node.need_bytes) << "one copy in, node " << node.node;
}

class PlannerOnPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(PlannerOnPreset, TinyTransferIsBitExact) {
  const DeploymentUnderTest d = describe(GetParam(), ModelScale::kTiny);
  const Deployment& deployment = d.instance.deployment;
  const Correspondence correspondence = build_correspondence(d.tensors, d.maps, d.sides);
  const Topology topology = Topology::uniform(deployment.world_size(), deployment.gpus_per_node, 400e9, 900e9);
  PlanOptions options;
  options.buffer_bytes_per_worker = 256 << 10;  // several rounds even at tiny scale
  options.piece_bytes = 1 << 10;
  const TransferPlan plan = plan_transfer(correspondence, topology, options);
  expect_exact_traffic(correspondence, plan);
  EXPECT_GT(plan.rounds, 1);

  // Trainers hold what their load_weights gives; rollouts start from a fill pattern and must end with
  // exactly what their own load_weights gives over that same pattern (padding included).
  SyntheticCheckpoint checkpoint(d.tensors, 2024);
  std::vector<std::vector<Bytes>> params, expected;
  for (int rank = 0; rank < deployment.world_size(); ++rank) {
    const bool trainer = deployment.is_trainer(rank);
    const auto worker = trainer ? make_trainer_worker(d.instance.model, deployment.trainer, rank)
                                : make_rollout_worker(d.instance.model, deployment.rollout, rank - deployment.trainer.world_size());
    HostParameters host(worker->parameter_infos());
    for (const auto& p : host.parameters()) std::memset(p.view.data, 0xEE, p.view.nbytes());
    std::vector<Bytes> before;
    for (const auto& p : host.parameters())
      before.emplace_back(static_cast<const std::byte*>(p.view.data), static_cast<const std::byte*>(p.view.data) + p.view.nbytes());
    worker->load_weights(checkpoint, host.parameters());
    std::vector<Bytes> after;
    for (const auto& p : host.parameters())
      after.emplace_back(static_cast<const std::byte*>(p.view.data), static_cast<const std::byte*>(p.view.data) + p.view.nbytes());
    params.push_back(trainer ? after : before);
    expected.push_back(std::move(after));
  }
  const RoundScheduleBuilder builder(correspondence, plan);
  std::vector<RoundSchedule> schedules;
  for (int rank = 0; rank < deployment.world_size(); ++rank) {
    schedules.push_back(builder.build(rank));
    ASSERT_EQ(deserialize_round_schedule(serialize_round_schedule(schedules.back())), schedules.back());
  }
  ::wb::testing_support::replay_schedules(schedules, params);
  for (int rank = deployment.trainer.world_size(); rank < deployment.world_size(); ++rank)
    for (std::size_t p = 0; p < params[static_cast<std::size_t>(rank)].size(); ++p)
      ASSERT_TRUE(params[static_cast<std::size_t>(rank)][p] == expected[static_cast<std::size_t>(rank)][p])
          << "rank " << rank << " parameter " << d.maps[static_cast<std::size_t>(rank)].parameters[p].name;
}

TEST_P(PlannerOnPreset, FullScalePlanIsExactBalancedWithinBudgetAndNearTheLowerBound) {
  const DeploymentUnderTest d = describe(GetParam(), ModelScale::kFull);
  const Deployment& deployment = d.instance.deployment;
  const Correspondence correspondence = build_correspondence(d.tensors, d.maps, d.sides);
  const Topology topology = Topology::uniform(deployment.world_size(), deployment.gpus_per_node, 400e9, 900e9);
  const PlanOptions options;
  const TransferPlan plan = plan_transfer(correspondence, topology, options);
  expect_exact_traffic(correspondence, plan);

  // Balance: the busiest trainer within 5 % of the best any plan can do (plus one piece), and the
  // rollout nodes' forwarding within 5 % of their mean, for nodes that need the same bytes.
  std::int64_t busiest_trainer = 0;
  for (std::size_t w = 0; w < d.sides.size(); ++w)
    if (d.sides[w] == Side::kTrainer) busiest_trainer = std::max(busiest_trainer, plan.worker_send_bytes[w]);
  EXPECT_LE(static_cast<double>(busiest_trainer),
            1.05 * static_cast<double>(::wb::testing_support::trainer_balance_bound(correspondence)) +
                static_cast<double>(::wb::testing_support::balancing_unit_bytes(correspondence, options)));
  std::int64_t egress_sum = 0, egress_max = 0;
  for (const auto& node : plan.bound.rollout_nodes) {
    egress_sum += plan.node_egress_bytes[static_cast<std::size_t>(node.node)];
    egress_max = std::max(egress_max, plan.node_egress_bytes[static_cast<std::size_t>(node.node)]);
  }
  const double egress_mean = static_cast<double>(egress_sum) / static_cast<double>(plan.bound.rollout_nodes.size());
  EXPECT_LE(static_cast<double>(egress_max), 1.05 * egress_mean + 1.0);
  // Rounds: within budget, and about equal.
  for (int w = 0; w < deployment.world_size(); ++w)
    EXPECT_LE(plan.worker_buffer_bytes(w), options.buffer_bytes_per_worker) << "worker " << w;
  std::int64_t round_max = 0, round_sum = 0;
  for (std::int64_t bytes : plan.round_bytes) round_max = std::max(round_max, bytes), round_sum += bytes;
  EXPECT_LE(static_cast<double>(round_max), 1.10 * static_cast<double>(round_sum) / plan.rounds);

  const SimulationResult simulated = simulate(traffic_of(correspondence, plan), topology);
  EXPECT_LE(simulated.ewtt_seconds, 1.10 * plan.bound.t_min_seconds);
  EXPECT_GE(simulated.ewtt_seconds, plan.bound.t_min_seconds);
}

INSTANTIATE_TEST_SUITE_P(Presets, PlannerOnPreset, testing_support::preset_names(), testing_support::preset_test_name);

}  // namespace
}  // namespace wb::emu
