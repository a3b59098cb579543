// The planner's invariants on random layouts, all-to-all and relayed: exact coverage (every rollout
// parameter equals what its own source map gives, padding untouched, every region filled once, relays
// forwarding only what arrived the round before), one copy out, one copy in per node, no node sending more
// than it receives beyond rounding, balance against a lower bound of the best possible, the buffer budget;
// for relays, bounded fan-out per node and round and schedules that do not grow with the replica count.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "../support/plan_checks.hpp"
#include "../support/schedule_replay.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"
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
// parameters are sometimes transposed and sometimes padded with a leading row. Up to `max_rollout_nodes`
// rollout nodes (many engines: many replicas).
Layout random_layout(unsigned seed, int max_rollout_nodes = 3) {
  std::mt19937 rng(seed);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int per_node = std::vector<int>{1, 2, 4}[static_cast<std::size_t>(pick(0, max_rollout_nodes > 3 ? 1 : 2))];
  const int trainers = per_node * pick(1, 3);
  const int rollouts = per_node * pick(1, max_rollout_nodes);
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

// How far rounding pieces to relay trees (or all-to-all origins) can push a node's egress past its ingress:
// in every group of nodes that need the same atoms and include `node`, two pieces per child it has there
// (fan_out in a relay tree; every other node of the group as an all-to-all origin): one for rounding, one
// for keeping a piece on its predecessor's route.
std::int64_t rounding_slack(const Correspondence& correspondence, const Topology& topology, int node, int fan_out,
                            std::int64_t piece) {
  std::set<std::set<int>> groups;
  for (const Atom& atom : correspondence.atoms) {
    std::set<int> nodes;
    for (const AtomEndpoint& n : atom.needers) nodes.insert(topology.node_of_worker[static_cast<std::size_t>(n.worker)]);
    if (nodes.size() > 1 && nodes.count(node)) groups.insert(nodes);
  }
  std::int64_t slack = 0;
  for (const auto& group : groups) {
    const auto others = static_cast<std::int64_t>(group.size()) - 1;
    slack += (fan_out >= 1 ? std::min<std::int64_t>(fan_out, others) : others) * 2 * piece;
  }
  return slack;
}

// What check_plan measured of a plan, for the tests that compare plans.
struct PlanStats {
  std::int64_t relay_bytes = 0;           // forwarded by relays (lag 1 writes)
  std::size_t most_entries = 0;           // schedule entries of the busiest rollout worker
  int most_destination_nodes = 0;         // other rollout nodes one node writes to in one round
  int most_source_nodes = 0;              // other rollout nodes one node hears from in one round
  std::size_t most_batches = 0;           // (peer, stage, lag) batches one rank posts in one round
  int height = 1;                         // deepest relay tree used
};

PlanStats check_plan(const Layout& layout, const PlanOptions& options, const std::string& context) {
  SCOPED_TRACE(context);
  PlanStats stats;
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
  // A node forwards what it received, not more: every relay tree carries an equal share, and a node has at
  // most as many children over a group's trees as there are trees (all-to-all: an origin's share is 1/k of
  // the group's, sent to k - 1 others); rounding pieces to trees leaves at most two pieces per child.
  const std::int64_t largest_piece = balancing_unit_bytes(correspondence, options);
  for (const auto& node : plan.bound.rollout_nodes) {
    const auto v = static_cast<std::size_t>(node.node);
    EXPECT_LE(plan.node_egress_bytes[v],
              plan.node_ingress_bytes[v] + rounding_slack(correspondence, layout.topology, node.node, options.relay_fan_out, largest_piece))
        << "node " << node.node;
  }
  for (const Segment& segment : plan.segments)
    if (segment.relay != Segment::kAllToAll) stats.height = std::max(stats.height, plan.relay_trees[segment.relay].height);
  // Balance: within 5 % of the best possible, give or take one piece of the largest atom.
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
    EXPECT_EQ(deserialize_round_schedule(serialize_round_schedule(schedules.back())), schedules.back());
  }
  const auto node_of = [&](int worker) { return layout.topology.node_of_worker[static_cast<std::size_t>(worker)]; };
  for (std::size_t r = 0; r < static_cast<std::size_t>(plan.rounds); ++r) {
    // Per rollout node: the other nodes it writes to and hears from in the external exchange.
    std::map<int, std::set<int>> destinations, sources;
    for (const RoundSchedule& s : schedules) {
      const RoundPlan& round = s.rounds[r];
      std::int64_t packed = 0, arriving = 0;
      for (const BufferCopy& p : round.pack) packed += p.bytes();
      for (const Arrival& a : round.arrivals) arriving += a.bytes;
      EXPECT_LE(packed, s.send_slot_bytes);
      EXPECT_LE(arriving, s.receive_slot_bytes);
      std::set<std::tuple<int, Stage, int>> batches;
      for (const Write& w : round.writes) {
        batches.emplace(w.peer, w.stage, w.lag);
        if (w.stage == Stage::kExternalExchange) destinations[node_of(s.rank)].insert(node_of(w.peer));
      }
      for (const Arrival& a : round.arrivals)
        if (a.stage == Stage::kExternalExchange) sources[node_of(s.rank)].insert(node_of(a.peer));
      stats.most_batches = std::max(stats.most_batches, batches.size());
    }
    for (const auto& [node, set] : destinations) stats.most_destination_nodes = std::max(stats.most_destination_nodes, static_cast<int>(set.size()));
    for (const auto& [node, set] : sources) stats.most_source_nodes = std::max(stats.most_source_nodes, static_cast<int>(set.size()));
  }
  for (const RoundSchedule& s : schedules) {
    if (s.side != Side::kRollout) continue;
    std::size_t entries = 0;
    for (const RoundPlan& round : s.rounds) entries += round.pack.size() + round.writes.size() + round.arrivals.size() + round.assemble.size();
    stats.most_entries = std::max(stats.most_entries, entries);
  }
  stats.relay_bytes = replay_schedules(schedules, params).relay_bytes;
  if (::testing::Test::HasFatalFailure()) return stats;
  for (std::size_t w = 0; w < workers; ++w) {
    if (layout.sides[w] != Side::kRollout) continue;
    for (std::size_t p = 0; p < params[w].size(); ++p)
      EXPECT_TRUE(params[w][p] == expected[w][p]) << "rollout worker " << w << " parameter " << p << " differs";
  }
  return stats;
}

