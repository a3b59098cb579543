// The round executor's progress loop. One loop per update drives every round in flight through its steps:
//
//   trainer:  slot free (its writes of round g - depth done) -> pack -> post one batch per peer (receive
//             stage) as soon as that peer granted round g;
//   rollout:  receive-stage arrivals complete -> post the external-exchange batches; those arrivals complete
//             too -> post the internal-exchange batches; every arrival in -> assemble; assembled and its own
//             forwards done -> release the slot: grant round g + depth to the peers that write then.
//   relay:    a batch with lag 1 forwards what arrived in round g - 1, out of that round's slot: it goes out
//             once round g - 1's arrivals are in, and round g - 1's slot is released only when these
//             batches of round g are done too (the planner never puts them in a schedule's first round).
//
// Rounds are numbered globally across updates (g = update × rounds + r), so a slot released near the end of
// one update is granted to the next update's early rounds and nothing waits at update boundaries. Writes
// carry (g, stage) in their immediate; grants travel as small MPI messages (control only).
//
// Pack and assemble go through the copy engine (copy_engine.hpp): a step is started, then polled until
// done (at once for host parameters; for CUDA parameters when the kernel's event is), and only then are
// its writes posted, or its slot released.
//
// Bounded failure: every MPI call returns its error (the communicator's handler is MPI_ERRORS_RETURN); an
// update that waits checks ExecutorOptions::interrupt about every millisecond, and one that makes no
// progress for the timeout fails naming the round, what it waits for and the peers it waits on.
#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "core/checks.hpp"
#include "core/settings.hpp"
#include "exec/executor_state.hpp"

