// The planner's invariants on random layouts: exact coverage (every rollout parameter equals what its own
// source map gives, padding untouched, every region filled once), one copy out, one copy in per node,
// balance against a lower bound of the best possible, and the buffer budget.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "../support/plan_checks.hpp"
#include "../support/schedule_replay.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using namespace testing_support;

struct Layout {
  std::vector<TensorInfo> tensors;
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
  Topology topology;
};

// Each side shards every tensor along a random axis into a random number of pieces; trainer workers
// hold shard w % shards (replicas for the rest), rollout engines do the same inside each engine. Rollout
// parameters are sometimes transposed and sometimes padded with a leading row.
Layout random_layout(unsigned seed) {
  std::mt19937 rng(seed);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int per_node = std::vector<int>{1, 2, 4}[static_cast<std::size_t>(pick(0, 2))];
  const int trainers = per_node * pick(1, 3);
  const int rollouts = per_node * pick(1, 3);
  Layout layout;
  const int tensor_count = pick(2, 6);
  for (int t = 0; t < tensor_count; ++t) {
    const DType dtype = std::vector<DType>{DType::kBF16, DType::kF32, DType::kF8E4M3}[static_cast<std::size_t>(pick(0, 2))];
    Shape shape = pick(0, 3) == 0 ? Shape{pick(4, 80)} : Shape{pick(2, 40), pick(2, 40)};
    layout.tensors.push_back({"t" + std::to_string(t), dtype, shape});
  }
  std::vector<int> divisors;
  for (int d = 1; d <= rollouts; ++d)
    if (rollouts % d == 0) divisors.push_back(d);
  const int engines = divisors[static_cast<std::size_t>(pick(0, static_cast<int>(divisors.size()) - 1))];
  const int engine_size = rollouts / engines;
  const auto shard_box = [](const Shape& shape, int axis, int shards, int shard) {
    Box box = Box::whole(shape);
    const std::int64_t extent = shape[static_cast<std::size_t>(axis)];
    box.offset[static_cast<std::size_t>(axis)] = extent * shard / shards;
    box.extent[static_cast<std::size_t>(axis)] = extent * (shard + 1) / shards - extent * shard / shards;
    return box;
  };
  std::vector<std::pair<int, int>> trainer_sharding, rollout_sharding;  // (axis, shards) per tensor
  for (const TensorInfo& t : layout.tensors) {
    const int ndim = static_cast<int>(t.shape.size());
    const int ta = pick(0, ndim - 1), ra = pick(0, ndim - 1);
    trainer_sharding.emplace_back(ta, std::min<int>(pick(1, trainers), static_cast<int>(t.shape[static_cast<std::size_t>(ta)])));
    rollout_sharding.emplace_back(ra, std::min<int>(pick(1, engine_size), static_cast<int>(t.shape[static_cast<std::size_t>(ra)])));
  }
  for (int w = 0; w < trainers + rollouts; ++w) {
    const bool trainer = w < trainers;
    SourceMap map;
    for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
      const auto [axis, shards] = trainer ? trainer_sharding[t] : rollout_sharding[t];
      const int index = trainer ? w % shards : ((w - trainers) % engine_size) % shards;
      const Box box = shard_box(layout.tensors[t].shape, axis, shards, index);
      const bool transpose = !trainer && box.ndim() == 2 && pick(0, 2) == 0;
      const bool pad = !trainer && pick(0, 2) == 0;
      Shape shape = box.extent;
      if (transpose) std::swap(shape[0], shape[1]);
      const std::int64_t row = shape.size() == 2 ? shape[1] : 1;
      if (pad) shape[0] += 1;
      Shape strides = box.ndim() == 2 ? (transpose ? Shape{1, shape[1]} : Shape{shape[1], 1}) : Shape{1};
      map.parameters.push_back({"p" + std::to_string(t), layout.tensors[t].dtype, shape});
      map.copies.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(t), box, pad ? row : 0, strides});
    }
    layout.maps.push_back(std::move(map));
    layout.sides.push_back(trainer ? Side::kTrainer : Side::kRollout);
  }
  layout.topology = Topology::uniform(trainers + rollouts, per_node, 100.0, 400.0);
  return layout;
}