TEST(Planner, RandomManyReplicaLayoutsAreExactWithEveryExchangeShape) {
  // Up to 10 rollout nodes; relay trees of fan-out 1 (chains: the deepest lags), 2 and 3, all-to-all, and
  // the planner's own choice. Depth 2 and 3: a relay's slot must survive until it has forwarded.
  std::int64_t relayed = 0;
  for (unsigned seed = 1; seed <= 60; ++seed) {
    for (int fan_out : {1, 2, 3, kRelayAllToAll, kRelayChoose}) {
      PlanOptions options;
      options.piece_bytes = 16;
      options.min_rounds = 1 + static_cast<int>(seed % 4);
      options.pipeline_depth = 2 + static_cast<int>(seed % 2);
      options.buffer_bytes_per_worker = std::int64_t{1} << (13 + seed % 6);
      options.relay_fan_out = fan_out;
      const PlanStats stats = check_plan(random_layout(seed, 10), options, "seed " + std::to_string(seed) + " fan-out " + std::to_string(fan_out));
      if (::testing::Test::HasFatalFailure()) return;
      if (fan_out == kRelayAllToAll) {
        EXPECT_EQ(stats.relay_bytes, 0);
      }
      if (fan_out >= 1) relayed += stats.relay_bytes;
    }
  }
  EXPECT_GT(relayed, 0);  // the layouts do exercise relays
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

// Figure 8 of the paper: one trainer, two nodes of two rollout workers that each need the whole model, the
// rollout workers on the nodes `node_of_worker` says. Each rollout worker lands a quarter from the trainer and
// forwards it to its counterpart on the other node (external exchange) and to its neighbour (internal).
void expect_figure8_exchange(std::vector<int> node_of_worker, const std::string& what) {
  Layout layout;
  layout.tensors = {{"w", DType::kF32, {64, 16}}};
  for (int w = 0; w < 5; ++w) {
    SourceMap map;
    map.parameters = {{"w", DType::kF32, {64, 16}}};
    map.copies = {{0, 0, Box{{0, 0}, {64, 16}}, 0, {16, 1}}};
    layout.maps.push_back(map);
    layout.sides.push_back(w == 0 ? Side::kTrainer : Side::kRollout);
  }
  layout.topology.node_of_worker = std::move(node_of_worker);
  PlanOptions options;
  options.piece_bytes = 256;
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
  const std::int64_t model = 64 * 16 * 4;
  EXPECT_EQ(plan.worker_send_bytes[0], model) << what;
  for (int node : {1, 2}) {
    EXPECT_EQ(plan.node_ingress_bytes[static_cast<std::size_t>(node)], model) << what;
    EXPECT_EQ(plan.node_egress_bytes[static_cast<std::size_t>(node)], model / 2) << what;
  }
  for (int w = 1; w < 5; ++w) EXPECT_EQ(plan.worker_receive_bytes[static_cast<std::size_t>(w)], model) << what << ", worker " << w;
  check_plan(layout, options, what);
}

TEST(Planner, ReplicatedRolloutsSplitTheModelAndExchangeIt) { expect_figure8_exchange({0, 1, 1, 2, 2}, "figure 8"); }

TEST(Planner, RolloutNodesInterleavedWithRanksAreExchangedLikeConsecutiveOnes) {
  // Rollout workers 1 and 3 on node 1, 2 and 4 on node 2: an atom's needers, which come by worker, are then
  // not by node (atom routes sort them).
  expect_figure8_exchange({0, 1, 2, 1, 2}, "interleaved nodes");
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

// One trainer node and n one-node engines that each need the whole model, sharded over the node's workers
// (the paper's Figure 12, small): every tensor split in `per_node` along rows on both sides.
Layout replica_sweep(int replicas, int per_node, int tensors = 6) {
  Layout layout;
  for (int t = 0; t < tensors; ++t) layout.tensors.push_back({"t" + std::to_string(t), DType::kBF16, {64 + 8 * t, 32}});
  for (int w = 0; w < per_node * (replicas + 1); ++w) {
    SourceMap map;
    const int shard = w % per_node;
    for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
      const Shape& shape = layout.tensors[t].shape;
      const std::int64_t rows = shape[0] / per_node;
      map.parameters.push_back({"p" + std::to_string(t), DType::kBF16, {rows, shape[1]}});
      map.copies.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(t), Box{{rows * shard, 0}, {rows, shape[1]}}, 0,
                            {shape[1], 1}});
    }
    layout.maps.push_back(std::move(map));
    layout.sides.push_back(w < per_node ? Side::kTrainer : Side::kRollout);
  }
  layout.topology = Topology::uniform(per_node * (replicas + 1), per_node, 100.0, 400.0);
  return layout;
}