namespace wb {
namespace {

using Clock = std::chrono::steady_clock;

// The trace's time base: the steady clock in seconds, as the coordinator's local_seconds().
double seconds_now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

constexpr int kGrantTag = 0x5743;  // "you may write round g into my slot"
constexpr std::uint32_t kRoundBits = 24;
constexpr std::uint64_t kRelayToken = std::uint64_t{1} << 63;  // completion token of a lag 1 post: round | this
constexpr std::uint64_t kRoundMask = (std::uint64_t{1} << kRoundBits) - 1;

std::uint32_t encode_immediate(std::uint64_t round, Stage stage) {
  return static_cast<std::uint32_t>(((round & kRoundMask) << 2) | static_cast<std::uint32_t>(stage));
}

// Sends "write round `round` into my slot" to `peer` without blocking.
Status send_grant(RoundExecutor::State& s, int peer, std::uint64_t round) {
  std::size_t slot = s.grant_requests.size();
  for (std::size_t i = 0; i < s.grant_requests.size(); ++i) {
    int done = 1;
    if (s.grant_requests[i] != MPI_REQUEST_NULL) WB_TRY_MPI(MPI_Test(&s.grant_requests[i], &done, MPI_STATUS_IGNORE));
    if (done) {
      slot = i;
      break;
    }
  }
  if (slot == s.grant_requests.size()) {
    s.grant_requests.push_back(MPI_REQUEST_NULL);
    s.grant_buffers.push_back(0);
  }
  s.grant_buffers[slot] = round;
  const int rc = MPI_Isend(&s.grant_buffers[slot], 1, MPI_UINT64_T, peer, kGrantTag, s.comm, &s.grant_requests[slot]);
  if (rc != MPI_SUCCESS)
    return make_call_error(ErrorCode::kMpi, "MPI_Isend", "a grant to " + s.name(peer) + ": " + detail::mpi_error_string(rc),
                           __FILE__, __LINE__);
  return Status::ok();
}

// Names a failed pack or assemble.
Status step_failed(const RoundExecutor::State& s, const Status& status, const char* step, std::uint64_t round) {
  return Status(status.code(), s.name(s.rank) + ", " + step + " of round " + std::to_string(s.round_index(round)) + ": " +
                                   status.message());
}

// What the oldest round waits for, when an update makes no progress for the timeout; `explained`: what
// options.explain said about its peers.
Status timed_out(RoundExecutor::State& s, std::uint64_t oldest, const std::string& explained) {
  const WaitState state = s.wait_state(oldest);
  std::ostringstream timeout;
  timeout << s.options.timeout_seconds;
  return Status(ErrorCode::kTimeout, s.name(s.rank) + ": no progress for " + timeout.str() + " s in round " +
                                         std::to_string(s.round_index(oldest) + 1) + " of " +
                                         std::to_string(s.rounds) + ", waiting for " + state.first +
                                         explained);
}

// The rounds of one update: this update's global rounds [first, end), of which this rank works on
// [oldest, oldest + depth), one buffer slot each.
struct UpdateRounds {
  std::uint64_t first = 0, end = 0;
  std::uint64_t depth = 0;   // rounds in flight: the pipeline's buffer slots
  std::uint64_t oldest = 0;  // the oldest round of this update this rank has not finished
};

// The buffer slot of global round `g`.
std::size_t slot_of(const UpdateRounds& u, std::uint64_t g) { return static_cast<std::size_t>(g % u.depth); }

// Whether every arrival of `stage` that round `p` expects is in.
bool stage_complete(const RoundProgress& p, const exec::RoundWork& work, Stage stage) {
  return p.arrived[static_cast<std::size_t>(stage)] == work.arrivals[static_cast<std::size_t>(stage)];
}

// A completion of this rank's own writes: counted, and the round's write and forward spans traced once
// the last of them is done.
void note_writes_done(RoundExecutor::State& s, const Completion& c) {
  const std::uint64_t g = c.token & ~kRelayToken;
  RoundProgress& done = s.progress(g);
  ++done.done;
  if (c.token & kRelayToken) ++done.relay_done;
  if (s.options.trace && done.done == done.posts && done.posted == static_cast<int>(s.work_of(g).batches.size())) {
    // Transports complete one peer's posts in order, not across peers: one span per round and kind,
    // from its first post to its last completion.
    const double now = seconds_now();
    if (done.write_begin > 0) s.trace(ExecutorSpan::kWrite, g, done.write_begin, now);
    if (done.forward_begin > 0) s.trace(ExecutorSpan::kForward, g, done.forward_begin, now);
  }
}

// A peer's write into this rank's slot: counted per stage and per writer. Its immediate carries the round
// modulo 2^kRoundBits, taken as the nearest round at or after the oldest; one beyond what may be in
// flight is corrupt.
Status note_arrival(RoundExecutor::State& s, const UpdateRounds& u, const Completion& c) {
  const std::uint64_t tag = c.immediate >> 2;
  const std::uint64_t g = u.oldest + ((tag - u.oldest) & kRoundMask);
  const auto stage = static_cast<std::size_t>(c.immediate & 3u);
  if (stage >= kStageCount || g >= u.oldest + 2 * u.depth + 1)
    return Status(ErrorCode::kCorruptData, s.name(s.rank) + " got a write notification for round " + std::to_string(g) +
                                               " stage " + std::to_string(stage) + " from " + s.name(c.peer) +
                                               " while at round " + std::to_string(u.oldest));
  RoundProgress& arrived = s.progress(g);
  ++arrived.arrived[stage];
  const std::vector<int>& writers = s.work_of(g).writers;
  const auto writer = std::lower_bound(writers.begin(), writers.end(), c.peer);
  if (writer != writers.end() && *writer == c.peer)
    ++arrived.arrived_from[static_cast<std::size_t>(writer - writers.begin())][stage];
  return Status::ok();
}

// Phase 1 of a pass: what the transports completed, this rank's writes and its peers'.
Status poll_completions(RoundExecutor::State& s, const UpdateRounds& u, bool& progressed) {
  s.completions.clear();
  for (auto& [kind, transport] : s.transports) WB_RETURN_IF_ERROR(transport->poll(s.completions));
  for (const Completion& c : s.completions) {
    progressed = true;
    if (c.kind == Completion::Kind::kWritesDone)
      note_writes_done(s, c);
    else
      WB_RETURN_IF_ERROR(note_arrival(s, u, c));
  }
  return Status::ok();
}

// Phase 2: the grants the peers sent. MPI delivers one peer's messages in order, so the latest is the largest.
Status take_grants(RoundExecutor::State& s, bool& progressed) {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    WB_TRY_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kGrantTag, s.comm, &flag, &status));
    if (!flag) return Status::ok();
    std::uint64_t granted = 0;
    WB_TRY_MPI(MPI_Recv(&granted, 1, MPI_UINT64_T, status.MPI_SOURCE, kGrantTag, s.comm, MPI_STATUS_IGNORE));
    auto it = s.peers.find(status.MPI_SOURCE);
    if (it != s.peers.end()) it->second.granted = std::max(it->second.granted, granted + 1);
    progressed = true;
  }
}

