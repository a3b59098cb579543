// Groups: the ranks of a communicator that run the same numbered steps in the same order (the trainers, one
// engine, the whole job at connect). Each step is one MPI_Iallreduce (MAX) of a small record: every rank's
// status and a few values, so that all of them take the same decision at the same step.
//
// Failing within a bounded time rests on two rules here (the others are the fault channel's, coord/):
//   - a step that one member gave up on is void on every member, even on one that completes it later (a
//     rank that was stopped and resumed): it is never acted on;
//   - a step that decides an install ("commit") is void when its ranks entered it too far apart for all of
//     them to have seen it complete before their deadline, so that either all of them install or none does.
//
// A group is built from a communicator and the names of its ranks (ids its StepWatch understands: world
// ranks for the adapters). A group whose members change is a new Group over the new communicator.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/operation.hpp"

namespace wb::comm {

/// What a group's steps ask of the failure notices around them (the coordinator's fault channel).
class StepWatch {
 public:
  virtual ~StepWatch() = default;
  /// This rank enters step `step` (`what`) and waits on `waits` there (for the answers to peers' queries).
  virtual void entering(std::uint64_t step, std::string what, std::vector<int> waits) = 0;
  /// True when a member of this rank's group announced giving up at step `step` or earlier: that step did
  /// not complete there, so it is void here too.
  virtual bool voids(std::uint64_t step) = 0;
  /// The first failure a peer announced; ok while none did.
  virtual Status announced() = 0;
  /// After a step timed out waiting on `members`: who holds it up ("; it comes down to ..."), or "".
  virtual std::string trace(const std::vector<int>& members, double seconds) = 0;
};

class Group {
 public:
  static constexpr int kValues = 4;  // what a step carries besides its own bookkeeping
  /// `members`: the name (id) of each rank of `comm`, by rank; `self`: this rank's. With members, a step
  /// that a member gave up on (StepWatch::voids) is void, and a timeout names who held it up; without
  /// (a step over the whole job at connect), a step is decided by its outcome alone. `watch` may be null
  /// (tools and tests without a fault channel).
  Group(MPI_Comm comm, std::string name, StepWatch* watch, std::vector<int> members = {}, int self = -1);

  /// One step: every rank gives its status and `values`; returns the status of the lowest failing rank
  /// (its message whole; a cause before a consequence: any error before a timeout) or ok, and the
  /// element-wise maximum of `values` in `values`. A void step fails with the reason of the rank that gave
  /// up. A `commit` step also fails on every rank when its ranks entered it further apart than the timeout
  /// allows (see the file comment). `completed` (optional) tells whether the step itself completed, i.e.
  /// whether a failure returned is a rank's own status rather than the step's (a timeout, a void).
  Status step(const Status& mine, std::span<std::int64_t, kValues> values, const Waiter& waiter, const std::string& what,
              bool commit = false, bool* completed = nullptr);
  Status step(const Status& mine, const Waiter& waiter, const std::string& what, bool commit = false,
              bool* completed = nullptr);

  /// The first step this rank did not see complete (what it announces when it gives up).
  std::uint64_t first_incomplete() const { return completed_; }
  MPI_Comm comm() const { return comm_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& members() const { return members_; }

  /// The clock every rank reads entry times on (a common one: world rank 0's), as an offset to
  /// local_seconds().
  void set_clock_offset(double offset) { clock_offset_ = offset; }

 private:
  Status broadcast_failure(int root, const Status& mine, const Waiter& waiter, const std::string& what);
  std::vector<int> others() const;

  MPI_Comm comm_;
  std::string name_;
  StepWatch* watch_ = nullptr;
  std::vector<int> members_;
  int self_ = -1;
  int rank_ = 0, size_ = 1;
  std::uint64_t next_ = 0, completed_ = 0;
  double clock_offset_ = 0;
};

}  // namespace wb::comm