TEST(Planner, RelaysKeepFanOutAndSchedulesBoundedWhateverTheReplicaCount) {
  for (int fan_out : {2, 3}) {
    std::size_t entries_at_smallest = 0;
    for (int replicas : {8, 16, 32}) {
      PlanOptions options;
      options.piece_bytes = 512;
      options.relay_fan_out = fan_out;
      const std::string context = std::to_string(replicas) + " replicas, fan-out " + std::to_string(fan_out);
      const PlanStats stats = check_plan(replica_sweep(replicas, 2), options, context);
      if (::testing::Test::HasFatalFailure()) return;
      SCOPED_TRACE(context);
      EXPECT_GT(stats.relay_bytes, 0);
      // One group of nodes: per round a node writes to at most fan_out others and hears from at most one
      // parent per tree.
      EXPECT_LE(stats.most_destination_nodes, fan_out);
      EXPECT_LE(stats.most_source_nodes, fan_out);
      // Batches per rank and round: its relay children (at most fan_out, lag 0 and 1), its node's other
      // worker, and nothing that grows with the replicas.
      EXPECT_LE(stats.most_batches, static_cast<std::size_t>(2 * fan_out + 1));
      // Depth about log_F(n), not n.
      EXPECT_LE(stats.height, static_cast<int>(std::ceil(std::log(replicas) / std::log(fan_out))) + 2);
      // A rollout worker's schedule does not grow with the replicas (it forwards to a bounded set, and
      // the rounds do not multiply).
      if (entries_at_smallest == 0) entries_at_smallest = stats.most_entries;
      EXPECT_LE(stats.most_entries, entries_at_smallest * 5 / 4 + 64) << "entries of the busiest rollout worker";
    }
  }
}

TEST(Planner, AllToAllWritesToEveryOtherReplicaEachRound) {
  // The contrast the relays remove: all-to-all fan-out is the replica count.
  PlanOptions options;
  options.piece_bytes = 512;
  options.relay_fan_out = kRelayAllToAll;
  const PlanStats stats = check_plan(replica_sweep(8, 2), options, "all-to-all");
  EXPECT_EQ(stats.relay_bytes, 0);
  EXPECT_EQ(stats.most_destination_nodes, 7);
}

