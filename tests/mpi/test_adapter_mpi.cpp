// The coordinator's contract under MPI (4 ranks: 2 trainers, 2 single-worker rollout engines on two
// logical nodes, so every stage runs): what send_weights and poll_requests promise in each of the four
// synchronization modes (docs/architecture.md), checked on stall intervals read on the job's common clock, with and without
// verify; the failure paths (a rollout that stops polling, a hook that throws, a version that does not
// increase, a loader that computes or reads a tensor the trainers lack); staging only what is sent; roles
// anywhere in the world; parameters load_weights never writes (declared, or an error at connect); timeouts
// of none.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <thread>

#include "core/device.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/backend.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::emu {
namespace {

constexpr int kTrainers = 2;
constexpr int kVersions = 3;

struct World {
  int rank = 0, size = 0;
  bool trainer = false;
  int side_rank = 0;  // among the trainers, or among the rollout workers
  ModelConfig model;
  std::vector<TensorInfo> tensors;
  std::unique_ptr<SyntheticCheckpoint> checkpoint;
  std::unique_ptr<EmulatedWorker> worker;
  std::unique_ptr<HostParameters> params;
  MPI_Comm group = MPI_COMM_NULL;

  // `trainers_last`: the rollouts take world ranks 0 and 1, the trainers 2 and 3.
  explicit World(const char* trainer_spec = "tp=2,ep=2", bool trainers_last = false) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    trainer = trainers_last ? rank >= size - kTrainers : rank < kTrainers;
    side_rank = trainer ? (trainers_last ? rank - (size - kTrainers) : rank) : (trainers_last ? rank : rank - kTrainers);
    ScaleOptions scale;
    scale.num_layers = 2;
    model = scale_model(load_named_model_config("qwen3-30b-a3b"), scale);
    tensors = model_tensors(model);
    checkpoint = std::make_unique<SyntheticCheckpoint>(tensors, 7);
    worker = trainer ? make_trainer_worker(model, TrainerSpec::parse(trainer_spec), side_rank)
                     : make_rollout_worker(model, RolloutSpec::parse("engines=2,tp=1"), side_rank);
    params = std::make_unique<HostParameters>(worker->parameter_infos());
    worker->load_weights(*checkpoint, params->parameters());
    MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + side_rank, rank, &group);
  }
  ~World() { MPI_Comm_free(&group); }

  LoadWeightsFn load() const {
    return [this](const CheckpointReader& c, const ParameterSet& p) { worker->load_weights(c, p); };
  }
  AdapterOptions options(bool sender_staging, bool receiver_staging, double timeout) const {
    AdapterOptions o;
    o.sender_staging = sender_staging;
    o.receiver_staging = receiver_staging;
    o.timeout_seconds = timeout;
    o.node = trainer ? 0 : 1 + side_rank;  // two rollout nodes: external exchange runs too
    o.buffer_bytes = 96 << 10;    // several rounds
    return o;
  }
  // This worker's own load_weights of version v.
  std::unique_ptr<HostParameters> expected(std::uint64_t v) const {
    auto out = std::make_unique<HostParameters>(worker->parameter_infos());
    worker->load_weights(VersionedCheckpoint(*checkpoint, v), out->parameters());
    return out;
  }
};

bool equal(const ParameterSet& a, const ParameterSet& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].view.data, b[i].view.data, a[i].view.nbytes()) != 0) return false;
  return true;
}

