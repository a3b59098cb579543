// The measured-against-planned network check of wb-replay and wb-bench (emu/reports/network_report.hpp) on
// canned runs: it passes exactly when the bytes between machines are the plan's, and names what differs.
#include <gtest/gtest.h>

#include "emu/reports/network_report.hpp"

namespace wb::emu {
namespace {

// Three nodes, one per machine: trainers (ranks 0, 1) on A, rollout node 1 (ranks 2, 3) on B, rollout
// node 2 (ranks 4, 5) on C. M = 100 bytes; each rollout node needs all of it: 50 from the trainers and
// 50 forwarded by the other rollout node.
TransferSummary planned() {
  TransferSummary s;
  s.model_bytes = 100;
  s.node_of_worker = {0, 0, 1, 1, 2, 2};
  s.node_ingress_bytes = {0, 100, 100};
  s.node_egress_bytes = {100, 50, 50};
  s.node_need_bytes = {0, 100, 100};
  return s;
}

const std::vector<std::string> kMachines = {"A:boot", "A:boot", "B:boot", "B:boot", "C:boot", "C:boot"};

// Two updates of the plan: trainer 0 -> rank 2, trainer 1 -> rank 4; rank 2 -> 4 and 4 -> 2 forward;
// internal copies 2 -> 3 and 4 -> 5 over cma.
std::vector<RankLink> as_planned(std::int64_t updates) {
  return {{0, 2, "libfabric", 50 * updates}, {1, 4, "libfabric", 50 * updates}, {2, 4, "libfabric", 50 * updates},
          {4, 2, "libfabric", 50 * updates}, {2, 3, "cma", 100 * updates},      {4, 5, "cma", 100 * updates}};
}

TEST(NetworkReport, MeasuredEqualsPlannedPasses) {
  const NetworkReport r = network_report(planned(), kMachines, as_planned(2), 2);
  EXPECT_TRUE(r.failures.empty()) << r.failures.front();
  EXPECT_EQ(r.json["matches_plan"], true);
  EXPECT_EQ(r.json["nodes_are_machines"], true);
  EXPECT_EQ(r.json["between_machines_bytes_by_transport"]["libfabric"], 200);
  EXPECT_EQ(r.json["within_machine_bytes_by_transport"]["cma"], 200);
  ASSERT_EQ(r.json["hosts"].size(), 3u);
  EXPECT_EQ(r.json["hosts"][1]["host"], "B");
  EXPECT_EQ(r.json["hosts"][1]["network_in_bytes"], 100);
  EXPECT_EQ(r.json["hosts"][1]["network_out_bytes"], 50);
  EXPECT_EQ(r.table.size(), 4u);
}

TEST(NetworkReport, ABytesDifferenceIsNamed) {
  std::vector<RankLink> links = as_planned(2);
  links[2].bytes += 1;  // one byte too many from node 1 to node 2
  const NetworkReport r = network_report(planned(), kMachines, links, 2);
  EXPECT_EQ(r.json["matches_plan"], false);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures.front().find("node 1 (B): measured network egress 101 bytes over 2 updates, planned 50"),
            std::string::npos)
      << r.failures.front();
}

TEST(NetworkReport, TrainerEgressMustBeTheModel) {
  TransferSummary s = planned();
  s.model_bytes = 90;  // the plan's M disagrees with what the trainers sent
  const NetworkReport r = network_report(s, kMachines, as_planned(1), 1);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures.back().find("M = 90"), std::string::npos) << r.failures.back();
}

TEST(NetworkReport, SameMachineTransportBetweenMachinesFails) {
  std::vector<RankLink> links = as_planned(1);
  links[0].transport = "cma";
  const NetworkReport r = network_report(planned(), kMachines, links, 1);
  ASSERT_FALSE(r.failures.empty());
  EXPECT_NE(r.failures.front().find("went over cma, a same-machine transport, between machines"), std::string::npos)
      << r.failures.front();
}

TEST(NetworkReport, LogicalNodesOnOneMachineAreNotCompared) {
  // The whole run on one machine: nothing crossed a network, and the plan's inter-node bytes are not
  // held against it.
  const std::vector<std::string> one(6, "A:boot");
  const NetworkReport r = network_report(planned(), one, as_planned(1), 1);
  EXPECT_TRUE(r.failures.empty());
  EXPECT_EQ(r.json["nodes_are_machines"], false);
  EXPECT_TRUE(r.json["matches_plan"].is_null());
  EXPECT_TRUE(r.json["between_machines_bytes_by_transport"].empty());
}

}  // namespace
}  // namespace wb::emu
