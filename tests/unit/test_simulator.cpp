// The network simulator (fluid model, processor sharing, pipelined rounds), the paper's two baselines as
// traffic, and a hand-built WeightBridge plan as traffic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <tuple>

#include "../support/expect_error.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using wb::testing::expect_error;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// One worker per node, 100 B/s between nodes, 1000 B/s inside, no latency unless a test sets one.
Topology nodes_of_one(int workers) {
  Topology topology = Topology::uniform(workers, 1, 100.0, 1000.0);
  topology.message_latency = 0;
  return topology;
}

TrafficSchedule one_stage(std::vector<Transfer> transfers) {
  TrafficSchedule schedule;
  schedule.stage_names = {"only"};
  schedule.rounds = {{std::move(transfers)}};
  return schedule;
}

// R rounds of two stages: stage 0 moves `bytes` over (from0 -> to0), stage 1 over (from1 -> to1).
TrafficSchedule two_stages(int rounds, int depth, Transfer first, Transfer second) {
  TrafficSchedule schedule;
  schedule.stage_names = {"first", "second"};
  schedule.pipeline_depth = depth;
  for (int r = 0; r < rounds; ++r) schedule.rounds.push_back({{first}, {second}});
  return schedule;
}

TEST(Simulator, OneTransferTakesBytesOverBandwidthPlusLatency) {
  Topology topology = nodes_of_one(2);
  topology.message_latency = 0.25;
  const SimulationResult result = simulate(one_stage({{0, 1, 1000, 2}}), topology);
  EXPECT_NEAR(result.ewtt_seconds, 1000.0 / 100.0 + 2 * 0.25, 1e-9);
  ASSERT_EQ(result.stages.size(), 1u);
  EXPECT_EQ(result.stages[0].name, "only");
  EXPECT_EQ(result.stages[0].bytes, 1000);
  EXPECT_EQ(result.stages[0].busiest_link, "node 0 egress");  // ties go to the first link
  EXPECT_EQ(result.stages[0].busiest_link_bytes, 1000);
  EXPECT_NEAR(result.stages[0].seconds, 10.5, 1e-9);
  EXPECT_THAT(result.node_egress_bytes, ElementsAre(1000, 0));
  EXPECT_THAT(result.node_ingress_bytes, ElementsAre(0, 1000));
}

TEST(Simulator, IntraNodeTransfersUseWorkerLinksAndSelfTransfersAreFree) {
  Topology topology = Topology::uniform(3, 3, 100.0, 1000.0);
  topology.message_latency = 0;
  const SimulationResult result = simulate(one_stage({{0, 1, 1000, 1}, {2, 2, 1 << 30, 1}}), topology);
  EXPECT_NEAR(result.ewtt_seconds, 1.0, 1e-9);
  EXPECT_EQ(result.stages[0].bytes, 1000);
  EXPECT_EQ(result.stages[0].busiest_link, "worker 0 intra egress");
  EXPECT_THAT(result.node_egress_bytes, ElementsAre(0));
  EXPECT_THAT(result.node_ingress_bytes, ElementsAre(0));
}

TEST(Simulator, LatencyIsChargedPerMessage) {
  Topology topology = nodes_of_one(2);
  topology.message_latency = 0.01;
  EXPECT_NEAR(simulate(one_stage({{0, 1, 0, 100}}), topology).ewtt_seconds, 1.0, 1e-9);
}

TEST(Simulator, SharedIngressSerializesDisjointLinksRunInParallel) {
  const Topology topology = nodes_of_one(4);
  // Two senders into node 2: its ingress carries 2000 B.
  EXPECT_NEAR(simulate(one_stage({{0, 2, 1000, 1}, {1, 2, 1000, 1}}), topology).ewtt_seconds, 20.0, 1e-9);
  // One sender to two nodes: its egress carries 2000 B.
  EXPECT_NEAR(simulate(one_stage({{0, 1, 1000, 1}, {0, 2, 1000, 1}}), topology).ewtt_seconds, 20.0, 1e-9);
  // Disjoint pairs.
  EXPECT_NEAR(simulate(one_stage({{0, 1, 1000, 1}, {2, 3, 1000, 1}}), topology).ewtt_seconds, 10.0, 1e-9);
}