// Per version: this worker's stall begin and end (NaN when it did not stall for it), all-gathered:
// result[rank][v - 1] = {begin, end}.
std::vector<std::vector<std::pair<double, double>>> gather_stalls(const std::vector<StallInterval>& stalls, int size) {
  std::vector<double> mine(2 * kVersions, std::nan(""));
  for (const StallInterval& s : stalls)
    if (s.version >= 1 && s.version <= kVersions) {
      mine[2 * (s.version - 1)] = s.begin_seconds;
      mine[2 * (s.version - 1) + 1] = s.end_seconds;
    }
  std::vector<double> all(static_cast<std::size_t>(size) * 2 * kVersions);
  MPI_Allgather(mine.data(), 2 * kVersions, MPI_DOUBLE, all.data(), 2 * kVersions, MPI_DOUBLE, MPI_COMM_WORLD);
  std::vector<std::vector<std::pair<double, double>>> out(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    for (int v = 0; v < kVersions; ++v)
      out[static_cast<std::size_t>(r)].push_back({all[static_cast<std::size_t>(r * 2 * kVersions + 2 * v)],
                                                  all[static_cast<std::size_t>(r * 2 * kVersions + 2 * v + 1)]});
  return out;
}

struct Mode {
  const char* name;
  bool sender_staging, receiver_staging;
  bool verify = false;
};

class AdapterModes : public ::testing::TestWithParam<Mode> {};

TEST_P(AdapterModes, EveryVersionArrivesWholeAndTheModesContractHolds) {
  World w;
  ASSERT_EQ(w.size, 4) << "run with 4 ranks";
  const Mode mode = GetParam();
  AdapterOptions options = w.options(mode.sender_staging, mode.receiver_staging, 30);
  options.verify = mode.verify;
  std::vector<StallInterval> stalls;
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, w.load(), options);
    sender.connect();
    const std::int64_t registrations = sender.stats().registrations;
    for (std::uint64_t v = 1; v <= kVersions; ++v) {
      w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, v), w.params->parameters());
      const Status status = sender.send_weights(v);
      ASSERT_TRUE(status.is_ok()) << status.to_string();
      // Whatever the trainer does now must not reach version v.
      for (const Parameter& p : w.params->parameters()) std::memset(p.view.data, 0x5A, p.view.nbytes());
    }
    ASSERT_TRUE(sender.shutdown().is_ok());
    EXPECT_EQ(sender.stats().registrations, registrations) << "an update registered memory";
    EXPECT_EQ(sender.stats().staging_bytes > 0, mode.sender_staging);
    stalls = sender.stats().stalls;
  } else {
    std::map<std::uint64_t, int> hooks;
    std::uint64_t installed = 0;
    std::unique_ptr<HostParameters> current = w.expected(0), next;
    int receiving_steps = 0;  // since the last install
    const auto hook = [&](std::uint64_t v) {
      ++hooks[v];
      EXPECT_TRUE(equal(w.params->parameters(), current->parameters()))
          << "rank " << w.rank << ": before_update_hook(" << v << ") saw a parameter that is not version " << installed;
    };
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), w.load(), options, hook);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::int64_t registrations = -1;
    for (;;) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank " << w.rank << " never saw the shutdown";
      const PollResult result = receiver.poll_requests();
      ASSERT_NE(result.event, PollResult::Event::kFailed) << result.status.to_string();
      if (result.event == PollResult::Event::kShutdown) break;
      if (result.event == PollResult::Event::kConnected) registrations = receiver.stats().registrations;
      if (result.event == PollResult::Event::kReceiving) {
        EXPECT_TRUE(mode.receiver_staging) << "only receiver staging returns while a version arrives";
        ++receiving_steps;
      }
      if (result.event == PollResult::Event::kInstalled) {
        // Staged: the engine went on generating (with the previous version) at least at the step that
        // started receiving.
        if (mode.receiver_staging) {
          EXPECT_GE(receiving_steps, 1) << "version " << installed + 1 << " installed without a receiving step";
        }
        receiving_steps = 0;
        EXPECT_EQ(result.version, installed + 1);
        installed = result.version;
        current = w.expected(installed);
        EXPECT_EQ(hooks[installed], 1) << "before_update_hook calls for version " << installed;
      }
      // At every step: one complete version, the one reported.
      ASSERT_TRUE(equal(w.params->parameters(), current->parameters()))
          << "rank " << w.rank << ": parameters are not version " << installed << " at a step";
      EXPECT_EQ(receiver.installed_version(), installed);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the inference step
    }
    EXPECT_EQ(installed, static_cast<std::uint64_t>(kVersions));
    EXPECT_EQ(receiver.stats().registrations, registrations) << "an update registered memory";
    stalls = receiver.stats().stalls;
  }

  // The modes' timing contract, on the common clock.
  const auto all = gather_stalls(stalls, w.size);
  if (w.rank != 0) return;
  for (int v = 0; v < kVersions; ++v) {
    double trainer_returned = 0, rollout_installed = 0;
    for (int r = 0; r < w.size; ++r) {
      const auto [begin, end] = all[static_cast<std::size_t>(r)][static_cast<std::size_t>(v)];
      ASSERT_FALSE(std::isnan(end)) << "world rank " << r << " has no stall interval for version " << v + 1;
      if (r < kTrainers)
        trainer_returned = std::max(trainer_returned, end);
      else
        rollout_installed = std::max(rollout_installed, end);
    }
    if (!mode.sender_staging && !mode.receiver_staging) {
      EXPECT_GE(trainer_returned, rollout_installed) << "sync: send_weights(" << v + 1 << ") returned before every install";
    }
    if (mode.sender_staging) {
      EXPECT_LT(trainer_returned, rollout_installed) << "sender staging: send_weights(" << v + 1 << ") waited for the rollouts";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AdapterModes,
                         ::testing::Values(Mode{"sync", false, false}, Mode{"sender_staged", true, false},
                                           Mode{"receiver_staged", false, true}, Mode{"async", true, true},
                                           Mode{"sync_verified", false, false, true}, Mode{"async_verified", true, true, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

TEST(AdapterFailures, VersionsMustIncrease) {
  World w;
  const AdapterOptions options = w.options(false, false, 30);
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, w.load(), options);
    sender.connect();
    ASSERT_TRUE(sender.send_weights(2).is_ok());
    const Status again = sender.send_weights(2);
    EXPECT_EQ(again.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(again.message().find("versions must increase"), std::string::npos) << again.message();
    // A refused argument is not a failed transfer: the next version goes through.
    EXPECT_TRUE(sender.send_weights(3).is_ok());
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), w.load(), options);
    while (!receiver.closed()) ASSERT_NE(receiver.poll_requests().event, PollResult::Event::kFailed);
    EXPECT_EQ(receiver.installed_version(), 3u);
  }
}

TEST(AdapterFailures, LoadWeightsThatIsNotACopyFailsConnectOnEveryRank) {
  World w;
  const AdapterOptions options = w.options(false, false, 30);
  const int culprit = 3;
  // World rank 3's loader scales what it reads (flips a low bit of every element): not a pure copy.
  const LoadWeightsFn load = [&w](const CheckpointReader& c, const ParameterSet& p) {
    w.worker->load_weights(c, p);
    if (w.rank != culprit) return;
    for (const Parameter& parameter : p) {
      auto* bytes = static_cast<unsigned char*>(parameter.view.data);
      for (std::size_t i = 0; i < parameter.view.nbytes(); i += parameter.view.element_size()) bytes[i] ^= 1;
    }
  };
  std::string message;
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, load, options);
    try {
      sender.connect();
    } catch (const Error& error) {
      message = error.what();
    }
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), load, options);
    PollResult result;
    while (result.event != PollResult::Event::kFailed && result.event != PollResult::Event::kConnected)
      result = receiver.poll_requests();
    ASSERT_EQ(result.event, PollResult::Event::kFailed) << "connect succeeded with a loader that is not a copy";
    message = result.status.message();
    EXPECT_TRUE(receiver.closed());
  }
  // The same error on every rank, naming the culprit.
  if (w.rank == 0) std::printf("[ connect error ] %s\n", message.c_str());
  EXPECT_NE(message.find("world rank " + std::to_string(culprit)), std::string::npos) << message;
  EXPECT_NE(message.find("load_weights"), std::string::npos) << message;
}

