// The control plane's pieces that need no MPI job: deadlines as given and said, the one wait policy, the
// status as bytes, and the records connect sends in the byte codec (tests/mpi/test_comm_mpi.cpp runs the
// collectives).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "../support/expect_error.hpp"
#include "comm/backoff.hpp"
#include "comm/dead_job.hpp"
#include "comm/deadline.hpp"
#include "comm/status_message.hpp"
#include "coord/connect_records.hpp"
#include "coord/connection.hpp"
#include "core/settings.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;
using wb::testing::expect_error;

// Open MPI 4.1's give-up time on a dead job's addresses by pmix_server_max_wait, as measured here (a connect to
// the port of a job killed after it published its half: 1 -> 5.02 s, 3 -> 6.02 s, 5 -> 5.02 s, 6 -> 6.02 s; 2, 4
// and 10 still inside MPI after 25 s, 15 after 20 s, the default after 70 s).
TEST(CommDeadJob, GiveUpSecondsAsMeasured) {
  EXPECT_EQ(comm::dead_job_give_up_seconds(1), 5.0);
  EXPECT_EQ(comm::dead_job_give_up_seconds(3), 6.0);
  EXPECT_EQ(comm::dead_job_give_up_seconds(5), 5.0);
  EXPECT_EQ(comm::dead_job_give_up_seconds(6), 6.0);
  for (int never : {2, 4, 10, 15, 0, -1}) EXPECT_FALSE(comm::dead_job_give_up_seconds(never).has_value()) << never;
}

TEST(CommDeadline, TimeoutsAsUsersGiveThem) {
  EXPECT_EQ(comm::normalize_timeout(2.5), 2.5);
  EXPECT_EQ(comm::normalize_timeout(0), comm::kNoDeadline);
  // Refused where it is given (it used to mean none here and fail the first wait "within -1 s" elsewhere).
  expect_error([] { (void)comm::normalize_timeout(-1); }, ErrorCode::kInvalidArgument,
               {"timeout_seconds -1", "negative", "0 or inf: no deadline"});
  EXPECT_EQ(comm::normalize_timeout(std::numeric_limits<double>::infinity()), comm::kNoDeadline);
  EXPECT_THROW((void)comm::normalize_timeout(std::nan("")), Error);
  EXPECT_EQ(comm::seconds_text(2), "2 s");
  EXPECT_EQ(comm::seconds_text(comm::kNoDeadline), "no deadline");
  EXPECT_EQ(comm::default_timeout_seconds(), 120.0);
}

TEST(CommDeadline, AdapterOptionsOutOfTheirRangeAreRefusedWhereGiven) {
  AdapterOptions options;
  options.timeout_seconds = -1;
  expect_error([&] { (void)coord::resolve_options(options); }, ErrorCode::kInvalidArgument, {"timeout_seconds -1"});
  options.timeout_seconds = 0;  // 0 and inf keep meaning no deadline
  EXPECT_EQ(coord::resolve_options(options).timeout_seconds, comm::kNoDeadline);
  options.timeout_seconds = std::numeric_limits<double>::infinity();
  EXPECT_EQ(coord::resolve_options(options).timeout_seconds, comm::kNoDeadline);
  options.node = -7;  // the range starts at -1 (this machine)
  expect_error([&] { (void)coord::resolve_options(options); }, ErrorCode::kInvalidArgument, {"node -7", "[-1, "});
  options.node = -1;
  EXPECT_EQ(coord::resolve_options(options).node, -1);
}

TEST(CommBackoff, YieldsWhileYoungThenSleepsNoLongerThanTheCap) {
  comm::Backoff backoff(200);
  EXPECT_LT(backoff.idle_seconds(), 0.5);
  // Once idle for a while, each pause sleeps at most the cap (200 us) plus the scheduler's slack: 50 pauses
  // take at least their sleeps and far less than a pause without a cap would (idle/8 grows to ~1 ms here).
  const auto start = std::chrono::steady_clock::now();
  while (backoff.idle_seconds() < 0.01) backoff.pause();
  for (int i = 0; i < 50; ++i) backoff.pause();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.01 + 50 * 150e-6);
  backoff.progressed();
  EXPECT_LT(backoff.idle_seconds(), 0.01);
  // Cap 0 only yields: a thousand pauses take no sleep.
  comm::Backoff yielding(0);
  for (int i = 0; i < 1000; ++i) yielding.pause();
  EXPECT_GE(yielding.idle_seconds(), 0.0);
}

TEST(CommBackoff, AStalledWaitSleepsUpToTenTimesTheCap) {
  // Idle for 100 ms, a wait is a stall: each pause then sleeps up to 2 ms (ten times the 200 us cap; idle/8
  // is past 12 ms), so 20 pauses take at least 40 ms; at the plain cap they would take about 4 ms.
  comm::Backoff backoff(200);
  while (backoff.idle_seconds() < 0.1) backoff.pause();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) backoff.pause();
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20 * 2e-3);
}