TEST(Simulator, PipelinedRoundsOverlapStages) {
  const Topology topology = nodes_of_one(4);
  const Transfer x{0, 1, 1000, 1}, y{2, 3, 1000, 1};  // 10 s each, disjoint links
  for (int rounds : {1, 2, 5, 12}) {
    SCOPED_TRACE(rounds);
    const SimulationResult pipelined = simulate(two_stages(rounds, 2, x, y), topology);
    EXPECT_NEAR(pipelined.ewtt_seconds, 10.0 * (rounds + 1), 1e-6);
    EXPECT_NEAR(pipelined.stages[0].seconds, 10.0 * rounds, 1e-6);
    EXPECT_NEAR(pipelined.stages[1].seconds, 10.0 * rounds, 1e-6);
    EXPECT_NEAR(simulate(two_stages(rounds, 1, x, y), topology).ewtt_seconds, 20.0 * rounds, 1e-6);
  }
  // Three stages need three buffers in flight to overlap fully; with two, a round waits for the one
  // two rounds back.
  TrafficSchedule three;
  three.stage_names = {"a", "b", "c"};
  for (int r = 0; r < 6; ++r) three.rounds.push_back({{x}, {y}, {{1, 2, 1000, 1}}});
  three.pipeline_depth = 3;
  EXPECT_NEAR(simulate(three, topology).ewtt_seconds, 10.0 * (6 + 2), 1e-6);
  three.pipeline_depth = 2;
  EXPECT_GT(simulate(three, topology).ewtt_seconds, 10.0 * (6 + 2) + 1);
}

TEST(Simulator, ConcurrentStagesShareALinkFairly) {
  const Topology topology = nodes_of_one(4);
  // A receive-like stage 0 -> 2 and an exchange-like stage {1, 3} -> 2 both enter node 2: after the first
  // round two tasks are always active on its ingress, so the transfer takes all of its bytes at full rate.
  const int rounds = 6;
  TrafficSchedule schedule;
  schedule.stage_names = {"receive", "exchange"};
  for (int r = 0; r < rounds; ++r) schedule.rounds.push_back({{{0, 2, 1000, 1}}, {{1, 2, 500, 1}, {3, 2, 500, 1}}});
  const SimulationResult result = simulate(schedule, topology);
  EXPECT_EQ(result.node_ingress_bytes[2], 2000 * rounds);
  EXPECT_NEAR(result.ewtt_seconds, 2000.0 * rounds / 100.0, 1e-6);
  EXPECT_EQ(result.stages[1].busiest_link, "node 2 ingress");
  EXPECT_EQ(result.stages[1].busiest_link_bytes, 1000 * rounds);
  EXPECT_EQ(result.stages[1].bytes, 1000 * rounds);
  // Without the other stage the same exchange takes half the time per round.
  for (auto& round : schedule.rounds) round[0].clear();
  EXPECT_NEAR(simulate(schedule, topology).ewtt_seconds, 1000.0 * rounds / 100.0, 1e-6);
}

TEST(Simulator, ProcessorSharingWithUnequalLoads) {
  const Topology topology = nodes_of_one(5);
  TrafficSchedule schedule;
  schedule.stage_names = {"first", "second"};
  schedule.rounds = {{{{0, 1, 1000, 1}}, {{3, 2, 1000, 1}}},  // round 0: 10 s alone, then 1000 B into node 2
                     {{{4, 2, 3000, 1}}, {}}};                 // round 1: 3000 B into node 2, then nothing
  const SimulationResult result = simulate(schedule, topology);
  // From t = 10 both tasks share node 2's ingress (each sender's egress is its own): the 1000 B end at
  // 30, when the 3000 B have received 1000; the other 2000 go alone at full rate and end at 50.
  EXPECT_NEAR(result.ewtt_seconds, 50.0, 1e-9);
  EXPECT_NEAR(result.stages[0].seconds, 10.0 + 40.0, 1e-9);
  EXPECT_NEAR(result.stages[1].seconds, 20.0 + 0.0, 1e-9);
}

TEST(Simulator, EmptySchedulesAndTasksTakeNoTime) {
  const Topology topology = nodes_of_one(2);
  TrafficSchedule none;
  none.stage_names = {"a"};
  EXPECT_EQ(simulate(none, topology).ewtt_seconds, 0.0);
  TrafficSchedule empty;
  empty.stage_names = {"a", "b"};
  empty.rounds.assign(5, std::vector<std::vector<Transfer>>(2));
  EXPECT_EQ(simulate(empty, topology).ewtt_seconds, 0.0);
  // Empty rounds between busy ones do not stall the pipeline.
  empty.rounds[4][1] = {{0, 1, 1000, 1}};
  EXPECT_NEAR(simulate(empty, topology).ewtt_seconds, 10.0, 1e-9);
}