// Parameters the adapters cannot take are refused at construction on every rank, naming the rank: one
// parameter in CUDA memory among host ones, and (on a machine without a device) CUDA parameters at all.
std::string construction_error(const World& w, const ParameterSet& params) {
  const AdapterOptions options = w.options(false, false, 30);
  try {
    if (w.trainer)
      SenderAdapter sender(MPI_COMM_WORLD, w.group, params, w.tensors, w.load(), options);
    else
      ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, params, w.load(), options);
  } catch (const Error& error) {
    return error.what();
  }
  return "constructed";
}

ParameterSet marked_cuda(const ParameterSet& params, bool all) {
  ParameterSet out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    TensorView view = params[i].view;
    if (all || i == 1) view.memory = MemoryKind::kCuda;
    out.add(params[i].name, view);
  }
  return out;
}

TEST(AdapterFailures, ParametersInTwoMemoriesOrOnAMissingDeviceAreRefusedOnEveryRank) {
  World w;
  const std::string mixed = construction_error(w, w.rank == 3 ? marked_cuda(w.params->parameters(), false) : w.params->parameters());
  EXPECT_NE(mixed.find("world rank 3"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find("all in host memory or all on one CUDA device"), std::string::npos) << mixed;
  if (cuda_device_count() > 0) return;  // the pointers below are not device memory; a device would say so at connect
  const std::string missing = construction_error(w, w.rank == 0 ? marked_cuda(w.params->parameters(), true) : w.params->parameters());
  EXPECT_NE(missing.find("world rank 0"), std::string::npos) << missing;
  EXPECT_NE(missing.find("has no CUDA device"), std::string::npos) << missing;
}

TEST(AdapterFailures, RolloutThatStopsPollingFailsSendWeightsNamingIt) {
  World w;
  constexpr double kTimeout = 2;
  const AdapterOptions options = w.options(false, false, kTimeout);
  const int silent = 3;  // engine 1
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, w.load(), options);
    sender.connect();
    const auto started = std::chrono::steady_clock::now();
    const Status status = sender.send_weights(1);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    EXPECT_EQ(status.code(), ErrorCode::kTimeout) << status.to_string();
    EXPECT_NE(status.message().find("rank " + std::to_string(silent)), std::string::npos) << status.message();
    EXPECT_LT(took, 4 * kTimeout + 15) << "send_weights took too long to give up";
    if (w.rank == 0) std::printf("[ send_weights(1) after %.1f s ] %s\n", took, status.to_string().c_str());
    // The adapter stays failed.
    EXPECT_EQ(sender.send_weights(2).code(), ErrorCode::kTimeout);
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), w.load(), options);
    while (!receiver.connected()) ASSERT_NE(receiver.poll_requests().event, PollResult::Event::kFailed);
    if (w.rank == silent) std::this_thread::sleep_for(std::chrono::duration<double>(3 * kTimeout));
    // Both engines end failed or shut down, within a few timeouts, and never install a partial version.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!receiver.closed() && std::chrono::steady_clock::now() < deadline) {
      (void)receiver.poll_requests();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(receiver.closed()) << "rank " << w.rank << " is still waiting";
  }
}


