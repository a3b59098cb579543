// What wb-replay and wb-bench say when they end after a failure (emu/process/bounded_exit), the faults the tests
// inject (emu/faults/fault_injection), and how a rank is named. The MPI side runs in the fault suite (tests/faults).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "emu/faults/fault_injection.hpp"
#include "emu/frameworks/layout_spec.hpp"
#include "emu/process/bounded_exit.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

TEST(BoundedExit, FirstFailureIsTheEarliestReportedOne) {
  std::vector<nlohmann::json> reports(4);
  reports[0] = {{"failure", ""}, {"failed_at", 0.0}};
  reports[1] = {{"failure", "trainer 1 gave up later"}, {"failed_at", 20.0}};
  reports[2] = {{"failure", "engine 0 worker 0 saw engine 1 worker 0 stop"}, {"failed_at", 10.0}};
  EXPECT_EQ(first_failure(reports, 3), "world rank 2: engine 0 worker 0 saw engine 1 worker 0 stop");
  reports[1]["failure"] = "";
  reports[2]["failure"] = "";
  EXPECT_EQ(first_failure(reports, 3), "world rank 3 did not report within 3 s (stopped or dead)");
  reports[3] = {{"failure", ""}};
  EXPECT_EQ(first_failure(reports, 3), "");
}

TEST(BoundedExit, AVerdictNotHeardSaysSoAndWhatThisRankDid) {
  Verdict missed;
  missed.heard = false;
  const std::string text = verdict_text(missed, 3, "verified 3 of 3 versions");
  EXPECT_NE(text.find("did not hear rank 0's verdict within 3 s"), std::string::npos) << text;
  EXPECT_NE(text.find("own part succeeded (verified 3 of 3 versions)"), std::string::npos) << text;
  EXPECT_EQ(text.find("another rank failed"), std::string::npos) << text;

  Verdict failed;
  failed.failure = "world rank 4: engine 1 worker 0 (world rank 4) stopped";
  const std::string heard = verdict_text(failed, 3, "sent all 3 versions");
  EXPECT_NE(heard.find("the run failed: world rank 4: engine 1 worker 0 (world rank 4) stopped"), std::string::npos) << heard;
}

TEST(FaultInjection, ParsesAndRefuses) {
  const Fault none = Fault::parse("");
  EXPECT_FALSE(none.due(0, 1));
  const Fault stop = Fault::parse("stop,rank=4,version=2,seconds=7.5");
  EXPECT_EQ(stop.kind, "stop");
  EXPECT_TRUE(stop.due(4, 2));
  EXPECT_FALSE(stop.due(4, 3));
  EXPECT_FALSE(stop.due(3, 2));
  EXPECT_DOUBLE_EQ(stop.seconds, 7.5);
  for (const char* bad : {"pause,rank=1,version=2", "stop,rank=1,version=2", "kill,rank=x,version=2", "kill,rank=1",
                          "kill,rank=1,version=2,colour=red", "kill,rank=1,version=2,when=/x", "kill,rank=1,when="})
    EXPECT_THROW(Fault::parse(bad), Error) << bad;
  // By file: not due before the file exists, then due at the first version met and at that one only.
  const std::string file = ::testing::TempDir() + "wb_fault_when_" + std::to_string(::getpid());
  std::remove(file.c_str());
  const Fault when = Fault::parse("kill,rank=1,when=" + file);
  EXPECT_FALSE(when.due(1, 5));
  std::FILE* created = std::fopen(file.c_str(), "w");
  ASSERT_NE(created, nullptr);
  std::fclose(created);
  EXPECT_FALSE(when.due(0, 6));
  EXPECT_TRUE(when.due(1, 6));
  EXPECT_FALSE(when.due(1, 7));
  EXPECT_TRUE(when.due(1, 6));
  std::remove(file.c_str());
}

TEST(FaultInjection, APlacedFaultIsTheProgramsToRunNeverDue) {
  const std::string file = ::testing::TempDir() + "wb_fault_placed_" + std::to_string(::getpid());
  const Fault placed = Fault::parse("kill,rank=0,when=" + file + ",at=500");
  ASSERT_TRUE(placed.placed());
  EXPECT_DOUBLE_EQ(*placed.at_ms, 500);
  EXPECT_FALSE(Fault::parse("kill,rank=0,when=" + file).placed());
  std::FILE* created = std::fopen(file.c_str(), "w");
  ASSERT_NE(created, nullptr);
  std::fclose(created);
  EXPECT_FALSE(placed.due(0, 3));  // not in before_update_hook: the engine job's thread runs it
  EXPECT_EQ(Fault::parse("stop,rank=1,when=" + file + ",at=0,seconds=2").at_ms, 0.0);
  // at=MS goes with a trigger file, for kill or stop (a throw on a thread of its own would end the process).
  for (const std::string& bad : {std::string("kill,rank=0,version=2,at=5"), "throw,rank=0,when=" + file + ",at=5",
                                "kill,rank=0,when=" + file + ",at=-1", "kill,rank=0,when=" + file + ",at=x",
                                "kill,rank=0,when=" + file + ",at=1e10"})
    EXPECT_THROW(Fault::parse(bad), Error) << bad;
  std::remove(file.c_str());
}

TEST(Deployment, NamesWorkersAsTheLibraryDoes) {
  Deployment deployment;
  deployment.trainer = TrainerSpec::parse("tp=2");
  deployment.rollout = RolloutSpec::parse("engines=2,tp=2");
  EXPECT_EQ(deployment.worker_name(1), "trainer 1 (world rank 1)");
  EXPECT_EQ(deployment.worker_name(4), "engine 1 worker 0 (world rank 4)");
  EXPECT_EQ(deployment.worker_name(3), "engine 0 worker 1 (world rank 3)");
}

}  // namespace
}  // namespace wb::emu