TEST(Simulator, RejectsWorkersOutsideTheTopologyAndBadSchedules) {
  const Topology topology = nodes_of_one(2);
  expect_error([&] { simulate(one_stage({{0, 2, 10, 1}}), topology); }, ErrorCode::kInvalidArgument, {"0 -> 2"});
  EXPECT_THROW(simulate(one_stage({{-1, 0, 10, 1}}), topology), Error);
  TrafficSchedule shallow = one_stage({{0, 1, 10, 1}});
  shallow.pipeline_depth = 0;
  EXPECT_THROW(simulate(shallow, topology), Error);
  TrafficSchedule unnamed = one_stage({{0, 1, 10, 1}});
  unnamed.stage_names.clear();
  EXPECT_THROW(simulate(unnamed, topology), Error);
}

TEST(Simulator, LargeScheduleIsFast) {
  // Kimi-K2 scale: 64 nodes of 8 workers, 30 rounds of 3 stages, 50,000 transfers per task.
  const int workers = 512, rounds = 30, per_task = 50000;
  const Topology topology = Topology::uniform(workers, 8, 400e9, 900e9);
  TrafficSchedule schedule;
  schedule.stage_names = {"receive", "external exchange", "internal exchange"};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> worker(0, workers - 1);
  std::uniform_int_distribution<std::int64_t> bytes(1 << 10, 1 << 20);
  std::int64_t total = 0;
  for (int r = 0; r < rounds; ++r) {
    schedule.rounds.emplace_back(3);
    for (auto& stage : schedule.rounds.back())
      for (int t = 0; t < per_task; ++t) {
        stage.push_back({worker(rng), worker(rng), bytes(rng), 1});
        if (stage.back().from != stage.back().to) total += stage.back().bytes;
      }
  }
  const auto start = std::chrono::steady_clock::now();
  const SimulationResult result = simulate(schedule, topology);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("simulate: %d transfers in %.3f s, EWTT %.3f s\n", rounds * 3 * per_task, seconds, result.ewtt_seconds);
  EXPECT_LT(seconds, 5.0);  // well under 1 s unloaded; generous for shared CI machines
  std::int64_t counted = 0;
  for (const auto& stage : result.stages) counted += stage.bytes;
  EXPECT_EQ(counted, total);
  // No link can carry its bytes faster than its bandwidth.
  for (std::size_t node = 0; node < result.node_ingress_bytes.size(); ++node)
    EXPECT_GE(result.ewtt_seconds * (1 + 1e-9), static_cast<double>(result.node_ingress_bytes[node]) / 400e9);
}

// --- Baselines ---------------------------------------------------------------------------------------

// Rows [first, first + count) of a [rows, cols] tensor 0, plus optionally the whole tensor 1 (a norm).
SourceMap holds_rows(std::int64_t first, std::int64_t count, std::int64_t cols, bool with_norm) {
  SourceMap map;
  map.parameters = {{"p", DType::kBF16, {count, cols}}};
  map.copies = {{0, 0, Box{{first, 0}, {count, cols}}, 0, {cols, 1}}};
  if (with_norm) {
    map.parameters.push_back({"norm", DType::kBF16, {cols}});
    map.copies.push_back({1, 1, Box{{0}, {cols}}, 0, {1}});
  }
  return map;
}

struct Deployment {
  Correspondence correspondence;
  Topology topology;
  std::vector<int> engine_of_worker;
  std::int64_t model_bytes = 0;
};

// `trainer_nodes` nodes of `trainer_tp` trainers (TP over rows, every node a full replica) and
// `rollout_nodes` one-node engines of `rollout_tp` workers (TP over rows when `sharded`, else every worker
// needs the whole tensor). Every worker needs and holds the norm.
Deployment deployment(int trainer_nodes, int trainer_tp, int rollout_nodes, int rollout_tp, bool sharded,
                      std::int64_t rows, std::int64_t cols) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {rows, cols}}, {"norm", DType::kBF16, {cols}}};
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
  Deployment d;
  d.topology.message_latency = 5e-6;
  for (int n = 0; n < trainer_nodes; ++n)
    for (int k = 0; k < trainer_tp; ++k) {
      maps.push_back(holds_rows(rows * k / trainer_tp, rows / trainer_tp, cols, true));
      sides.push_back(Side::kTrainer);
      d.topology.node_of_worker.push_back(n);
      d.engine_of_worker.push_back(-1);
    }
  for (int n = 0; n < rollout_nodes; ++n)
    for (int k = 0; k < rollout_tp; ++k) {
      maps.push_back(sharded ? holds_rows(rows * k / rollout_tp, rows / rollout_tp, cols, true)
                             : holds_rows(0, rows, cols, true));
      sides.push_back(Side::kRollout);
      d.topology.node_of_worker.push_back(trainer_nodes + n);
      d.engine_of_worker.push_back(n);
    }
  d.correspondence = build_correspondence(tensors, std::move(maps), std::move(sides));
  d.model_bytes = (rows * cols + cols) * 2;
  return d;
}

