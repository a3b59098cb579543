#include "comm/operation.hpp"

#include <mutex>

#include "comm/backoff.hpp"
#include "comm/interrupt.hpp"
#include "core/checks.hpp"

namespace wb::comm {
namespace {

// Operations let go of while pending, kept until MPI completes them, and objects kept for good. Reached
// through a pointer that is never freed, so that what is still pending at exit is neither destroyed under
// MPI nor reported as a leak.
struct Kept {
  std::mutex mutex;
  std::vector<std::unique_ptr<Operation>> operations;
  std::vector<std::shared_ptr<void>> objects;
};
Kept& kept() {
  static Kept* registry = new Kept;
  return *registry;
}

// The deleter of every operation: a pending one joins the kept ones, and those that completed since leave
// (a failed test keeps an operation: it is never freed early).
struct KeepWhilePending {
  void operator()(Operation* operation) const noexcept {
    std::unique_ptr<Operation> owned(operation);
    if (owned->request == MPI_REQUEST_NULL) return;
    int finalized = 0;
    if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) {
      (void)owned.release();  // MPI is gone: nothing completes it any more, nothing may free it either
      return;
    }
    Kept& registry = kept();
    std::lock_guard lock(registry.mutex);
    std::erase_if(registry.operations, [](const std::unique_ptr<Operation>& op) {
      int done = 0;
      return MPI_Test(&op->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done;
    });
    registry.operations.push_back(std::move(owned));
  }
};

}  // namespace

OperationPtr make_operation(std::size_t out_bytes, std::size_t in_bytes) {
  OperationPtr operation(new Operation, KeepWhilePending{});
  operation->out.resize(out_bytes);
  operation->in.resize(in_bytes);
  return operation;
}

void abandon(OperationPtr operation) { operation.reset(); }

void keep_alive(std::shared_ptr<void> object) {
  if (!object) return;
  Kept& registry = kept();
  std::lock_guard lock(registry.mutex);
  registry.objects.push_back(std::move(object));
}

Waiter Waiter::from_settings() { return Waiter{normalize_timeout(timeout_setting()), {}}; }

Status wait_for(const OperationPtr& operation, const Waiter& waiter, bool interruptible, const std::string& what) {
  const double start = local_seconds();
  double served = start;
  Backoff backoff;
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Test(&operation->request, &done, MPI_STATUS_IGNORE);
    // A wait given up on leaves the operation pending: the last pointer to it keeps it (make_operation).
    if (rc != MPI_SUCCESS) {
      return Status(ErrorCode::kMpi, what + ": MPI_Test failed: " + detail::mpi_error_string(rc));
    }
    if (done) return Status::ok();
    // Notices and queries are looked at every few dozen polls, and at least every 100 us: often enough to
    // take a failure notice before a later consequence of it arrives, rarely enough to cost nothing next
    // to the polling.
    const double now = local_seconds();
    if (waiter.service && (polls % 32 == 0 || now - served >= 100e-6)) {
      served = now;
      Status status = waiter.service(interruptible);
      if (!status) return status;
    }
    if (interruptible) {
      if (Status stop = poll_interrupt(); !stop) return Status(stop.code(), what + ": " + stop.message());
    }
    if (now - start > waiter.timeout) {
      return Status(ErrorCode::kTimeout, what + " did not complete within " + seconds_text(waiter.timeout));
    }
    backoff.pause();
  }
}

void wait_or_throw(const OperationPtr& operation, const Waiter& waiter, const std::string& what) {
  throw_if_error(wait_for(operation, waiter, false, what));
}

bool complete_within(std::span<MPI_Request> requests, double seconds) noexcept {
  const double deadline = local_seconds() + seconds;
  std::int64_t longest_sleep_us = 100;
  try {
    longest_sleep_us = idle_sleep_setting();
  } catch (const Error&) {  // a bad WB_IDLE_SLEEP_US was refused at set-up already
  }
  Backoff backoff(longest_sleep_us);
  for (;;) {
    bool pending = false;
    for (MPI_Request& request : requests) {
      if (request == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      pending = pending || !done;
    }
    if (!pending) return true;
    if (local_seconds() > deadline) return false;  // the requests stay pending: MPI owns them
    backoff.pause();
  }
}

}  // namespace wb::comm
