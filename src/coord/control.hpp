// The coordinator's control plane: small MPI messages between trainer rank 0 and the engines' rank 0,
// numbered steps inside a group, waits with deadlines, failure notices between ranks, and one clock for the
// stall intervals. MPI only: never the training or inference engine's own control plane, never weight bytes.
//
// Failing within a bounded time (DESIGN.md, property 7) rests on four rules:
//   - every wait has a deadline (the timeout), and a wait given up leaves no MPI request pointing at freed
//     memory: the operation's buffers are kept until MPI completes it (abandon());
//   - a rank that gives up tells its neighbours at once (FaultChannel), and they give up too, so the whole
//     job fails within about one timeout of the first rank noticing, not one timeout per hop;
//   - a group step (an all-reduce every rank of a trainer group or an engine takes part in, numbered the same
//     on every rank) that one rank gave up on is void on every rank, even on one that completes it later
//     (a rank that was stopped and resumed): it is never acted on;
//   - a step that decides an install ("commit") is void when its ranks entered it too far apart for all of
//     them to have seen it complete before their deadline, so that either all of them install or none does.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::coord {

// Tags on the adapters' own duplicate of the world communicator.
inline constexpr int kRequestTag = 0x5701;  // trainer rank 0 -> engine rank 0
inline constexpr int kAckTag = 0x5702;      // engine rank 0 -> trainer rank 0
inline constexpr int kClockTag = 0x5703;    // clock offset ping-pong at construction
inline constexpr int kStartedTag = 0x5704;  // engine rank 0 -> trainer rank 0: "took update v" (diagnostics)
inline constexpr int kNoticeTag = 0x5705;   // "I gave up", to a rank's neighbours
inline constexpr int kQueryTag = 0x5706;    // "where are you?" from a rank whose step timed out
inline constexpr int kAnswerTag = 0x5707;   // its answer

inline constexpr double kNoDeadline = std::numeric_limits<double>::infinity();

/// A timeout as the user gives it: <= 0 or infinite means no deadline (kNoDeadline); NaN is refused
/// (kInvalidArgument). Values are only ever compared, never turned into a clock duration, so none overflows.
double normalize_timeout(double seconds);

/// "2 s", "0.5 s", or "no deadline".
std::string seconds_text(double seconds);

/// Seconds on this process's steady clock.
double local_seconds();

// kAbort: the trainers shut down after a failure (the engines fail too, with the reason their notices carry).
enum class RequestKind : std::int64_t { kNone = 0, kConnect = 1, kUpdate = 2, kShutdown = 3, kAbort = 4 };
const char* request_name(RequestKind kind);

/// A non-blocking MPI operation and the buffers it reads and writes, owned together. When a wait on it is
/// given up, abandon() keeps both until MPI completes the operation (a late peer may still join a
/// collective, or match a receive), so that MPI never writes into memory that was handed out again.
struct Operation {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<std::byte> out, in;
};
using OperationPtr = std::shared_ptr<Operation>;
OperationPtr make_operation(std::size_t out_bytes = 0, std::size_t in_bytes = 0);
/// Keeps `operation` until it completes (tested whenever another is abandoned); never freed before.
void abandon(OperationPtr operation);

/// The roles of every world rank, learnt at construction (collective over world).
struct Roles {
  int world_rank = 0, world_size = 0;
  bool trainer = false;
  int trainer_leader = -1;                  // world rank of trainer rank 0
  std::vector<int> trainers;                // world ranks by trainer rank
  std::vector<int> engine_leaders;          // world rank of each engine's rank 0, ascending
  std::vector<std::vector<int>> engines;    // per engine: world ranks by engine rank
  std::vector<int> engine_of_rank;          // per world rank: engine index, -1 for trainers
  std::vector<int> group_rank_of;           // per world rank: its rank in its trainer group or engine
  int engine = -1;                          // this rank's engine
  int group_rank = 0, group_size = 1;       // in its own group
  bool leader = false;                      // rank 0 of its group
  /// The world ranks of this rank's own group, by group rank.
  const std::vector<int>& group() const { return trainer ? trainers : engines[static_cast<std::size_t>(engine)]; }
};

/// "trainer 3 (world rank 3)" or "engine 1 worker 0 (world rank 12)".
std::string describe_worker(const Roles& roles, int world_rank);

/// What every wait does besides polling its request: serve peers' queries and take failure notices.
/// `service(interruptible)` returns a peer's failure when one was announced and the wait may end on it.
struct Waiter {
  double timeout = kNoDeadline;
  std::function<Status(bool interruptible)> service;
};

/// Polls `operation` until it completes, `waiter.timeout` passes (kTimeout: "<what> did not complete within
/// N s"; the operation is abandoned), or, when `interruptible`, a peer announces a failure (returned as is;
/// abandoned too). Sleeps briefly between polls once the wait gets long, so waiting ranks leave the cores
/// to the ranks that work (CI oversubscribes).
Status wait_for(const OperationPtr& operation, const Waiter& waiter, bool interruptible, const std::string& what);

