// The requests trainer rank 0 sends an engine's rank 0, taken in order (coord::RequestInbox): an update
// followed by a shutdown or an abort is skipped, any other request after an update is taken at the next
// take, not in the update's place (on the fleet link an asynchronous resend after a loss is followed at
// once by kBeReplica; taken instead, the resend's writes to the new replica waited out the trainers'
// deadline). Each rank sends to itself over its own communicator, so that both requests are in before the
// first take.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "coord/messages.hpp"

namespace wb::coord {

void PrintTo(RequestKind kind, std::ostream* os) { *os << request_name(kind); }  // gtest's messages

namespace {

class RequestInboxTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(MPI_Comm_dup(MPI_COMM_SELF, &comm_), MPI_SUCCESS); }
  void TearDown() override { MPI_Comm_free(&comm_); }

  void send(RequestKind kind, std::uint64_t v) { ASSERT_TRUE(send_request(comm_, 0, kind, v).is_ok()); }

  // Every request the inbox gives until it gives none.
  std::vector<std::pair<RequestKind, std::int64_t>> take_all() {
    std::vector<std::pair<RequestKind, std::int64_t>> out;
    for (;;) {
      std::int64_t values[2] = {-1, -1};
      const Status taken = inbox_.take(comm_, 0, values);
      EXPECT_TRUE(taken.is_ok()) << taken.message();
      if (!taken || static_cast<RequestKind>(values[0]) == RequestKind::kNone) return out;
      out.emplace_back(static_cast<RequestKind>(values[0]), values[1]);
    }
  }

  // The versions of the "took update v" notes sent to trainer rank 0 (here: this rank), waited for up to
  // a second each.
  std::vector<std::int64_t> started_notes(std::size_t expected) {
    std::vector<std::int64_t> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (out.size() < expected && std::chrono::steady_clock::now() < deadline) {
      int found = 0;
      MPI_Iprobe(0, kStartedTag, comm_, &found, MPI_STATUS_IGNORE);
      if (!found) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::int64_t v = 0;
      MPI_Recv(&v, 1, MPI_INT64_T, 0, kStartedTag, comm_, MPI_STATUS_IGNORE);
      out.push_back(v);
    }
    int more = 0;
    MPI_Iprobe(0, kStartedTag, comm_, &more, MPI_STATUS_IGNORE);
    EXPECT_EQ(more, 0) << "a note for an update that was not taken";
    return out;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  RequestInbox inbox_;
};

using Taken = std::vector<std::pair<RequestKind, std::int64_t>>;

TEST_F(RequestInboxTest, ARequestRightAfterAnUpdateIsTakenNextNotInItsPlace) {
  send(RequestKind::kUpdate, 6);
  send(RequestKind::kBeReplica, 0);
  EXPECT_EQ(take_all(), (Taken{{RequestKind::kUpdate, 6}, {RequestKind::kBeReplica, 0}}));
  EXPECT_EQ(started_notes(1), std::vector<std::int64_t>{6});
}

TEST_F(RequestInboxTest, AnUpdateFollowedByAShutdownOrAnAbortIsSkipped) {
  send(RequestKind::kUpdate, 7);
  send(RequestKind::kShutdown, 0);
  EXPECT_EQ(take_all(), (Taken{{RequestKind::kShutdown, 0}}));
  send(RequestKind::kUpdate, 8);
  send(RequestKind::kAbort, 0);
  EXPECT_EQ(take_all(), (Taken{{RequestKind::kAbort, 0}}));
  EXPECT_TRUE(started_notes(0).empty());
}

TEST_F(RequestInboxTest, AKeptRequestIsTakenBeforeLaterOnesAndAShutdownAfterItStillEnds) {
  send(RequestKind::kUpdate, 9);
  send(RequestKind::kServeJoiner, 9);
  send(RequestKind::kShutdown, 0);
  EXPECT_EQ(take_all(), (Taken{{RequestKind::kUpdate, 9}, {RequestKind::kServeJoiner, 9}, {RequestKind::kShutdown, 0}}));
  send(RequestKind::kUpdate, 10);
  EXPECT_EQ(take_all(), (Taken{{RequestKind::kUpdate, 10}}));
  EXPECT_EQ(started_notes(2), (std::vector<std::int64_t>{9, 10}));
}

}  // namespace
}  // namespace wb::coord
