// The settings are the one source of defaults and ranges: every numeric setting of the library declares its
// range (so --help shows it and a bad WB_* value is refused where it is read), and the option structs built
// in code start from the settings' declared defaults instead of numbers of their own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "coord/connection.hpp"
#include "core/settings.hpp"
#include "exec/round_executor.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"

namespace wb {
namespace {

double declared_default(const char* name) {
  const SettingBase* setting = find_setting(name);
  EXPECT_NE(setting, nullptr) << name;
  return setting == nullptr ? 0 : std::stod(setting->default_text());
}

TEST(SettingDefaults, EveryNumericSettingDeclaresItsRange) {
  int numeric = 0;
  for (const SettingBase* setting : all_settings()) {
    if (setting->name().starts_with("test_")) continue;  // the unit tests' own, some deliberately unranged
    if (setting->type_name() != "int" && setting->type_name() != "float") continue;
    ++numeric;
    EXPECT_FALSE(setting->range_text().empty()) << setting->name() << " (" << setting->environment_variable()
                                                << ") declares no range";
  }
  EXPECT_GT(numeric, 20) << "the library's settings are not all registered";
}

TEST(SettingDefaults, OptionStructsStartFromTheDeclaredDefaults) {
  const PlanOptions plan;
  EXPECT_EQ(plan.buffer_bytes_per_worker, static_cast<std::int64_t>(declared_default("buffer_mib")) << 20);
  EXPECT_EQ(plan.pipeline_depth, declared_default("pipeline_depth"));
  EXPECT_EQ(plan.relay_fan_out, declared_default("relay_fan_out"));
  EXPECT_EQ(TransferPlan{}.pipeline_depth, plan.pipeline_depth);
  EXPECT_EQ(RoundSchedule{}.pipeline_depth, plan.pipeline_depth);
  EXPECT_EQ(TrafficSchedule{}.pipeline_depth, plan.pipeline_depth);
  EXPECT_EQ(BaselineTrafficOptions{}.pipeline_depth, plan.pipeline_depth);

  const NetworkSettings network;
  EXPECT_EQ(network.node_bandwidth, declared_default("node_gbps") * 1e9);
  EXPECT_EQ(network.intra_node_bandwidth, declared_default("intra_gbps") * 1e9);
  EXPECT_DOUBLE_EQ(network.message_latency, declared_default("message_us") * 1e-6);
  const Topology topology;
  EXPECT_EQ(topology.node_bandwidth, network.node_bandwidth);
  EXPECT_EQ(topology.intra_node_bandwidth, network.intra_node_bandwidth);
  EXPECT_EQ(topology.message_latency, network.message_latency);

  EXPECT_EQ(ExecutorOptions{}.timeout_seconds, declared_default("timeout_seconds"));
  EXPECT_EQ(ExecutorOptions{}.verify, find_setting("verify")->default_text() == "true");
  EXPECT_EQ(ExecutorOptions{}.trace, find_setting("timeline")->default_text() == "true");
  EXPECT_EQ(coord::ResolvedOptions{}.timeout_seconds, declared_default("timeout_seconds"));
  EXPECT_EQ(coord::ResolvedOptions{}.pipeline_depth, plan.pipeline_depth);
}

TEST(SettingDefaults, UnsetSettingsGiveTheDefaultsOfCode) {
  // Nobody sets the planner's settings in the unit tests: reading them gives what code starts from.
  const PlanOptions read = plan_options_from_settings();
  const PlanOptions built;
  EXPECT_EQ(read.buffer_bytes_per_worker, built.buffer_bytes_per_worker);
  EXPECT_EQ(read.pipeline_depth, built.pipeline_depth);
  EXPECT_EQ(read.relay_fan_out, built.relay_fan_out);
  EXPECT_EQ(network_from_settings().node_bandwidth, NetworkSettings{}.node_bandwidth);
  EXPECT_EQ(comm::timeout_setting(), ExecutorOptions{}.timeout_seconds);
}

}  // namespace
}  // namespace wb
