// The control plane's room (src/comm/) over MPI, 4 ranks: its collectives deliver every rank's bytes, and
// a failure on one rank (the root's, or any contributor's) reaches every rank at once, whole, not at the
// deadline; a rank that does not take part makes the others fail at the deadline, naming what; group steps
// agree on the lowest failing rank and the maxima; an intercommunicator is refused with the way out; and
// the communicator is still in step after each failure.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.hpp"
#include "comm/group.hpp"
#include "comm/operation.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Far beyond what any of these collectives takes: a failure that arrives "at once" comes well before it.
constexpr double kLongDeadline = 60;

int rank_of(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}
int size_of(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}
std::vector<std::byte> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), reinterpret_cast<const std::byte*>(text.data()) + text.size()};
}
std::string text_of(const std::vector<std::byte>& bytes) { return {reinterpret_cast<const char*>(bytes.data()), bytes.size()}; }
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

const comm::Waiter kPatient{kLongDeadline, {}};

// Every rank in step again: one more collective that must complete everywhere.
void expect_in_step(MPI_Comm comm) { EXPECT_NO_THROW(comm::barrier(comm, kPatient, "the barrier after")); }

TEST(Comm, AllgatherDeliversEveryRanksBytesInRankOrder) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  // Sizes differ per rank, one rank gives nothing.
  const std::string mine = rank == 1 ? "" : std::string(static_cast<std::size_t>(rank * 1000 + 3), static_cast<char>('a' + rank));
  const auto all = comm::allgather(bytes_of(mine), comm, kPatient, "test: the strings");
  ASSERT_EQ(all.size(), static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    EXPECT_EQ(text_of(all[static_cast<std::size_t>(r)]),
              r == 1 ? "" : std::string(static_cast<std::size_t>(r * 1000 + 3), static_cast<char>('a' + r)));
}

TEST(Comm, AFailureOfOneContributorReachesEveryRankAtOnce) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  // Ranks 2 and 3 fail (2 with a cause, 3 with a timeout of its own); the lowest failing rank's message wins.
  Status mine;
  if (rank == 2) mine = Status(ErrorCode::kNotFound, "rank 2: probing load_weights failed: no tensor 'x'");
  if (rank == 3 && size > 3) mine = Status(ErrorCode::kTimeout, "rank 3: something else");
  const auto start = Clock::now();
  try {
    (void)comm::allgather(bytes_of("payload"), comm, kPatient, "test: the maps", mine);
    ADD_FAILURE() << "rank " << rank << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    EXPECT_EQ(std::string(e.status().message()), "rank 2: probing load_weights failed: no tensor 'x'");
  }
  EXPECT_LT(seconds_since(start), kLongDeadline / 4) << "rank " << rank << " waited for the deadline";
  expect_in_step(comm);
}

TEST(Comm, AgreeIsOkOnlyWhenEveryRankIs) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  EXPECT_NO_THROW(comm::agree(Status::ok(), comm, kPatient, "test: all ok"));
  const Status mine = rank == size - 1 ? Status(ErrorCode::kInvalidArgument, "the last rank refuses") : Status::ok();
  try {
    comm::agree(mine, comm, kPatient, "test: one refuses");
    ADD_FAILURE() << "rank " << rank << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("the last rank refuses"));
  }
}

TEST(Comm, ScatterGivesEachRankItsPartAndTheRootsFailureToAll) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  for (const int root : {0, size - 1}) {
    std::vector<std::vector<std::byte>> parts;
    if (rank == root)
      for (int r = 0; r < size; ++r) parts.push_back(bytes_of("part " + std::to_string(r) + std::string(static_cast<std::size_t>(r) * 77, '.')));
    EXPECT_EQ(text_of(comm::scatter(parts, root, comm, kPatient, "test: parts")),
              "part " + std::to_string(rank) + std::string(static_cast<std::size_t>(rank) * 77, '.'));
  }
  // Planning failed on the root: every rank throws the root's error, at once.
  const Status failure = rank == 0 ? Status(ErrorCode::kInvalidArgument, "planning on rank 0 failed: no slice fits") : Status::ok();
  const auto start = Clock::now();
  try {
    (void)comm::scatter({}, 0, comm, kPatient, "test: schedules", failure);
    ADD_FAILURE() << "rank " << rank << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.status().message()), "planning on rank 0 failed: no slice fits");
  }
  EXPECT_LT(seconds_since(start), kLongDeadline / 4);
  expect_in_step(comm);
}

TEST(Comm, BroadcastCarriesTheRootsBytesOrItsFailure) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  const int root = size - 1;
  EXPECT_EQ(text_of(comm::broadcast(rank == root ? bytes_of("the tensor list") : std::vector<std::byte>{}, root, comm, kPatient,
                                    "test: list")),
            "the tensor list");
  EXPECT_TRUE(comm::broadcast({}, 0, comm, kPatient, "test: nothing").empty());
  const Status failure = rank == root ? Status(ErrorCode::kCorruptData, "the root could not read it") : Status::ok();
  try {
    (void)comm::broadcast({}, root, comm, kPatient, "test: list", failure);
    ADD_FAILURE() << "rank " << rank << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_THAT(e.what(), HasSubstr("the root could not read it"));
  }
  double value = rank == 0 ? 2.5 : 0;
  comm::broadcast_fixed(std::as_writable_bytes(std::span(&value, 1)), 0, comm, kPatient, "test: a double");
  EXPECT_EQ(value, 2.5);
  const int mine = 10 + rank;
  const std::vector<std::byte> all = comm::allgather_fixed(std::as_bytes(std::span(&mine, 1)), comm, kPatient, "test: ints");
  ASSERT_EQ(all.size(), sizeof(int) * static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    int got = 0;
    std::memcpy(&got, all.data() + sizeof(int) * static_cast<std::size_t>(r), sizeof got);
    EXPECT_EQ(got, 10 + r);
  }
}