// A round in flight: its global number, its schedule round's work and its progress.
struct InFlight {
  std::uint64_t g;
  exec::RoundWork& work;
  RoundProgress& p;
};

// The trainer's pack of round g into its send slot, advanced one step.
Status pack_round(RoundExecutor::State& s, const UpdateRounds& u, const InFlight& round, bool& progressed) {
  RoundProgress& p = round.p;
  if (!round.work.packs || p.packed) return Status::ok();
  if (s.packable != nullptr && !p.pack_started) {
    const int ready = s.packable->load(std::memory_order_acquire);
    if (ready < 0) return step_failed(s, Status(ErrorCode::kSystem, "its sources were not made (the staging copy failed)"), "pack", round.g);
    if (static_cast<std::int64_t>(s.round_index(round.g)) >= ready) return Status::ok();  // its sources are not ready yet
  }
  const bool was_started = p.pack_started;
  if (s.options.trace && p.pack_begin == 0) p.pack_begin = seconds_now();
  const Status status = s.engine->advance(exec::CopyStep::kPack, s.round_index(round.g), slot_of(u, round.g),
                                          p.pack_started, p.packed, s.stats.pack_seconds);
  if (!status) return step_failed(s, status, "pack", round.g);
  if (p.packed) s.trace(ExecutorSpan::kPack, round.g, p.pack_begin, seconds_now());
  if (p.packed || p.pack_started != was_started) progressed = true;
  return Status::ok();
}

// Whether `batch` of round g has its data: the pack for the receive stage, the earlier stages' arrivals
// for the exchanges, and for a relay batch round g - 1's arrivals (it reads that round's slot, which stays
// unreleased until the batch is done: release_slot).
bool batch_ready(RoundExecutor::State& s, const UpdateRounds& u, const InFlight& round, const exec::Batch& batch) {
  const auto previous_complete = [&] {
    const exec::RoundWork& before = s.work_of(round.g - 1);
    const RoundProgress& q = s.progress(round.g - 1);
    return q.arrived[0] == before.arrivals[0] && q.arrived[1] == before.arrivals[1];
  };
  const auto complete = [&](Stage stage) { return stage_complete(round.p, round.work, stage); };
  return batch.stage == Stage::kReceive ? (!round.work.packs || round.p.packed)
         : batch.lag != 0              ? round.g > u.first && previous_complete()
         : batch.stage == Stage::kExternalExchange
             ? complete(Stage::kReceive)
             : complete(Stage::kReceive) && complete(Stage::kExternalExchange);
}