TEST(Planner, ASenderWritesToOneOriginPerRoundWhereItsShardLandsOnOneColumn) {
  // Trainer worker w holds the shard that worker w of every rollout node needs, and the relay trees are one
  // per column: every write costs link time, so a sender should write to one origin in a round rather than
  // spread its share over all rounds and origins, while every round still carries its share of each.
  PlanOptions options;
  options.piece_bytes = 512;
  options.relay_fan_out = 8;
  const Layout layout = replica_sweep(20, 8, 32);
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
  std::map<std::pair<std::uint32_t, int>, std::set<int>> origins;  // (round, sender) -> origin landers
  std::map<std::pair<std::uint32_t, int>, std::int64_t> bytes;      // (round, sender) -> bytes
  std::map<int, std::int64_t> sender_total;
  for (const Segment& segment : plan.segments) {
    const Atom& atom = correspondence.atoms[segment.atom];
    const int sender = atom.holders[segment.sender].worker;
    origins[{segment.round, sender}].insert(atom.needers[plan.landers_of(segment)[segment.origin]].worker);
    const std::int64_t b = segment.box.numel() * 2;
    bytes[{segment.round, sender}] += b;
    sender_total[sender] += b;
  }
  std::size_t writes = 0;
  for (const auto& [key, set] : origins) writes += set.size();
  EXPECT_LE(static_cast<double>(writes), 1.25 * static_cast<double>(origins.size())) << "origins per sender and round";
  const int trainer_rounds = plan.rounds - (plan.relay_trees.empty() ? 0 : plan.relay_trees.front().height - 1);
  ASSERT_GE(trainer_rounds, options.min_rounds);
  for (const auto& [key, b] : bytes)
    EXPECT_LE(static_cast<double>(b), 1.3 * static_cast<double>(sender_total[key.second]) / trainer_rounds)
        << "sender " << key.second << " round " << key.first;
}

TEST(Planner, ChoosingSimulatesTheShapesAndKeepsTheFastest) {
  const Layout layout = replica_sweep(12, 2);
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  PlanOptions options;
  options.piece_bytes = 512;
  const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
  ASSERT_FALSE(plan.candidates.empty());
  bool all_to_all = false, relays = false;
  int chosen = 0;
  double fastest = 1e300;
  for (const ExchangeCandidate& c : plan.candidates) {
    all_to_all = all_to_all || c.shape == "all-to-all";
    relays = relays || c.shape != "all-to-all";
    chosen += c.chosen ? 1 : 0;
    fastest = std::min(fastest, c.simulated_seconds);
  }
  EXPECT_TRUE(all_to_all);
  EXPECT_TRUE(relays);
  EXPECT_EQ(chosen, 1);
  // The plan returned is the fastest candidate, and simulating it again gives its time.
  for (const ExchangeCandidate& c : plan.candidates)
    if (c.chosen) {
      EXPECT_EQ(c.simulated_seconds, fastest);
      EXPECT_EQ(c.shape, plan.exchange);
      EXPECT_EQ(c.rounds, plan.rounds);
    }
  EXPECT_DOUBLE_EQ(simulate(traffic_of(correspondence, plan), layout.topology).ewtt_seconds, fastest);
}

TEST(Planner, ADeploymentThatWouldNotFitIsRefusedBeforePlanning) {
  const Layout layout = replica_sweep(16, 2);
  const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
  PlanOptions options;
  options.piece_bytes = 512;
  const std::int64_t estimate = estimate_plan_memory(correspondence, layout.topology, options);
  EXPECT_GT(estimate, 0);
  options.memory_limit_bytes = estimate / 2;
  try {
    plan_transfer(correspondence, layout.topology, options);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("would take about " + std::to_string((estimate + (1 << 20) - 1) >> 20) + " MiB"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("limit of " + std::to_string((estimate / 2 + (1 << 20) - 1) >> 20) + " MiB"));
  }
  options.memory_limit_bytes = estimate;
  EXPECT_NO_THROW(plan_transfer(correspondence, layout.topology, options));
}

TEST(Planner, MemoryEstimateGrowsAboutLinearlyWithReplicas) {
  // Pieces do not shrink as replicas are added, so the planner's structures grow with the workers, not
  // with their square.
  PlanOptions options;
  const auto estimate = [&](int replicas) {
    const Layout layout = replica_sweep(replicas, 2);
    return estimate_plan_memory(build_correspondence(layout.tensors, layout.maps, layout.sides), layout.topology, options);
  };
  const std::int64_t at16 = estimate(16), at64 = estimate(64);
  EXPECT_LE(at64, 5 * at16);
}

}  // namespace
}  // namespace wb