TEST(Comm, ARankThatDoesNotComeFailsTheOthersAtTheDeadlineNamingWhat) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm);
  constexpr double kShort = 0.3;
  if (rank == 0) {
    // Late: the others have given up by the time it arrives; its barrier still matches theirs, which
    // stayed pending (abandoned with their buffers), so the communicator stays in step.
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    EXPECT_NO_THROW(comm::barrier(comm, kPatient, "test: the late barrier"));
  } else {
    const auto start = Clock::now();
    try {
      comm::barrier(comm, comm::Waiter{kShort, {}}, "test: the barrier rank 0 is late for");
      ADD_FAILURE() << "rank " << rank << ": no timeout";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kTimeout);
      EXPECT_THAT(e.what(), HasSubstr("test: the barrier rank 0 is late for did not complete within 0.3 s"));
    }
    EXPECT_GE(seconds_since(start), kShort);
  }
  expect_in_step(comm);
}

TEST(Comm, SwapExchangesRecordsPairwise) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  const int peer = rank ^ 1;
  if (peer >= size) GTEST_SKIP() << "needs an even number of ranks";
  const std::string mine(static_cast<std::size_t>(100 * rank), 'x');
  EXPECT_EQ(text_of(comm::swap(peer, bytes_of(mine), 0x77, comm, kPatient, "test: records")),
            std::string(static_cast<std::size_t>(100 * peer), 'x'));
}

TEST(Comm, AnOperationLetGoOfWhilePendingIsKeptUntilItCompletes) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  {
    comm::OperationPtr receive = comm::make_operation(0, 1 << 16);
    ASSERT_EQ(MPI_Irecv(receive->in.data(), 1 << 16, MPI_BYTE, previous, 0x78, comm, &receive->request), MPI_SUCCESS);
    const Status waited = comm::wait_for(receive, comm::Waiter{0.01, {}}, false, "test: a receive nobody sends yet");
    EXPECT_EQ(waited.code(), ErrorCode::kTimeout);
  }  // the last pointer goes while MPI still owns the receive: it must be kept, not freed
  comm::barrier(comm, kPatient, "test: all let go");
  std::vector<std::byte> payload(1 << 16, std::byte{7});
  ASSERT_EQ(MPI_Send(payload.data(), 1 << 16, MPI_BYTE, next, 0x78, comm), MPI_SUCCESS);  // lands in the kept buffer
  // Another operation let go of tests the kept ones and frees those that completed.
  comm::abandon(comm::make_operation());
  expect_in_step(comm);
}

TEST(Comm, GroupStepsAgreeOnTheLowestFailureAndTheMaxima) {
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int rank = rank_of(comm), size = size_of(comm);
  std::vector<int> members;
  for (int r = 0; r < size; ++r) members.push_back(100 + r);  // named ranks: any ids the watch understands
  comm::Group group(comm, "the test group", nullptr, members, 100 + rank);
  std::int64_t values[comm::Group::kValues] = {rank, -rank, 7, 0};
  ASSERT_TRUE(group.step(Status::ok(), std::span<std::int64_t, comm::Group::kValues>(values), kPatient, "test: maxima").is_ok());
  EXPECT_EQ(values[0], size - 1);
  EXPECT_EQ(values[1], 0);
  EXPECT_EQ(values[2], 7);
  // A timeout of a lower rank is a consequence: the cause (any other error) of a higher rank wins.
  Status mine;
  if (rank == 1) mine = Status(ErrorCode::kTimeout, "rank 1 timed out");
  if (rank == size - 1) mine = Status(ErrorCode::kCorruptData, "the last rank found corrupt data");
  const Status agreed = group.step(mine, kPatient, "test: failures");
  EXPECT_EQ(agreed.code(), ErrorCode::kCorruptData);
  EXPECT_EQ(std::string(agreed.message()), "the last rank found corrupt data");
  EXPECT_EQ(group.first_incomplete(), 2u);
  EXPECT_THROW(comm::Group(comm, "wrong", nullptr, {1, 2}), Error) << "members must name every rank";
}

TEST(Comm, CollectivesRefuseAnIntercommunicatorWithTheWayOut) {
  const int rank = rank_of(MPI_COMM_WORLD), size = size_of(MPI_COMM_WORLD);
  if (size < 2) GTEST_SKIP();
  MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half), MPI_SUCCESS);
  ASSERT_EQ(MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 0x79, &inter), MPI_SUCCESS);
  try {
    (void)comm::allgather(bytes_of("x"), inter, kPatient, "test: over the intercommunicator");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_THAT(e.what(), HasSubstr("MPI_Intercomm_merge"));
  }
  // Operations take any communicator: a point-to-point swap across the two groups.
  if (rank_of(half) == 0) {
    const std::vector<std::byte> theirs = comm::swap(0, bytes_of("side " + std::to_string(rank % 2)), 0x7a, inter, kPatient,
                                                     "test: across");
    EXPECT_EQ(text_of(theirs), "side " + std::to_string(1 - rank % 2));
  }
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
}

}  // namespace
}  // namespace wb