std::int64_t stage_bytes(const TrafficSchedule& schedule, std::size_t stage) {
  std::int64_t total = 0;
  for (const auto& round : schedule.rounds)
    for (const Transfer& t : round[stage]) total += t.bytes;
  return total;
}

TEST(Baseline, BroadcastGathersToTheHeadAndRelaysTheWholeModelThroughEveryRolloutWorker) {
  // One trainer node (TP2), two rollout nodes of two TP2 workers: each rollout worker needs half of w.
  const Deployment d = deployment(1, 2, 2, 2, true, 64, 32);
  BaselineTrafficOptions options;
  options.bucket_bytes = d.model_bytes / 4 + 1;
  const TrafficSchedule schedule = broadcast_baseline_traffic(d.correspondence, d.topology, options);
  EXPECT_EQ(schedule.strategy, "broadcast");
  EXPECT_THAT(schedule.stage_names, ElementsAre("gather", "broadcast"));
  ASSERT_EQ(schedule.rounds.size(), 4u);
  // Gather: worker 1 sends its half of w to the head (the norm is the head's own).
  EXPECT_EQ(stage_bytes(schedule, 0), 32 * 32 * 2);
  for (const auto& round : schedule.rounds)
    for (const Transfer& t : round[0]) {
      EXPECT_EQ(t.from, 1);
      EXPECT_EQ(t.to, 0);
    }
  // Broadcast: the chain 0 -> 2 -> 3 -> 4 -> 5, every hop the whole bucket.
  for (const auto& round : schedule.rounds) {
    ASSERT_EQ(round[1].size(), 4u);
    std::vector<std::pair<int, int>> hops;
    for (const Transfer& t : round[1]) hops.emplace_back(t.from, t.to);
    std::sort(hops.begin(), hops.end());
    EXPECT_THAT(hops, ElementsAre(std::pair{0, 2}, std::pair{2, 3}, std::pair{3, 4}, std::pair{4, 5}));
  }
  EXPECT_EQ(stage_bytes(schedule, 1), 4 * d.model_bytes);
  const SimulationResult result = simulate(schedule, d.topology);
  // Every rollout node takes the whole model M over its ingress, not what its workers need (M/2 + norm).
  EXPECT_THAT(result.node_ingress_bytes, ElementsAre(0, d.model_bytes, d.model_bytes));
  EXPECT_THAT(result.node_egress_bytes, ElementsAre(d.model_bytes, d.model_bytes, 0));
}

TEST(Baseline, P2PSourceWritesEachWorkerWhatItNeedsWithoutDeduplication) {
  // Two trainer nodes, each a full replica on one worker; two one-node engines of two TP2 workers: each
  // worker needs half of w and the whole norm.
  const Deployment d = deployment(2, 1, 2, 2, true, 64, 32);
  BaselineTrafficOptions options;
  options.engine_of_worker = d.engine_of_worker;
  options.bucket_bytes = 1000;
  const TrafficSchedule schedule = p2p_baseline_traffic(d.correspondence, d.topology, options);
  EXPECT_EQ(schedule.strategy, "p2p");
  EXPECT_THAT(schedule.stage_names, ElementsAre("gather", "write"));
  const auto rounds = static_cast<std::size_t>((d.model_bytes + 999) / 1000);
  EXPECT_EQ(schedule.rounds.size(), rounds);
  EXPECT_EQ(stage_bytes(schedule, 0), 0);  // every source holds the whole model
  const SimulationResult result = simulate(schedule, d.topology);
  // Engine 0 is served from node 0, engine 1 from node 1: each source writes its two workers half of w
  // and the norm each, the norm twice.
  const std::int64_t per_engine = 2 * (32 * 32 * 2 + 32 * 2);
  EXPECT_THAT(result.node_egress_bytes, ElementsAre(per_engine, per_engine, 0, 0));
  EXPECT_THAT(result.node_ingress_bytes, ElementsAre(0, 0, per_engine, per_engine));
  EXPECT_GT(per_engine, d.model_bytes);
}

TEST(Baseline, P2PSourcesGatherWhatTheirEnginesNeed) {
  // One trainer node of two TP2 workers serves two engines: engine 0 from worker 0, engine 1 from worker 1.
  const Deployment d = deployment(1, 2, 2, 2, false, 64, 32);
  BaselineTrafficOptions options;
  options.engine_of_worker = d.engine_of_worker;
  const TrafficSchedule schedule = p2p_baseline_traffic(d.correspondence, d.topology, options);
  ASSERT_EQ(schedule.rounds.size(), 1u);
  std::vector<std::tuple<int, int, std::int64_t>> gather;
  for (const Transfer& t : schedule.rounds[0][0]) gather.emplace_back(t.from, t.to, t.bytes);
  EXPECT_THAT(gather, ElementsAre(std::tuple{0, 1, 32 * 32 * 2}, std::tuple{1, 0, 32 * 32 * 2}));
  const SimulationResult result = simulate(schedule, d.topology);
  EXPECT_EQ(result.node_egress_bytes[0], 4 * d.model_bytes);  // four workers, each needs everything
}

