// What relays across engine jobs need first (issue 31): one communicator that spans the trainers and two
// engine jobs, made with the join operations of the control plane (comm/join.hpp) only, so that an engine
// job that already holds a version can write it to a job that joined later. run_relay_link.sh starts, with
// one ompi-server:
//   relay_link trainers DIR   2 ranks: rank 0 opens the trainers' port (DIR/t); A is taken and widened
//                             with (link T+A), then B, widened with the whole link T+A (link T+A+B)
//   relay_link a DIR          2 ranks: joins the trainers (link T+A); its rank 0 opens a port of its own
//                             (DIR/a) and admits B there; then every rank takes part in widening T+A with B
//   relay_link b DIR          1 rank: connects to A's port first (Open MPI's runtime then knows both jobs:
//                             without it, the widening of T+A with B hung in every process, measured), then
//                             joins the trainers and is widened with T+A
// On T+A+B, A's rank 0 writes 16 MiB to B's rank 0 and B checks them bit for bit; every step has a deadline.
// With `kill` (a fourth argument, every job): A's rank 0 SIGKILLs itself after the first half, as a relay
// lost mid-update (with `stop` it SIGSTOPs itself, a relay stalled for good: the script kills it at the end); B waits for the rest at most kMissSeconds and tells trainer 0 where it stopped; the
// survivors (T0 T1 B0) rebuild their link without A (comm::rebuild_link: A's ranks are never waited for),
// trainer 0 re-sends the rest over it, and B checks all 16 MiB bit for bit. With `fleet`, a third engine job
// joins (relay_link c DIR, 1 rank): it opens a port (DIR/c) that A's and B's leaders connect to, one each,
// then joins the trainers and is widened with T+A+B; A dies after writing B and C the first half, and the
// survivors T0 T1 B0 C0 rebuild their link, T0 re-sends the rest to B and B forwards it to C.
// With `join_after_stop` / `join_after_kill`, A's rank 0 is lost once T+A+B formed, before C joins; the
// survivors leave it out, rebuild T+B and widen that with C (join_after_loss below).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "comm/deadline.hpp"
#include "comm/join.hpp"
#include "comm/operation.hpp"
#include "core/checks.hpp"
#include "weightbridge/status.hpp"

