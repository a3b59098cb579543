// The trainers' update mark, the bench's knob that places a joiner's knock or an engine's kill in an update
// (emu/setup/update_mark): written whole, read back, and waited for the next update and into it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stop_token>
#include <string>
#include <thread>

#include "emu/process/bounded_exit.hpp"
#include "emu/setup/update_mark.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

std::string mark_path(const char* name) { return ::testing::TempDir() + name + std::to_string(::getpid()); }

TEST(UpdateMark, NoneUntilWrittenThenTheLastWritten) {
  const std::string path = mark_path("wb_update_mark_");
  std::remove(path.c_str());
  EXPECT_EQ(UpdateMark::read(path).version, 0u);
  UpdateMark{7, 1796598690.25}.write(path);
  UpdateMark{8, 1796598692.5}.write(path);
  const UpdateMark read = UpdateMark::read(path);
  EXPECT_EQ(read.version, 8u);
  EXPECT_DOUBLE_EQ(read.began, 1796598692.5);
  std::remove(path.c_str());
}

TEST(UpdateMark, WaitsForTheNextUpdateThenIntoIt) {
  const std::string path = mark_path("wb_update_mark_next_");
  UpdateMark{3, wall_seconds()}.write(path);  // an update in flight when the wait begins: not the one
  double began = 0;
  std::jthread trainer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    began = wall_seconds();
    UpdateMark{4, began}.write(path);
  });
  const UpdateMark next = UpdateMark::wait_into_next(path, 200, 10);
  const double returned = wall_seconds();
  trainer.join();
  EXPECT_EQ(next.version, 4u);
  EXPECT_DOUBLE_EQ(next.began, began);
  EXPECT_GE(returned - began, 0.2);  // 200 ms into update 4 at the earliest
  std::remove(path.c_str());
}

TEST(UpdateMark, NoNextUpdateTimesOutAndAStopEndsTheWait) {
  const std::string path = mark_path("wb_update_mark_none_");
  UpdateMark{5, wall_seconds()}.write(path);
  try {
    (void)UpdateMark::wait_into_next(path, 0, 0.2);
    ADD_FAILURE() << "no update after version 5, and no timeout";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(error.what()).find("no update after version 5"), std::string::npos) << error.what();
  }
  std::stop_source stop;
  std::jthread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop.request_stop();
  });
  EXPECT_EQ(UpdateMark::wait_into_next(path, 0, 30, stop.get_token()).version, 0u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace wb::emu