TEST(Baseline, P2PNeedsAnEngineForEveryRolloutWorker) {
  const Deployment d = deployment(1, 2, 1, 2, true, 8, 4);
  BaselineTrafficOptions options;
  options.engine_of_worker = {-1, -1, 0};
  EXPECT_THROW(p2p_baseline_traffic(d.correspondence, d.topology, options), Error);
  options.engine_of_worker = {-1, -1, 0, -1};
  expect_error([&] { p2p_baseline_traffic(d.correspondence, d.topology, options); }, ErrorCode::kInvalidArgument,
               {"rollout worker 3 has no engine"});
}

TEST(Baseline, TransfersGoAsChunkedMessages) {
  const Deployment d = deployment(1, 2, 2, 2, true, std::int64_t{1} << 12, 4096);  // 32 MiB of w
  BaselineTrafficOptions options;
  options.bucket_bytes = std::int64_t{16} << 20;
  options.message_bytes = std::int64_t{4} << 20;
  TrafficSchedule schedule = broadcast_baseline_traffic(d.correspondence, d.topology, options);
  ASSERT_EQ(schedule.rounds.size(), 3u);  // 32 MiB + the norm
  const Transfer& hop = schedule.rounds[0][1].front();
  EXPECT_EQ(hop.messages, (hop.bytes + (4 << 20) - 1) >> 22);
  EXPECT_GT(hop.messages, 1);
  // Each message costs the latency on its links: the chunked broadcast is slower by about that much.
  const double chunked = simulate(schedule, d.topology).ewtt_seconds;
  options.message_bytes = 0;
  schedule = broadcast_baseline_traffic(d.correspondence, d.topology, options);
  for (const auto& round : schedule.rounds)
    for (const auto& stage : round)
      for (const Transfer& t : stage) EXPECT_EQ(t.messages, 1);
  const double whole = simulate(schedule, d.topology).ewtt_seconds;
  EXPECT_GT(chunked, whole + 5 * d.topology.message_latency);
}

TEST(Baseline, P2PGrowsWithRolloutReplicasBroadcastDoesNot) {
  // One trainer node (TP2), N one-node engines of two workers that each need the whole 512 MiB model.
  const auto ewtt = [](int engines, bool p2p) {
    const Deployment d = deployment(1, 2, engines, 2, false, std::int64_t{1} << 16, 4096);
    BaselineTrafficOptions options;
    options.bucket_bytes = std::int64_t{64} << 20;
    options.engine_of_worker = d.engine_of_worker;
    const TrafficSchedule schedule = p2p ? p2p_baseline_traffic(d.correspondence, d.topology, options)
                                         : broadcast_baseline_traffic(d.correspondence, d.topology, options);
    return simulate(schedule, d.topology).ewtt_seconds;
  };
  const double p2p_1 = ewtt(1, true), p2p_4 = ewtt(4, true);
  const double broadcast_1 = ewtt(1, false), broadcast_4 = ewtt(4, false);
  std::printf("p2p %.3f ms -> %.3f ms, broadcast %.3f ms -> %.3f ms\n", p2p_1 * 1e3, p2p_4 * 1e3, broadcast_1 * 1e3,
              broadcast_4 * 1e3);
  EXPECT_GE(p2p_4 / p2p_1, 3.5);
  EXPECT_LE(broadcast_4 / broadcast_1, 1.3);
  // The broadcast relays M through each rollout node's ingress: never faster than M / B.
  EXPECT_GE(broadcast_1, static_cast<double>((std::int64_t{1} << 16) * 4096 * 2) / 400e9);
}

// --- WeightBridge plans as traffic -------------------------------------------------------------------