// Rollouts first in the world (world ranks 0 and 1), trainers after them: roles come from the adapters, not
// from positions.
TEST(AdapterRoles, TrainersAndRolloutsMaySitAnywhereInTheWorld) {
  World w("tp=2,ep=2", true);
  const AdapterOptions options = w.options(false, false, 30);
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, w.load(), options);
    sender.connect();
    for (std::uint64_t v = 1; v <= 2; ++v) {
      w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, v), w.params->parameters());
      const Status status = sender.send_weights(v);
      ASSERT_TRUE(status.is_ok()) << status.to_string();
    }
    ASSERT_TRUE(sender.shutdown().is_ok());
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), w.load(), options);
    while (!receiver.closed()) {
      const PollResult result = receiver.poll_requests();
      ASSERT_NE(result.event, PollResult::Event::kFailed) << result.status.to_string();
    }
    EXPECT_EQ(receiver.installed_version(), 2u);
    EXPECT_TRUE(equal(w.params->parameters(), w.expected(2)->parameters())) << "world rank " << w.rank;
  }
}

// With DP=2 each trainer sends half of what it holds: it stages that half, not all of it.
TEST(AdapterStaging, SenderStagingHoldsOnlyWhatThePlanReads) {
  World w("dp=2");
  const AdapterOptions options = w.options(true, false, 30);
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, w.load(), options);
    sender.connect();
    w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, 1), w.params->parameters());
    ASSERT_TRUE(sender.send_weights(1).is_ok());
    ASSERT_TRUE(sender.shutdown().is_ok());
    const AdapterStats stats = sender.stats();
    const auto held = static_cast<std::int64_t>(w.params->parameters().total_bytes());
    std::printf("[ trainer %d ] staged %lld of %lld parameter bytes, wrote %lld per update\n", w.rank,
                static_cast<long long>(stats.staging_bytes), static_cast<long long>(held),
                static_cast<long long>(stats.bytes_written));
    // Each replica sends its own half of the model (within the planner's balance), and stages no byte it
    // does not send: at most what it wrote (elements needed by both rollout nodes are written twice).
    EXPECT_GT(stats.staging_bytes, held / 4);
    EXPECT_LT(stats.staging_bytes, 3 * held / 4);
    EXPECT_LE(stats.staging_bytes, stats.bytes_written);
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), w.load(), options);
    while (!receiver.closed()) ASSERT_NE(receiver.poll_requests().event, PollResult::Event::kFailed);
    EXPECT_TRUE(equal(w.params->parameters(), w.expected(1)->parameters())) << "world rank " << w.rank;
    EXPECT_EQ(receiver.stats().staging_bytes, 0);
  }
}

