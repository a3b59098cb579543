// A trainer job that starts with no engine at all (issue 31): a world of trainers only constructs and
// connects its adapters, its load_weights is still probed (a bad one fails connect on every trainer), and
// send_weights returns at once in every mode, sending nothing. Its join port closes on every path, an
// adapter destroyed by an exception included.
#include <gtest/gtest.h>
#include <mpi.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/join.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::emu {
namespace {

struct Trainers {
  int rank = 0, size = 0;
  ModelConfig model;
  std::vector<TensorInfo> tensors;
  std::unique_ptr<SyntheticCheckpoint> checkpoint;
  std::unique_ptr<EmulatedWorker> worker;
  std::unique_ptr<HostParameters> params;

  Trainers() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ScaleOptions scale;
    scale.num_layers = 2;
    model = scale_model(load_named_model_config("qwen3-30b-a3b"), scale);
    tensors = model_tensors(model);
    checkpoint = std::make_unique<SyntheticCheckpoint>(tensors, 7);
    worker = make_trainer_worker(model, TrainerSpec::parse("tp=" + std::to_string(size)), rank);
    params = std::make_unique<HostParameters>(worker->parameter_infos());
    worker->load_weights(*checkpoint, params->parameters());
  }
  LoadWeightsFn load() const {
    return [this](const CheckpointReader& c, const ParameterSet& p) { worker->load_weights(c, p); };
  }
};

struct Mode {
  const char* name;
  bool sender_staging;
};

class NoEngine : public ::testing::TestWithParam<Mode> {};

