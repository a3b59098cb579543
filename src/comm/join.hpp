// Joins by address: how a job of its own (a rollout engine started by its own mpirun) meets a running
// trainer job. The trainers' leader opens an MPI port and writes it, with a secret, to an address file the
// user names (created readable by its owner only); a joiner's leader reads the file, connects and presents
// the secret; anything that presents another is refused before it is told anything.
//
// MPI_Comm_accept and MPI_Comm_connect block with no deadline in Open MPI, and MPI has no non-blocking
// form of either. So the trainers' leader accepts on a thread of its own over MPI_COMM_SELF (the training
// never waits for a joiner: a join that arrived is taken at the next send_weights, JoinPort::take), which
// needs MPI_THREAD_MULTIPLE on that rank; the joiner connects on a thread too, and its wait is bounded by
// the deadline. Separate mpirun jobs only meet through one ompi-server (mpirun --ompi-server file:URI).
//
// What is refused stays refused: the intercommunicator of a refused or timed-out peer is abandoned
// (abandon_link: no disconnect, since both may wait on a peer that is gone).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/operation.hpp"
#include "weightbridge/status.hpp"

namespace wb::comm {

/// What the address file holds: the MPI port name and the secret a joiner presents.
struct JoinAddress {
  std::string port;
  std::string secret;  // 64 hexadecimal digits
};

/// A fresh secret of 256 random bits (std::random_device: the kernel's generator).
std::string make_join_secret();
/// Writes `address` to `path`, created with mode 0600 and only if it does not exist (a stale file of an
/// earlier job is refused rather than overwritten). Throws wb::Error naming the path.
void write_address_file(const std::string& path, const JoinAddress& address);
/// Reads an address file. Throws wb::Error naming the path (absent, unreadable, malformed).
JoinAddress read_address_file(const std::string& path);

/// How often the trainers' port touches its address file (keep_fresh) while it takes joins.
inline constexpr double kAddressTouchSeconds = 0.5;

/// The trainers' leader's side: the open port, the address file, and the thread that accepts joiners.
class JoinPort {
 public:
  /// Opens a port, writes the address file and starts accepting. `timeout`: how long an accepted peer may
  /// take to present its secret. `admit_at_most` > 0: the accept thread ends on its own once that many
  /// peers were admitted, with no knock (a joiner's port that the joined jobs connect to, one each: a job
  /// of one rank has no other process to knock). Throws kUnsupported without MPI_THREAD_MULTIPLE.
  JoinPort(std::string path, double timeout, std::int64_t admit_at_most = 0);
  /// Removes the address file and stops taking joins; waits (up to the timeout) for the accept thread to end,
  /// which a knock() after stop_accepting() brings about. One still waiting then is left to the end of the
  /// process (and MPI_Finalize may then hang: measured).
  ~JoinPort();
  JoinPort(const JoinPort&) = delete;
  JoinPort& operator=(const JoinPort&) = delete;

  /// Takes no joiner from now on. The accept thread still waits in MPI_Comm_accept until some process
  /// connects (knock(): nothing wakes it from inside its own process in Open MPI 4.1, measured).
  void stop_accepting();
  /// The port and the secret (the other trainers knock with them).
  const JoinAddress& address() const;
  /// True once the accept thread has ended.
  bool stopped() const;
  const std::string& port_name() const;
  /// The intercommunicator to a joiner's leader that presented the secret, when one is waiting; never
  /// blocks. The caller owns it.
  std::optional<MPI_Comm> take();
  /// The first admitted peer for which `ready(peer)` holds (said_ready: a joiner that connected while it
  /// still probed), when one is; the others stay queued. Never blocks. The caller owns it.
  std::optional<MPI_Comm> take(const std::function<bool(MPI_Comm)>& ready);
  /// Peers refused so far (a wrong secret, or none within the timeout).
  std::int64_t refused() const;
  const std::string& path() const { return path_; }
  /// From now until the port stops taking joins, a thread of its own touches the address file every
  /// `interval` seconds, so that a joiner can tell (address_touched) whether the process behind it runs
  /// before it connects: a connect to the port of a job that is stopped or dead stays inside MPI and keeps
  /// every later connect of the joiner's process from pairing (measured: 30 s, to the joiner's deadline),
  /// and (AddressWatch) whether it still runs while a joiner waits to be taken.
  void keep_fresh(double interval);

