// The background thread of a staged side: it runs one transfer (RoundExecutor::run_update) at a time while
// the caller's thread goes on training or generating. Created once, at construction of the adapter.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "comm/operation.hpp"
#include "weightbridge/status.hpp"

namespace wb::coord {

class TransferThread {
 public:
  TransferThread();
  ~TransferThread();  // join()
  /// Waits for a running job (each job ends within the executor's timeout), then stops the thread.
  void join();
  TransferThread(const TransferThread&) = delete;
  TransferThread& operator=(const TransferThread&) = delete;

  /// Runs `job` on the thread. Precondition: no job running or unclaimed (wait() returned since).
  void start(std::function<Status()> job);
  /// A job was started and has not been claimed by wait().
  bool active() const;
  /// The started job has finished (its result is ready for wait()).
  bool finished() const;
  /// No job runs (none started, claimed, or finished): nothing of it reads or writes its buffers any more.
  bool idle() const;
  /// Waits until no job runs, at most `seconds` (infinite: no limit), without claiming its result; false
  /// when it still runs.
  bool wait_finished(double seconds);
  /// The caller is this thread (its job's own work after the transfer: SenderAdapter::State::rebuild_behind).
  bool is_current() const { return std::this_thread::get_id() == thread_.get_id(); }
  /// Waits for the job and returns its status (ok when none was started). Returns early, the job still
  /// running and unclaimed, with kTimeout naming `what` when it runs past the waiter's timeout, or with the
  /// failure a peer announced (the job, which watches the same notices, ends soon after).
  Status wait(const comm::Waiter& waiter, const std::string& what);

 private:
  void loop();
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::function<Status()> job_;
  bool active_ = false, running_ = false, stopping_ = false;
  Status result_;
  std::thread thread_;
};

}  // namespace wb::coord
