// The whole connect-time path across real processes, then the plan played across them. Each rank is one
// emulated worker: it probes its load_weights, the source maps are all-gathered, rank 0 builds the
// correspondence, plans, builds and serializes every rank's round schedule and scatters them; every rank
// checks that what it received equals what it plans itself (plans are deterministic, across processes too).
// Then the schedules are played over MPI point-to-point messages, stage by stage, and every rollout parameter
// must equal, bit for bit, what its own load_weights gives over the same fill. A planning failure on rank 0
// must end with an error on every rank, never with a rank left waiting.
//
// The data plane here is TEST-ONLY. In production MPI never carries weight bytes (docs/architecture.md: "MPI carries
// control only"); the one-sided transports (cma, ibverbs, cuda_ipc) do. MPI messages stand in for those
// writes so that the schedules' semantics — who writes which bytes where, in which stage — are checked
// across processes before the transports exist.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../support/schedule_replay.hpp"
#include "comm/backoff.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/setup/emulated_rank.hpp"
#include "layout/probe.hpp"
#include "layout/source_map_exchange.hpp"
#include "plan/planned_schedules.hpp"
#include "plan/round_schedule.hpp"
#include "plan/round_schedule_scatter.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using ::testing::HasSubstr;
using ::wb::testing_support::element_position;
using ::wb::testing_support::for_each_element;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::byte>;

constexpr std::byte kRolloutFill{0xEE};
constexpr std::byte kPoison{0xCD};
constexpr auto kPlayTimeout = std::chrono::seconds(60);

// A communicator of its own per test, so that messages a failed test leaves behind cannot reach the next.
class TestComm {
 public:
  TestComm() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~TestComm() { MPI_Comm_free(&comm_); }
  TestComm(const TestComm&) = delete;
  TestComm& operator=(const TestComm&) = delete;
  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// True when every rank passes ok = true. Every rank calls it at the same points, whether its own work
// failed or not, so a failure on one rank never leaves the others waiting in a later collective.
bool all_ranks_ok(bool ok, MPI_Comm comm) {
  int mine = ok ? 1 : 0, all = 0;
  if (MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) {
    ADD_FAILURE() << "MPI_Allreduce failed";
    return false;
  }
  return all == 1;
}

// Runs one local step of a rank's work: an exception becomes a test failure naming the rank and step, and
// an ASSERT inside `step` returns from `step` only. Returns whether this rank has no failure so far.
template <class Fn>
bool local_step(int rank, const char* step, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << rank << ", " << step << ": " << e.what();
  }
  return !::testing::Test::HasFailure();
}

struct LayoutPair {
  std::string model;
  std::string trainer;
  std::string rollout;
  int gpus_per_node = 4;
};

// One rank's share of a deployment: its emulated worker, and what every rank knows about the others.
struct RankSetup : EmulatedRank {
  Topology topology;
};

RankSetup set_up(const LayoutPair& pair, int rank, int world_size) {
  RankSetup s{emulated_rank({pair.model, 4, pair.trainer, pair.rollout, pair.gpus_per_node}, rank, world_size), {}};
  s.topology = Topology::uniform(s.deployment.world_size(), pair.gpus_per_node, 400e9, 900e9);
  return s;
}

// Small buffers and pieces: many rounds even at tiny scale.
PlanOptions small_plan_options() {
  PlanOptions options;
  options.buffer_bytes_per_worker = 64 << 10;
  options.piece_bytes = 512;
  return options;
}

void fill(const ParameterSet& params, std::byte value) {
  for (const Parameter& p : params) std::memset(p.view.data, static_cast<int>(value), p.view.nbytes());
}

std::string where(int rank, int round, Stage stage) {
  return "rank " + std::to_string(rank) + ", round " + std::to_string(round) + ", " + stage_name(stage);
}

// ---------------------------------------------------------------------------------------------------------
// The test-only data plane: one MPI message per Write — a header {remote_offset, bytes} and the bytes — to
// the write's peer, tagged with its round and stage. A receiver takes, in each stage, messages from each
// peer of its arrival regions of that stage until the regions' bytes are in; each message must land inside
// one region from that peer and stage, and no byte may be written twice (the checks schedule_replay makes in
// one process). Every wait polls against one deadline for the whole play.

struct MessageHeader {
  std::int64_t remote_offset = 0;
  std::int64_t bytes = 0;
};