TEST_P(NoEngine, SendWeightsSucceedsAtOnceAndSendsNothing) {
  Trainers t;
  AdapterOptions options;
  options.sender_staging = GetParam().sender_staging;
  options.timeout_seconds = 30;
  SenderAdapter sender(MPI_COMM_WORLD, MPI_COMM_WORLD, t.params->parameters(), t.tensors, t.load(), options);
  sender.connect();
  ASSERT_TRUE(sender.connected());
  EXPECT_EQ(sender.summary().workers, t.size);
  EXPECT_EQ(sender.summary().rounds, 0);
  EXPECT_EQ(sender.summary().bytes_per_update, 0);
  // Ranks enter send_weights at different times: none waits for another (nothing is collective there).
  if (t.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (std::uint64_t v = 1; v <= 4; ++v) {
    const Status status = sender.send_weights(v);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    EXPECT_EQ(sender.stats().version, v);
  }
  // A version that does not increase is still refused.
  EXPECT_FALSE(sender.send_weights(4).is_ok());
  EXPECT_TRUE(sender.wait().is_ok());
  const AdapterStats stats = sender.stats();
  ASSERT_EQ(stats.history.size(), 4u);
  for (std::size_t i = 0; i < stats.history.size(); ++i) {
    EXPECT_EQ(stats.history[i].version, i + 1);
    EXPECT_TRUE(stats.history[i].completed);
    EXPECT_EQ(stats.history[i].bytes_written, 0);
  }
  EXPECT_EQ(stats.bytes_written, 0);
  EXPECT_TRUE(sender.shutdown().is_ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, NoEngine, ::testing::Values(Mode{"sync", false}, Mode{"sender_staged", true}),
                         [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

// With no engine to send to, the trainers' load_weights is probed all the same: one that reads a tensor the
// checkpoint does not have fails connect on every trainer, naming the rank and the tensor.
TEST(NoEngineFailures, ABadTrainerLoaderFailsConnectOnEveryTrainer) {
  Trainers t;
  const LoadWeightsFn load = [&t](const CheckpointReader& c, const ParameterSet& p) {
    t.worker->load_weights(c, p);
    if (t.rank == 1) {
      float value = 0;
      c.read_box("model.no_such_tensor", Box{{0}, {1}}, &value);
    }
  };
  AdapterOptions options;
  options.timeout_seconds = 30;
  SenderAdapter sender(MPI_COMM_WORLD, MPI_COMM_WORLD, t.params->parameters(), t.tensors, load, options);
  std::string message;
  try {
    sender.connect();
  } catch (const Error& error) {
    message = error.status().message();
  }
  EXPECT_NE(message.find("trainer 1 (world rank 1)"), std::string::npos) << message;
  EXPECT_NE(message.find("model.no_such_tensor"), std::string::npos) << message;
  EXPECT_FALSE(sender.connected());
}

// A trainer job that takes joins by address, whose SenderAdapter is destroyed by an exception without
// shutdown() (on every trainer, or on trainer 0 only while trainer 1 shuts down): the accept thread on trainer
// 0 ends (trainer 1 knocks with the secret, no step of the trainers needed) and the address file goes, well
// within the timeout. Before, trainer 0 waited twice the timeout for a knock that never came, left the
// thread in MPI_Comm_accept, and MPI_Finalize hung.
class JoinPortAtAnException : public ::testing::TestWithParam<bool> {};

TEST_P(JoinPortAtAnException, TheAcceptThreadEndsAndTheAddressFileGoes) {
  const bool every_trainer_throws = GetParam();
  Trainers t;
  int id = t.rank == 0 ? static_cast<int>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/wb-join-test-" + std::to_string(id) + (every_trainer_throws ? "-all" : "-one");
  AdapterOptions options;
  options.timeout_seconds = 10;
  options.join_address = path;
  std::chrono::steady_clock::time_point thrown;
  try {
    SenderAdapter sender(MPI_COMM_WORLD, MPI_COMM_WORLD, t.params->parameters(), t.tensors, t.load(), options);
    sender.connect();
    for (std::uint64_t v = 1; v <= 2; ++v) ASSERT_TRUE(sender.send_weights(v).is_ok());
    struct stat st {};
    if (t.rank == 0) {
      ASSERT_EQ(::stat(path.c_str(), &st), 0) << "no address file " << path;
    }
    thrown = std::chrono::steady_clock::now();
    if (every_trainer_throws || t.rank == 0) throw std::runtime_error("the training step failed");
    (void)sender.shutdown();  // fails once trainer 0's departure is known; the port closes either way
  } catch (const std::runtime_error&) {
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - thrown).count();
  EXPECT_LT(seconds, 5.0) << "trainer " << t.rank << ": the adapter's end took " << seconds << " s";
  MPI_Barrier(MPI_COMM_WORLD);
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "the address file " << path << " is still there";
  ::unlink(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Paths, JoinPortAtAnException, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "EveryTrainerThrows" : "TrainerZeroThrows");
                         });

// A port keeps its address file touched (JoinPort::keep_fresh) while it takes joins, and a joiner connects
// to a replica only where it sees the touches (comm::address_touched): a file nobody touches (the process
// behind it stopped or dead) is not, within the bound; the port's file, from either process of the job, is,
// within a few touches. A joiner waiting to be taken watches the same touches (comm::AddressWatch): alive
// for as long as the port runs, silent once a file went untouched for its bound, gone once removed.
TEST(JoinPortFresh, AJoinerSeesTheTouchesOfARunningPortOnly) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int id = rank == 0 ? static_cast<int>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/wb-fresh-test-" + std::to_string(id);
  const std::string still = path + ".untouched";
  if (rank == 0) std::ofstream(still) << "a file nobody touches\n";
  std::unique_ptr<comm::JoinPort> port;
  if (rank == 0) {
    port = std::make_unique<comm::JoinPort>(path, 10.0);
    port->keep_fresh(0.1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto began = std::chrono::steady_clock::now();
  EXPECT_TRUE(comm::address_touched(path, 1.0)) << "rank " << rank << ": the port's address was not touched within 1 s";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(), 1.0);
  EXPECT_FALSE(comm::address_touched(still, 0.3)) << "rank " << rank << ": a file nobody touches was seen touched";
  EXPECT_FALSE(comm::address_touched(path + ".absent", 0.1));
  {
    // The first look reads the time each file has; silence counts from there.
    comm::AddressWatch running(path, 0.6), untouched(still, 0.6);
    // EXPECT, not ASSERT: a rank that returned early would leave the other in the collectives below.
    EXPECT_EQ(untouched.look(), comm::AddressWatch::Verdict::kAlive);
    for (const double start = comm::local_seconds(); comm::local_seconds() - start < 2.0;) {
      const comm::AddressWatch::Verdict seen = running.look();
      EXPECT_EQ(seen, comm::AddressWatch::Verdict::kAlive) << "rank " << rank << ": a running port's address seen silent or gone";
      if (seen != comm::AddressWatch::Verdict::kAlive) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(untouched.look(), comm::AddressWatch::Verdict::kSilent) << "rank " << rank << ": 2 s without a touch, not silent";
    const Status why = untouched.check();
    EXPECT_EQ(why.code(), ErrorCode::kTimeout);
    EXPECT_NE(why.message().find(still), std::string::npos) << why.message();
    EXPECT_EQ(comm::AddressWatch(path + ".absent", 10.0).look(), comm::AddressWatch::Verdict::kGone);
  }
  comm::AddressWatch waiting(path, 10.0);
  EXPECT_EQ(waiting.look(), comm::AddressWatch::Verdict::kAlive) << "rank " << rank;
  MPI_Barrier(MPI_COMM_WORLD);  // both looked before rank 0 stops the port (its broadcasts below do not wait)
  // The port's end: its file goes and its touches end; rank 1 knocks to end the accept thread.
  comm::JoinAddress address;
  if (rank == 0) address = port->address();
  std::string text = address.port + "\n" + address.secret;
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  text.resize(static_cast<std::size_t>(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) port->stop_accepting();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) {
    EXPECT_TRUE(comm::knock({text.substr(0, text.find('\n')), text.substr(text.find('\n') + 1)}, 10.0));
  }
  port.reset();
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(comm::address_touched(path, 0.3)) << "the stopped port's address is still touched";
  // Its file removed: a joiner waiting to be taken learns so at its next look, not after its bound.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(waiting.look(), comm::AddressWatch::Verdict::kGone) << "rank " << rank;
  EXPECT_EQ(waiting.check().code(), ErrorCode::kNotFound);
  if (rank == 0) ::unlink(still.c_str());
}

}  // namespace
}  // namespace wb::emu