// A before_update_hook that throws on one worker: every rollout is told the update was aborted after its
// hook ran (kAborted, naming the version), and its parameters still hold the previous one, byte for byte.
class AdapterAbort : public ::testing::TestWithParam<Mode> {};

TEST_P(AdapterAbort, AHookThatThrowsAbortsTheVersionOnEveryRollout) {
  World w;
  const Mode mode = GetParam();
  const AdapterOptions options = w.options(mode.sender_staging, mode.receiver_staging, 20);
  constexpr int kCulprit = 3;
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, w.load(), options);
    sender.connect();
    w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, 1), w.params->parameters());
    ASSERT_TRUE(sender.send_weights(1).is_ok());
    w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, 2), w.params->parameters());
    Status status = sender.send_weights(2);
    if (status) status = sender.wait();  // staged: the outcome comes with the next call
    EXPECT_FALSE(status.is_ok());
    EXPECT_NE(status.message().find("world rank " + std::to_string(kCulprit) + "): before_update_hook(2) threw: no"),
              std::string::npos)
        << status.message();
  } else {
    const auto hook = [&w](std::uint64_t v) {
      if (w.rank == kCulprit && v == 2) throw std::runtime_error("no");
    };
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), w.load(), options, hook);
    PollResult result;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (result.event != PollResult::Event::kAborted && result.event != PollResult::Event::kFailed &&
           std::chrono::steady_clock::now() < deadline)
      result = receiver.poll_requests();
    // The culprit's engine ran its hook for version 2: aborted. The other engine may not have begun
    // installing it when it learnt of the failure (kFailed), or may even have installed it (engines are
    // independent replicas); either way its parameters hold the version it reports.
    if (w.rank == kCulprit) {
      ASSERT_EQ(result.event, PollResult::Event::kAborted) << result.status.to_string();
      EXPECT_EQ(result.version, 1u);
    }
    ASSERT_NE(result.event, PollResult::Event::kNone) << "world rank " << w.rank << " never learnt of the failure";
    if (result.event == PollResult::Event::kAborted) {
      EXPECT_EQ(result.aborted_version, 2u);
    }
    // With receiver staging nothing of version 2 reaches the parameters before the install; without it, a
    // transfer interrupted midway may have written part of it, and then says so.
    if (mode.receiver_staging) {
      EXPECT_TRUE(result.parameters_intact);
    }
    EXPECT_NE(result.status.message().find("before_update_hook(2) threw: no"), std::string::npos) << result.status.message();
    if (result.parameters_intact) {
      EXPECT_TRUE(equal(w.params->parameters(), w.expected(result.version)->parameters()))
          << "world rank " << w.rank << " says its parameters hold version " << result.version << ", but they do not";
    }
    // Said once: later calls say failed, with the same reason.
    const PollResult again = receiver.poll_requests();
    EXPECT_EQ(again.event, PollResult::Event::kFailed);
    EXPECT_EQ(again.status.message(), result.status.message());
    EXPECT_EQ(again.parameters_intact, result.parameters_intact);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AdapterAbort,
                         ::testing::Values(Mode{"sync", false, false}, Mode{"receiver_staged", false, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

// A rollout's load_weights that reads a tensor the trainers' list lacks: connect fails on every rank, in
// those words.
TEST(AdapterFailures, ATensorTheTrainersDoNotListIsNamedAsSuch) {
  World w;
  const AdapterOptions options = w.options(false, false, 30);
  const LoadWeightsFn load = [&w](const CheckpointReader& c, const ParameterSet& p) {
    w.worker->load_weights(c, p);
    if (!w.trainer) {
      float scratch[1];
      c.read_box("lm_head.extra_bias", Box{{0}, {1}}, scratch);
    }
  };
  std::string message;
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, w.params->parameters(), w.tensors, load, options);
    try {
      sender.connect();
    } catch (const Error& error) {
      message = error.status().message();
    }
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, w.params->parameters(), load, options);
    PollResult result;
    while (result.event != PollResult::Event::kFailed && result.event != PollResult::Event::kConnected)
      result = receiver.poll_requests();
    message = result.status.message();
  }
  EXPECT_NE(message.find("reads tensor 'lm_head.extra_bias', which the trainers' tensor list (checkpoint_tensors"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("engine 0 worker 0 (world rank 2)"), std::string::npos) << message;
}