TEST(CommPace, AStepAfterAQuietOneWaitsTheRestOfTheInterval) {
  const auto seconds_of = [](const std::function<void()>& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // A step not paced returns at once; one paced by mistake would sleep 100 s (the bound 50 s: no flake).
  comm::Pace long_interval(100);
  EXPECT_LT(seconds_of([&] { long_interval.before_step(); }), 50);  // nothing before: no pause
  long_interval.after_step(false);                                   // a step that found something
  EXPECT_LT(seconds_of([&] { long_interval.before_step(); }), 50);
  comm::Pace pace(0.05);
  pace.after_step(true);
  EXPECT_GE(seconds_of([&] { pace.before_step(); }), 0.045);  // the rest of 50 ms (a sleep takes no less)
  comm::Pace unpaced(0);
  unpaced.after_step(true);
  EXPECT_LT(seconds_of([&] { unpaced.before_step(); }), 50);
}

TEST(CommBackoff, TheSettingDeclaresItsRange) {
  SettingBase* setting = find_setting("idle_sleep_us");
  ASSERT_NE(setting, nullptr);
  EXPECT_EQ(setting->range_text(), "[0, 100000]");
  EXPECT_EQ(comm::idle_sleep_setting(), 100);
}

TEST(CommStatusMessage, RoundTripsAndRefusesWhatIsNotOne) {
  const Status status(ErrorCode::kTimeout, "engine 1 worker 0 (world rank 4): a wait did not complete");
  std::int64_t a = 0, b = 0;
  std::vector<int> ranks;
  const Status back = comm::decode_status(comm::encode_status(status, 7, -3, {4, 5}), &a, &b, &ranks);
  EXPECT_EQ(back.code(), ErrorCode::kTimeout);
  EXPECT_EQ(std::string(back.message()), std::string(status.message()));
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, -3);
  EXPECT_EQ(ranks, (std::vector<int>{4, 5}));
  std::vector<std::byte> bytes = comm::encode_status(status, 0, 0, {1});
  EXPECT_EQ(comm::decode_status(std::span(bytes).first(10)).code(), ErrorCode::kCorruptData);
  bytes[24] = std::byte{0x7f};  // the rank count, far beyond the bytes
  EXPECT_EQ(comm::decode_status(bytes).code(), ErrorCode::kCorruptData);
}

TEST(ConnectRecords, AWorkerConfigurationRoundTripsThroughTheCodec) {
  coord::WorkerConfig config;
  config.trainer = true;
  config.engine = -1;
  config.node_key = (1LL << 40) + 12345;
  config.sender_staging = true;
  config.verify = true;
  config.buffer_bytes = 1LL << 30;
  config.pipeline_depth = 2;
  EXPECT_EQ(coord::decode_worker_config(coord::encode_worker_config(config)), config);
  config.trainer = false;
  config.engine = 3;
  config.receiver_staging = true;
  EXPECT_EQ(coord::decode_worker_config(coord::encode_worker_config(config)), config);
}

TEST(ConnectRecords, ACorruptWorkerConfigurationIsRefused) {
  coord::WorkerConfig config;
  config.pipeline_depth = 2;
  std::vector<std::byte> bytes = coord::encode_worker_config(config);
  testing::expect_error([&] { (void)coord::decode_worker_config(std::span(bytes).first(bytes.size() - 1)); },
                        ErrorCode::kCorruptData, {"worker configuration", "truncated"});
  bytes.push_back(std::byte{0});
  testing::expect_error([&] { (void)coord::decode_worker_config(bytes); }, ErrorCode::kCorruptData, {"trailing bytes"});
  bytes.pop_back();
  bytes[0] = std::byte{9};
  testing::expect_error([&] { (void)coord::decode_worker_config(bytes); }, ErrorCode::kCorruptData, {"version 9"});
}

TEST(ConnectRecords, ASummaryRoundTripsAndItsListsMustAgree) {
  TransferSummary s;
  s.workers = 3;
  s.trainer_nodes = 1;
  s.rollout_nodes = 1;
  s.rounds = 17;
  s.model_bytes = 1LL << 36;
  s.max_node_need_bytes = 12345;
  s.bytes_per_update = 99;
  s.inter_node_bytes = 98;
  s.t_min_seconds = 0.153;
  s.simulated_seconds = 0.16125;
  s.node_of_worker = {0, 1, 1};
  s.node_ingress_bytes = {0, 98};
  s.node_egress_bytes = {98, 0};
  s.node_need_bytes = {0, 12345};
  const TransferSummary back = coord::decode_summary(coord::encode_summary(s));
  EXPECT_EQ(back.workers, 3);
  EXPECT_EQ(back.rounds, 17);
  EXPECT_EQ(back.model_bytes, 1LL << 36);
  EXPECT_EQ(back.t_min_seconds, 0.153);  // bit for bit
  EXPECT_EQ(back.simulated_seconds, 0.16125);
  EXPECT_EQ(back.node_of_worker, s.node_of_worker);
  EXPECT_EQ(back.node_ingress_bytes, s.node_ingress_bytes);
  EXPECT_EQ(back.node_egress_bytes, s.node_egress_bytes);
  EXPECT_EQ(back.node_need_bytes, s.node_need_bytes);
  s.node_of_worker = {0, 1, 2};  // a node that has no figures
  testing::expect_error([&] { (void)coord::decode_summary(coord::encode_summary(s)); }, ErrorCode::kCorruptData,
                        {"transfer summary", "a worker on node 2"});
  s.node_of_worker = {0, 1};
  testing::expect_error([&] { (void)coord::decode_summary(coord::encode_summary(s)); }, ErrorCode::kCorruptData,
                        {"2 workers' nodes for 3 workers"});
}

}  // namespace
}  // namespace wb
