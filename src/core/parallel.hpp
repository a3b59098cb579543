#pragma once
// Independent tasks on a few threads of this process: the planner's candidate exchanges and every rank's
// round schedule, which rank 0 makes at connect on the cores of its host.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace wb {

/// Threads to use for `tasks` independent tasks when the caller asks for `threads` (0: the machine's
/// cores, at most 16): never more than there are tasks, at least one.
inline int task_threads(std::size_t tasks, int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(static_cast<std::size_t>(threads), tasks)));
}

/// Calls task(i, thread) for every i in [0, tasks) on `threads` threads (task_threads; the calling thread is
/// thread 0), each taking the next task as it finishes one. The first exception a task throws is rethrown
/// here once every thread has stopped; the tasks not yet started are then skipped.
template <class Task>
void run_tasks(std::size_t tasks, int threads, Task&& task) {
  threads = task_threads(tasks, threads);
  std::atomic<std::size_t> next{0};
  std::mutex lock;
  std::exception_ptr failure;
  const auto work = [&](int thread) {
    try {
      for (std::size_t i = next++; i < tasks; i = next++) task(i, thread);
    } catch (...) {
      const std::lock_guard<std::mutex> guard(lock);
      if (!failure) failure = std::current_exception();
      next = tasks;  // the others stop at their next task
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

/// Calls work(i) for every i in [0, count), in blocks of `block` on the machine's cores. Where some fail,
/// rethrows what the lowest i threw, as a loop in order would have: errors name the same thing on any host.
template <class Work>
void for_each_index(std::size_t count, std::size_t block, Work&& work) {
  block = std::max<std::size_t>(1, block);
  const std::size_t blocks = (count + block - 1) / block;
  std::vector<std::exception_ptr> failures(blocks);
  run_tasks(blocks, 0, [&](std::size_t b, int) {
    try {
      for (std::size_t i = b * block; i < std::min(count, (b + 1) * block); ++i) work(i);
    } catch (...) {
      failures[b] = std::current_exception();
    }
  });
  for (const std::exception_ptr& failure : failures)
    if (failure) std::rethrow_exception(failure);
}

}  // namespace wb
