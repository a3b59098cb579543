#include "coord/transfer_thread.hpp"

#include <chrono>
#include <cmath>
#include <exception>

namespace wb::coord {

TransferThread::TransferThread() : thread_([this] { loop(); }) {}

TransferThread::~TransferThread() { join(); }

void TransferThread::join() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void TransferThread::start(std::function<Status()> job) {
  {
    std::unique_lock lock(mutex_);
    job_ = std::move(job);
    active_ = running_ = true;
  }
  changed_.notify_all();
}

bool TransferThread::active() const {
  std::unique_lock lock(mutex_);
  return active_;
}

bool TransferThread::finished() const {
  std::unique_lock lock(mutex_);
  return active_ && !running_;
}

bool TransferThread::idle() const {
  std::unique_lock lock(mutex_);
  return !running_;
}

bool TransferThread::wait_finished(double seconds) {
  std::unique_lock lock(mutex_);
  const auto done = [this] { return !running_; };
  if (!std::isfinite(seconds)) {
    changed_.wait(lock, done);
    return true;
  }
  return changed_.wait_for(lock, std::chrono::duration<double>(seconds), done);
}

Status TransferThread::wait(const comm::Waiter& waiter, const std::string& what) {
  const double start = comm::local_seconds();
  std::unique_lock lock(mutex_);
  if (!active_) return Status::ok();
  while (running_) {
    // Short waits, so that queries are answered and notices taken meanwhile (never a clock duration
    // built from the timeout, which may be infinite).
    changed_.wait_for(lock, std::chrono::milliseconds(2), [this] { return !running_; });
    if (!running_) break;
    lock.unlock();
    Status status = waiter.service ? waiter.service(true) : Status::ok();
    if (status && comm::local_seconds() - start > waiter.timeout)
      status = Status(ErrorCode::kTimeout, what + " did not finish within " + comm::seconds_text(waiter.timeout));
    lock.lock();
    if (!status && running_) return status;
  }
  active_ = false;
  return result_;
}

void TransferThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || (running_ && job_); });
    if (!job_) return;  // stopping, nothing left to run
    std::function<Status()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    Status result;
    try {
      result = job();
    } catch (const std::exception& error) {
      result = Status(ErrorCode::kInternal, std::string("transfer thread: ") + error.what());
    }
    lock.lock();
    result_ = std::move(result);
    running_ = false;
    changed_.notify_all();
  }
}

}  // namespace wb::coord
