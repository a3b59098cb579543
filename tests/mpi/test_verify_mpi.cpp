// End-to-end verification (exec/verify.hpp) on 3 ranks, schedules written by hand: trainer (world rank 0)
// packs two segments and writes them to rank 1, which forwards them to rank 2 (internal exchange). A byte
// changed on the way is found where it lands, named by parameter and elements, also by rank 2, which
// compares against the trainer's digests that rank 1 passed on (not digests of rank 1's own bytes); also
// through the programs that pack and assemble while they digest (the executor's path).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "exec/verify.hpp"

namespace wb::exec {
namespace {

constexpr int kTag = 0x7abc;

// Elements [first, first + n) of parameter 0 (4-byte elements) at `buffer_offset`.
BufferCopy segment(std::int64_t first, std::int64_t buffer_offset, std::int64_t n = 4) {
  BufferCopy copy;
  copy.copy.tensor = 0;
  copy.copy.parameter = 0;
  copy.copy.box = Box{{first}, {n}};
  copy.copy.offset = first;
  copy.copy.strides = {1};
  copy.buffer_offset = buffer_offset;
  copy.element_bytes = 4;
  return copy;
}

// Two segments of `n` elements each.
RoundSchedule schedule_of(int rank, std::int64_t n = 4) {
  RoundSchedule s;
  s.rank = rank;
  s.rounds.resize(1);
  RoundPlan& round = s.rounds[0];
  const std::int64_t bytes = 8 * n;
  const std::vector<BufferCopy> both{segment(0, 0, n), segment(n, 4 * n, n)};
  if (rank == 0) {
    s.side = Side::kTrainer;
    round.pack = both;
    round.writes = {{1, Stage::kReceive, 0, 0, bytes}};
  } else if (rank == 1) {
    s.side = Side::kRollout;
    round.arrivals = {{0, Stage::kReceive, 0, bytes}};
    round.assemble = both;
    round.writes = {{2, Stage::kInternalExchange, 0, 0, bytes}};
  } else {
    s.side = Side::kRollout;
    round.arrivals = {{1, Stage::kInternalExchange, 0, bytes}};
    round.assemble = both;
  }
  s.send_slot_bytes = rank == 0 ? bytes : 0;
  s.receive_slot_bytes = rank == 0 ? 0 : bytes;
  return s;
}

std::string describe_rank(int r) { return "rank " + std::to_string(r); }
std::string describe_element(std::uint32_t p, std::int64_t e) { return "p" + std::to_string(p) + "[" + std::to_string(e) + "]"; }

// One update: rank 0 packs `sent`; rank 1 receives it with `flip_at_1` changed (-1: none) and forwards what
// it holds; rank 2 receives that. Returns this rank's verdict.
Status one_update(Verifier& verifier, int rank, int flip_at_1) {
  std::vector<std::byte> bytes(32);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(3 * i + 1);
  if (rank >= 1 && flip_at_1 >= 0) bytes[static_cast<std::size_t>(flip_at_1)] ^= std::byte{0x10};
  verifier.begin_update();
  if (rank == 0) verifier.packed(0, bytes.data());
  else verifier.arrived(0, bytes.data());
  return verifier.exchange(30, nullptr, describe_rank, describe_element);
}

TEST(Verify, SegmentsThatArriveIntactPassAndAChangedByteIsNamedWhereItLands) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 3) << "run with 3 ranks";
  const RoundSchedule schedule = schedule_of(rank);
  Verifier verifier(schedule, MPI_COMM_WORLD, kTag);

  // Intact, twice (the second update reuses every buffer).
  for (int update = 0; update < 2; ++update) {
    const Status status = one_update(verifier, rank, -1);
    EXPECT_TRUE(status.is_ok()) << status.to_string();
  }