TEST(Traffic, HandBuiltPlanGivesThePerStageTransfers) {
  // Trainer 0 on node 0 holds w [8, 4]; rollout workers 1, 2 on node 1 and 3, 4 on node 2 need all of it,
  // worker 2 at two places (two parameters).
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {8, 4}}};
  SourceMap trainer = holds_rows(0, 8, 4, false);
  SourceMap twice = holds_rows(0, 8, 4, false);
  twice.parameters.push_back({"q", DType::kBF16, {8, 4}});
  twice.copies.push_back({0, 1, Box{{0, 0}, {8, 4}}, 0, {4, 1}});
  const Correspondence c = build_correspondence(
      tensors, {trainer, holds_rows(0, 8, 4, false), twice, holds_rows(0, 8, 4, false), holds_rows(0, 8, 4, false)},
      {Side::kTrainer, Side::kRollout, Side::kRollout, Side::kRollout, Side::kRollout});
  ASSERT_EQ(c.atoms.size(), 1u);
  const Atom& atom = c.atoms[0];
  ASSERT_EQ(atom.needers.size(), 5u);
  const auto needer = [&](int worker) {
    for (std::size_t i = 0; i < atom.needers.size(); ++i)
      if (atom.needers[i].worker == worker) return static_cast<std::uint32_t>(i);
    ADD_FAILURE() << "worker " << worker << " is no needer";
    return std::uint32_t{0};
  };

  TransferPlan plan;
  plan.rounds = 2;
  plan.pipeline_depth = 2;
  plan.topology.node_of_worker = {0, 1, 1, 2, 2};
  plan.landers = {needer(1), needer(3), needer(2), needer(4)};
  // Round 0: rows 0-2 and 2-4 land on workers 1 and 3, from the trainer to worker 1.
  plan.segments.push_back({0, Box{{0, 0}, {2, 4}}, 0, 0, 0, 2, 0});
  plan.segments.push_back({0, Box{{2, 0}, {2, 4}}, 0, 0, 0, 2, 0});
  // Round 1: rows 4-8 land on workers 2 and 4, from the trainer to worker 4.
  plan.segments.push_back({0, Box{{4, 0}, {4, 4}}, 1, 0, 2, 2, 1});

  const TrafficSchedule schedule = traffic_of(c, plan);
  EXPECT_EQ(schedule.strategy, "weightbridge");
  EXPECT_THAT(schedule.stage_names, ElementsAre("receive", "external exchange", "internal exchange"));
  EXPECT_EQ(schedule.pipeline_depth, 2);
  ASSERT_EQ(schedule.rounds.size(), 2u);
  const auto flat = [](const std::vector<Transfer>& transfers) {
    std::vector<std::tuple<int, int, std::int64_t, int>> out;
    for (const Transfer& t : transfers) out.emplace_back(t.from, t.to, t.bytes, t.messages);
    return out;
  };
  const std::int64_t half = 4 * 4 * 2;  // four rows of four bf16
  using T = std::tuple<int, int, std::int64_t, int>;
  // Round 0: the two segments of one route are one transfer of one message; worker 2 receives once.
  EXPECT_THAT(flat(schedule.rounds[0][0]), ElementsAre(T{0, 1, half, 1}));
  EXPECT_THAT(flat(schedule.rounds[0][1]), ElementsAre(T{1, 3, half, 1}));
  EXPECT_THAT(flat(schedule.rounds[0][2]), ElementsAre(T{1, 2, half, 1}, T{3, 4, half, 1}));
  EXPECT_THAT(flat(schedule.rounds[1][0]), ElementsAre(T{0, 4, half, 1}));
  EXPECT_THAT(flat(schedule.rounds[1][1]), ElementsAre(T{4, 2, half, 1}));
  EXPECT_THAT(flat(schedule.rounds[1][2]), ElementsAre(T{2, 1, half, 1}, T{4, 3, half, 1}));

  // One copy out, one copy in per node.
  Topology topology = Topology::uniform(5, 1, 100.0, 1000.0);
  topology.node_of_worker = plan.topology.node_of_worker;
  const SimulationResult result = simulate(schedule, topology);
  EXPECT_THAT(result.node_egress_bytes, ElementsAre(2 * half, half, half));
  EXPECT_THAT(result.node_ingress_bytes, ElementsAre(0, 2 * half, 2 * half));

  // Without the plan's topology the internal exchange cannot be routed.
  TransferPlan blind = plan;
  blind.topology = {};
  try {
    traffic_of(c, blind);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("topology"));
  }
  // A bad lander index is reported with its segment.
  TransferPlan broken = plan;
  broken.landers[3] = 99;
  expect_error([&] { traffic_of(c, broken); }, ErrorCode::kInvalidArgument, {"segment 2"});
}

TEST(Traffic, PlannerOutputCarriesOneCopyPerNode) {
  // The real planner on the broadcast deployment: the traffic's node ingress equals each node's need.
  const Deployment d = deployment(1, 2, 2, 2, true, 64, 32);
  PlanOptions options;
  options.min_rounds = 2;
  const TransferPlan plan = plan_transfer(d.correspondence, d.topology, options);
  const TrafficSchedule schedule = traffic_of(d.correspondence, plan);
  ASSERT_EQ(static_cast<int>(schedule.rounds.size()), plan.rounds);
  const SimulationResult result = simulate(schedule, d.topology);
  // Each rollout node's two TP2 workers together need all of w and the norm: M.
  EXPECT_EQ(result.node_ingress_bytes[1], d.model_bytes);
  EXPECT_EQ(result.node_ingress_bytes[2], d.model_bytes);
  EXPECT_EQ(result.node_egress_bytes[0], d.model_bytes);
  EXPECT_GE(result.ewtt_seconds, plan.bound.t_min_seconds * (1 - 1e-9));
}

