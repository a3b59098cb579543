// Round schedules in compact binary form: random schedules round-trip exactly, continuing 2-D boxes take a
// few bytes each, every truncation and malformed field is a clear kCorruptData error (never a crash or a
// huge allocation), random byte flips either fail cleanly or decode to a valid schedule, and
// serialization refuses schedules that would not deserialize.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <random>

#include "../support/expect_error.hpp"
#include "core/byte_codec.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using wb::testing::expect_error;

using ::testing::HasSubstr;

class Random {
 public:
  explicit Random(unsigned seed) : rng_(seed) {}
  std::int64_t in(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::mt19937_64& engine() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

// A slice copy of a random 0-4 D box into a parameter of a random shape, its axes permuted (transposed
// strides), now and then a negative stride.
SliceCopy random_copy(Random& r) {
  SliceCopy c;
  const int ndim = r.chance(0.05) ? 0 : static_cast<int>(r.in(1, 4));
  c.tensor = static_cast<std::uint32_t>(r.chance(0.02) ? r.in(0, UINT32_MAX) : r.in(0, 60));
  c.parameter = static_cast<std::uint32_t>(r.in(0, 40));
  Shape param_shape;
  for (int a = 0; a < ndim; ++a) {
    c.box.extent.push_back(r.in(1, 24));
    c.box.offset.push_back(r.chance(0.05) ? r.in(0, std::int64_t{1} << 40) : r.in(0, 5000));
    param_shape.push_back(c.box.extent.back() + r.in(0, 8));
  }
  Shape row_major(static_cast<std::size_t>(ndim));
  std::int64_t stride = 1;
  for (int a = ndim - 1; a >= 0; --a) {
    row_major[static_cast<std::size_t>(a)] = stride;
    stride *= param_shape[static_cast<std::size_t>(a)];
  }
  std::vector<std::size_t> order(static_cast<std::size_t>(ndim));
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (r.chance(0.4)) std::shuffle(order.begin(), order.end(), r.engine());
  for (int a = 0; a < ndim; ++a) c.strides.push_back(row_major[order[static_cast<std::size_t>(a)]]);
  c.offset = r.chance(0.05) ? r.in(0, std::int64_t{1} << 50) : r.in(0, 100000);
  if (ndim > 0 && r.chance(0.05)) {  // a reversed axis: offset points at the last element along it
    c.strides[0] = -c.strides[0];
    c.offset += (c.box.extent[0] - 1) * -c.strides[0];
  }
  return c;
}

// The next piece of the same slice copy: the box continues `previous` along one axis.
SliceCopy continuing_copy(Random& r, const SliceCopy& previous) {
  SliceCopy c = previous;
  if (c.box.extent.empty()) return c;
  const auto axis = static_cast<std::size_t>(r.in(0, static_cast<std::int64_t>(c.box.extent.size()) - 1));
  c.box.offset[axis] += previous.box.extent[axis];
  c.offset += previous.box.extent[axis] * c.strides[axis];
  if (r.chance(0.3)) c.box.extent[axis] = r.in(1, 24);
  if (c.offset < 0) c.offset = 0;
  return c;
}

std::vector<BufferCopy> random_copies(Random& r, std::int64_t& slot_end) {
  std::vector<BufferCopy> list(static_cast<std::size_t>(r.chance(0.2) ? 0 : r.in(1, 30)));
  std::int64_t end = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    BufferCopy& b = list[i];
    const bool continues = i > 0 && r.chance(0.5);
    b.copy = continues ? continuing_copy(r, list[i - 1].copy) : random_copy(r);
    b.element_bytes = continues && r.chance(0.9) ? list[i - 1].element_bytes
                                                 : static_cast<std::uint8_t>(std::vector<int>{1, 2, 4, 8}[static_cast<std::size_t>(r.in(0, 3))]);
    b.buffer_offset = r.chance(0.7) ? end : std::max<std::int64_t>(0, end + r.in(-2000, 2000));
    end = b.buffer_offset + b.bytes();
    slot_end = std::max(slot_end, end);
  }
  return list;
}

Stage random_stage(Random& r) { return static_cast<Stage>(r.in(0, kStageCount - 1)); }

RoundSchedule random_schedule(unsigned seed) {
  Random r(seed);
  RoundSchedule s;
  s.rank = static_cast<int>(r.in(0, 1000));
  s.side = r.chance(0.5) ? Side::kTrainer : Side::kRollout;
  s.pipeline_depth = static_cast<int>(r.in(1, 4));
  for (int p = 0; p < 300; ++p)
    if (r.chance(0.03)) s.peers.push_back(p);
  if (r.chance(0.1)) s.peers.push_back(INT32_MAX);
  std::int64_t send_end = 0, receive_end = 0;
  s.rounds.resize(static_cast<std::size_t>(r.in(0, 7)));
  for (RoundPlan& round : s.rounds) {
    if (r.chance(0.2)) continue;  // an empty round
    round.pack = random_copies(r, send_end);
    round.assemble = random_copies(r, receive_end);
    if (s.peers.empty()) continue;
    const auto random_peer = [&] { return s.peers[static_cast<std::size_t>(r.in(0, static_cast<std::int64_t>(s.peers.size()) - 1))]; };
    round.writes.resize(static_cast<std::size_t>(r.in(0, 8)));
    for (Write& w : round.writes) {
      w.peer = random_peer();
      w.stage = random_stage(r);
      w.bytes = r.chance(0.05) ? 0 : r.in(1, std::int64_t{1} << (r.chance(0.2) ? 36 : 16));
      w.local_offset = r.in(0, 100000);
      w.remote_offset = r.in(0, std::int64_t{1} << 34);
    }
    std::sort(round.writes.begin(), round.writes.end(), [](const Write& a, const Write& b) { return a.stage < b.stage; });
    const bool relays = &round != &s.rounds.front() && s.pipeline_depth >= 2;
    for (Write& w : round.writes)  // relays: forwards out of the previous round's slot
      if (relays && w.stage == Stage::kExternalExchange && r.chance(0.5)) w.lag = 1;
    for (std::size_t i = 1; i < round.writes.size(); ++i)  // most writes continue the previous one locally
      if (r.chance(0.5)) round.writes[i].local_offset = round.writes[i - 1].local_offset + round.writes[i - 1].bytes;
    for (const Write& w : round.writes)
      (w.stage == Stage::kReceive ? send_end : receive_end) =
          std::max(w.stage == Stage::kReceive ? send_end : receive_end, w.local_offset + w.bytes);
    round.arrivals.resize(static_cast<std::size_t>(r.in(0, 8)));
    std::int64_t at = r.in(0, 64);
    for (Arrival& a : round.arrivals) {
      a.peer = random_peer();
      a.stage = random_stage(r);
      a.bytes = r.in(0, 1 << 20);
      a.offset = r.chance(0.8) ? at : r.in(0, 1 << 22);
      at = a.offset + a.bytes;
      receive_end = std::max(receive_end, at);
    }
    std::sort(round.arrivals.begin(), round.arrivals.end(), [](const Arrival& a, const Arrival& b) { return a.stage < b.stage; });
  }
  s.send_slot_bytes = send_end + (r.chance(0.5) ? 0 : r.in(0, 4096));
  s.receive_slot_bytes = receive_end + (r.chance(0.5) ? 0 : r.in(0, 4096));
  return s;
}

// Contiguous 2-D boxes of one tensor continuing one another along rows, packed back to back.
RoundSchedule continuing_rows_schedule(int entries, std::int64_t rows, std::int64_t columns, bool transposed) {
  RoundSchedule s;
  s.side = Side::kTrainer;
  s.rounds.resize(1);
  std::int64_t end = 0;
  for (int i = 0; i < entries; ++i) {
    BufferCopy b;
    b.copy.tensor = 7;
    b.copy.parameter = 3;
    b.copy.box = {{rows * i, 0}, {rows, columns}};
    // Row-major into a [rows * entries, columns] parameter, or transposed into [columns, rows * entries].
    b.copy.strides = transposed ? Shape{1, rows * entries} : Shape{columns, 1};
    b.copy.offset = rows * i * b.copy.strides[0];
    b.element_bytes = 2;
    b.buffer_offset = end;
    end += b.bytes();
    s.rounds[0].pack.push_back(b);
  }
  s.send_slot_bytes = end;
  return s;
}

ErrorCode code_of_decoding(std::span<const std::byte> bytes, std::string* message = nullptr) {
  try {
    (void)deserialize_round_schedule(bytes);
  } catch (const Error& e) {
    if (message != nullptr) *message = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

TEST(RoundSchedule, RandomSchedulesRoundTrip) {
  std::size_t total_bytes = 0, total_entries = 0;
  for (unsigned seed = 0; seed < 300; ++seed) {
    const RoundSchedule schedule = random_schedule(seed);
    const std::vector<std::byte> bytes = serialize_round_schedule(schedule);
    const RoundSchedule back = deserialize_round_schedule(bytes);
    ASSERT_EQ(back, schedule) << "seed " << seed;
    EXPECT_EQ(serialize_round_schedule(back), bytes) << "seed " << seed;
    total_bytes += bytes.size();
    for (const RoundPlan& r : schedule.rounds) total_entries += r.pack.size() + r.writes.size() + r.arrivals.size() + r.assemble.size();
  }
  std::cout << "random schedules: " << total_bytes << " bytes for " << total_entries << " entries\n";
}

TEST(RoundSchedule, EmptyAndDefaultSchedulesRoundTrip) {
  RoundSchedule s;
  s.pipeline_depth = 1;
  EXPECT_EQ(deserialize_round_schedule(serialize_round_schedule(s)), s);
  s.rounds.resize(1000);  // every rank has the plan's rounds, most of them empty here: a byte each
  s.side = Side::kRollout;
  const auto bytes = serialize_round_schedule(s);
  EXPECT_LE(bytes.size(), 1000u + 16u);
  EXPECT_EQ(deserialize_round_schedule(bytes), s);
}

TEST(RoundSchedule, ContinuingTwoDimensionalBoxesTakeAFewBytesEach) {
  for (const bool transposed : {false, true}) {
    for (const auto& [rows, columns] : {std::pair<std::int64_t, std::int64_t>{1, 4096}, {8, 4096}, {64, 7168}, {3, 100}}) {
      const RoundSchedule schedule = continuing_rows_schedule(10000, rows, columns, transposed);
      const std::vector<std::byte> bytes = serialize_round_schedule(schedule);
      const double per_entry = static_cast<double>(bytes.size()) / 10000.0;
      std::cout << "10000 continuing [" << rows << ", " << columns << "] boxes" << (transposed ? ", transposed" : "")
                << ": " << bytes.size() << " bytes, " << per_entry << " bytes/entry\n";
      EXPECT_LE(per_entry, 16.0);
      EXPECT_EQ(deserialize_round_schedule(bytes), schedule);
    }
  }
}

TEST(RoundSchedule, PiecesOfManyTensorsStayCompact) {
  // Pack lists as a trainer sends them: a box of a different tensor and parameter each time, with a
  // fresh shape now and then; the buffer contiguous.
  Random r(99);
  RoundSchedule s;
  s.rounds.resize(1);
  std::int64_t end = 0;
  for (int i = 0; i < 10000; ++i) {
    BufferCopy b;
    b.copy.tensor = static_cast<std::uint32_t>(i / 2);
    b.copy.parameter = static_cast<std::uint32_t>(i / 4);
    const std::int64_t rows = i % 16 == 0 ? r.in(1, 4096) : 512, columns = 4096;
    b.copy.box = {{r.in(0, 8) * rows, 0}, {rows, columns}};
    b.copy.strides = {columns, 1};
    b.copy.offset = r.in(0, 4) * rows * columns;
    b.element_bytes = 2;
    b.buffer_offset = end;
    end += b.bytes();
    s.rounds[0].pack.push_back(b);
  }
  s.send_slot_bytes = end;
  const auto bytes = serialize_round_schedule(s);
  std::cout << "10000 boxes of changing tensors and parameters: " << static_cast<double>(bytes.size()) / 10000.0
            << " bytes/entry\n";
  EXPECT_LE(bytes.size(), 16u * 10000u);
  EXPECT_EQ(deserialize_round_schedule(bytes), s);
}

TEST(RoundSchedule, SchedulesThePlannerBuildsRoundTrip) {
  // Two trainers (tensor parallel along rows) on node 0; two nodes of two rollout workers (tensor parallel
  // along columns, one of them transposed), each node needing the whole model.
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {256, 64}}, {"b", DType::kF32, {64}}};
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
  for (int w = 0; w < 6; ++w) {
    SourceMap map;
    if (w < 2) {
      map.parameters = {{"w", DType::kBF16, {128, 64}}, {"b", DType::kF32, {64}}};
      map.copies = {{0, 0, Box{{128 * w, 0}, {128, 64}}, 0, {64, 1}}, {1, 1, Box{{0}, {64}}, 0, {1}}};
    } else {
      const int shard = w % 2;
      const bool transposed = w == 3;
      map.parameters = {{"w", DType::kBF16, transposed ? Shape{32, 256} : Shape{256, 32}}, {"b", DType::kF32, {32}}};
      map.copies = {{0, 0, Box{{0, 32 * shard}, {256, 32}}, 0, transposed ? Shape{1, 256} : Shape{32, 1}},
                    {1, 1, Box{{32 * shard}, {32}}, 0, {1}}};
    }
    maps.push_back(std::move(map));
    sides.push_back(w < 2 ? Side::kTrainer : Side::kRollout);
  }
  const Correspondence correspondence = build_correspondence(tensors, maps, sides);
  PlanOptions options;
  options.piece_bytes = 512;
  options.buffer_bytes_per_worker = 16 << 10;
  const TransferPlan plan = plan_transfer(correspondence, Topology::uniform(6, 2, 100.0, 400.0), options);
  const RoundScheduleBuilder builder(correspondence, plan);
  std::size_t bytes = 0, entries = 0;
  for (int rank = 0; rank < 6; ++rank) {
    const RoundSchedule schedule = builder.build(rank);
    const std::vector<std::byte> serialized = serialize_round_schedule(schedule);
    EXPECT_EQ(deserialize_round_schedule(serialized), schedule) << "rank " << rank;
    bytes += serialized.size();
    for (const RoundPlan& r : schedule.rounds) entries += r.pack.size() + r.writes.size() + r.arrivals.size() + r.assemble.size();
  }
  std::cout << "planner-built schedules of 6 ranks, " << plan.rounds << " rounds: " << bytes << " bytes for " << entries
            << " entries\n";
}

TEST(RoundSchedule, EveryTruncationIsCorruptData) {
  for (unsigned seed = 0; seed < 30; ++seed) {
    const std::vector<std::byte> bytes = serialize_round_schedule(random_schedule(seed));
    for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
      std::string message;
      ASSERT_EQ(code_of_decoding(std::span(bytes).first(cut), &message), ErrorCode::kCorruptData)
          << "seed " << seed << ", truncated to " << cut << " of " << bytes.size() << " bytes";
      ASSERT_THAT(message, HasSubstr("round schedule: ")) << message;
    }
  }
}

