// Operations with deadlines: a non-blocking MPI operation owned together with the buffers it reads and
// writes, and the one way the library waits for it (wait_for: a deadline, the fault channel served while
// waiting, the backoff of comm/backoff.hpp). Any communicator: an intracommunicator, or an
// intercommunicator to a job that joined through MPI_Comm_connect / MPI_Comm_accept.
//
// A wait given up on (its deadline passed, a peer announced a failure, an exception unwound past it) must
// leave no MPI request pointing at freed memory: an operation made by make_operation is never freed while
// its request is pending. When the last pointer to a pending one goes, it is kept with its buffers until
// MPI completes it (a late peer may still join a collective, or match a receive).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/deadline.hpp"
#include "weightbridge/status.hpp"

namespace wb::comm {

/// A non-blocking MPI operation and what it reads and writes, owned together. Made by make_operation only.
struct Operation {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<std::byte> out, in;
  /// Anything else MPI reads while the operation runs (the counts and displacements of a v-collective).
  std::shared_ptr<void> also;
};
using OperationPtr = std::shared_ptr<Operation>;

/// An operation whose bytes are `out_bytes` to send and `in_bytes` to receive; when its last pointer goes
/// while its request is pending, it is kept until MPI completes it (tested whenever another is kept).
OperationPtr make_operation(std::size_t out_bytes = 0, std::size_t in_bytes = 0);

/// Lets go of an operation nobody waits for (a notice, an acknowledgement): it is kept until it completes.
/// What dropping the pointer does too; said where it is meant.
void abandon(OperationPtr operation);

/// Keeps `object` for the rest of the process (never destroyed, never reported as a leak): memory MPI or a
/// peer may still use once a wait for it was given up and no request is left to test.
void keep_alive(std::shared_ptr<void> object);

/// What every wait does besides polling: its deadline, and a service run every few polls (a fault channel:
/// answer peers' queries, take failure notices). `service(interruptible)` returns a peer's failure when one
/// was announced and the wait may end on it.
struct Waiter {
  double timeout = kNoDeadline;
  std::function<Status(bool interruptible)> service;

  /// The deadline of the timeout_seconds setting, nothing served: what the blocking exchanges of tools and
  /// tests wait with.
  static Waiter from_settings();
};

/// Polls `operation` until it completes, `waiter.timeout` passes (kTimeout: "<what> did not complete within
/// N s"; the operation is abandoned), or, when `interruptible`, the service returns a failure (returned as
/// is; abandoned too). Pauses through a Backoff between polls.
Status wait_for(const OperationPtr& operation, const Waiter& waiter, bool interruptible, const std::string& what);
/// The same, throwing the failure (set-up paths).
void wait_or_throw(const OperationPtr& operation, const Waiter& waiter, const std::string& what);

/// Polls raw requests (whose buffers the caller keeps) until all completed (true) or `seconds` passed, or a
/// test failed (false: some may still be pending, and MPI may still read their buffers). For teardowns.
bool complete_within(std::span<MPI_Request> requests, double seconds) noexcept;

}  // namespace wb::comm
