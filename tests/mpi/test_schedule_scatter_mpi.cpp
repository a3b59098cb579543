// Round schedules delivered through the control plane's scatter (comm::scatter, one MPI_Iscatterv): each
// rank receives exactly its own schedule, from any root and over a sub-communicator; a root given the wrong
// number of schedules, and a schedule that does not decode, give one clear error on every rank without
// leaving any rank waiting.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "plan/round_schedule.hpp"
#include "plan/round_schedule_scatter.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

// A schedule for `rank` of `size` ranks, determined by (seed, rank): every rank can rebuild anyone's.
RoundSchedule make_schedule(unsigned seed, int rank, int size) {
  std::mt19937 rng(seed * 7919u + static_cast<unsigned>(rank));
  const auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  RoundSchedule s;
  s.rank = rank;
  s.side = rank % 2 == 0 ? Side::kTrainer : Side::kRollout;
  s.pipeline_depth = static_cast<int>(pick(1, 3));
  for (int p = 0; p < size; ++p)
    if (p != rank) s.peers.push_back(p);
  s.rounds.resize(static_cast<std::size_t>(pick(2, 6)));
  std::int64_t send_end = 0, receive_end = 0;
  for (RoundPlan& round : s.rounds) {
    if (pick(0, 4) == 0) continue;  // an empty round
    std::int64_t end = 0;
    const std::int64_t pieces = pick(1, 200), rows = pick(1, 16), columns = pick(1, 512);
    const auto tensor = static_cast<std::uint32_t>(pick(0, 100));
    for (std::int64_t i = 0; i < pieces; ++i) {
      BufferCopy b;
      b.copy.tensor = tensor;
      b.copy.parameter = static_cast<std::uint32_t>(tensor / 2);
      b.copy.box = {{i * rows, 0}, {rows, columns}};
      b.copy.strides = pick(0, 1) ? Shape{columns, 1} : Shape{1, pieces * rows};
      b.copy.offset = i * rows * b.copy.strides[0];
      b.element_bytes = 2;
      b.buffer_offset = end;
      end += b.bytes();
      (s.side == Side::kTrainer ? round.pack : round.assemble).push_back(b);
    }
    (s.side == Side::kTrainer ? send_end : receive_end) = std::max(s.side == Side::kTrainer ? send_end : receive_end, end);
    if (s.peers.empty()) continue;
    const Stage stage = s.side == Side::kTrainer ? Stage::kReceive : Stage::kInternalExchange;
    std::int64_t at = 0;
    for (int peer : s.peers) {
      const std::int64_t bytes = pick(0, 1 << 16);
      round.writes.push_back({peer, stage, 0, at, bytes});
      round.arrivals.push_back({peer, stage, at, bytes});
      at += bytes;
    }
    for (const Write& w : round.writes) (stage == Stage::kReceive ? send_end : receive_end) =
        std::max(stage == Stage::kReceive ? send_end : receive_end, w.local_offset + w.bytes);
    receive_end = std::max(receive_end, at);
  }
  s.send_slot_bytes = send_end;
  s.receive_slot_bytes = receive_end;
  return s;
}

std::vector<std::vector<std::byte>> serialize_all(unsigned seed, int size) {
  std::vector<std::vector<std::byte>> all;
  for (int r = 0; r < size; ++r) all.push_back(serialize_round_schedule(make_schedule(seed, r, size)));
  return all;
}

TEST(ScheduleScatter, EveryRankReceivesItsOwnSchedule) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = comm_rank(comm), size = comm_size(comm);
  for (unsigned seed = 1; seed <= 3; ++seed) {
    for (const int root : {0, size - 1}) {
      const auto serialized = rank == root ? serialize_all(seed, size) : std::vector<std::vector<std::byte>>{};
      const RoundSchedule mine = scatter_round_schedules(serialized, root, comm);
      EXPECT_EQ(mine, make_schedule(seed, rank, size)) << "seed " << seed << ", root " << root;
      EXPECT_EQ(mine.rank, rank);
    }
  }
}

TEST(ScheduleScatter, NonRootRanksIgnoreTheirInput) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = comm_rank(comm), size = comm_size(comm);
  // Non-root ranks pass other schedules (even the wrong number); only the root's count.
  const auto serialized = rank == 0 ? serialize_all(11, size) : serialize_all(12, size + 1);
  EXPECT_EQ(scatter_round_schedules(serialized, 0, comm), make_schedule(11, rank, size));
}

TEST(ScheduleScatter, WorksOverASubCommunicator) {
  const int world_rank = comm_rank(MPI_COMM_WORLD);
  MPI_Comm half = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half), MPI_SUCCESS);
  const int rank = comm_rank(half), size = comm_size(half);
  const unsigned seed = 20 + static_cast<unsigned>(world_rank % 2);
  const auto serialized = rank == 0 ? serialize_all(seed, size) : std::vector<std::vector<std::byte>>{};
  EXPECT_EQ(scatter_round_schedules(serialized, 0, half), make_schedule(seed, rank, size));
  MPI_Comm_free(&half);
}

TEST(ScheduleScatter, WrongScheduleCountFailsOnEveryRankWithoutHanging) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = comm_rank(comm), size = comm_size(comm);
  auto serialized = rank == 0 ? serialize_all(5, size) : std::vector<std::vector<std::byte>>{};
  if (rank == 0) serialized.pop_back();
  try {
    (void)scatter_round_schedules(serialized, 0, comm);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    // The root's own words, on every rank.
    EXPECT_THAT(e.what(), HasSubstr("the round schedules: " + std::to_string(size - 1) + " parts given for a communicator of " +
                                    std::to_string(size) + " ranks"));
  }
  // Every rank took part in the same collectives: the communicator is still in step.
  const auto good = rank == 0 ? serialize_all(6, size) : std::vector<std::vector<std::byte>>{};
  EXPECT_EQ(scatter_round_schedules(good, 0, comm), make_schedule(6, rank, size));
}

TEST(ScheduleScatter, ACorruptScheduleFailsOnEveryRankNamingItsRank) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = comm_rank(comm), size = comm_size(comm);
  const int victim = size - 1;
  auto serialized = rank == 0 ? serialize_all(8, size) : std::vector<std::vector<std::byte>>{};
  if (rank == 0) serialized[static_cast<std::size_t>(victim)].resize(serialized[static_cast<std::size_t>(victim)].size() / 2);
  try {
    (void)scatter_round_schedules(serialized, 0, comm);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_THAT(e.what(), HasSubstr("round schedule received by rank " + std::to_string(victim) + ": round schedule: "));
  }
  // Still in step.
  const auto good = rank == 0 ? serialize_all(9, size) : std::vector<std::vector<std::byte>>{};
  EXPECT_EQ(scatter_round_schedules(good, 0, comm), make_schedule(9, rank, size));
}

}  // namespace
}  // namespace wb