// Relays: stages "early" and "late"; worker 0 feeds relay 1, which forwards to worker 2.
TrafficSchedule relay_schedule(int rounds, int depth) {
  TrafficSchedule schedule;
  schedule.stage_names = {"early", "late"};
  schedule.pipeline_depth = depth;
  schedule.rounds.assign(static_cast<std::size_t>(rounds), std::vector<std::vector<Transfer>>(2));
  return schedule;
}

TEST(Simulator, ARelayForwardsOnlyWhatHasFullyArrived) {
  // Round 0 brings 1000 B to worker 1 in the late stage (10 s); in round 1 it forwards them (lag 1) in the
  // early stage, which the pipeline order alone would let start at once.
  TrafficSchedule schedule = relay_schedule(2, 2);
  schedule.rounds[0][1] = {{0, 1, 1000, 1}};
  schedule.rounds[1][0] = {{1, 2, 100, 1, 1}};
  EXPECT_NEAR(simulate(schedule, nodes_of_one(3)).ewtt_seconds, 11.0, 1e-9);
  schedule.rounds[1][0][0].lag = 0;  // the same bytes without the relay's constraint
  EXPECT_NEAR(simulate(schedule, nodes_of_one(3)).ewtt_seconds, 10.0, 1e-9);
}

TEST(Simulator, ARoundThatReusesARelaysSlotWaitsForItsForwards) {
  // Depth 2: worker 1 relays in round 1 (10 s) out of its slot of round 0, which round 2 reuses: round 2's
  // 2000 B into worker 1 (from worker 3, on links of their own) must wait for the relay.
  TrafficSchedule schedule = relay_schedule(3, 2);
  schedule.rounds[0][0] = {{0, 1, 100, 1}};
  schedule.rounds[1][1] = {{1, 2, 1000, 1, 1}};
  schedule.rounds[2][0] = {{3, 1, 2000, 1}};
  EXPECT_NEAR(simulate(schedule, nodes_of_one(4)).ewtt_seconds, 1.0 + 10.0 + 20.0, 1e-9);
  // With a third slot, round 2 does not reuse it and goes ahead.
  schedule.pipeline_depth = 3;
  EXPECT_NEAR(simulate(schedule, nodes_of_one(4)).ewtt_seconds, 21.0, 1e-9);
}

TEST(Simulator, StagesCanFollowStagesOtherThanThePreviousOne) {
  // Two stages on disjoint links: one after the other by default, side by side when the second follows
  // nothing; a cycle is refused.
  TrafficSchedule schedule = two_stages(1, 2, {0, 1, 1000, 1}, {2, 3, 1000, 1});
  EXPECT_NEAR(simulate(schedule, nodes_of_one(4)).ewtt_seconds, 20.0, 1e-9);
  schedule.stage_after = {0, 0};
  EXPECT_NEAR(simulate(schedule, nodes_of_one(4)).ewtt_seconds, 10.0, 1e-9);
  schedule.stage_after = {2, 1};
  EXPECT_THAT([&] { simulate(schedule, nodes_of_one(4)); }, ::testing::ThrowsMessage<Error>(HasSubstr("cycle")));
  schedule.stage_after = {1};
  EXPECT_THAT([&] { simulate(schedule, nodes_of_one(4)); }, ::testing::ThrowsMessage<Error>(HasSubstr("stage_after")));
}

TEST(Simulator, ARelayThatHeardOnlyFromItsOwnNodeNeedNotWait) {
  // The relay rule looks at what came over the network: worker 1's intra-node arrival in round 0 (from its
  // neighbour 3 on node 1) does not hold up its relay in round 1.
  Topology topology = Topology::uniform(4, 1, 100.0, 1000.0);
  topology.message_latency = 0;
  topology.node_of_worker = {0, 1, 2, 1};
  TrafficSchedule schedule = relay_schedule(2, 2);
  schedule.rounds[0][1] = {{3, 1, 10000, 1}};  // 10 s inside node 1
  schedule.rounds[1][0] = {{1, 2, 100, 1, 1}};
  EXPECT_NEAR(simulate(schedule, topology).ewtt_seconds, 10.0, 1e-9);
}