// What connect ends with on this rank: the error's message, or "" when it connected.
std::string connect_outcome(World& w, const ParameterSet& params, const LoadWeightsFn& load, const AdapterOptions& options) {
  if (w.trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, w.group, params, w.tensors, load, options);
    try {
      sender.connect();
    } catch (const Error& error) {
      return error.status().message();
    }
    return "";
  }
  ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, params, load, options);
  PollResult result;
  while (result.event != PollResult::Event::kFailed && result.event != PollResult::Event::kConnected)
    result = receiver.poll_requests();
  return result.status.message();
}

// A rollout parameter that load_weights never writes and nobody declared fails connect on every rank,
// naming the rank, the parameter and the cause; a declared one that load_weights writes after all, too.
TEST(AdapterFailures, UndeclaredUnwrittenRolloutParametersFailConnect) {
  World w;
  const int victim = kTrainers + 1;  // engine 1's worker
  AdapterOptions options = w.options(false, false, 30);
  std::vector<TensorInfo> infos = w.worker->parameter_infos();
  if (w.rank == victim) infos.push_back({"rotary.inv_freq", DType::kF32, {16}});
  HostParameters params(infos);
  std::string message = connect_outcome(w, params.parameters(), w.load(), options);
  // The victim's count, on every rank.
  EXPECT_NE(message.find("engine 1 worker 0 (world rank 3): no update would reach 1 parameter of 22 on this rank: "
                         "rotary.inv_freq. Cause: load_weights never writes them"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("not_loaded"), std::string::npos) << message;

  // Declared, but load_weights writes it.
  AdapterOptions declared = w.options(false, false, 30);
  if (w.rank == victim) declared.not_loaded = {w.worker->parameter_infos()[0].name};
  message = connect_outcome(w, w.params->parameters(), w.load(), declared);
  EXPECT_NE(message.find("engine 1 worker 0 (world rank 3): parameters declared not loaded (not_loaded) are written by "
                         "load_weights after all: model.embed_tokens.weight (64000 of 64000 elements)"),
            std::string::npos)
      << message;
}

// A rank whose load_weights writes nothing: connect fails on every rank with that cause, naming the rank.
TEST(AdapterFailures, ALoaderThatWritesNothingFailsConnectOnEveryRank) {
  World w;
  const int victim = kTrainers;  // engine 0's worker
  const LoadWeightsFn load = [&w, victim](const CheckpointReader& c, const ParameterSet& p) {
    if (w.rank != victim) w.worker->load_weights(c, p);
  };
  const std::string message = connect_outcome(w, w.params->parameters(), load, w.options(false, false, 30));
  EXPECT_NE(message.find("engine 0 worker 0 (world rank 2): no update would reach"), std::string::npos) << message;
  EXPECT_NE(message.find("Cause: load_weights wrote nothing on this rank"), std::string::npos) << message;
}


// A parameter that load_weights never writes (a rotary cache), declared not loaded, is left alone by every
// update, and a timeout of 0 (none) and one of infinity are accepted.
TEST(AdapterOptionsTest, DeclaredUnwrittenParametersAreLeftAloneAndTimeoutsOfNoneWork) {
  for (const double timeout : {0.0, std::numeric_limits<double>::infinity(), 1e10}) {
    World w;
    AdapterOptions options = w.options(false, true, 30);
    options.timeout_seconds = timeout;
    options.not_loaded = {"rotary.inv_freq"};
    // One more parameter, never written by load_weights.
    std::vector<TensorInfo> infos = w.worker->parameter_infos();
    infos.push_back({"rotary.inv_freq", DType::kF32, {16}});
    HostParameters params(infos);
    w.worker->load_weights(*w.checkpoint, params.parameters());
    const Parameter& cache = params.parameters()[infos.size() - 1];
    std::vector<float> pattern(16);
    for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = 1.5f + static_cast<float>(i);
    std::memcpy(cache.view.data, pattern.data(), sizeof(float) * pattern.size());
    if (w.trainer) {
      SenderAdapter sender(MPI_COMM_WORLD, w.group, params.parameters(), w.tensors, w.load(), options);
      sender.connect();
      w.worker->load_weights(VersionedCheckpoint(*w.checkpoint, 1), params.parameters());
      const Status status = sender.send_weights(1);
      ASSERT_TRUE(status.is_ok()) << "timeout " << timeout << ": " << status.to_string();
      ASSERT_TRUE(sender.shutdown().is_ok());
    } else {
      ReceiverAdapter receiver(MPI_COMM_WORLD, w.group, params.parameters(), w.load(), options);
      while (!receiver.closed()) {
        const PollResult result = receiver.poll_requests();
        ASSERT_NE(result.event, PollResult::Event::kFailed) << "timeout " << timeout << ": " << result.status.to_string();
      }
      EXPECT_EQ(receiver.installed_version(), 1u);
      EXPECT_EQ(std::memcmp(cache.view.data, pattern.data(), sizeof(float) * pattern.size()), 0)
          << "an update wrote into a parameter load_weights never writes";
    }
  }
}

}  // namespace
}  // namespace wb::emu