void check_plan(const Layout& layout, const PlanOptions& options, const std::string& context) {
  SCOPED_TRACE(context);
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
  const std::size_t workers = layout.sides.size();

  // One copy out: the trainers send M bytes in all.
  std::int64_t trainer_egress = 0, largest_trainer = 0;
  for (std::size_t w = 0; w < workers; ++w)
    if (layout.sides[w] == Side::kTrainer) {
      trainer_egress += plan.worker_send_bytes[w];
      largest_trainer = std::max(largest_trainer, plan.worker_send_bytes[w]);
    }
  EXPECT_EQ(trainer_egress, plan.bound.model_bytes);
  // One copy in per node: every rollout node receives exactly M_v over the inter-node network.
  for (const auto& node : plan.bound.rollout_nodes)
    EXPECT_EQ(plan.node_ingress_bytes[static_cast<std::size_t>(node.node)], node.need_bytes) << "node " << node.node;
  for (int node : plan.bound.trainer_nodes) EXPECT_EQ(plan.node_ingress_bytes[static_cast<std::size_t>(node)], 0);
  // Balance: within 5 % of the best possible, give or take one piece of the largest atom.
  const std::int64_t largest_piece = balancing_unit_bytes(correspondence, options);
  EXPECT_LE(static_cast<double>(largest_trainer),
            1.05 * static_cast<double>(trainer_balance_bound(correspondence)) + static_cast<double>(largest_piece));
  // Budget.
  for (std::size_t w = 0; w < workers; ++w)
    EXPECT_LE(plan.worker_buffer_bytes(static_cast<int>(w)), options.buffer_bytes_per_worker) << "worker " << w;

  // Exactness, by playing every schedule.
  const std::vector<Bytes> checkpoint = random_checkpoint(layout.tensors, 7);
  std::vector<std::vector<Bytes>> params, expected;
  for (std::size_t w = 0; w < workers; ++w) {
    const bool trainer = layout.sides[w] == Side::kTrainer;
    params.push_back(trainer ? load_parameters(layout.maps[w], layout.tensors, checkpoint, std::byte{0})
                             : load_parameters(SourceMap{layout.maps[w].parameters, {}}, layout.tensors, checkpoint, std::byte{0xEE}));
    expected.push_back(load_parameters(layout.maps[w], layout.tensors, checkpoint, trainer ? std::byte{0} : std::byte{0xEE}));
  }
  const RoundScheduleBuilder builder(correspondence, plan);
  std::vector<RoundSchedule> schedules;
  for (std::size_t w = 0; w < workers; ++w) {
    schedules.push_back(builder.build(static_cast<int>(w)));
    ASSERT_EQ(deserialize_round_schedule(serialize_round_schedule(schedules.back())), schedules.back());
  }
  for (const RoundSchedule& s : schedules)
    for (const RoundPlan& round : s.rounds) {
      std::int64_t packed = 0, arriving = 0;
      for (const BufferCopy& p : round.pack) packed += p.bytes();
      for (const Arrival& a : round.arrivals) arriving += a.bytes;
      EXPECT_LE(packed, s.send_slot_bytes);
      EXPECT_LE(arriving, s.receive_slot_bytes);
    }
  replay_schedules(schedules, params);
  for (std::size_t w = 0; w < workers; ++w) {
    if (layout.sides[w] != Side::kRollout) continue;
    for (std::size_t p = 0; p < params[w].size(); ++p)
      ASSERT_TRUE(params[w][p] == expected[w][p]) << "rollout worker " << w << " parameter " << p << " differs";
  }
}

TEST(Planner, RandomLayoutsAreExactOneCopyOutOneCopyInBalancedAndWithinBudget) {
  for (unsigned seed = 1; seed <= 150; ++seed) {
    PlanOptions options;
    options.piece_bytes = 16;
    options.min_rounds = 1 + static_cast<int>(seed % 4);
    options.buffer_bytes_per_worker = std::int64_t{1} << (12 + seed % 8);
    check_plan(random_layout(seed), options, "seed " + std::to_string(seed));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Planner, ReplicatedRolloutsSplitTheModelAndExchangeIt) {
  // Figure 8 of the paper: one trainer, two nodes of two rollout workers that each need the whole model.
  Layout layout;
  layout.tensors = {{"w", DType::kF32, {64, 16}}};
  for (int w = 0; w < 5; ++w) {
    SourceMap map;
    map.parameters = {{"w", DType::kF32, {64, 16}}};
    map.copies = {{0, 0, Box{{0, 0}, {64, 16}}, 0, {16, 1}}};
    layout.maps.push_back(map);
    layout.sides.push_back(w == 0 ? Side::kTrainer : Side::kRollout);
  }
  layout.topology.node_of_worker = {0, 1, 1, 2, 2};
  PlanOptions options;
  options.piece_bytes = 256;
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
  const std::int64_t model = 64 * 16 * 4;
  EXPECT_EQ(plan.worker_send_bytes[0], model);
  // Each rollout worker lands a quarter from the trainer and forwards it to its counterpart on the other
  // node (external exchange) and to its neighbour (internal exchange).
  for (int node : {1, 2}) {
    EXPECT_EQ(plan.node_ingress_bytes[static_cast<std::size_t>(node)], model);
    EXPECT_EQ(plan.node_egress_bytes[static_cast<std::size_t>(node)], model / 2);
  }
  for (int w = 1; w < 5; ++w) EXPECT_EQ(plan.worker_receive_bytes[static_cast<std::size_t>(w)], model) << w;
  check_plan(layout, options, "figure 8");
}

TEST(Planner, APieceLargerThanTheBudgetIsAClearError) {
  Layout layout;
  layout.tensors = {{"big.weight", DType::kF32, {4, 4096}}};
  for (int w = 0; w < 2; ++w) {
    SourceMap map;
    map.parameters = {{"w", DType::kF32, {4, 4096}}};
    map.copies = {{0, 0, Box{{0, 0}, {4, 4096}}, 0, {4096, 1}}};
    layout.maps.push_back(map);
    layout.sides.push_back(w == 0 ? Side::kTrainer : Side::kRollout);
  }
  layout.topology.node_of_worker = {0, 1};
  PlanOptions options;
  options.buffer_bytes_per_worker = 16 << 10;
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  try {
    plan_transfer(correspondence, layout.topology, options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("big.weight"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("buffer budget"));
  }
}

}  // namespace
}  // namespace wb