// Posts the next writes of `batch` (at most writes_per_post of them) from this rank's slot into the
// peer's slot of round g. `posted` false: the transport asks to retry later.
Status post_next_writes(RoundExecutor::State& s, const UpdateRounds& u, const InFlight& round, const exec::Batch& batch,
                        PeerLink& link, bool& posted) {
  RoundProgress& p = round.p;
  const std::uint64_t g = round.g;
  const std::size_t count = std::min(batch.writes_per_post, batch.writes.size() - p.next_write);
  const auto chunk = batch.writes.begin() + static_cast<std::ptrdiff_t>(p.next_write);
  s.scratch.assign(chunk, chunk + static_cast<std::ptrdiff_t>(count));
  const std::uint64_t local_base =
      slot_of(u, g - batch.lag) *
      static_cast<std::uint64_t>(batch.stage == Stage::kReceive ? s.buffers.send_slot_stride : s.buffers.receive_slot_stride);
  const std::uint64_t remote_base = slot_of(u, g) * static_cast<std::uint64_t>(link.receive_slot_stride);
  for (WriteRequest& w : s.scratch) {
    w.local_offset += local_base;
    w.remote_offset += remote_base;
  }
  posted = false;
  Status status =
      link.transport->post_writes(batch.peer, s.scratch, encode_immediate(g, batch.stage), batch.lag != 0 ? g | kRelayToken : g);
  if (status.code() == ErrorCode::kRetryLater) return Status::ok();
  if (!status) {
    s.failed_write_peer.store(batch.peer);
    return Status(status.code(), s.name(s.rank) + ": its " + stage_name(batch.stage) + " stage write to " +
                                     s.name(batch.peer) + " failed: " + status.message());
  }
  posted = true;
  for (const WriteRequest& w : s.scratch) s.stats.bytes_written += static_cast<std::int64_t>(w.bytes);
  if (s.options.trace) {
    double& begin = batch.stage == Stage::kReceive ? p.write_begin : p.forward_begin;
    if (begin == 0) begin = seconds_now();
  }
  ++p.posts;
  if (batch.lag != 0) ++p.relay_posts;
  p.next_write += count;
  if (p.next_write == batch.writes.size()) {
    ++p.posted;
    if (batch.lag != 0) ++p.relay_posted;
    p.next_write = 0;
  }
  return Status::ok();
}

// Whether this rank's writes of round h are all posted and done (a round before the oldest is released).
bool writes_finished(RoundExecutor::State& s, const UpdateRounds& u, std::uint64_t h) {
  if (h < u.oldest) return true;
  const RoundProgress& q = s.progress(h);
  return q.posted == static_cast<int>(s.work_of(h).batches.size()) && q.done == q.posts;
}

// Round g's batches, in order, each once it has its data and its receiver granted the slot; a
// receive-stage batch, with WB_SEND_ROUNDS_IN_FLIGHT = K, only once the writes of round g - K are done.
Status post_batches(RoundExecutor::State& s, const UpdateRounds& u, const InFlight& round, bool& progressed) {
  RoundProgress& p = round.p;
  while (p.posted < static_cast<int>(round.work.batches.size())) {
    const exec::Batch& batch = round.work.batches[static_cast<std::size_t>(p.posted)];
    const auto k = static_cast<std::uint64_t>(s.send_rounds);
    if (k > 0 && batch.stage == Stage::kReceive && round.g >= k && !writes_finished(s, u, round.g - k)) break;
    const bool ready = batch_ready(s, u, round, batch);
    PeerLink& link = s.peers.at(batch.peer);
    if (!ready) break;
    if (round.g >= u.depth && link.granted <= round.g) {  // ready, but the receiver's slot is still taken
      if (s.options.trace && p.credit_wait_begin == 0) p.credit_wait_begin = seconds_now();
      break;
    }
    if (p.credit_wait_begin > 0) {
      s.trace(ExecutorSpan::kCreditWait, round.g, p.credit_wait_begin, seconds_now());
      p.credit_wait_begin = 0;
    }
    bool posted = false;
    WB_RETURN_IF_ERROR(post_next_writes(s, u, round, batch, link, posted));
    if (!posted) break;
    progressed = true;
  }
  return Status::ok();
}

