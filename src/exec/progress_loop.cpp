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
#include <sstream>
#include <string>
#include <thread>

#include "comm/backoff.hpp"
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
  return Status(status.code(), s.name(s.rank) + ", " + step + " of round " + std::to_string(round % s.work.size()) + ": " +
                                   status.message());
}

// What the oldest round waits for, when an update makes no progress for the timeout.
Status timed_out(RoundExecutor::State& s, std::uint64_t oldest) {
  const WaitState state = s.wait_state(oldest);
  std::ostringstream timeout;
  timeout << s.options.timeout_seconds;
  return Status(ErrorCode::kTimeout, s.name(s.rank) + ": no progress for " + timeout.str() + " s in round " +
                                         std::to_string(oldest % static_cast<std::uint64_t>(s.rounds) + 1) + " of " +
                                         std::to_string(s.rounds) + ", waiting for " + state.first +
                                         (s.options.explain ? s.options.explain(state.second) : std::string()));
}

// Every round of one update.
Status run_rounds(RoundExecutor::State& s) {
  const auto started = Clock::now();
  auto last_progress = started;
  comm::Backoff backoff(s.idle_sleep_us);
  const auto depth = static_cast<std::uint64_t>(s.depth);
  const std::uint64_t first = s.next_round, end = first + static_cast<std::uint64_t>(s.rounds);
  std::uint64_t oldest = first;  // the oldest round of this update this rank has not finished
  const auto slot_of = [&](std::uint64_t g) { return static_cast<std::size_t>(g % depth); };
  auto last_interrupt_check = started;

  while (oldest < end) {
    bool progressed = false;
    s.completions.clear();
    for (auto& [kind, transport] : s.transports) WB_RETURN_IF_ERROR(transport->poll(s.completions));
    for (const Completion& c : s.completions) {
      progressed = true;
      if (c.kind == Completion::Kind::kWritesDone) {
        const std::uint64_t g = c.token & ~kRelayToken;
        RoundProgress& done = s.progress(g);
        ++done.done;
        if (c.token & kRelayToken) ++done.relay_done;
        if (s.options.trace && done.done == done.posts &&
            done.posted == static_cast<int>(s.work[static_cast<std::size_t>(g % static_cast<std::uint64_t>(s.rounds))].batches.size())) {
          // Transports complete one peer's posts in order, not across peers: one span per round and kind,
          // from its first post to its last completion.
          const double now = seconds_now();
          if (done.write_begin > 0) s.trace(ExecutorSpan::kWrite, g, done.write_begin, now);
          if (done.forward_begin > 0) s.trace(ExecutorSpan::kForward, g, done.forward_begin, now);
        }
        continue;
      }
      const std::uint64_t tag = c.immediate >> 2;
      const std::uint64_t g = oldest + ((tag - oldest) & kRoundMask);
      const auto stage = static_cast<std::size_t>(c.immediate & 3u);
      if (stage >= kStageCount || g >= oldest + 2 * depth + 1)
        return Status(ErrorCode::kCorruptData, s.name(s.rank) + " got a write notification for round " + std::to_string(g) +
                                                   " stage " + std::to_string(stage) + " from " + s.name(c.peer) +
                                                   " while at round " + std::to_string(oldest));
      RoundProgress& arrived = s.progress(g);
      ++arrived.arrived[stage];
      const std::vector<int>& writers = s.work[static_cast<std::size_t>(g % static_cast<std::uint64_t>(s.rounds))].writers;
      const auto writer = std::lower_bound(writers.begin(), writers.end(), c.peer);
      if (writer != writers.end() && *writer == c.peer)
        ++arrived.arrived_from[static_cast<std::size_t>(writer - writers.begin())][stage];
    }
    // Grants: MPI delivers one peer's messages in order, so the latest is the largest.
    for (;;) {
      int flag = 0;
      MPI_Status status;
      WB_TRY_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kGrantTag, s.comm, &flag, &status));
      if (!flag) break;
      std::uint64_t granted = 0;
      WB_TRY_MPI(MPI_Recv(&granted, 1, MPI_UINT64_T, status.MPI_SOURCE, kGrantTag, s.comm, MPI_STATUS_IGNORE));
      auto it = s.peers.find(status.MPI_SOURCE);
      if (it != s.peers.end()) it->second.granted = std::max(it->second.granted, granted + 1);
      progressed = true;
    }

    for (std::uint64_t g = oldest; g < end && g < oldest + depth; ++g) {
      const auto r = static_cast<std::size_t>(g % static_cast<std::uint64_t>(s.rounds));
      exec::RoundWork& work = s.work[r];
      RoundProgress& p = s.progress(g);
      if (work.packs && !p.packed) {
        const bool was_started = p.pack_started;
        if (s.options.trace && p.pack_begin == 0) p.pack_begin = seconds_now();
        const Status status = s.engine->advance(exec::CopyStep::kPack, r, slot_of(g), p.pack_started, p.packed, s.stats.pack_seconds);
        if (!status) return step_failed(s, status, "pack", g);
        if (p.packed) s.trace(ExecutorSpan::kPack, g, p.pack_begin, seconds_now());
        progressed = progressed || p.packed || p.pack_started != was_started;
      }
      const auto complete = [&](Stage stage) {
        return p.arrived[static_cast<std::size_t>(stage)] == work.arrivals[static_cast<std::size_t>(stage)];
      };
      // A relay batch reads round g - 1's slot, which stays unreleased until it is done (below).
      const auto previous_complete = [&] {
        const exec::RoundWork& before = s.work[static_cast<std::size_t>((g - 1) % static_cast<std::uint64_t>(s.rounds))];
        const RoundProgress& q = s.progress(g - 1);
        return q.arrived[0] == before.arrivals[0] && q.arrived[1] == before.arrivals[1];
      };
      while (p.posted < static_cast<int>(work.batches.size())) {
        const exec::Batch& batch = work.batches[static_cast<std::size_t>(p.posted)];
        const bool ready = batch.stage == Stage::kReceive ? (!work.packs || p.packed)
                           : batch.lag != 0 ? g > first && previous_complete()
                           : batch.stage == Stage::kExternalExchange
                               ? complete(Stage::kReceive)
                               : complete(Stage::kReceive) && complete(Stage::kExternalExchange);
        PeerLink& link = s.peers.at(batch.peer);
        if (!ready) break;
        if (g >= depth && link.granted <= g) {  // ready, but the receiver's slot is still taken
          if (s.options.trace && p.credit_wait_begin == 0) p.credit_wait_begin = seconds_now();
          break;
        }
        if (p.credit_wait_begin > 0) {
          s.trace(ExecutorSpan::kCreditWait, g, p.credit_wait_begin, seconds_now());
          p.credit_wait_begin = 0;
        }
        const std::size_t count = std::min(batch.writes_per_post, batch.writes.size() - p.next_write);
        const auto chunk = batch.writes.begin() + static_cast<std::ptrdiff_t>(p.next_write);
        s.scratch.assign(chunk, chunk + static_cast<std::ptrdiff_t>(count));
        const std::uint64_t local_base =
            slot_of(g - batch.lag) * static_cast<std::uint64_t>(batch.stage == Stage::kReceive ? s.buffers.send_slot_stride
                                                                                   : s.buffers.receive_slot_stride);
        const std::uint64_t remote_base = slot_of(g) * static_cast<std::uint64_t>(link.receive_slot_stride);
        for (WriteRequest& w : s.scratch) {
          w.local_offset += local_base;
          w.remote_offset += remote_base;
        }
        Status status = link.transport->post_writes(batch.peer, s.scratch, encode_immediate(g, batch.stage),
                                                    batch.lag != 0 ? g | kRelayToken : g);
        if (status.code() == ErrorCode::kRetryLater) break;
        if (!status)
          return Status(status.code(), s.name(s.rank) + ": its " + stage_name(batch.stage) + " stage write to " +
                                           s.name(batch.peer) + " failed: " + status.message());
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
        progressed = true;
      }
      if (!p.assembled && complete(Stage::kReceive) && complete(Stage::kExternalExchange) &&
          complete(Stage::kInternalExchange)) {
        const bool was_started = p.assemble_started;
        if (s.options.trace && p.assemble_begin == 0) p.assemble_begin = seconds_now();
        const Status status =
            s.engine->advance(exec::CopyStep::kAssemble, r, slot_of(g), p.assemble_started, p.assembled, s.stats.assemble_seconds);
        if (!status) return step_failed(s, status, "assemble", g);
        if (p.assembled && work.assembled_bytes > 0) s.trace(ExecutorSpan::kAssemble, g, p.assemble_begin, seconds_now());
        progressed = progressed || p.assembled || p.assemble_started != was_started;
        if (p.assembled) s.stats.bytes_assembled += work.assembled_bytes;
      }
      // Slots are released in round order, so that a peer's grants arrive in order and the latest one
      // stands for every round before it; a slot that round g + 1 relays out of, only once those relays
      // are done (g + 1 < oldest + depth: depth >= 2 wherever a schedule relays).
      const auto relays_done = [&] {
        const exec::RoundWork& next = s.work[static_cast<std::size_t>((g + 1) % static_cast<std::uint64_t>(s.rounds))];
        if (next.relay_batches == 0 || g + 1 >= end) return true;
        const RoundProgress& q = s.progress(g + 1);
        return q.relay_posted == next.relay_batches && q.relay_done == q.relay_posts;
      };
      if (!p.released && p.assembled && (!work.packs || p.packed) && p.posted == static_cast<int>(work.batches.size()) &&
          p.done == p.posts && (g == oldest || s.progress(g - 1).released) && relays_done()) {
        // The slot is free again: whoever writes into it depth rounds later may go ahead.
        const std::uint64_t next = g + depth;
        for (int writer : s.work[static_cast<std::size_t>(next % static_cast<std::uint64_t>(s.rounds))].writers)
          WB_RETURN_IF_ERROR(send_grant(s, writer, next));
        p.released = true;
        progressed = true;
      }
    }
    while (oldest < end && s.progress(oldest).released) ++oldest;

    const auto now = Clock::now();
    if (progressed) {
      last_progress = now;
      backoff.progressed();
    } else if (s.options.interrupt && now - last_interrupt_check > std::chrono::milliseconds(1)) {
      // Idle: a peer that gave up ends this update at once rather than at the deadline; a peer that asks
      // what this rank waits for is told.
      last_interrupt_check = now;
      WB_RETURN_IF_ERROR(s.options.interrupt([&s, oldest] { return s.wait_state(oldest); }));
    }
    if (!progressed && std::chrono::duration<double>(now - last_progress).count() > s.options.timeout_seconds)
      return timed_out(s, oldest);
    // Nothing moved: let the processes that have work run first (on one machine ranks often outnumber
    // cores, and a spinning rank would take the core from the peer it waits for): the one wait policy.
    if (!progressed) backoff.pause();
  }
  // Grants still in flight complete in the background; reap the finished ones.
  for (MPI_Request& request : s.grant_requests) {
    int done = 0;
    if (request != MPI_REQUEST_NULL) WB_TRY_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  }
  if (s.verifier) {
    const std::function<std::string(std::uint32_t, std::int64_t)> element =
        s.options.describe_element ? s.options.describe_element : [](std::uint32_t parameter, std::int64_t e) {
          return "parameter " + std::to_string(parameter) + " element " + std::to_string(e);
        };
    const std::function<Status()> poll = [&s]() { return s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok(); };
    WB_RETURN_IF_ERROR(
        s.verifier->exchange(s.options.timeout_seconds, poll, [&s](int peer) { return s.name(peer); }, element, s.idle_sleep_us));
  }
  s.stats.last_update_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return Status::ok();
}

}  // namespace

// What round `g` waits for: a sentence, and the peers it waits on.
WaitState RoundExecutor::State::wait_state(std::uint64_t g) {
  const exec::RoundWork& round = work[static_cast<std::size_t>(g % static_cast<std::uint64_t>(rounds))];
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
  if (p.done < p.posts) add(std::to_string(p.posts - p.done) + " posts to complete");
  if (p.pack_started && !p.packed) add("the pack kernel to finish");
  if (p.assemble_started && !p.assembled) add("the assemble kernel to finish");
  if (waiting.empty()) waiting = "its own work";
  std::sort(state.second.begin(), state.second.end());
  state.second.erase(std::unique(state.second.begin(), state.second.end()), state.second.end());
  return state;
}


Status RoundExecutor::run_update(const DeviceOrdering& after) {
  State& s = *state_;
  // A peer that gave up before this update began: nothing is written or assembled.
  Status status = s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok();
  if (status) status = s.engine->begin_update(after);
  if (status && s.verifier) s.verifier->begin_update();
  if (status) status = run_rounds(s);
  if (status) status = s.engine->end_update();
  if (!status) {
    s.failed = true;
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
