// core/parallel.hpp: every task runs once whatever the thread count, and a failure is reported as a loop in
// order would report it.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/parallel.hpp"

namespace wb {
namespace {

TEST(Parallel, EveryTaskRunsOnceOnAThreadOfItsOwnRange) {
  for (int threads : {0, 1, 2, 5}) {
    std::vector<std::atomic<int>> runs(1000);
    std::vector<int> thread_of(runs.size(), -1);
    run_tasks(runs.size(), threads, [&](std::size_t i, int thread) {
      ++runs[i];
      thread_of[i] = thread;
    });
    for (std::size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(runs[i], 1) << "task " << i << ", " << threads << " threads";
      EXPECT_GE(thread_of[i], 0);
      EXPECT_LT(thread_of[i], task_threads(runs.size(), threads));
    }
  }
  EXPECT_EQ(task_threads(3, 8), 3);
  EXPECT_EQ(task_threads(0, 8), 1);
}

TEST(Parallel, ForEachIndexRethrowsWhatTheLowestIndexThrew) {
  // Blocks of 7: indices 30 and 900 fail, in blocks that may run in either order; 30's error comes back.
  std::atomic<int> done{0};
  try {
    for_each_index(1000, 7, [&](std::size_t i) {
      if (i == 900 || i == 30) throw std::runtime_error("index " + std::to_string(i));
      ++done;
    });
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "index 30");
  }
  EXPECT_EQ(done, 1000 - 2 - 4 - 2);  // the rest of each failed block (31-34, 901-902) is skipped, every other block runs
}

}  // namespace
}  // namespace wb