TEST(Simulator, RelaysOutsideWhatTheExecutorRunsAreRefused) {
  TrafficSchedule schedule = relay_schedule(2, 2);
  schedule.rounds[0][0] = {{0, 1, 100, 1, 1}};
  EXPECT_THAT([&] { simulate(schedule, nodes_of_one(3)); }, ::testing::ThrowsMessage<Error>(HasSubstr("in round 0")));
  schedule.rounds[0][0][0].lag = 0;
  schedule.rounds[1][0] = {{1, 2, 100, 1, 2}};
  EXPECT_THAT([&] { simulate(schedule, nodes_of_one(3)); }, ::testing::ThrowsMessage<Error>(HasSubstr("lag 2")));
  schedule.rounds[1][0][0].lag = 1;
  schedule.pipeline_depth = 1;
  EXPECT_THAT([&] { simulate(schedule, nodes_of_one(3)); }, ::testing::ThrowsMessage<Error>(HasSubstr("pipeline depth of 2")));
}

TEST(Traffic, RelayTreesForwardARoundLaterPerHop) {
  // One trainer (node 0) and four one-worker rollout nodes that all need w; a chain 1 -> 2 -> 3 -> 4 from
  // the origin at position 0: position 1 lands in the segment's round, 2 one round later (lag 1), 3 two.
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {8, 4}}};
  const Correspondence c = build_correspondence(
      tensors, {holds_rows(0, 8, 4, false), holds_rows(0, 8, 4, false), holds_rows(0, 8, 4, false), holds_rows(0, 8, 4, false),
                holds_rows(0, 8, 4, false)},
      {Side::kTrainer, Side::kRollout, Side::kRollout, Side::kRollout, Side::kRollout});
  ASSERT_EQ(c.atoms.size(), 1u);
  TransferPlan plan;
  plan.rounds = 4;
  plan.pipeline_depth = 2;
  plan.topology.node_of_worker = {0, 1, 2, 3, 4};
  plan.landers = {0, 1, 2, 3};  // needers in worker order: workers 1..4
  RelayTree chain;
  chain.parent = {RelayTree::kRoot, 0, 1, 2};
  chain.depth = {0, 1, 2, 3};
  chain.height = 3;
  plan.relay_trees = {chain};
  Segment segment{0, Box{{0, 0}, {8, 4}}, 1, 0, 0, 4, 0, 0};
  plan.segments = {segment};
  const TrafficSchedule schedule = traffic_of(c, plan);
  const auto flat = [](const std::vector<Transfer>& transfers) {
    std::vector<std::tuple<int, int, int>> out;
    for (const Transfer& t : transfers) out.emplace_back(t.from, t.to, t.lag);
    return out;
  };
  using T = std::tuple<int, int, int>;
  // Relays are a fourth stage that follows nothing in its round; the internal exchange follows them.
  EXPECT_THAT(schedule.stage_names, ElementsAre("receive", "external exchange", "internal exchange", "relay"));
  EXPECT_THAT(schedule.stage_after, ElementsAre(0, 1, 2 | 8, 0));
  ASSERT_EQ(schedule.rounds.size(), 4u);
  EXPECT_TRUE(schedule.rounds[0][0].empty() && schedule.rounds[0][1].empty());
  EXPECT_THAT(flat(schedule.rounds[1][0]), ElementsAre(T{0, 1, 0}));
  EXPECT_THAT(flat(schedule.rounds[1][1]), ElementsAre(T{1, 2, 0}));
  EXPECT_TRUE(schedule.rounds[2][1].empty());
  EXPECT_THAT(flat(schedule.rounds[2][3]), ElementsAre(T{2, 3, 1}));
  EXPECT_THAT(flat(schedule.rounds[3][3]), ElementsAre(T{3, 4, 1}));
  const SimulationResult result = simulate(schedule, Topology::uniform(5, 1, 100.0, 1000.0));
  EXPECT_THAT(result.node_ingress_bytes, ElementsAre(0, 64, 64, 64, 64));
  EXPECT_THAT(result.node_egress_bytes, ElementsAre(64, 64, 64, 64, 0));

  // A tree that does not fit its segment, or whose last hop falls past the last round, is refused.
  TransferPlan late = plan;
  late.rounds = 3;
  late.segments[0].round = 1;
  EXPECT_THAT([&] { traffic_of(c, late); }, ::testing::ThrowsMessage<Error>(HasSubstr("after the last round")));
  TransferPlan wrong_root = plan;
  wrong_root.segments[0].origin = 1;
  EXPECT_THAT([&] { traffic_of(c, wrong_root); }, ::testing::ThrowsMessage<Error>(HasSubstr("does not span")));
}

}  // namespace
}  // namespace wb