  // Byte 21 (in the second segment: elements 4..7) changed on its way to rank 1, which forwards it.
  const Status status = one_update(verifier, rank, 21);
  if (rank == 0) {
    EXPECT_TRUE(status.is_ok()) << status.to_string();
  } else {
    ASSERT_EQ(status.code(), ErrorCode::kCorruptData) << status.to_string();
    EXPECT_NE(status.message().find("p0[4] to p0[7] (4 elements)"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(rank == 1 ? "received from rank 0" : "received from rank 1"), std::string::npos)
        << status.message();
    EXPECT_EQ(status.message().find("p0[0] to p0[3]"), std::string::npos) << "the intact segment was named too";
    std::printf("[ rank %d ] %s\n", rank, status.message().c_str());
  }
}

// The executor's own path: rank 0 packs its parameter with Verifier::pack and ranks 1 and 2 install with
// Verifier::assemble, the round's programs that digest as they copy, out of a receive slot that holds what
// rank 0 packed; one byte is flipped on the way to rank 1, which forwards it.
TEST(Verify, AByteFlippedInTheReceiveSlotIsFoundByTheAssembleThatDigestsAsItCopies) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  constexpr std::int64_t kElements = 1000;  // per segment: long runs, digested inside the copy loop
  constexpr std::size_t kBytes = 8 * kElements;
  const RoundSchedule schedule = schedule_of(rank, kElements);
  const std::vector<std::int64_t> parameter_bytes{static_cast<std::int64_t>(kBytes)};
  Verifier verifier(schedule, MPI_COMM_WORLD, kTag, parameter_bytes, schedule.send_slot_bytes, schedule.receive_slot_bytes);
  std::vector<std::byte> sent(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) sent[i] = static_cast<std::byte>(7 * i + 3);
  const std::size_t flipped = 4 * kElements + 2345;  // in the second segment: element 1586
  for (int update = 0; update < 3; ++update) {
    const bool corrupt = update == 2;  // two intact updates first (every buffer reused)
    std::vector<std::byte> parameter(kBytes, std::byte{0xEE}), slot(kBytes, std::byte{0xCD});
    std::byte* const parameters[] = {parameter.data()};
    verifier.begin_update();
    if (rank == 0) {
      parameter = sent;
      verifier.pack(0, parameters, slot.data());
      EXPECT_EQ(slot, sent) << "the pack that digests did not pack";
    } else {
      slot = sent;
      if (corrupt) slot[flipped] ^= std::byte{0x10};
      verifier.assemble(0, parameters, slot.data());
      EXPECT_EQ(parameter, slot) << "the assemble that digests did not assemble";
    }
    const Status status = verifier.exchange(30, nullptr, describe_rank, describe_element);
    if (!corrupt || rank == 0) {
      EXPECT_TRUE(status.is_ok()) << "update " << update << ": " << status.to_string();
      continue;
    }
    ASSERT_EQ(status.code(), ErrorCode::kCorruptData) << status.to_string();
    EXPECT_NE(status.message().find("p0[1000] to p0[1999] (1000 elements)"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(rank == 1 ? "received from rank 0" : "received from rank 1"), std::string::npos)
        << status.message();
    EXPECT_EQ(status.message().find("p0[0] to p0[999]"), std::string::npos) << "the intact segment was named too";
  }
}

TEST(Verify, DigestsSeeEveryByteAndItsPlace) {
  std::vector<std::byte> a(1000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::byte>(i * 7 + 3);
  const std::uint64_t base = digest_bytes(a.data(), a.size());
  for (std::size_t at : {0u, 7u, 31u, 32u, 500u, 999u}) {
    std::vector<std::byte> b = a;
    b[at] ^= std::byte{1};
    EXPECT_NE(digest_bytes(b.data(), b.size()), base) << "byte " << at;
  }
  std::vector<std::byte> swapped = a;  // two words swapped: same bytes, other places
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(digest_bytes(swapped.data(), swapped.size()), base);
  EXPECT_NE(digest_bytes(a.data(), a.size() - 1), base);  // the length counts
  EXPECT_EQ(digest_bytes(a.data(), a.size()), base);
}

}  // namespace
}  // namespace wb::exec