int message_tag(int round, Stage stage) { return 1 + (round % 10000) * kStageCount + static_cast<int>(stage); }

class MpiPlayer {
 public:
  MpiPlayer(const RoundSchedule& schedule, const ParameterSet& params, MPI_Comm comm)
      : schedule_(schedule), params_(params), comm_(comm), deadline_(Clock::now() + kPlayTimeout) {}

  ~MpiPlayer() {
    // After a failure, sends may still be in flight: their buffers must outlive them, so they are left to
    // the end of the process (only on a failing run).
    if (!pending_.empty()) {
      static std::vector<std::vector<Bytes>> abandoned;
      for (MPI_Request& request : pending_)
        if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
      abandoned.push_back(std::move(outgoing_));
    }
  }

  // Plays every round. Returns "" or the first error, naming rank, peer, round and stage.
  std::string play() {
    send_.assign(static_cast<std::size_t>(schedule_.send_slot_bytes), kPoison);
    receive_.assign(static_cast<std::size_t>(schedule_.receive_slot_bytes), kPoison);
    for (std::size_t r = 0; r < schedule_.rounds.size(); ++r) {
      std::string error = play_round(static_cast<int>(r), schedule_.rounds[r]);
      if (!error.empty()) return error;
    }
    return {};
  }

  std::array<std::int64_t, kStageCount> messages_sent{};
  std::array<std::int64_t, kStageCount> bytes_sent{};

 private:
  std::string play_round(int round, const RoundPlan& plan) {
    std::fill(send_.begin(), send_.end(), kPoison);
    std::fill(receive_.begin(), receive_.end(), kPoison);
    filled_.assign(receive_.size(), 0);
    for (const BufferCopy& pack : plan.pack) {
      std::string error = check_copy(pack, send_, round, "pack");
      if (!error.empty()) return error;
      auto* param = static_cast<const std::byte*>(params_[pack.copy.parameter].view.data);
      for_each_element(pack.copy.box, [&](std::span<const std::int64_t> i, std::int64_t ordinal) {
        std::memcpy(send_.data() + pack.buffer_offset + ordinal * pack.element_bytes,
                    param + element_position(pack.copy, i) * pack.element_bytes, pack.element_bytes);
      });
    }
    for (Stage stage : {Stage::kReceive, Stage::kExternalExchange, Stage::kInternalExchange}) {
      std::string error = post_writes(round, stage, plan);
      if (error.empty()) error = take_arrivals(round, stage, plan);
      if (!error.empty()) return error;
    }
    std::string error = wait_for_sends(round);
    if (!error.empty()) return error;
    for (const BufferCopy& assemble : plan.assemble) {
      error = check_copy(assemble, receive_, round, "assemble");
      if (!error.empty()) return error;
      auto* param = static_cast<std::byte*>(params_[assemble.copy.parameter].view.data);
      for_each_element(assemble.copy.box, [&](std::span<const std::int64_t> i, std::int64_t ordinal) {
        std::memcpy(param + element_position(assemble.copy, i) * assemble.element_bytes,
                    receive_.data() + assemble.buffer_offset + ordinal * assemble.element_bytes, assemble.element_bytes);
      });
    }
    return {};
  }

  // A pack or assemble copy must stay inside its buffer and its parameter.
  std::string check_copy(const BufferCopy& copy, const Bytes& buffer, int round, const char* what) const {
    const std::string at = "rank " + std::to_string(schedule_.rank) + ", round " + std::to_string(round) + ", " + what;
    if (copy.buffer_offset < 0 || copy.buffer_offset + copy.bytes() > static_cast<std::int64_t>(buffer.size()))
      return at + ": buffer range outside the slot";
    if (copy.copy.parameter >= params_.size()) return at + ": parameter " + std::to_string(copy.copy.parameter) + " out of range";
    const TensorView& view = params_[copy.copy.parameter].view;
    if (copy.element_bytes != view.element_size()) return at + ": element size differs from parameter " + params_[copy.copy.parameter].name;
    std::int64_t lowest = copy.copy.offset, highest = copy.copy.offset;
    for (std::size_t a = 0; a < copy.copy.strides.size(); ++a) {
      const std::int64_t span = (copy.copy.box.extent[a] - 1) * copy.copy.strides[a];
      (span < 0 ? lowest : highest) += span;
    }
    if (copy.copy.box.numel() > 0 && (lowest < 0 || highest >= view.numel()))
      return at + ": elements outside parameter " + params_[copy.copy.parameter].name;
    return {};
  }

