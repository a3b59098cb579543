// Correspondence: atoms with uniform holder and needer sets, positions on both sides, and one clear
// error when a rollout needs an element no trainer holds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;

const std::vector<TensorInfo> kTensors = {{"w", DType::kBF16, {8, 4}}, {"n", DType::kBF16, {4}}};

SourceMap rows(std::int64_t first, std::int64_t count, bool with_norm) {
  SourceMap map;
  map.parameters = {{"p", DType::kBF16, {count, 4}}};
  map.copies = {{0, 0, Box{{first, 0}, {count, 4}}, 0, {4, 1}}};
  if (with_norm) {
    map.parameters.push_back({"norm", DType::kBF16, {4}});
    map.copies.push_back({1, 1, Box{{0}, {4}}, 0, {1}});
  }
  return map;
}

TEST(Correspondence, AtomsHaveUniformHoldersAndNeeders) {
  // Two trainers hold rows 0-4 and 4-8 (TP 2) and the norm; two rollouts need rows 0-6 and 2-8 (odd
  // split) and the norm.
  const Correspondence c = build_correspondence(
      kTensors, {rows(0, 4, true), rows(4, 4, true), rows(0, 6, true), rows(2, 6, true)},
      {Side::kTrainer, Side::kTrainer, Side::kRollout, Side::kRollout});
  // Rows cut at 2, 4, 6: [0:2] held by 0 needed by 2; [2:4] held by 0 needed by 2,3; [4:6] held by 1
  // needed by 2,3; [6:8] held by 1 needed by 3; plus one norm atom.
  ASSERT_EQ(c.atoms.size(), 5u);
  EXPECT_EQ(c.atoms[0].box.to_string(), "[0:2, 0:4]");
  EXPECT_EQ(c.atoms[1].needers.size(), 2u);
  EXPECT_EQ(c.atoms[4].tensor, 1u);
  EXPECT_EQ(c.atoms[4].holders.size(), 2u);
  EXPECT_EQ(c.atoms[4].needers.size(), 2u);
  // Row 5, column 1 of w sits at row 1 of trainer 1's shard and row 3 of rollout 3's.
  const Atom& atom = c.atoms[2];
  const std::int64_t index[2] = {1, 1};
  EXPECT_EQ(c.position(atom, atom.holders[0], index), 1 * 4 + 1);
  EXPECT_EQ(c.position(atom, atom.needers[1], index), 3 * 4 + 1);
  EXPECT_EQ(c.needed_elements(), 6 * 4 + 6 * 4 + 2 * 4);
}

TEST(Correspondence, AnElementNoTrainerHoldsIsAnError) {
  try {
    build_correspondence(kTensors, {rows(0, 4, true), rows(2, 6, false)}, {Side::kTrainer, Side::kRollout});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rollout worker 1 needs w[4:8, 0:4] (parameter p)"));
    EXPECT_THAT(e.what(), HasSubstr("no trainer worker holds"));
  }
}

TEST(Correspondence, ManyTensorsGiveAtomsInTensorOrderAndNameTheFirstUnheldOne) {
  // 3,000 one-row tensors, cut on the host's cores in blocks: atoms come out in tensor order; where two
  // tensors lack a holder (here 700 and 2,900), the error names the first, whichever block failed first.
  std::vector<TensorInfo> tensors;
  SourceMap trainer, rollout;
  for (std::uint32_t t = 0; t < 3000; ++t) {
    tensors.push_back({"t" + std::to_string(t), DType::kF32, {4}});
    rollout.parameters.push_back({"r" + std::to_string(t), DType::kF32, {4}});
    rollout.copies.push_back({t, t, Box{{0}, {4}}, 0, {1}});
    trainer.parameters.push_back({"h" + std::to_string(t), DType::kF32, {4}});
    trainer.copies.push_back({t, t, Box{{0}, {t == 700 || t == 2900 ? 2 : 4}}, 0, {1}});
  }
  try {
    build_correspondence(tensors, {trainer, rollout}, {Side::kTrainer, Side::kRollout});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rollout worker 1 needs t700[2:4] (parameter r700)"));
  }
  trainer.copies[700].box.extent = {4};
  trainer.copies[2900].box.extent = {4};
  const Correspondence c = build_correspondence(tensors, {trainer, rollout}, {Side::kTrainer, Side::kRollout});
  ASSERT_EQ(c.atoms.size(), 3000u);
  for (std::uint32_t t = 0; t < 3000; ++t) EXPECT_EQ(c.atoms[t].tensor, t);
}

}  // namespace
}  // namespace wb

namespace wb {
namespace {

TEST(LowerBound, ModelBytesNodeNeedsAndTMin) {
  // Trainers on node 0 hold w and the norm; rollout 2 (node 1) needs rows 0-6 and the norm, rollout 3
  // (node 2) rows 2-8 and the norm.
  const Correspondence c = build_correspondence(
      kTensors, {rows(0, 4, true), rows(4, 4, true), rows(0, 6, true), rows(2, 6, true)},
      {Side::kTrainer, Side::kTrainer, Side::kRollout, Side::kRollout});
  Topology topology = Topology::uniform(4, 2, 100.0, 1000.0);
  topology.node_of_worker = {0, 0, 1, 2};
  const LowerBound bound = lower_bound(c, topology);
  EXPECT_EQ(bound.model_bytes, (8 * 4 + 4) * 2);  // every element needed by someone, counted once
  ASSERT_EQ(bound.rollout_nodes.size(), 2u);
  EXPECT_EQ(bound.rollout_nodes[0].need_bytes, (6 * 4 + 4) * 2);
  EXPECT_EQ(bound.rollout_nodes[1].need_bytes, (6 * 4 + 4) * 2);
  EXPECT_EQ(bound.trainer_egress_bandwidth, 100.0);
  EXPECT_DOUBLE_EQ(bound.t_min_seconds, 72.0 / 100.0);  // M / B_T dominates: one trainer node
  // Both rollouts on one node: M_v is the union, not the sum.
  topology.node_of_worker = {0, 0, 1, 1};
  const LowerBound shared = lower_bound(c, topology);
  ASSERT_EQ(shared.rollout_nodes.size(), 1u);
  EXPECT_EQ(shared.rollout_nodes[0].need_bytes, 72);
  // A node with both kinds of worker is refused.
  topology.node_of_worker = {0, 1, 1, 2};
  EXPECT_THROW(lower_bound(c, topology), Error);
}

}  // namespace
}  // namespace wb