namespace {

using namespace wb::comm;
constexpr double kTimeout = 20;
constexpr std::size_t kBytes = std::size_t(16) << 20;
constexpr double kMissSeconds = 3;  // how long B waits for the rest of a relay's bytes (a test's deadline)
constexpr int kDataTag = 5, kMissingTag = 6;
int loss_signal = 0;  // how the relay is lost: SIGKILL, SIGSTOP, or 0 (it is not)
bool fleet = false;   // a third engine job C on the link (T+A+B+C), which the others connect to

std::byte pattern(std::size_t i) { return static_cast<std::byte>((i * 131 + 7) & 0xff); }

// A port's leader: the next admitted peer, within the deadline.
MPI_Comm admitted(JoinPort& port) {
  Backoff backoff;
  for (const double start = local_seconds(); local_seconds() - start < kTimeout; backoff.pause())
    if (std::optional<MPI_Comm> peer = port.take()) return *peer;
  throw wb::Error(wb::ErrorCode::kTimeout, "nobody joined within " + seconds_text(kTimeout));
}

// Every rank of `comm` learns its rank 0's port address (the knocker needs it at the end).
JoinAddress shared_address(const JoinPort* port, MPI_Comm comm) {
  const std::string text = port ? port->address().port + "\n" + port->address().secret : std::string();
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size());
  bytes = broadcast(std::move(bytes), 0, comm, Waiter{kTimeout, {}}, "the port's address");
  const std::string shared(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return JoinAddress{shared.substr(0, shared.find('\n')), shared.substr(shared.find('\n') + 1)};
}

// The joiner's side of a take: answers, merges the leaders' link (rank 0), then every rank widens.
MPI_Comm be_taken(MPI_Comm local, MPI_Comm leaders) {
  MPI_Comm bridge = MPI_COMM_NULL;
  if (leaders != MPI_COMM_NULL) {
    wb::throw_if_error(answer_take(leaders, kTimeout));
    bridge = bridge_join(leaders, true, kTimeout, "joiner");
  }
  agree(wb::Status::ok(), local, Waiter{kTimeout, {}}, "taken");
  return widen_join(local, bridge, true, kTimeout, "joiner");
}

// The taking side: rank 0 of `local` holds the admitted joiner's link.
MPI_Comm take(MPI_Comm local, MPI_Comm leaders) {
  MPI_Comm bridge = MPI_COMM_NULL;
  if (leaders != MPI_COMM_NULL) {
    if (!confirm_take(leaders, kTimeout)) throw wb::Error(wb::ErrorCode::kTimeout, "the joiner did not answer");
    bridge = bridge_join(leaders, false, kTimeout, "taker");
  }
  agree(wb::Status::ok(), local, Waiter{kTimeout, {}}, "taking");
  return widen_join(local, bridge, false, kTimeout, "taker");
}

// The trainers' start of every scenario: rank 0 opens their port (kept in `port`), every rank learns its
// address (for trainer 1's knock), and the trainers take A (T+A), then B (T+A+B).
struct TrainersLinks {
  JoinAddress address;
  MPI_Comm ta, tab;
};
TrainersLinks take_a_and_b(std::optional<JoinPort>& port, int rank, const std::string& dir) {
  if (rank == 0) port.emplace(dir + "/t", kTimeout);
  JoinAddress address = shared_address(port ? &*port : nullptr, MPI_COMM_WORLD);
  const MPI_Comm ta = take(MPI_COMM_WORLD, port ? admitted(*port) : MPI_COMM_NULL);
  return {std::move(address), ta, take(ta, port ? admitted(*port) : MPI_COMM_NULL)};
}

// On T+A+B (T0 T1 A0 A1 B0): A0 writes kBytes to B0; B0 checks them. True where nothing was wrong.
bool relay(MPI_Comm all, const char* who) {
  int rank = 0, size = 0;
  MPI_Comm_rank(all, &rank);
  MPI_Comm_size(all, &size);
  if (size != 5) {
    std::fprintf(stderr, "%s: the link has %d ranks, not 5\n", who, size);
    return false;
  }
  const int a0 = 2, b0 = 4;
  const Waiter waiter{kTimeout, {}};
  const double start = local_seconds();
  if (rank == a0) {
    OperationPtr op = make_operation(kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) op->out[i] = pattern(i);
    WB_CHECK_MPI(MPI_Isend(op->out.data(), static_cast<int>(kBytes), MPI_BYTE, b0, kDataTag, all, &op->request));
    wait_or_throw(op, waiter, "A0 writing to B0");
  } else if (rank == b0) {
    OperationPtr op = make_operation(0, kBytes);
    WB_CHECK_MPI(MPI_Irecv(op->in.data(), static_cast<int>(kBytes), MPI_BYTE, a0, kDataTag, all, &op->request));
    wait_or_throw(op, waiter, "B0 receiving from A0");
    for (std::size_t i = 0; i < kBytes; ++i)
      if (op->in[i] != pattern(i)) {
        std::fprintf(stderr, "%s: byte %zu from A0 differs\n", who, i);
        return false;
      }
    std::printf("B0: 16 MiB from A0 over the link T+A+B in %.3f s, bit for bit\n", local_seconds() - start);
  }
  return barrier_within(all, kTimeout);
}

// The relay lost mid-update, on T+A+B (or T+A+B+C): A0 writes the first half to each child (B0, and C0)
// and dies. Each child waits for the rest at most kMissSeconds and tells T0 the offset it stopped at; the
// survivors rebuild their link without A, T0 re-sends the rest to the first child, and each child forwards
// it to the next (another replica re-sends). True where every child then holds all kBytes bit for bit (A's
// ranks never return).
bool relay_and_lose(MPI_Comm all, const char* who, const std::string& dir) {
  int rank = 0, size = 0;
  MPI_Comm_rank(all, &rank);
  MPI_Comm_size(all, &size);
  const int t0 = 0, a0 = 2;
  std::vector<int> children;  // on `all`: the ranks after A's two
  for (int r = 4; r < size; ++r) children.push_back(r);
  const std::size_t half = kBytes / 2;
  const Waiter waiter{kTimeout, {}};
  if (rank == a0) {
    std::vector<OperationPtr> sent;
    for (int child : children) {
      sent.push_back(make_operation(half));
      for (std::size_t i = 0; i < half; ++i) sent.back()->out[i] = pattern(i);
      WB_CHECK_MPI(MPI_Isend(sent.back()->out.data(), static_cast<int>(half), MPI_BYTE, child, kDataTag, all, &sent.back()->request));
    }
    for (const OperationPtr& op : sent) wait_or_throw(op, waiter, "A0 writing the first half to its children");
    if (FILE* f = std::fopen((dir + "/a0.pid").c_str(), "w")) {  // the script ends a stopped relay
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
    std::fflush(nullptr);
    std::raise(loss_signal);
    return false;  // resumed: nothing more of this relay is waited for
  }
  if (rank == a0 + 1) return barrier_within(all, kTimeout);  // A1: its job ends it
  const auto child = std::find(children.begin(), children.end(), rank);
  std::vector<std::byte> got(kBytes);
  std::int64_t missing = 0;
  double lost_at = 0;
  if (child != children.end()) {
    OperationPtr first = make_operation(0, half);
    WB_CHECK_MPI(MPI_Irecv(first->in.data(), static_cast<int>(half), MPI_BYTE, a0, kDataTag, all, &first->request));
    wait_or_throw(first, waiter, "receiving the first half from A0");
    std::memcpy(got.data(), first->in.data(), half);
    OperationPtr rest = make_operation(0, kBytes - half);
    WB_CHECK_MPI(MPI_Irecv(rest->in.data(), static_cast<int>(kBytes - half), MPI_BYTE, a0, kDataTag, all, &rest->request));
    if (wait_for(rest, Waiter{kMissSeconds, {}}, false, "receiving the rest from A0").is_ok()) {
      std::fprintf(stderr, "%s: the rest came from A, which was to die first\n", who);
      return false;
    }
    abandon(std::move(rest));  // never waited on again: A is gone
    lost_at = local_seconds();
    missing = static_cast<std::int64_t>(half);
    OperationPtr note = make_operation(sizeof missing);
    std::memcpy(note->out.data(), &missing, sizeof missing);
    WB_CHECK_MPI(MPI_Isend(note->out.data(), 1, MPI_INT64_T, t0, kMissingTag, all, &note->request));
    wait_or_throw(note, waiter, "telling T0 where it stopped");
  } else if (rank == t0) {
    for (int c : children) {
      OperationPtr note = make_operation(0, sizeof missing);
      WB_CHECK_MPI(MPI_Irecv(note->in.data(), 1, MPI_INT64_T, c, kMissingTag, all, &note->request));
      wait_or_throw(note, waiter, "T0 hearing from a child of A");
      std::int64_t at = 0;
      std::memcpy(&at, note->in.data(), sizeof at);
      if (c != children.front() && at != missing) {
        std::fprintf(stderr, "T0: the children stopped at bytes %lld and %lld\n", static_cast<long long>(missing), static_cast<long long>(at));
        return false;
      }
      missing = at;
    }
  }
  std::vector<int> kept = {t0, 1};
  kept.insert(kept.end(), children.begin(), children.end());
  const double rebuilding = local_seconds();
  const MPI_Comm survivors = rebuild_link(all, kept, 7, kTimeout, who);
  const double rebuilt_in = local_seconds() - rebuilding;
  // On the rebuilt link: T0 is 0, the children 2, 3, ...; the rest goes down the chain T0 -> first child -> next.
  const int me = rank == t0 ? 0 : child != children.end() ? 2 + static_cast<int>(child - children.begin()) : 1;
  const int last = 1 + static_cast<int>(children.size());
  if (rank == t0) {
    if (missing <= 0 || missing >= static_cast<std::int64_t>(kBytes)) {
      std::fprintf(stderr, "T0: the children stopped at byte %lld\n", static_cast<long long>(missing));
      return false;
    }
    OperationPtr op = make_operation(kBytes - static_cast<std::size_t>(missing));
    for (std::size_t i = static_cast<std::size_t>(missing); i < kBytes; ++i) op->out[i - static_cast<std::size_t>(missing)] = pattern(i);
    WB_CHECK_MPI(MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, 2, kDataTag, survivors, &op->request));
    wait_or_throw(op, waiter, "T0 re-sending the rest");
  } else if (child != children.end()) {
    const int from = me == 2 ? 0 : me - 1;
    OperationPtr op = make_operation(kBytes - half, kBytes - half);
    WB_CHECK_MPI(MPI_Irecv(op->in.data(), static_cast<int>(kBytes - half), MPI_BYTE, from, kDataTag, survivors, &op->request));
    wait_or_throw(op, waiter, "receiving the rest on the rebuilt link");
    std::memcpy(got.data() + half, op->in.data(), kBytes - half);
    if (me < last) {  // forwarded as received: this child is the next one's replica
      std::memcpy(op->out.data(), op->in.data(), kBytes - half);
      WB_CHECK_MPI(MPI_Isend(op->out.data(), static_cast<int>(kBytes - half), MPI_BYTE, me + 1, kDataTag, survivors, &op->request));
      wait_or_throw(op, waiter, "forwarding the rest");
    }
    for (std::size_t i = 0; i < kBytes; ++i)
      if (got[i] != pattern(i)) {
        std::fprintf(stderr, "%s: byte %zu differs\n", who, i);
        return false;
      }
    std::printf("%s: A lost after 8 MiB; the other 8 MiB re-sent by %s over the rebuilt link %.3f s after giving up on A "
                "(the rebuild %.3f s of it), all 16 MiB bit for bit\n", who, me == 2 ? "T0" : "the child before it",
                local_seconds() - lost_at, rebuilt_in);
  }
  int rebuilt_size = 0;
  MPI_Comm_size(survivors, &rebuilt_size);
  const bool ok = rebuilt_size == last + 1 && part(survivors, kTimeout);
  abandon_link(all);  // it spans the dead job: never waited on again
  return ok;
}

// Waits for a file a port's leader writes (the joiner's port, which the joined jobs connect to).
void await_file(const std::string& path) {
  Backoff backoff;
  for (const double start = local_seconds(); access(path.c_str(), R_OK) != 0; backoff.pause())
    if (local_seconds() - start > kTimeout) throw wb::Error(wb::ErrorCode::kTimeout, path + " did not appear within " + seconds_text(kTimeout));
}

// A relay job lost before the next join (`join_after_stop`, `join_after_kill`): on T+A+B, A's rank 0 is
// stopped (or killed) before C joins. C (1 rank) opens a port for the joined jobs' leaders and joins the
// trainers once B's leader connected there (the test's order: B is taken first). Each joined leader that
// connected to C's port says so to T0 over T+A+B; T0 waits for those notes at most kMissSeconds, names the
// jobs that stayed silent, and tells the others which ranks are kept. Trainer 1 knocks C's port (it expected
// one connection more than came: a one-rank job cannot end its own accept), the survivors rebuild their link
// without A (comm::rebuild_link: A never waited for), and that link, not T+A+B, is widened with C (T+B+C).
// T0 then writes 16 MiB to B and to C over it, each checks them bit for bit. True where all of that held.
constexpr int kConnectedTag = 8, kKeptTag = 9;

// The trainers' verdict after a joiner's port: the ranks of `tab` that are kept, as a bit mask.
std::int64_t kept_mask(MPI_Comm tab, int rank, const Waiter& waiter, const std::string& dir) {
  const int t0 = 0;
  const std::vector<std::vector<int>> jobs = {{2, 3}, {4}};  // A, B on T+A+B; their leaders 2 and 4
  std::int64_t kept = 0b11;                                  // the trainers
  if (rank == t0) {
    std::vector<OperationPtr> notes;
    for (const std::vector<int>& job : jobs) {
      notes.push_back(make_operation(0, sizeof(std::int64_t)));
      WB_CHECK_MPI(MPI_Irecv(notes.back()->in.data(), 1, MPI_INT64_T, job.front(), kConnectedTag, tab, &notes.back()->request));
    }
    // The bound runs from the joiner's port being there (in the adapters, trainer 0 asks the joined leaders
    // only then), not from C's start, which a loaded machine may delay by seconds.
    await_file(dir + "/c");
    const double start = local_seconds();
    for (std::size_t j = 0; j < jobs.size(); ++j) {
      const double left = std::max(0.0, kMissSeconds - (local_seconds() - start));
      if (wait_for(notes[j], Waiter{left, {}}, false, "a joined leader's note").is_ok()) {
        for (int r : jobs[j]) kept |= std::int64_t(1) << r;
      } else {
        abandon(std::move(notes[j]));  // never waited on again: that job is gone
        std::printf("T0: the job of link ranks %d.. did not connect to the joiner's port within %.0f s: it is left out\n",
                    jobs[j].front(), kMissSeconds);
      }
    }
    for (int to : {1, 4}) {
      OperationPtr verdict = make_operation(sizeof kept);
      std::memcpy(verdict->out.data(), &kept, sizeof kept);
      WB_CHECK_MPI(MPI_Isend(verdict->out.data(), 1, MPI_INT64_T, to, kKeptTag, tab, &verdict->request));
      wait_or_throw(verdict, waiter, "T0 telling the survivors who is kept");
    }
  } else {
    OperationPtr verdict = make_operation(0, sizeof kept);
    WB_CHECK_MPI(MPI_Irecv(verdict->in.data(), 1, MPI_INT64_T, t0, kKeptTag, tab, &verdict->request));
    wait_or_throw(verdict, waiter, "hearing from T0 who is kept");
    std::memcpy(&kept, verdict->in.data(), sizeof kept);
  }
  return kept;
}

// T0 writes kBytes to B0 and C0 on T+B+C (ranks 2, 3); they check them. True where nothing was wrong.
bool write_survivors(MPI_Comm tbc, const char* who, double since, const char* since_what) {
  const Waiter waiter{kTimeout, {}};
  int rank = 0, size = 0;
  MPI_Comm_rank(tbc, &rank);
  MPI_Comm_size(tbc, &size);
  if (size != 4) {
    std::fprintf(stderr, "%s: T+B+C has %d ranks, not 4\n", who, size);
    return false;
  }
  if (rank == 0) {
    OperationPtr to_b = make_operation(kBytes), to_c = make_operation(kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) to_b->out[i] = to_c->out[i] = pattern(i);
    WB_CHECK_MPI(MPI_Isend(to_b->out.data(), static_cast<int>(kBytes), MPI_BYTE, 2, kDataTag, tbc, &to_b->request));
    WB_CHECK_MPI(MPI_Isend(to_c->out.data(), static_cast<int>(kBytes), MPI_BYTE, 3, kDataTag, tbc, &to_c->request));
    wait_or_throw(to_b, waiter, "T0 writing B0");
    wait_or_throw(to_c, waiter, "T0 writing C0");
  } else if (rank >= 2) {
    OperationPtr op = make_operation(0, kBytes);
    WB_CHECK_MPI(MPI_Irecv(op->in.data(), static_cast<int>(kBytes), MPI_BYTE, 0, kDataTag, tbc, &op->request));
    wait_or_throw(op, waiter, "receiving from T0 on T+B+C");
    for (std::size_t i = 0; i < kBytes; ++i)
      if (op->in[i] != pattern(i)) {
        std::fprintf(stderr, "%s: byte %zu differs\n", who, i);
        return false;
      }
    std::printf("%s: 16 MiB from T0 over T+B+C (A left out, the link rebuilt, then widened with C) %.3f s after %s, "
                "bit for bit\n", who, local_seconds() - since, since_what);
  }
  return true;
}

int join_after_loss(const std::string& role, const std::string& dir) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const Waiter waiter{kTimeout, {}};
  // The survivors of T+A+B (T0 T1 B0): the verdict, the knock, the rebuild and the widening with C.
  const auto survive = [&](MPI_Comm tab, int link_rank, JoinPort* port, const char* who) {
    const std::int64_t kept = kept_mask(tab, link_rank, waiter, dir);
    const double verdict_at = local_seconds();
    std::vector<int> ranks;
    for (int r = 0; r < 5; ++r)
      if (kept & (std::int64_t(1) << r)) ranks.push_back(r);
    if (ranks != std::vector<int>{0, 1, 4}) {
      std::fprintf(stderr, "%s: kept %zu ranks of T+A+B, not T0 T1 B0\n", who, ranks.size());
      return false;
    }
    // C's port expected A's leader too: trainer 1 ends its accept (C has no other process to).
    if (link_rank == 1) {
      if (!knock(read_address_file(dir + "/c"), kTimeout)) return false;
      std::printf("T1: knocked C's port in %.3f s\n", local_seconds() - verdict_at);
    }
    const MPI_Comm tb = rebuild_link(tab, ranks, 7, kTimeout, who);
    abandon_link(tab);  // it spans A: never waited on again
    const double widening = local_seconds();
    const MPI_Comm tbc = take(tb, port ? admitted(*port) : MPI_COMM_NULL);
    if (link_rank == 0) {
      std::printf("T0: after the verdict, T1's knock and the rebuild of T+B %.3f s, its widening with C %.3f s\n",
                  widening - verdict_at, local_seconds() - widening);
    }
    const bool ok = write_survivors(tbc, who, verdict_at, "T0's verdict");
    return part(tbc, kTimeout) && part(tb, kTimeout) && ok;
  };
  bool ok = true;
  if (role == "trainers") {
    std::optional<JoinPort> port;
    const auto [address, ta, tab] = take_a_and_b(port, rank, dir);
    ok = survive(tab, rank, port ? &*port : nullptr, "trainers");
    abandon_link(ta);
    if (port) port->stop_accepting();
    if (rank == 1 && !knock(address, kTimeout)) ok = false;
  } else if (role == "a") {
    const MPI_Comm ta = be_taken(MPI_COMM_WORLD, rank == 0 ? join_by_address(dir + "/t", kTimeout) : MPI_COMM_NULL);
    std::optional<JoinPort> port;  // B connects here before it joins the trainers
    if (rank == 0) port.emplace(dir + "/a", kTimeout, 1);
    if (port) abandon_link(admitted(*port));
    port.reset();
    agree(wb::Status::ok(), MPI_COMM_WORLD, Waiter{kTimeout, {}}, "B connected to A");
    const MPI_Comm tab = take(ta, MPI_COMM_NULL);
    if (rank == 0) {  // lost before it would connect to C's port
      if (FILE* f = std::fopen((dir + "/a0.pid").c_str(), "w")) {
        std::fprintf(f, "%d\n", static_cast<int>(getpid()));
        std::fclose(f);
      }
      std::fflush(nullptr);
      std::raise(loss_signal);
      return 1;
    }
    (void)barrier_within(tab, kTimeout);  // A1: its job ends it
    return 1;
  } else if (role == "b") {
    abandon_link(join_by_address(dir + "/a", kTimeout));
    const MPI_Comm tab = be_taken(MPI_COMM_WORLD, join_by_address(dir + "/t", kTimeout));
    await_file(dir + "/c");
    abandon_link(join_by_address(dir + "/c", kTimeout));
    OperationPtr note = make_operation(sizeof(std::int64_t));
    WB_CHECK_MPI(MPI_Isend(note->out.data(), 1, MPI_INT64_T, 0, kConnectedTag, tab, &note->request));
    wait_or_throw(note, waiter, "B0 telling T0 it connected to C");
    ok = survive(tab, 4, nullptr, "B");
  } else {
    std::optional<JoinPort> port;
    port.emplace(dir + "/c", kTimeout, 2);
    abandon_link(admitted(*port));  // B's leader: the trainers have taken B by now
    const MPI_Comm tbc = be_taken(MPI_COMM_WORLD, join_by_address(dir + "/t", kTimeout));
    port.reset();  // its accept ended by trainer 1's knock
    ok = write_survivors(tbc, "C", local_seconds(), "its widening") && part(tbc, kTimeout);
  }
  return ok ? 0 : 1;
}