// The rollout's assemble of round g out of its receive slot, advanced one step once every arrival is in.
Status assemble_round(RoundExecutor::State& s, const UpdateRounds& u, const InFlight& round, bool& progressed) {
  RoundProgress& p = round.p;
  if (p.assembled || !stage_complete(p, round.work, Stage::kReceive) ||
      !stage_complete(p, round.work, Stage::kExternalExchange) || !stage_complete(p, round.work, Stage::kInternalExchange))
    return Status::ok();
  const bool was_started = p.assemble_started;
  if (s.options.trace && p.assemble_begin == 0) p.assemble_begin = seconds_now();
  const Status status = s.engine->advance(exec::CopyStep::kAssemble, s.round_index(round.g), slot_of(u, round.g),
                                          p.assemble_started, p.assembled, s.stats.assemble_seconds);
  if (!status) return step_failed(s, status, "assemble", round.g);
  if (p.assembled && round.work.assembled_bytes > 0) s.trace(ExecutorSpan::kAssemble, round.g, p.assemble_begin, seconds_now());
  if (p.assembled || p.assemble_started != was_started) progressed = true;
  if (p.assembled) s.stats.bytes_assembled += round.work.assembled_bytes;
  return Status::ok();
}

// Whether round g + 1's relay batches, which read round g's slot, are done (none: at once).
bool relays_done(RoundExecutor::State& s, const UpdateRounds& u, std::uint64_t g) {
  const exec::RoundWork& next = s.work_of(g + 1);
  if (next.relay_batches == 0 || g + 1 >= u.end) return true;
  const RoundProgress& q = s.progress(g + 1);
  return q.relay_posted == next.relay_batches && q.relay_done == q.relay_posts;
}

// Releases round g's slot once the round is finished here: grants round g + depth to the peers that write
// it then. Slots are released in round order, so that a peer's grants arrive in order and the latest one
// stands for every round before it; a slot that round g + 1 relays out of, only once those relays are
// done (g + 1 < oldest + depth: depth >= 2 wherever a schedule relays).
Status release_slot(RoundExecutor::State& s, const UpdateRounds& u, const InFlight& round, bool& progressed) {
  RoundProgress& p = round.p;
  const std::uint64_t g = round.g;
  const bool finished = !p.released && p.assembled && (!round.work.packs || p.packed) && writes_finished(s, u, g) &&
                        (g == u.oldest || s.progress(g - 1).released) && relays_done(s, u, g);
  if (!finished) return Status::ok();
  const std::uint64_t next = g + u.depth;
  for (int writer : s.work_of(next).writers) WB_RETURN_IF_ERROR(send_grant(s, writer, next));
  p.released = true;
  progressed = true;
  return Status::ok();
}

// Phase 3: one round in flight moved as far as it goes now: pack, post, assemble, release its slot.
Status advance_round(RoundExecutor::State& s, const UpdateRounds& u, std::uint64_t g, bool& progressed) {
  const InFlight round{g, s.work_of(g), s.progress(g)};
  WB_RETURN_IF_ERROR(pack_round(s, u, round, progressed));
  WB_RETURN_IF_ERROR(post_batches(s, u, round, progressed));
  WB_RETURN_IF_ERROR(assemble_round(s, u, round, progressed));
  return release_slot(s, u, round, progressed);
}

// Phase 4: after a pass that moved nothing, the wait. Nothing moved: let the processes that have work
// run first (on one machine ranks often outnumber cores, and a spinning rank would take the core from
// the peer it waits for): the one wait policy. Idle, a peer that gave up ends this update at once rather
// than at the deadline, and a peer that asks what this rank waits for is told; no progress for the
// timeout fails the update naming what the oldest round waits for.
class IdleWait {
 public:
  IdleWait(RoundExecutor::State& s, Clock::time_point started)
      : s_(s), backoff_(s.idle_sleep_us), last_progress_(started), last_interrupt_check_(started) {}