TEST(RoundSchedule, RandomByteFlipsFailCleanlyOrDecodeToAValidSchedule) {
  Random r(4242);
  int failed = 0, decoded = 0;
  for (unsigned seed = 0; seed < 100; ++seed) {
    const std::vector<std::byte> original = serialize_round_schedule(random_schedule(seed));
    if (original.empty()) continue;
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<std::byte> bytes = original;
      const int flips = static_cast<int>(r.in(1, 3));
      for (int f = 0; f < flips; ++f)
        bytes[static_cast<std::size_t>(r.in(0, static_cast<std::int64_t>(bytes.size()) - 1))] ^=
            static_cast<std::byte>(r.in(1, 255));
      try {
        const RoundSchedule s = deserialize_round_schedule(bytes);
        ++decoded;
        // What decodes passed every check serialization makes, so it serializes and decodes again alike.
        EXPECT_EQ(deserialize_round_schedule(serialize_round_schedule(s)), s);
      } catch (const Error& e) {
        ++failed;
        ASSERT_EQ(e.code(), ErrorCode::kCorruptData) << e.what();
      }
    }
  }
  std::cout << "byte flips: " << failed << " rejected, " << decoded << " decoded\n";
  EXPECT_GT(failed, 0);
}

// The header of a schedule with peers {2, 5}, then `rounds` as the round count.
codec::ByteWriter header(std::uint64_t rounds, std::uint64_t send_slot = 1000, std::uint64_t receive_slot = 1000) {
  codec::ByteWriter out;
  out.varint(0x53524257);
  out.varint(1);
  out.varint(4);  // rank
  out.varint(1);  // rollout
  out.varint(2);  // depth
  out.varint(send_slot);
  out.varint(receive_slot);
  out.varint(2);
  out.varint(2);
  out.varint(2);  // 5 = 2 + 1 + 2
  out.varint(rounds);
  return out;
}

