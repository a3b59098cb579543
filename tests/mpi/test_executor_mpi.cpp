// The round executor end to end under MPI, over the real transports of one machine (cma): every rank probes
// its emulated worker, the maps are all-gathered, rank 0 plans and scatters the round schedules, and every
// update moves a new checkpoint version from the trainers into every rollout parameter, which must equal
// the rollout's own load_weights of that version bit for bit. Registrations happen at connect only.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../support/executor_rank.hpp"
#include "emu/check/checkpoint_check.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "exec/round_executor.hpp"
#include "exec/round_work.hpp"
#include "weightbridge/plan.hpp"

namespace wb::emu {
namespace {

struct Case {
  std::string name, model, trainer, rollout;
  int gpus_per_node;
  std::int64_t buffer_bytes;
};

// Host parameters as the executor addresses them.
ParameterMemory memory_of(const ParameterSet& params) {
  ParameterMemory memory;
  for (const Parameter& p : params) {
    memory.data.push_back(static_cast<std::byte*>(p.view.data));
    memory.bytes.push_back(p.view.nbytes());
  }
  return memory;
}

class ExecutorUnderMpi : public ::testing::TestWithParam<Case> {};

TEST_P(ExecutorUnderMpi, EveryUpdateIsBitExactAndRegistersNothing) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Case& c = GetParam();
  // connect: probe, all-gather, plan on rank 0, scatter.
  testing_support::ExecutorRank r =
      testing_support::executor_rank({c.model, 3, c.trainer, c.rollout, c.gpus_per_node}, c.buffer_bytes, MPI_COMM_WORLD);
  const std::vector<TensorInfo>& tensors = r.setup.tensors;
  const EmulatedWorker& worker = *r.setup.worker;
  const HostParameters& host = r.host;
  const bool trainer = r.trainer;
  RoundSchedule& schedule = r.schedule;
  const int rounds = static_cast<int>(schedule.rounds.size());