  Status after_pass(bool progressed, std::uint64_t oldest) {
    const auto now = Clock::now();
    if (progressed) {
      last_progress_ = now;
      backoff_.progressed();
      explained_.reset();
      return Status::ok();
    }
    if (s_.options.interrupt && now - last_interrupt_check_ > std::chrono::milliseconds(1)) {
      last_interrupt_check_ = now;
      RoundExecutor::State& s = s_;
      WB_RETURN_IF_ERROR(s.options.interrupt([&s, oldest] { return s.wait_state(oldest); }));
    }
    const double idle = std::chrono::duration<double>(now - last_progress_).count();
    if (!explained_ && idle > s_.options.timeout_seconds - s_.options.explain_seconds) {
      // The diagnosis in the deadline's last explain_seconds; the next pass may still progress.
      explained_ = s_.options.explain ? s_.options.explain(s_.wait_state(oldest).second) : std::string();
      return Status::ok();
    }
    if (idle > s_.options.timeout_seconds) return timed_out(s_, oldest, *explained_);
    backoff_.pause();
    return Status::ok();
  }

 private:
  RoundExecutor::State& s_;
  comm::Backoff backoff_;
  Clock::time_point last_progress_, last_interrupt_check_;
  std::optional<std::string> explained_;  // options.explain's text since the last progress
};

// After the last round: grants still in flight complete in the background; reap the finished ones.
Status reap_grants(RoundExecutor::State& s) {
  for (MPI_Request& request : s.grant_requests) {
    int done = 0;
    if (request != MPI_REQUEST_NULL) WB_TRY_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  }
  return Status::ok();
}

// options.verify: the update's digests exchanged and compared (exec/verify.hpp).
Status verify_update(RoundExecutor::State& s) {
  if (!s.verifier) return Status::ok();
  const std::function<std::string(std::uint32_t, std::int64_t)> element =
      s.options.describe_element ? s.options.describe_element : [](std::uint32_t parameter, std::int64_t e) {
        return "parameter " + std::to_string(parameter) + " element " + std::to_string(e);
      };
  const std::function<Status()> poll = [&s]() { return s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok(); };
  return s.verifier->exchange(s.options.timeout_seconds, poll, [&s](int peer) { return s.name(peer); }, element, s.idle_sleep_us);
}

// Every round of one update: passes of poll completions, take grants, advance each round in flight,
// then wait if nothing moved, until every round of the update has released its slot.
Status run_rounds(RoundExecutor::State& s) {
  const auto started = Clock::now();
  UpdateRounds u;
  u.depth = static_cast<std::uint64_t>(s.depth);
  u.first = u.oldest = s.next_round;
  u.end = u.first + static_cast<std::uint64_t>(s.rounds);
  IdleWait idle(s, started);
  while (u.oldest < u.end) {
    bool progressed = false;
    WB_RETURN_IF_ERROR(poll_completions(s, u, progressed));
    WB_RETURN_IF_ERROR(take_grants(s, progressed));
    for (std::uint64_t g = u.oldest; g < u.end && g < u.oldest + u.depth; ++g)
      WB_RETURN_IF_ERROR(advance_round(s, u, g, progressed));
    while (u.oldest < u.end && s.progress(u.oldest).released) ++u.oldest;
    WB_RETURN_IF_ERROR(idle.after_pass(progressed, u.oldest));
  }
  WB_RETURN_IF_ERROR(reap_grants(s));
  WB_RETURN_IF_ERROR(verify_update(s));
  s.stats.last_update_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return Status::ok();
}

}  // namespace