void expect_corrupt(codec::ByteWriter out, const std::string& expected) {
  const std::vector<std::byte> bytes = out.take();
  std::string message;
  EXPECT_EQ(code_of_decoding(bytes, &message), ErrorCode::kCorruptData) << expected;
  EXPECT_THAT(message, HasSubstr(expected));
}

TEST(RoundSchedule, MalformedFieldsAreNamed) {
  {
    codec::ByteWriter out = header(0);
    EXPECT_EQ(deserialize_round_schedule(out.take()).peers, (std::vector<int>{2, 5}));
  }
  {
    codec::ByteWriter out;
    out.varint(0x4d534257);  // a source map's magic
    expect_corrupt(std::move(out), "bad magic");
  }
  {
    codec::ByteWriter out;
    out.varint(0x53524257);
    out.varint(2);
    expect_corrupt(std::move(out), "unsupported version 2");
  }
  {
    codec::ByteWriter out;
    out.varint(0x53524257);
    out.varint(1);
    out.varint(0);
    out.varint(2);
    expect_corrupt(std::move(out), "side value 2 out of range");
  }
  {
    codec::ByteWriter out;
    out.varint(0x53524257);
    out.varint(1);
    out.varint(std::uint64_t{1} << 31);
    expect_corrupt(std::move(out), "rank 2147483648 out of range");
  }
  {
    codec::ByteWriter out;
    for (int i = 0; i < 11; ++i) out.byte(0xff);  // more than 64 bits
    expect_corrupt(std::move(out), "integer longer than 64 bits");
  }
  // A huge count is refused before anything is allocated.
  expect_corrupt(header(std::uint64_t{1} << 60), "round count 1152921504606846976 out of range");
  {
    codec::ByteWriter out = header(1);
    out.varint(1);                       // pack
    out.varint(std::uint64_t{1} << 40);  // entries
    expect_corrupt(std::move(out), "pack entry count 1099511627776 out of range (0 bytes left hold at most 0) at byte 24 (round 0)");
  }
  {
    codec::ByteWriter out = header(2);
    out.varint(0);   // an empty round
    out.varint(2);   // writes
    out.varint(1);
    out.varint(3);   // stage 3
    out.varint(0);   // peer index, remote offset, bytes
    out.varint(0);
    out.varint(0);
    expect_corrupt(std::move(out), "stage value 3 out of range");
  }
  {
    codec::ByteWriter out = header(2);
    out.varint(0);
    out.varint(2);   // writes
    out.varint(2);
    out.varint(1);   // external exchange
    out.varint(1);   // peer 5
    out.varint(0);   // remote offset
    out.varint(10);  // bytes
    out.varint(0);   // then receive: out of order
    out.varint(0);
    out.varint(0);
    out.varint(0);
    expect_corrupt(std::move(out), "receive after external exchange (not in stage order) at byte");
  }
  {
    codec::ByteWriter out = header(1);
    out.varint(4);  // arrivals
    out.varint(1);
    out.varint(0);
    out.varint(2);  // peer index 2 of 2 peers
    out.varint(0);
    expect_corrupt(std::move(out), "peer index 2 out of range");
  }
  {
    codec::ByteWriter out = header(1);
    out.varint(4);     // arrivals
    out.varint(1);
    out.varint(0);
    out.varint(0);
    out.varint(999);   // bytes [0, 999) fit the 1000-byte slot ...
    auto ok = out.take();
    EXPECT_EQ(deserialize_round_schedule(ok).rounds[0].arrivals[0].bytes, 999);
    codec::ByteWriter bad = header(1);
    bad.varint(4);
    bad.varint(1);
    bad.varint(0);
    bad.varint(0);
    bad.varint(1001);  // ... [0, 1001) does not
    expect_corrupt(std::move(bad), "received bytes [0, 1001) outside the receive slot of 1000 bytes");
  }
  {
    codec::ByteWriter out = header(1);
    out.varint(8);   // assemble
    out.varint(1);
    out.varint(4 | 16);  // shape, element size
    out.varint(17);      // axes
    expect_corrupt(std::move(out), "number of axes 17 out of range (at most 16) at byte");
  }
  {
    codec::ByteWriter out = header(1);
    out.varint(8);  // assemble
    out.varint(1);
    out.varint(4);  // shape, but no strides for its 2 axes
    out.varint(2);
    out.varint(2);
    out.varint(2);
    expect_corrupt(std::move(out), "strides of the previous entry have the wrong number of axes");
  }
  {
    codec::ByteWriter out = header(2);
    out.varint(0);
    out.varint(8);   // assemble
    out.varint(2);
    out.varint(4 | 8 | 16);  // a [2, 2] box of 4-byte elements at buffer offset 0: 16 bytes
    out.varint(2);
    out.varint(2);
    out.varint(2);
    out.signed_varint(2);
    out.signed_varint(1);
    out.varint(4);
    out.signed_varint(0);
    out.signed_varint(0);
    out.varint(64);  // the next, the same box: a buffer gap of -17 puts it at -1
    out.signed_varint(0);
    out.signed_varint(0);
    out.signed_varint(-17);
    expect_corrupt(std::move(out), "buffer bytes [-1, 15) outside the receive slot of 1000 bytes at byte");
  }
  {
    codec::ByteWriter out = header(1);
    out.varint(8);
    out.varint(1);
    out.varint(128);  // an unknown flag
    expect_corrupt(std::move(out), "entry flags 128 out of range");
  }
  {
    codec::ByteWriter out = header(0);
    out.byte(0);
    expect_corrupt(std::move(out), "1 trailing bytes");
  }
}

