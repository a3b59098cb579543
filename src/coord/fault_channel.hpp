// Failure notices between ranks, and the answers to "where are you?". Failing within a bounded time
// (docs/architecture.md, "Fail loudly, never hang") rests on the rules of comm/ (every wait has a deadline; a
// wait given up on leaves no request pointing at freed memory; a void group step is void everywhere) and on
// this one: a rank that gives up tells its neighbours at once, and they give up too, so the whole job fails
// within about one timeout of the first rank noticing, not one timeout per hop.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.hpp"
#include "comm/operation.hpp"
#include "coord/roles.hpp"
#include "weightbridge/status.hpp"

namespace wb::coord {

/// Tells a rank's neighbours that it gave up and learns when one of them did; answers "where are you?"
/// queries. A rank's neighbours are chosen so that one stopped rank cannot cut the others off and a wave of
/// notices costs O(ranks) messages: trainer ranks 0 and 1 (the "heads") tell every trainer and the heads of
/// every engine; engine heads tell their engine and the trainer heads; every other rank tells its group's
/// heads and the trainer heads. A rank that learns of a failure announces it in turn (once).
/// Thread-safe: the transfer thread of a staged side polls it too. It is what the adapters' group steps
/// watch (comm::StepWatch): a step of the own group that a member gave up on is void.
class FaultChannel final : public comm::StepWatch {
 public:
  FaultChannel(MPI_Comm world, const Roles& roles);

  /// Adds ranks to tell: after connect, the peers this rank's transfers write to or receive from (the
  /// first to run into a peer that left, so they should hear of it first).
  void add_neighbours(const std::vector<int>& ranks);
  /// Tells this rank's neighbours (the first call only) that it gave up with `status`, having completed
  /// the steps of its group before `next_step`.
  void announce(const Status& status, std::uint64_t next_step);
  /// A write of this rank to `world_rank` failed (the peer is most likely gone): heard() says so
  /// here, and this rank's notices carry it to its neighbours (the trainer heads among them).
  void note_gone(int world_rank);
  /// On a link across jobs: the engine job of `world_rank` is gone (a write to one of its ranks failed,
  /// noted here, at a rank whose notice came, or at another trainer: rebuild_fleet). No notice, query or
  /// answer goes to its ranks from now on: Open MPI's TCP transport, asked to reach a process that died,
  /// reconnects and fails ("failed to TCP connect ... Your Open MPI job may now hang or fail"; 1-3 times
  /// in each of 15 kills of a relay on the emulated cluster, once a fault in MPI_Finalize after it; none
  /// in 18 since). A no-op on a link within one job (it ends with the dead rank).
  void note_job_gone(int world_rank);
  /// Tells the neighbours of a failure this rank just met, before it takes part in the group step that
  /// agrees on it: their waits end at once instead of at their deadline. Voids no step.
  void warn(const Status& status) { announce(status, std::numeric_limits<std::uint64_t>::max()); }
  /// This rank gave up: poll() returns `status` from now on (so a transfer on another thread stops too),
  /// unless a peer's failure came first.
  void raise(const Status& status);
  /// What a rank is waiting for right now, asked only when a peer's query arrives: a sentence and the
  /// world ranks it waits on.
  using WaitProbe = std::function<std::pair<std::string, std::vector<int>>()>;
  /// Takes the notices and queries that arrived (answered with the activity, and `probe` when given).
  /// Returns the first failure a peer announced (its status as that peer gave it), ok while none did.
  /// `answer` false leaves the queries to the thread that can say more (a transfer on the background
  /// thread answers with its probe).
  Status poll(const WaitProbe* probe = nullptr, bool answer = true);
  /// True when a rank of this rank's own group announced giving up at step `step` or earlier: that step
  /// did not complete there, so it is void here too.
  bool voids(std::uint64_t step) override;
  /// What this rank is doing and whom it waits on (while in a group step: the rest of its group), for
  /// the answers to queries.
  void set_activity(std::uint64_t step, std::string what, std::vector<int> waits = {});
  /// The ranks this rank was left waiting on when its own wait timed out (answers name them from then on).
  void set_waits(std::vector<int> waits);
  /// A transfer thread's current wait (what it waits for, and on whom), noted while it idles: the other
  /// thread's answers to a peer's query include it for a moment (a group step and a transfer run at once,
  /// and what holds the step up is often what holds the transfer up).
  void note_transfer_wait(std::pair<std::string, std::vector<int>> wait);
  /// After a wait on `ranks` timed out: asks them what they are doing and whom they wait on, follows those
  /// answers a few hops (up to `seconds` in all), and names the ranks at the end of the chain that do not
  /// answer: "; it waits on engine 1 worker 0 (world rank 4), which does not answer (...)". "" when every
  /// rank answered and waits on no one silent.
  std::string trace(const std::vector<int>& ranks, double seconds) override;
  /// Per world rank: what this rank has learned of it in failures so far. `silent`: a trace of this rank
  /// asked it and it neither answered nor announced giving up (stopped, dead, or busy in its own code past
  /// the deadline), or a write to it failed, here or at a rank whose notice came; `notice`: the message
  /// of its failure notice ("" when none came); `own`: that message names it first (its own failure, not
  /// one it passed on).
  struct Heard {
    std::vector<bool> silent, own;
    std::vector<bool> write_failed;  // a write to it failed (here, or at a rank whose notice came): dead
    std::vector<std::string> notice;
  };
  Heard heard();

  // comm::StepWatch: entering a step is an activity; the failure announced is poll()'s.
  void entering(std::uint64_t step, std::string what, std::vector<int> waits) override {
    set_activity(step, std::move(what), std::move(waits));
  }
  Status announced() override { return poll(); }

 private:
  void take_notices_locked();
  void answer_queries_locked(const WaitProbe* probe);

  std::mutex mutex_;
  MPI_Comm world_;
  const Roles& roles_;
  std::vector<int> neighbours_;
  bool announced_ = false, announced_origin_ = false;
  Status first_;                                                  // first failure a peer announced
  std::uint64_t group_gave_up_at_ = std::numeric_limits<std::uint64_t>::max();  // lowest step, own group
  std::uint64_t activity_step_ = 0;
  std::string activity_ = "constructing the adapter";
  std::vector<int> activity_waits_;
  std::vector<bool> gave_up_;             // per world rank: a notice came from it (it left; not "silent" in a trace)
  std::vector<std::string> gave_up_why_;  // per world rank: its notice's message (a trace cites it)
  std::vector<bool> found_silent_;        // per world rank: a trace found it silent, or a write to it failed (heard())
  std::vector<int> gone_;                 // note_gone's ranks, carried by this rank's notices
  std::vector<bool> write_failed_;        // per world rank: note_gone's, here or in a notice that came
  bool spans_jobs_ = false;
  std::vector<bool> lost_engine_;  // per engine: note_job_gone
  void note_job_gone_locked(int world_rank);
  bool in_gone_job_locked(int world_rank) const;
  std::pair<std::string, std::vector<int>> transfer_wait_;  // note_transfer_wait
  double transfer_wait_at_ = -1;                            // local_seconds() when noted
  std::uint64_t query_serial_ = 0;
  std::vector<comm::OperationPtr> sends_;  // notices and answers in flight
};

}  // namespace wb::coord