/// Tells a rank's neighbours that it gave up and learns when one of them did; answers "where are you?"
/// queries. A rank's neighbours are chosen so that one stopped rank cannot cut the others off and a wave of
/// notices costs O(ranks) messages: trainer ranks 0 and 1 (the "heads") tell every trainer and the heads of
/// every engine; engine heads tell their engine and the trainer heads; every other rank tells its group's
/// heads and the trainer heads. A rank that learns of a failure announces it in turn (once).
/// Thread-safe: the transfer thread of a staged side polls it too.
class FaultChannel {
 public:
  FaultChannel(MPI_Comm world, const Roles& roles);

  /// Adds ranks to tell: after connect, the peers this rank's transfers write to or receive from (the
  /// first to run into a peer that left, so they should hear of it first).
  void add_neighbours(const std::vector<int>& ranks);
  /// Tells this rank's neighbours (the first call only) that it gave up with `status`, having completed
  /// the steps of its group before `next_step`.
  void announce(const Status& status, std::uint64_t next_step);
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
  bool voids(std::uint64_t step);
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
  std::string trace(const std::vector<int>& ranks, double seconds);

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
  std::vector<bool> gave_up_;  // per world rank: a notice came from it (it left; not "silent" in a trace)
  std::vector<std::string> gave_up_why_;
  std::pair<std::string, std::vector<int>> transfer_wait_;  // note_transfer_wait
  double transfer_wait_at_ = -1;                            // local_seconds() when noted  // per world rank: its notice's message (a trace cites it)
  std::uint64_t query_serial_ = 0;
  std::vector<OperationPtr> sends_;  // notices and answers in flight
};

/// The numbered collective steps of one group (the trainers, or one engine). Every rank of the group runs
/// the same steps in the same order; each is one MPI_Iallreduce (MAX) of a small record.
class Group {
 public:
  static constexpr int kValues = 4;  // what a step carries besides its own bookkeeping
  /// `own_group`: the trainers or this rank's engine, whose steps the fault channel's notices can void
  /// (a step over the whole world, at connect, is decided by its outcome alone).
  Group(MPI_Comm comm, const Roles& roles, std::string name, bool own_group = true);

  /// One step: every rank gives its status and `values`; returns the status of the lowest failing rank
  /// (its message whole) or ok, and the element-wise maximum of `values` in `values`. A step that another
  /// rank of the group gave up on (FaultChannel::voids) fails with that rank's reason. A `commit` step also
  /// fails on every rank when its ranks entered it further apart than the timeout allows (see the file
  /// comment). A timeout names the ranks that did not take part (FaultChannel::trace).
  /// `completed` (optional) tells whether the step itself completed, i.e. whether a failure returned is a
  /// rank's own status rather than the step's (a timeout, a void).
  Status step(const Status& mine, std::span<std::int64_t, kValues> values, const Waiter& waiter, FaultChannel& faults,
              const std::string& what, bool commit = false, bool* completed = nullptr);
  Status step(const Status& mine, const Waiter& waiter, FaultChannel& faults, const std::string& what, bool commit = false,
              bool* completed = nullptr);

  /// The first step this rank did not see complete (what it announces when it gives up).
  std::uint64_t first_incomplete() const { return completed_; }
  MPI_Comm comm() const { return comm_; }
  const std::string& name() const { return name_; }

  /// The clock every rank reads entry times on (world rank 0's; set after construction).
  void set_clock_offset(double offset) { clock_offset_ = offset; }

 private:
  Status broadcast_failure(int root, const Status& mine, const Waiter& waiter, const std::string& what);

  MPI_Comm comm_;
  const Roles& roles_;
  std::string name_;
  bool own_group_ = true;
  int rank_ = 0, size_ = 1;
  std::uint64_t next_ = 0, completed_ = 0;
  double clock_offset_ = 0;
};

/// Collective over `world`: each rank says whether it trains and gives its group. Throws when the groups do
/// not make one trainer group and at least one engine, or when a rank does not take part within `timeout`.
Roles exchange_roles(MPI_Comm world, MPI_Comm group, bool trainer, double timeout);

/// Collective over `world`: the offset to add to local_seconds() to read world rank 0's clock, from the
/// fastest of a few ping-pongs with rank 0 (Cristian's method; error below half that round trip).
double measure_clock_offset(MPI_Comm world, const Roles& roles, double timeout);
/// The same for any communicator, `name` naming a rank in errors.
double measure_clock_offset(MPI_Comm world, double timeout, const std::function<std::string(int)>& name);

/// MPI_Comm_dup with MPI_ERRORS_RETURN on the duplicate, so that in a job whose error handler is
/// MPI_ERRORS_ARE_FATAL a failing call still reaches the library's checks (a Status naming the call)
/// instead of aborting the job.
MPI_Comm duplicate(MPI_Comm comm);

/// Messages of any length as bytes (the codec of notices, acknowledgements, answers and failures): a
/// status, two numbers and a list of ranks.
std::vector<std::byte> encode_status(const Status& status, std::int64_t a = 0, std::int64_t b = 0,
                                     const std::vector<int>& ranks = {});
Status decode_status(std::span<const std::byte> bytes, std::int64_t* a = nullptr, std::int64_t* b = nullptr,
                     std::vector<int>* ranks = nullptr);

}  // namespace wb::coord