TEST(RoundSchedule, ErrorsNameTheRoundListAndEntry) {
  RoundSchedule s;
  s.side = Side::kRollout;
  s.peers = {1, 9};
  s.send_slot_bytes = 8;
  s.receive_slot_bytes = 8;
  s.rounds.resize(3);
  s.rounds[0].arrivals = {{1, Stage::kReceive, 0, 8}};
  s.rounds[2].writes = {{1, Stage::kExternalExchange, 0, 0, 4}, {9, Stage::kInternalExchange, 4, 0, 4}};
  std::vector<std::byte> bytes = serialize_round_schedule(s);
  EXPECT_EQ(deserialize_round_schedule(bytes), s);
  // The last write is its head, peer index, remote offset and size (its local offset continues the first).
  ASSERT_EQ(bytes[bytes.size() - 4], static_cast<std::byte>(2));
  bytes[bytes.size() - 4] = static_cast<std::byte>(3);
  std::string message;
  EXPECT_EQ(code_of_decoding(bytes, &message), ErrorCode::kCorruptData);
  EXPECT_THAT(message, HasSubstr("stage value 3 out of range"));
  EXPECT_THAT(message, HasSubstr("(round 2, write entry 1)"));
}

TEST(RoundSchedule, RelayWritesRoundTripAndAreRefusedWhereNoPreviousSlotHoldsTheirBytes) {
  RoundSchedule s;
  s.rank = 2;
  s.side = Side::kRollout;
  s.peers = {1, 3};
  s.send_slot_bytes = 0;
  s.receive_slot_bytes = 64;
  s.rounds.resize(3);
  s.rounds[1].writes = {{3, Stage::kExternalExchange, 0, 0, 16, 1}, {3, Stage::kExternalExchange, 16, 16, 16, 0},
                        {1, Stage::kInternalExchange, 0, 0, 32, 0}};
  s.rounds[2].writes = {{1, Stage::kExternalExchange, 8, 0, 8, 1}};
  const std::vector<std::byte> bytes = serialize_round_schedule(s);
  EXPECT_EQ(deserialize_round_schedule(bytes), s);

  const auto refuses = [](RoundSchedule bad, const std::string& expected) {
    expect_error([&] { (void)serialize_round_schedule(bad); }, ErrorCode::kInvalidArgument, {expected});
  };
  RoundSchedule first = s;
  first.rounds[0].writes = {{3, Stage::kExternalExchange, 0, 0, 8, 1}};
  refuses(first, "(round 0, write entry 0): a relay (lag 1) in the first round");
  RoundSchedule internal = s;
  internal.rounds[1].writes[2].lag = 1;
  refuses(internal, "a relay (lag 1) in the internal exchange stage");
  RoundSchedule single = s;
  single.pipeline_depth = 1;
  refuses(single, "a relay (lag 1) with a pipeline depth of 1");
  RoundSchedule two = s;
  two.rounds[2].writes[0].lag = 2;
  refuses(two, "lag 2 out of range");

  // Decoding checks the same: the relay bit on an internal-exchange write, or on an arrival.
  codec::ByteWriter out = header(1);
  out.varint(2);       // writes
  out.varint(1);
  out.varint(2 | 8);   // internal exchange, relay
  out.varint(0);       // peer 2
  out.varint(0);       // remote offset
  out.varint(4);       // bytes
  expect_corrupt(std::move(out), "a relay (lag 1) in the internal exchange stage");
  codec::ByteWriter arrival = header(1);
  arrival.varint(4);   // arrivals
  arrival.varint(1);
  arrival.varint(8);   // no relay bit on arrivals
  arrival.varint(0);   // peer 2
  arrival.varint(4);   // bytes
  expect_corrupt(std::move(arrival), "entry head 8 out of range");
}