 private:
  struct Shared;  // what the accept thread reads and writes: it may outlive this object (see ~JoinPort)
  std::string path_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  std::thread fresh_;  // keep_fresh's
};

/// Whether the address file at `path` is touched (JoinPort::keep_fresh) within the next `seconds`: the process
/// behind it ran a moment ago (a stopped or dead one touches nothing).
bool address_touched(const std::string& path, double seconds);

/// What a joiner admitted at a port watches while it waits to be taken, at the trainers' next send_weights
/// after a training step of any length: the address file, which that port keeps fresh (keep_fresh). Not a
/// deadline on the step, but one on the silence of the process behind the port. The file's own times are
/// compared with each other only (no clock of another host is read).
class AddressWatch {
 public:
  enum class Verdict { kAlive, kGone, kSilent };
  /// `silence`: how long an untouched file is waited on.
  AddressWatch(std::string path, double silence);
  /// kGone: the file was removed (the port stopped taking joins: its job shut down or gave up on joins);
  /// kSilent: not touched for `silence` seconds (the job is stopped or dead). Reads the file at most every
  /// quarter of a second; between reads, the last verdict.
  Verdict look();
  /// The reason for a verdict other than kAlive, in the words of a joiner that waited to be taken.
  Status why(Verdict verdict) const;
  /// look() as a wait's service: ok while alive, else why().
  Status check() { return why(look()); }

