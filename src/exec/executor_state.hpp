// What a RoundExecutor holds, shared by the files of its lifecycle phases (round_executor.hpp lists them).
// Private to src/exec.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/copy_engine.hpp"
#include "exec/round_executor.hpp"
#include "exec/round_work.hpp"
#include "exec/transfer_memory.hpp"
#include "exec/verify.hpp"
#include "plan/round_schedule.hpp"
#include "transport/transport.hpp"

namespace wb {

namespace exec {
/// MPI tags on the executor's communicator: connect-time records 0x5742 (connect_handshake.cpp), grants
/// 0x5743 (progress_loop.cpp), and the verify digests of an update:
inline constexpr int kDigestTag = 0x5744;
}  // namespace exec

// A peer this rank writes to or hears from.
struct PeerLink {
  Transport* transport = nullptr;
  std::uint32_t receive_memory = 0;      // the peer's receive buffer, imported
  std::int64_t receive_slot_stride = 0;  // the peer's: bytes from one slot to the next
  std::uint64_t granted = 0;             // rounds < granted may be written (first depth rounds are free)
};

// Per global round in flight (a ring of these, indexed g % ring size).
struct RoundProgress {
  std::uint64_t round = UINT64_MAX;
  std::array<int, kStageCount> arrived{};
  int posted = 0;              // batches of this rank posted completely
  std::size_t next_write = 0;  // in the batch being posted: its first write not yet posted
  int posts = 0, done = 0;     // posts made (one per batch unless it is split) and completed
  int relay_posted = 0;        // lag 1 batches posted completely
  int relay_posts = 0, relay_done = 0;  // their posts, made and completed (also counted in posts, done)
  bool packed = false, assembled = false, released = false;
  bool pack_started = false, assemble_started = false;  // CUDA parameters: kernel enqueued, maybe not done
  // options.trace, in local_seconds() (0: not yet): when the round's pack and assemble were first
  // advanced, its first receive-stage write and first forward posted, and since when a batch ready to
  // post has waited for the receiver's credit.
  double pack_begin = 0, assemble_begin = 0, write_begin = 0, forward_begin = 0, credit_wait_begin = 0;
  std::vector<std::array<int, kStageCount>> arrived_from;  // per writer of the round (sized once, at construction)
};

struct RoundExecutor::State {
  RoundSchedule schedule;
  ParameterMemory parameters;
  MPI_Comm comm = MPI_COMM_NULL;
  ExecutorOptions options;
  ExecutorStats stats;
  int rank = 0, depth = 1, rounds = 0;
  std::int64_t idle_sleep_us = 0;   // the setting, read once
  std::int64_t send_rounds = 0;     // WB_SEND_ROUNDS_IN_FLIGHT, read once (0: no limit but the depth)
  bool collective_teardown = false;  // some rank of the plan has CUDA parameters (round_executor.hpp)
  bool failed = false;               // an update returned an error
  std::atomic<int> failed_write_peer{-1};  // the peer a post of this rank's writes failed to (failed_write_peer())
  bool peers_failed = false;         // the caller gave up on the job (note_peer_failure): teardown as after a failure

  // Members are destroyed in reverse order: the transports (which registered the buffers and imported the
  // peers' memory) go first, then the engine (its stream and programs), then the buffers.
  exec::TransferBuffers buffers;
  std::unique_ptr<exec::CopyEngine> engine;
  std::map<TransportKind, std::unique_ptr<Transport>> transports;
  std::map<TransportKind, std::pair<std::uint32_t, std::uint32_t>> local_memory;  // send, receive ids
  std::map<TransportKind, std::vector<std::byte>> receive_keys;                    // what peers import
  std::map<int, PeerLink> peers;
  std::vector<exec::RoundWork> work;  // per schedule round

  std::uint64_t next_round = 0;  // global number of the next update's first round
  std::vector<RoundProgress> ring;
  std::vector<Completion> completions;
  std::vector<WriteRequest> scratch;
  std::vector<MPI_Request> grant_requests;
  std::deque<std::uint64_t> grant_buffers;  // one per grant request; a deque, so buffers in flight never move
  std::unique_ptr<exec::Verifier> verifier;  // options.verify
  const std::atomic<int>* packable = nullptr;  // run_update's, during the update

  /// The schedule round that global round `g` runs (rounds are numbered across updates), and its work.
  std::size_t round_index(std::uint64_t g) const { return static_cast<std::size_t>(g % static_cast<std::uint64_t>(rounds)); }
  exec::RoundWork& work_of(std::uint64_t g) { return work[round_index(g)]; }

  RoundProgress& progress(std::uint64_t g) {
    RoundProgress& p = ring[g % ring.size()];
    if (p.round != g) {
      // Reset without giving back the per-writer counters' memory: an update allocates nothing.
      std::vector<std::array<int, kStageCount>> from = std::move(p.arrived_from);
      std::fill(from.begin(), from.end(), std::array<int, kStageCount>{});
      p = RoundProgress{};
      p.round = g;
      p.arrived_from = std::move(from);
    }
    return p;
  }

  /// options.trace: one span of this rank's timeline (seconds of the steady clock), up to kMaxTraceSpans.
  static constexpr std::size_t kMaxTraceSpans = std::size_t{1} << 20;  // about 40 MB per rank
  void trace(ExecutorSpan::Kind kind, std::uint64_t g, double begin, double end) {
    if (!options.trace) return;
    if (stats.trace.size() >= kMaxTraceSpans) {
      ++stats.trace_dropped;
      return;
    }
    stats.trace.push_back({kind, stats.updates, static_cast<int>(round_index(g)), begin, end});
  }

  /// A rank of the communicator in messages (ExecutorOptions::describe_rank).
  std::string name(int peer) const {
    return options.describe_rank ? options.describe_rank(peer) : "rank " + std::to_string(peer);
  }

  /// What round `g` waits for: a sentence, and the peers it waits on (progress_loop.cpp).
  WaitState wait_state(std::uint64_t g);
};

}  // namespace wb