  // Rollouts start from a fill pattern that only padding keeps.
  for (const Parameter& p : host.parameters()) std::memset(p.view.data, 0xEE, p.view.nbytes());
  const ParameterMemory memory = memory_of(host.parameters());
  ExecutorOptions options;
  options.timeout_seconds = 60;
  // The batches longer than one write, which a post size of one must split (counted before the schedule
  // moves into the executor).
  std::int64_t long_batches = 0;
  for (const auto& [peer, list] : exec::split_batches(schedule, [](int) { return std::size_t{1}; }))
    long_batches += static_cast<std::int64_t>(list.size());
  RoundExecutor executor(std::move(schedule), memory, MPI_COMM_WORLD, options);
  const std::int64_t registrations = executor.stats().registrations;
  if (std::getenv("WB_MAX_WRITES_PER_POST") != nullptr) {
    // Run with a tiny post size: every batch longer than one write is split. A plan whose batches are all
    // one write (the planner coalesces a route's segments) has nothing to split: it proves nothing here.
    std::int64_t split = executor.stats().split_batches, total = 0, expected = 0;
    EXPECT_EQ(split, long_batches);
    MPI_Allreduce(&split, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&long_batches, &expected, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (expected == 0) GTEST_SKIP() << "this plan has no batch longer than one write: nothing to split";
    ASSERT_GT(total, 0) << "WB_MAX_WRITES_PER_POST is set but no batch was split";
  }

  for (std::uint64_t version = 1; version <= 3; ++version) {
    SyntheticCheckpoint checkpoint(tensors, 1000 + version);
    if (trainer) worker.load_weights(checkpoint, host.parameters());
    const Status status = executor.run_update();
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    if (!trainer) {
      HostParameters expected(worker.parameter_infos());
      for (const Parameter& p : expected.parameters()) std::memset(p.view.data, 0xEE, p.view.nbytes());
      worker.load_weights(checkpoint, expected.parameters());
      const std::string difference = first_difference(host.parameters(), expected.parameters());
      ASSERT_TRUE(difference.empty()) << "rank " << rank << " version " << version << ": " << difference;
    }
  }
  EXPECT_EQ(executor.stats().registrations, registrations) << "an update registered memory";
  EXPECT_EQ(executor.stats().updates, 3);
  if (rank == 0) std::printf("[ %s ] %d rounds per update\n", GetParam().name.c_str(), rounds);
}

// A framework that moved every parameter between two updates (RoundExecutor::rebind_parameter, what the
// Python adapters do for a rebound tensor), with every rank entering each update together: the next version
// is packed from and assembled into the new memory, and the old memory, filled with a pattern, is neither
// read (the rollouts would get the pattern) nor written.
TEST(ExecutorUnderMpiRebound, UpdatesFollowParametersMovedBetweenThem) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  testing_support::ExecutorRank r = testing_support::executor_rank({"qwen3-30b-a3b", 3, "tp=2,ep=2", "engines=3,tp=2,ep=2", 2},
                                                                   96 << 10, MPI_COMM_WORLD);
  const EmulatedWorker& worker = *r.setup.worker;
  const ParameterMemory memory = memory_of(r.host.parameters());
  ExecutorOptions options;
  options.timeout_seconds = 60;
  options.enter_together = true;
  RoundExecutor executor(std::move(r.schedule), memory, MPI_COMM_WORLD, options);
  const auto expect_version = [&](const ParameterSet& params, std::uint64_t version) {
    HostParameters expected(worker.parameter_infos());
    for (std::size_t p = 0; p < params.size(); ++p) std::memcpy(expected.parameters()[p].view.data, params[p].view.data, params[p].view.nbytes());
    worker.load_weights(SyntheticCheckpoint(r.setup.tensors, 2000 + version), expected.parameters());
    return first_difference(params, expected.parameters());
  };
  // Version 1 in place.
  if (r.trainer) worker.load_weights(SyntheticCheckpoint(r.setup.tensors, 2001), r.host.parameters());
  ASSERT_TRUE(executor.run_update().is_ok());
  if (!r.trainer) {
    ASSERT_EQ(expect_version(r.host.parameters(), 1), "") << "rank " << rank;
  }
  // Every parameter moves to new memory holding the same bytes; the old memory gets a pattern.
  HostParameters moved(worker.parameter_infos());
  int rebound = 0;
  for (std::size_t p = 0; p < moved.parameters().size(); ++p) {
    auto* from = static_cast<std::byte*>(r.host.parameters()[p].view.data);
    auto* to = static_cast<std::byte*>(moved.parameters()[p].view.data);
    std::memcpy(to, from, memory.bytes[p]);
    std::memset(from, 0xAB, memory.bytes[p]);
    rebound += executor.rebind_parameter(p, from, to) ? 1 : 0;
    EXPECT_FALSE(executor.rebind_parameter(p, from, to)) << "a second rebinding from the old address";
  }
  EXPECT_EQ(rebound, static_cast<int>(moved.parameters().size()));
  for (std::uint64_t version = 2; version <= 3; ++version) {
    if (r.trainer) worker.load_weights(SyntheticCheckpoint(r.setup.tensors, 2000 + version), moved.parameters());
    const Status status = executor.run_update();
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    if (!r.trainer) {
      ASSERT_EQ(expect_version(moved.parameters(), version), "") << "rank " << rank << " version " << version;
    }
  }
  for (const Parameter& p : r.host.parameters())
    for (std::size_t b = 0; b < p.view.nbytes(); ++b)
      ASSERT_EQ(static_cast<unsigned char*>(p.view.data)[b], 0xAB) << "rank " << rank << ": the old memory of " << p.name
                                                                    << " was written at byte " << b;
}

// run_update's gate (what sender staging copied round by round uses): the trainers start their update
// with no round's sources ready, write the version into their parameters 300 ms later, and only then open
// the gate. Every rollout parameter must be that version: a round packed before its gate opened would carry
// the pattern the trainers' parameters held until then.
TEST(ExecutorUnderMpiGated, RoundsArePackedOnlyOnceTheGateSaysTheirSourcesAreReady) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  testing_support::ExecutorRank r = testing_support::executor_rank({"qwen3-30b-a3b", 3, "tp=2,ep=2", "engines=3,tp=2,ep=2", 2},
                                                                   96 << 10, MPI_COMM_WORLD);
  const EmulatedWorker& worker = *r.setup.worker;
  for (const Parameter& p : r.host.parameters()) std::memset(p.view.data, 0xAB, p.view.nbytes());
  const ParameterMemory memory = memory_of(r.host.parameters());
  ExecutorOptions options;
  options.timeout_seconds = 60;
  RoundExecutor executor(std::move(r.schedule), memory, MPI_COMM_WORLD, options);
  const SyntheticCheckpoint checkpoint(r.setup.tensors, 3001);
  std::atomic<int> packable{0};
  Status status;
  if (r.trainer) {
    std::thread update([&] { status = executor.run_update({}, &packable); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    worker.load_weights(checkpoint, r.host.parameters());
    packable.store(1 << 30, std::memory_order_release);
    update.join();
  } else {
    status = executor.run_update();
  }
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  if (!r.trainer) {
    HostParameters expected(worker.parameter_infos());
    for (std::size_t p = 0; p < expected.parameters().size(); ++p)
      std::memcpy(expected.parameters()[p].view.data, r.host.parameters()[p].view.data, memory.bytes[p]);
    worker.load_weights(checkpoint, expected.parameters());
    ASSERT_EQ(first_difference(r.host.parameters(), expected.parameters()), "") << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExecutorUnderMpi,
    ::testing::Values(
        // MoE with GQA; two rollout nodes, so external exchange runs; several rounds.
        Case{"qwen3_moe", "qwen3-30b-a3b", "tp=2,ep=2", "engines=3,tp=2,ep=2", 2, 96 << 10},
        // MLA with pipeline trainer, DP-attention rollout with transposed experts.
        Case{"mla", "moonlight-16b-a3b", "tp=2", "engines=3,tp=2,ep=2,dp_attn=2,transpose=experts", 2, 128 << 10},
        // Dense, replicated trainers (DP) and one rollout node of three engines: internal exchange.
        Case{"dense", "qwen3-32b", "tp=1,dp=2", "engines=3,tp=2", 2, 192 << 10}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace wb::emu