TEST(RoundSchedule, SerializationRefusesSchedulesThatWouldNotDecode) {
  const auto refuses = [](const RoundSchedule& s, const std::string& expected) {
    expect_error([&] { (void)serialize_round_schedule(s); }, ErrorCode::kInvalidArgument, {expected});
  };
  RoundSchedule base;
  base.rank = 3;
  base.peers = {1, 4};
  base.send_slot_bytes = 100;
  base.receive_slot_bytes = 100;
  base.rounds.resize(2);
  {
    RoundSchedule s = base;
    s.peers = {4, 1};
    refuses(s, "peers not strictly ascending");
  }
  {
    RoundSchedule s = base;
    s.pipeline_depth = 0;
    refuses(s, "pipeline depth 0");
  }
  {
    RoundSchedule s = base;
    s.rounds[1].writes = {{2, Stage::kReceive, 0, 0, 10}};
    refuses(s, "schedule of rank 3 (round 1, write entry 0): peer 2 is not in the peer list");
  }
  {
    RoundSchedule s = base;
    s.rounds[0].arrivals = {{4, Stage::kInternalExchange, 0, 10}, {1, Stage::kReceive, 10, 10}};
    refuses(s, "receive after internal exchange (not in stage order)");
  }
  {
    RoundSchedule s = base;
    s.rounds[0].writes = {{4, Stage::kReceive, 95, 0, 10}};
    refuses(s, "local bytes [95, 105) outside the send slot of 100 bytes");
  }
  {
    RoundSchedule s = base;
    BufferCopy b;
    b.copy.box = {{0, 0}, {2, 3}};
    b.copy.strides = {3};
    b.element_bytes = 2;
    s.rounds[1].pack = {b};
    refuses(s, "(round 1, pack entry 0): box offsets, extents and strides have 2, 2 and 1 axes");
    s.rounds[1].pack[0].copy.strides = {3, 1};
    s.rounds[1].pack[0].element_bytes = 0;
    refuses(s, "element size 0");
    s.rounds[1].pack[0].element_bytes = 2;
    s.rounds[1].pack[0].buffer_offset = 90;
    refuses(s, "buffer bytes [90, 102) outside the send slot of 100 bytes");
  }
}

}  // namespace
}  // namespace wb
