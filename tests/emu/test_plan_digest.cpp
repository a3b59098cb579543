// Plans pinned: the digest of every rank's serialized round schedule for a few deployments at tiny scale,
// with the planner choosing the exchange (so the candidates it simulates and the one it keeps count too).
// A change meant to make planning faster must leave these equal; a digest that moves means the plans did.
//
// When a plan change is intended (a better balance, another exchange shape): check the new plans first
// (ctest -L plan, the PlannerOnPreset and PlannerOnReplicas tests, wb-plan's simulated EWTT), then run
//   build/tests/wb_emu_tests --gtest_filter='PlanDigest.*'
// and copy the digests it prints as "now" into kPinned below, saying in the commit why the plans changed.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>

#include "emu/frameworks/described_map.hpp"
#include "emu/models/model.hpp"
#include "emu/models/presets.hpp"
#include "plan/planned_schedules.hpp"
#include "plan/round_schedule.hpp"

namespace wb::emu {
namespace {

struct Pinned {
  const char* name;
  std::uint64_t digest;
};

// Computed with the planner of commit c13bc54 (before the planning-speed work of issue 30), then with the
// deeper pipeline where rounds leave room in the buffer (assign_rounds.cpp, deepen_pipeline: the same
// rounds and segments, more slots in flight; the last three tiny plans changed, kimi-k2's did not, nor did
// any full-scale preset's). At full scale `wb-plan --preset kimi-k2` printed "schedule digest
// f413a208e136adc3" with it (its default settings).
constexpr Pinned kPinned[] = {
    {"kimi-k2", 0xc5cb9c8a79fc9e3cull},
    {"qwen3-30b-a3b", 0x3018121abf8f5f6bull},
    {"qwen3-235b-a22b", 0x77161ba86d02d7c3ull},
    {"replicas-6", 0x4d2269e77f6a83a8ull},
};

std::uint64_t pinned(const std::string& name) {
  for (const Pinned& p : kPinned)
    if (name == p.name) return p.digest;
  ADD_FAILURE() << "no pinned digest for " << name;
  return 0;
}

std::string hex(std::uint64_t digest) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llxull", static_cast<unsigned long long>(digest));
  return text;
}

// Several rounds at tiny scale (a small buffer and pieces), the planner's own choice of exchange.
PlanOptions tiny_options() {
  PlanOptions options;
  options.buffer_bytes_per_worker = 256 << 10;
  options.piece_bytes = 1 << 10;
  return options;
}

void expect_pinned(const std::string& name, const PresetInstance& instance) {
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  DescribedDeployment described = describe_deployment(instance.model, instance.deployment, tensors);
  const Deployment& deployment = instance.deployment;
  const Topology topology = Topology::uniform(deployment.world_size(), deployment.gpus_per_node, 400e9, 900e9);
  const PlannedSchedules planned =
      plan_round_schedules(tensors, std::move(described.maps), std::move(described.sides), topology, tiny_options());
  ASSERT_GT(planned.plan.rounds, 1) << name;
  const std::uint64_t now = round_schedules_digest(planned.schedules);
  std::printf("plan digest %-16s now %s (%d rounds, %s)\n", name.c_str(), hex(now).c_str(), planned.plan.rounds,
              planned.plan.exchange.c_str());
  EXPECT_EQ(hex(now), hex(pinned(name))) << name << ": the plans changed (see the top of this file)";
}

TEST(PlanDigest, PresetsAtTinyScale) {
  for (const char* preset : {"kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b"})
    expect_pinned(preset, instantiate_preset(find_preset(preset), ModelScale::kTiny));
}

TEST(PlanDigest, ReplicasAlongRelayTrees) {
  // The paper's Figure 12 at six one-node replicas: the planner tries relay trees of several fan-outs.
  PresetInstance instance;
  instance.model = load_named_model_config("qwen3-30b-a3b");
  ScaleOptions tiny;
  tiny.num_layers = 2;
  instance.model = scale_model(instance.model, tiny);
  instance.deployment.trainer = TrainerSpec::parse("tp=4,ep=8,dp=2");
  instance.deployment.rollout = RolloutSpec::parse("engines=6,tp=8,ep=8");
  instance.deployment.gpus_per_node = 8;
  expect_pinned("replicas-6", instance);
}

}  // namespace
}  // namespace wb::emu