  std::string post_writes(int round, Stage stage, const RoundPlan& plan) {
    for (const Write& write : plan.writes) {
      if (write.stage != stage) continue;
      const Bytes& from = stage == Stage::kReceive ? send_ : receive_;
      if (write.local_offset < 0 || write.bytes < 0 || write.local_offset + write.bytes > static_cast<std::int64_t>(from.size()))
        return where(schedule_.rank, round, stage) + ": write to rank " + std::to_string(write.peer) + " reads outside the buffer";
      Bytes message(sizeof(MessageHeader) + static_cast<std::size_t>(write.bytes));
      const MessageHeader header{write.remote_offset, write.bytes};
      std::memcpy(message.data(), &header, sizeof header);
      std::memcpy(message.data() + sizeof header, from.data() + write.local_offset, static_cast<std::size_t>(write.bytes));
      outgoing_.push_back(std::move(message));
      pending_.push_back(MPI_REQUEST_NULL);
      if (MPI_Isend(outgoing_.back().data(), static_cast<int>(outgoing_.back().size()), MPI_BYTE, write.peer,
                    message_tag(round, stage), comm_, &pending_.back()) != MPI_SUCCESS)
        return where(schedule_.rank, round, stage) + ": MPI_Isend to rank " + std::to_string(write.peer) + " failed";
      ++messages_sent[static_cast<std::size_t>(stage)];
      bytes_sent[static_cast<std::size_t>(stage)] += write.bytes;
    }
    return {};
  }