 private:
  std::string path_;
  double silence_;
  std::int64_t seen_sec_ = -1, seen_nsec_ = -1;  // the file's last modification time read
  double changed_at_, read_at_ = -1;
  Verdict last_ = Verdict::kAlive;
};

/// Throws kUnsupported unless MPI runs at MPI_THREAD_MULTIPLE, naming `who`, `why` it needs it, and
/// MPI_Init_thread.
void require_thread_multiple(const std::string& who, const char* why);

/// The joiner's leader: connects to the address in `path` over MPI_COMM_SELF and presents its secret. One
/// joiner connects at a time (an exclusive flock on the address file, waited for within `timeout`).
/// Returns the intercommunicator to the trainers' leader. Throws wb::Error: kTimeout when the connection
/// or the answer does not come within `timeout`, kInvalidArgument when the trainers refused the secret.
MPI_Comm join_by_address(const std::string& path, double timeout);

/// The take handshake, on the leaders' intercommunicator of an admitted joiner, before both jobs enter the
/// widening (MPI_Intercomm_create has no deadline, and a thread left in it with a joiner that is gone blocked
/// every later join and failed the trainer job: measured). The trainers' leader, when it takes the joiner:
/// asks "take" and waits up to `seconds` for "ready"; false (the joiner is gone, or gave up waiting) means
/// the joiner is not widened with. The joiner's leader answers: waits up to `seconds` for "take", says
/// "ready" and goes straight into the widening; kTimeout when the trainers did not take it in time. With a
/// waiter instead of `seconds` (a joiner admitted at the trainers' port, whose waiter watches the port's
/// address: AddressWatch), it waits as that waiter says, and fails with its service's reason.
bool confirm_take(MPI_Comm leaders, double seconds);
Status answer_take(MPI_Comm leaders, double seconds);
Status answer_take(MPI_Comm leaders, const Waiter& waiter);
/// The joiner's leader, not blocking: whether the trainers' "take" has come.
bool take_began(MPI_Comm leaders);
/// The same two words the other way round, for a joiner that connects before it can be taken (to a fleet
/// replica's port, while it probes: the connect is then off the join's path): it says "ready" once it can,
/// then waits as `waiter` says for "take"; the port's side takes only a joiner whose "ready" came
/// (said_ready, not blocking), and its confirm_take then finds the word there.
Status say_ready(MPI_Comm leaders, const Waiter& waiter);
bool said_ready(MPI_Comm leaders);
/// Over a catch-up link that the fleet's replica made with a joiner before the joiner's probe ended (its
/// widening and the link's adapter, 80-300 ms on the emulated cluster, then off the copy's path): the
/// joiner's leader asks for the copy once its probe passed and waits as `waiter` says for the replica's
/// answer, the version it copies (kNotFound where the replica gave up on it), or declines it (its probe
/// failed). The replica's leader looks for that word, never waiting (copy_asked: the word, taken, once
/// there), and answers it (answer_copy: its version as its workers enter the copy; 0 where it drops the
/// joiner). On the link the replica's leader is rank 0, the joiner's `joiner_leader`.
Status ask_copy(MPI_Comm link, const Waiter& waiter, std::uint64_t& version);
void decline_copy(MPI_Comm link);
std::optional<bool> copy_asked(MPI_Comm link);
void answer_copy(MPI_Comm link, int joiner_leader, std::uint64_t version);

/// Another process of the trainer job ends a port's accept thread: it connects to the port (bounded by
/// `timeout`), presents the secret as a knock, not a join, and lets the connection go. The accept thread
/// ends on it whether or not stop_accepting() was called yet (so the knocker needs no step with the port's
/// rank first: that rank may be unwinding an exception). False when the connection did not complete in time.
bool knock(const JoinAddress& address, double timeout);

/// The two leaders, right after the take handshake: merges the leaders' intercommunicator (freed once
/// merged) into the bridge of widen_join, this side rank 1 when `high`. MPI_Intercomm_merge has no
/// deadline: it runs on a thread, bounded by `timeout` (kTimeout; the other leader died after its answer,
/// and the thread stays in MPI to the end of the process, holding `leaders`). Only the leaders take part,
/// so the other ranks of either job never wait for a joiner that died between its answer and this.
/// Sets SIGPIPE to be ignored when it has its default action (a link to a job that ended must not kill
/// this process).
MPI_Comm bridge_join(MPI_Comm leaders, bool high, double timeout, const std::string& what);

/// Both jobs, collective over each side's `local` communicator: widens the bridge (significant on local
/// rank 0 only; freed once widened) to every rank of both jobs and merges it into one intracommunicator,
/// this side's ranks after the other side's when `high`. MPI_Intercomm_create and MPI_Intercomm_merge have
/// no deadline either: they run on a thread, bounded by `timeout` (kTimeout), over a duplicate of `local`
/// of their own, so that a widening given up on never meets a later collective of `local`.
MPI_Comm widen_join(MPI_Comm local, MPI_Comm bridge, bool high, double timeout, const std::string& what);

/// Collective over `comm`: the communicator of its ranks that are `member`s, in the order of `key` (MPI_COMM_NULL
/// on the others): MPI_Comm_split, which has no deadline either. With MPI_THREAD_MULTIPLE it runs on a
/// thread, bounded by `timeout` (kTimeout; given up on, it keeps its thread to the end of the process);
/// without, it is called after a barrier bounded by `timeout` (every rank has then arrived: a split of
/// live ranks that all entered it completes).
MPI_Comm split(MPI_Comm comm, bool member, int key, double timeout, const std::string& what);

/// A link that lost a job (relays across engine jobs, issue 31): the communicator of `survivors` (ranks of
/// `link`, in that order; this rank among them), made by the survivors alone (MPI_Comm_create_group is
/// collective over the new group only, so the dead job's ranks are never waited for), on a thread bounded
/// by `timeout` like the widening (kTimeout; given up on, it keeps its thread to the end of the process).
/// `tag` tells apart rebuilds of one link that may overlap. The old link is the caller's to abandon.
MPI_Comm rebuild_link(MPI_Comm link, const std::vector<int>& survivors, int tag, double timeout, const std::string& what);

/// The clean end of a communicator that spans two jobs (a joined engine's link), collective over `comm`:
/// a barrier bounded by `seconds`, then the communicator is freed. Open MPI's MPI_Finalize runs a barrier
/// of its own over every communicator still spanning two jobs; with the other job already ended, it
/// wrote into closed sockets and hung in libevent (measured: 5 runs of 5). False when the barrier did not
/// complete in time: the communicator is then abandoned (abandon_link: never waited on again, the other
/// job may be gone).
bool part(MPI_Comm comm, double seconds) noexcept;

/// Whether `comm` holds a process of another job (one MPI_COMM_WORLD does not hold). Local.
bool spans_jobs(MPI_Comm comm) noexcept;

/// Gives up on a communicator that spans two jobs (the other job may be gone or stopped): it is freed, so
/// that MPI_Finalize does not synchronize over it with that job (Open MPI 4.1's MPI_Finalize disconnects
/// every communicator still spanning jobs, and with a dead or stopped peer waited for ever: measured, a
/// trainer job whose joined engine was SIGKILLed never ended). A receive that nothing matches is left
/// pending on it first: its context id then stays taken, so a message the other job still sends (a
/// stopped engine that resumes) never reaches a later joiner's communicator, and its buffers stay kept.
/// Nothing is waited for.
void abandon_link(MPI_Comm comm) noexcept;

}  // namespace wb::comm