// What round `g` waits for: a sentence, and the peers it waits on.
WaitState RoundExecutor::State::wait_state(std::uint64_t g) {
  const exec::RoundWork& round = work_of(g);
  RoundProgress& p = progress(g);
  WaitState state;
  std::string& waiting = state.first;
  const auto add = [&waiting](const std::string& text) { waiting += (waiting.empty() ? "" : "; ") + text; };
  for (std::size_t st = 0; st < kStageCount; ++st) {
    if (p.arrived[st] == round.arrivals[st]) continue;
    std::string from;
    for (std::size_t w = 0; w < round.writers.size(); ++w)
      if (p.arrived_from[w][st] < round.expected_from[w][st]) {
        from += (from.empty() ? "" : ", ") + name(round.writers[w]);
        state.second.push_back(round.writers[w]);
      }
    add(std::string(stage_name(static_cast<Stage>(st))) + " stage writes from " + from);
  }
  if (p.posted < static_cast<int>(round.batches.size())) {
    const exec::Batch& batch = round.batches[static_cast<std::size_t>(p.posted)];
    const bool granted = !(peers.at(batch.peer).granted <= g && g >= static_cast<std::uint64_t>(depth));
    add("its " + std::string(stage_name(batch.stage)) + " stage write to " + name(batch.peer) +
        (granted ? "" : ", which has not granted that buffer slot yet"));
    if (!granted) state.second.push_back(batch.peer);
  }
  if (p.done < p.posts) {
    // The peers this rank's posts still wait on, this round's among them (a transport completes one peer's
    // posts in order, so the oldest round's are the first each of them owes).
    std::string to;
    for (const auto& [kind, transport] : transports)
      for (int peer : transport->awaited_peers()) {
        to += (to.empty() ? "" : ", ") + name(peer);
        state.second.push_back(peer);
      }
    add(std::to_string(p.posts - p.done) + " posts to complete" + (to.empty() ? "" : " (writes to " + to + ")"));
  }
  if (p.pack_started && !p.packed) add("the pack kernel to finish");
  if (packable != nullptr && round.packs && !p.pack_started && static_cast<std::int64_t>(round_index(g)) >= packable->load())
    add("its sources (the staging copy of round " + std::to_string(round_index(g) + 1) + ")");
  if (p.assemble_started && !p.assembled) add("the assemble kernel to finish");
  if (waiting.empty()) waiting = "its own work";
  std::sort(state.second.begin(), state.second.end());
  state.second.erase(std::unique(state.second.begin(), state.second.end()), state.second.end());
  return state;
}


Status RoundExecutor::run_update(const DeviceOrdering& after, const std::atomic<int>* packable) {
  State& s = *state_;
  if (packable != nullptr && s.parameters.memory != MemoryKind::kHost)
    return Status(ErrorCode::kInvalidArgument, "run_update: packing as sources become ready is for host parameters only");
  s.packable = packable;
  struct Clear {
    State& s;
    ~Clear() { s.packable = nullptr; }
  } clear{s};
  // A peer that gave up before this update began: nothing is written or assembled.
  Status status = s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok();
  if (status && s.options.enter_together) {
    const comm::Waiter waiter{s.options.timeout_seconds, [&s](bool) {
                                return s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok();
                              }};
    status = comm::barrier_or_failure(s.comm, waiter, "rank " + std::to_string(s.rank) +
                                                          ": every rank entering the update (one that refused it never does)");
  }
  if (status) status = s.engine->begin_update(after);
  if (status && s.verifier) s.verifier->begin_update();
  if (status) status = run_rounds(s);
  if (status) status = s.engine->end_update();
  if (!status) {
    s.failed = true;
    // A write that failed after its post: the transport knows to whom (the coordinator names it lost).
    for (const auto& [kind, transport] : s.transports)
      for (int peer : transport->failed_peers())
        if (s.failed_write_peer.load() < 0) s.failed_write_peer.store(peer);
    return s.engine->explain(std::move(status));
  }
  s.next_round += static_cast<std::uint64_t>(s.rounds);
  ++s.stats.updates;
  s.stats.traffic.clear();
  for (const auto& [kind, transport] : s.transports)
    for (const PeerTraffic& link : transport->traffic()) s.stats.traffic.emplace_back(kind, link);
  return Status::ok();
}

}  // namespace wb