int run(const std::string& role, const std::string& dir) {
  const bool lose = loss_signal != 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool ok = true;
  if (role == "trainers") {
    std::optional<JoinPort> port;
    const auto [address, ta, tab] = take_a_and_b(port, rank, dir);
    const MPI_Comm all = fleet ? take(tab, port ? admitted(*port) : MPI_COMM_NULL) : tab;
    ok = lose ? relay_and_lose(all, "trainers", dir) : relay(all, "trainers");
    if (port) port->stop_accepting();
    if (rank == 1 && !knock(address, kTimeout)) ok = false;
    port.reset();
    if (lose) abandon_link(ta);  // they span the dead job (`all` went in relay_and_lose)
    if (fleet) abandon_link(tab);
    if (!lose) ok = part(tab, kTimeout) && part(ta, kTimeout) && ok;
  } else if (role == "a") {
    const MPI_Comm ta = be_taken(MPI_COMM_WORLD, rank == 0 ? join_by_address(dir + "/t", kTimeout) : MPI_COMM_NULL);
    // B connects here before it joins the trainers; what it needs is the connection, not this link.
    std::optional<JoinPort> port;
    if (rank == 0) port.emplace(dir + "/a", kTimeout);
    const JoinAddress address = shared_address(port ? &*port : nullptr, MPI_COMM_WORLD);
    if (port) abandon_link(admitted(*port));
    agree(wb::Status::ok(), MPI_COMM_WORLD, Waiter{kTimeout, {}}, "B connected to A");
    const MPI_Comm tab = take(ta, MPI_COMM_NULL);  // T0 is rank 0 of T+A: it holds B's link
    MPI_Comm all = tab;
    if (fleet) {  // C, the next joiner, opened a port: A's leader connects to it, then T+A+B is widened with C
      if (rank == 0) {
        await_file(dir + "/c");
        abandon_link(join_by_address(dir + "/c", kTimeout));
      }
      agree(wb::Status::ok(), MPI_COMM_WORLD, Waiter{kTimeout, {}}, "A connected to C");
      all = take(tab, MPI_COMM_NULL);
    }
    ok = lose ? relay_and_lose(all, "A", dir) : relay(all, "A");
    if (port) port->stop_accepting();
    if (rank == 1 && !knock(address, kTimeout)) ok = false;
    port.reset();
    ok = part(tab, kTimeout) && part(ta, kTimeout) && ok;
  } else if (role == "b") {
    abandon_link(join_by_address(dir + "/a", kTimeout));
    const MPI_Comm tab = be_taken(MPI_COMM_WORLD, join_by_address(dir + "/t", kTimeout));
    MPI_Comm all = tab;
    if (fleet) {
      await_file(dir + "/c");
      abandon_link(join_by_address(dir + "/c", kTimeout));
      all = take(tab, MPI_COMM_NULL);
      abandon_link(tab);  // it spans A, which relay_and_lose loses
    }
    if (lose) return relay_and_lose(all, "B", dir) ? 0 : 1;
    ok = relay(all, "B");
    ok = part(all, kTimeout) && ok;
  } else {
    // C (one rank, `fleet` only): the joined jobs connect to its port, one each, and its accept thread ends
    // on its own after the second (no other process of its job could knock); then it joins the trainers.
    std::optional<JoinPort> port;
    port.emplace(dir + "/c", kTimeout, 2);
    abandon_link(admitted(*port));
    abandon_link(admitted(*port));
    port.reset();
    const MPI_Comm all = be_taken(MPI_COMM_WORLD, join_by_address(dir + "/t", kTimeout));
    return relay_and_lose(all, "C", dir) ? 0 : 1;
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 2;
  try {
    const std::string loss = argc == 4 ? argv[3] : "";
    loss_signal = loss == "kill" || loss == "fleet" || loss == "join_after_kill" ? SIGKILL
                  : loss == "stop" || loss == "join_after_stop"                 ? SIGSTOP
                                                                                : 0;
    fleet = loss == "fleet";
    if (loss.starts_with("join_after_")) rc = join_after_loss(argv[1], argv[2]);
    else if (argc == 3 || loss_signal != 0) rc = run(argv[1], argv[2]);
    else std::fprintf(stderr, "usage: relay_link trainers|a|b|c DIR [kill|stop|fleet|join_after_stop|join_after_kill]\n");
  } catch (const wb::Error& error) {
    std::fprintf(stderr, "%s\n", error.status().to_string().c_str());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