  std::string take_arrivals(int round, Stage stage, const RoundPlan& plan) {
    std::map<int, std::int64_t> remaining;  // per peer: bytes still to come in this stage
    for (const Arrival& a : plan.arrivals)
      if (a.stage == stage) remaining[a.peer] += a.bytes;
    const int tag = message_tag(round, stage);
    std::size_t open = 0;
    for (const auto& [peer, bytes] : remaining) open += bytes > 0 ? 1 : 0;
    Bytes message;
    comm::Backoff backoff;
    while (open > 0) {
      bool progressed = false;
      for (auto& [peer, bytes] : remaining) {
        if (bytes <= 0) continue;
        int flag = 0;
        MPI_Message handle = MPI_MESSAGE_NULL;
        MPI_Status status;
        if (MPI_Improbe(peer, tag, comm_, &flag, &handle, &status) != MPI_SUCCESS)
          return where(schedule_.rank, round, stage) + ": MPI_Improbe for rank " + std::to_string(peer) + " failed";
        if (!flag) continue;
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        message.resize(static_cast<std::size_t>(count));
        if (MPI_Mrecv(message.data(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE) != MPI_SUCCESS)
          return where(schedule_.rank, round, stage) + ": MPI_Mrecv from rank " + std::to_string(peer) + " failed";
        std::string error = land(round, stage, plan, peer, message);
        if (!error.empty()) return error;
        MessageHeader header;
        std::memcpy(&header, message.data(), sizeof header);
        bytes -= header.bytes;
        if (bytes < 0)
          return where(schedule_.rank, round, stage) + ": rank " + std::to_string(peer) + " wrote more than the regions it fills";
        if (bytes == 0) --open;
        progressed = true;
      }
      if (progressed) {
        backoff.progressed();
        continue;
      }
      if (Clock::now() > deadline_) {
        std::string waiting;
        for (const auto& [peer, bytes] : remaining)
          if (bytes > 0) waiting += (waiting.empty() ? "" : ", ") + std::to_string(bytes) + " bytes from rank " + std::to_string(peer);
        return where(schedule_.rank, round, stage) + ": timed out after " + std::to_string(kPlayTimeout.count()) +
               " s waiting for " + waiting;
      }
      backoff.pause();
    }
    for (const Arrival& a : plan.arrivals) {
      if (a.stage != stage) continue;
      for (std::int64_t b = a.offset; b < a.offset + a.bytes; ++b)
        if (filled_[static_cast<std::size_t>(b)] != 1)
          return where(schedule_.rank, round, stage) + ": byte " + std::to_string(b) + " of the region [" +
                 std::to_string(a.offset) + ", +" + std::to_string(a.bytes) + ") from rank " + std::to_string(a.peer) +
                 " was written " + std::to_string(filled_[static_cast<std::size_t>(b)]) + " times";
    }
    return {};
  }

  // One received message: inside one region `peer` fills in `stage`, each byte written once.
  std::string land(int round, Stage stage, const RoundPlan& plan, int peer, const Bytes& message) {
    const std::string at = where(schedule_.rank, round, stage) + ", message from rank " + std::to_string(peer);
    MessageHeader header;
    if (message.size() < sizeof header) return at + ": shorter than its header";
    std::memcpy(&header, message.data(), sizeof header);
    if (header.bytes < 0 || message.size() != sizeof header + static_cast<std::size_t>(header.bytes))
      return at + ": header says " + std::to_string(header.bytes) + " bytes, message carries " +
             std::to_string(message.size() - sizeof header);
    bool inside = false;
    for (const Arrival& a : plan.arrivals)
      inside = inside || (a.peer == peer && a.stage == stage && header.remote_offset >= a.offset &&
                          header.remote_offset + header.bytes <= a.offset + a.bytes);
    if (!inside)
      return at + ": [" + std::to_string(header.remote_offset) + ", +" + std::to_string(header.bytes) +
             ") lands outside every region that rank fills in this stage";
    for (std::int64_t b = 0; b < header.bytes; ++b)
      if (filled_[static_cast<std::size_t>(header.remote_offset + b)]++ != 0)
        return at + ": byte " + std::to_string(header.remote_offset + b) + " written twice";
    std::memcpy(receive_.data() + header.remote_offset, message.data() + sizeof header, static_cast<std::size_t>(header.bytes));
    return {};
  }

  std::string wait_for_sends(int round) {
    comm::Backoff backoff;
    for (;;) {
      int done = 0;
      if (MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return "rank " + std::to_string(schedule_.rank) + ", round " + std::to_string(round) + ": MPI_Testall failed";
      if (done) break;
      if (Clock::now() > deadline_) {
        std::string peers;
        std::size_t i = 0;
        for (const RoundPlan& plan = schedule_.rounds[static_cast<std::size_t>(round)]; const Write& w : plan.writes) {
          if (i < pending_.size() && pending_[i] != MPI_REQUEST_NULL)
            peers += (peers.empty() ? "" : ", ") + std::string("rank ") + std::to_string(w.peer) + " (" + stage_name(w.stage) + ")";
          ++i;
        }
        return "rank " + std::to_string(schedule_.rank) + ", round " + std::to_string(round) + ": timed out after " +
               std::to_string(kPlayTimeout.count()) + " s waiting for writes to " + peers + " to be taken";
      }
      backoff.pause();
    }
    pending_.clear();
    outgoing_.clear();
    return {};
  }

  const RoundSchedule& schedule_;
  const ParameterSet& params_;
  MPI_Comm comm_;
  Clock::time_point deadline_;
  Bytes send_, receive_;
  std::vector<int> filled_;        // per receive-buffer byte: times written this round
  std::vector<Bytes> outgoing_;    // messages of this round, alive until their sends complete
  std::vector<MPI_Request> pending_;
};

// ---------------------------------------------------------------------------------------------------------

class PlanScatterUnderMpi : public ::testing::TestWithParam<LayoutPair> {};

TEST_P(PlanScatterUnderMpi, ScatteredSchedulesMatchLocalPlansAndPlayBitExact) {
  const TestComm comm;
  const int rank = comm.rank(), size = comm.size();
  const PlanOptions options = small_plan_options();

  // 1. Each rank: its worker, its probed source map; all-gather.
  RankSetup s;
  std::unique_ptr<HostParameters> params;
  SourceMap mine;
  bool ok = local_step(rank, "set-up and probe", [&] {
    s = set_up(GetParam(), rank, size);
    params = std::make_unique<HostParameters>(s.worker->parameter_infos());
    fill(params->parameters(), kRolloutFill);  // the probe restores it
    mine = probe_source_map(s.tensors, params->parameters(),
                            [&](const CheckpointReader& c, const ParameterSet& p) { s.worker->load_weights(c, p); });
  });
  if (!all_ranks_ok(ok, comm.get())) return;
  std::vector<SourceMap> maps = allgather_source_maps(mine, comm.get());

  // 2. Every rank plans (deterministic); rank 0 also serializes every rank's schedule, as connect does.
  Correspondence correspondence;
  TransferPlan plan;
  std::unique_ptr<RoundScheduleBuilder> builder;
  std::vector<Bytes> serialized;
  ok = local_step(rank, "planning", [&] {
    if (rank == 0) serialized = plan_round_schedules(s.tensors, maps, s.deployment.sides(), s.topology, options).schedules;
    correspondence = build_correspondence(s.tensors, std::move(maps), s.deployment.sides());
    plan = plan_transfer(correspondence, s.topology, options);
    builder = std::make_unique<RoundScheduleBuilder>(correspondence, plan);
  });
  // Rank 0 takes part in the scatter whatever happened: with no schedules every rank throws.
  RoundSchedule schedule;
  ok = local_step(rank, "scatter", [&] { schedule = scatter_round_schedules(serialized, 0, comm.get()); }) && ok;
  if (ok) ok = local_step(rank, "checking the schedule", [&] {
    ASSERT_TRUE(schedule == builder->build(rank)) << "the schedule rank 0 sent differs from the one rank " << rank << " plans";
    EXPECT_EQ(schedule.rank, rank);
    EXPECT_EQ(schedule.side, s.deployment.sides()[static_cast<std::size_t>(rank)]);
    EXPECT_EQ(static_cast<int>(schedule.rounds.size()), plan.rounds);
    EXPECT_LE(schedule.pipeline_depth * (schedule.send_slot_bytes + schedule.receive_slot_bytes), options.buffer_bytes_per_worker);
    EXPECT_GT(plan.rounds, 4) << "the small budget should give several rounds";
  });
  if (!all_ranks_ok(ok, comm.get())) return;

  // 3. Play across processes. Trainers hold what their load_weights gives; rollouts start from the fill.
  const SyntheticCheckpoint checkpoint(s.tensors, 4242);
  ok = local_step(rank, "loading", [&] {
    if (schedule.side == Side::kTrainer) s.worker->load_weights(checkpoint, params->parameters());
  });
  if (!all_ranks_ok(ok, comm.get())) return;
  MpiPlayer player(schedule, params->parameters(), comm.get());
  const auto start = Clock::now();
  const std::string error = player.play();
  const double play_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(error, "");
  if (!all_ranks_ok(error.empty(), comm.get())) return;

  // Every stage this layout needs was exercised, and the plan's traffic went over the wire.
  std::array<std::int64_t, 2 * kStageCount> sent{}, total{};
  for (int st = 0; st < kStageCount; ++st) {
    sent[static_cast<std::size_t>(st)] = player.messages_sent[static_cast<std::size_t>(st)];
    sent[static_cast<std::size_t>(kStageCount + st)] = player.bytes_sent[static_cast<std::size_t>(st)];
  }
  MPI_Allreduce(sent.data(), total.data(), 2 * kStageCount, MPI_INT64_T, MPI_SUM, comm.get());
  std::int64_t planned = 0, played = 0;
  for (std::int64_t b : plan.worker_send_bytes) planned += b;
  for (int st = 0; st < kStageCount; ++st) played += total[static_cast<std::size_t>(kStageCount + st)];
  EXPECT_EQ(played, planned);
  EXPECT_GT(total[0], 0) << "no receive-stage writes";
  const bool several_rollout_nodes = plan.bound.rollout_nodes.size() > 1;
  EXPECT_EQ(total[1] > 0, several_rollout_nodes) << "external exchange writes: " << total[1];
  EXPECT_GT(total[2], 0) << "no internal-exchange writes";
  if (rank == 0)
    std::printf("[plan_scatter] %s %s -> %s, %d per node: %d rounds, %zu segments; messages %lld / %lld / %lld "
                "(receive / external / internal), %lld bytes; played in %.2f s\n",
                GetParam().model.c_str(), GetParam().trainer.c_str(), GetParam().rollout.c_str(), GetParam().gpus_per_node,
                plan.rounds, plan.segments.size(), static_cast<long long>(total[0]), static_cast<long long>(total[1]),
                static_cast<long long>(total[2]), static_cast<long long>(played), play_seconds);

  // 4. Exactness: each rollout parameter equals its own load_weights over the same fill, bit for bit.
  if (schedule.side == Side::kRollout) {
    HostParameters expected(s.worker->parameter_infos());
    fill(expected.parameters(), kRolloutFill);
    s.worker->load_weights(checkpoint, expected.parameters());
    for (std::size_t p = 0; p < expected.parameters().size(); ++p) {
      const Parameter& got = params->parameters()[p];
      const Parameter& want = expected.parameters()[p];
      const auto* a = static_cast<const std::byte*>(got.view.data);
      const auto* b = static_cast<const std::byte*>(want.view.data);
      const std::size_t n = want.view.nbytes();
      const std::size_t first = static_cast<std::size_t>(std::mismatch(a, a + n, b).first - a);
      EXPECT_EQ(first, n) << "rank " << rank << " (" << s.worker->describe() << "): parameter " << want.name
                          << " differs first at byte " << first << " of " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlanScatterUnderMpi,
    ::testing::Values(
        // MoE with GQA; both engines on one rollout node (internal exchange between replicas).
        LayoutPair{"qwen3-30b-a3b", "tp=2,ep=2,dp=2", "engines=2,tp=2,ep=2", 4},
        // The same on nodes of two: one engine per rollout node (external exchange between replicas).
        LayoutPair{"qwen3-30b-a3b", "tp=2,ep=2,dp=2", "engines=2,tp=2,ep=2", 2},
        // MLA, pipeline trainer, DP attention and transposed experts, one engine over two rollout nodes.
        LayoutPair{"moonlight-16b-a3b", "tp=2,pp=2", "engines=1,tp=4,ep=4,dp_attn=2,transpose=experts", 2},
        // Dense: two TP-2 engines on one rollout node.
        LayoutPair{"qwen3-32b", "tp=4", "engines=2,tp=2", 4}),
    [](const auto& info) {
      std::string name = info.param.model + "_" + std::to_string(info.param.gpus_per_node) + "_per_node";
      for (char& c : name)
        if (c == '-' || c == '.') c = '_';
      return name;
    });

// A plan rank 0 cannot make (a buffer budget no slice fits) must fail on every rank, with no rank waiting:
// rank 0 still takes part in the scatter, with its planning error in place of the schedules (as connect
// does), so every rank throws that error, whole, at once.
TEST(PlanScatterFailure, PlanningFailureOnRootFailsEveryRankWithoutHanging) {
  const TestComm comm;
  const int rank = comm.rank(), size = comm.size();
  const LayoutPair pair{"qwen3-30b-a3b", "tp=2,ep=2,dp=2", "engines=2,tp=2,ep=2", 4};
  RankSetup s;
  std::vector<SourceMap> maps;
  bool ok = local_step(rank, "set-up", [&] {
    s = set_up(pair, rank, size);
  });
  SourceMap mine;
  if (ok) ok = local_step(rank, "probe", [&] {
    const HostParameters params(s.worker->parameter_infos());
    mine = probe_source_map(s.tensors, params.parameters(),
                            [&](const CheckpointReader& c, const ParameterSet& p) { s.worker->load_weights(c, p); });
  });
  if (!all_ranks_ok(ok, comm.get())) return;
  maps = allgather_source_maps(mine, comm.get());

  std::vector<Bytes> serialized;
  std::string planning_error;
  Status planned;
  if (rank == 0) {
    PlanOptions tiny = small_plan_options();
    tiny.buffer_bytes_per_worker = 256;  // no slice of any tensor fits
    try {
      serialized = plan_round_schedules(s.tensors, maps, s.deployment.sides(), s.topology, tiny).schedules;  // as connect plans
    } catch (const Error& e) {
      planning_error = e.what();
      planned = e.status();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
    EXPECT_THAT(planning_error, HasSubstr("tensor "));
    EXPECT_THAT(planning_error, HasSubstr("raise the buffer budget"));
    EXPECT_TRUE(serialized.empty());
  }
  const auto start = Clock::now();
  try {
    (void)scatter_round_schedules(serialized, 0, comm.get(), {}, planned);
    ADD_FAILURE() << "rank " << rank << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << "rank " << rank << ": " << e.what();
    EXPECT_THAT(e.what(), HasSubstr("raise the buffer budget")) << "rank " << rank;
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0) << "rank " << rank;

  // The communicator is still in step: a good plan scatters afterwards and matches every rank's own.
  const Correspondence correspondence = build_correspondence(s.tensors, std::move(maps), s.deployment.sides());
  const TransferPlan plan = plan_transfer(correspondence, s.topology, small_plan_options());
  const RoundScheduleBuilder builder(correspondence, plan);
  serialized.clear();
  if (rank == 0)
    for (int r = 0; r < size; ++r) serialized.push_back(serialize_round_schedule(builder.build(r)));
  EXPECT_TRUE(scatter_round_schedules(serialized, 0, comm.get()) == builder.build(rank)) << "rank " << rank;
}

}  // namespace
}  // namespace wb::emu
