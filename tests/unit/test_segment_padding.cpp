// Padded segments in transfer buffers (exec/segment_padding.hpp): plans over tensors of odd sizes (fp8
// matrices of odd extents, 4-byte scales), every rank's schedule padded as the executor does it at connect
// (the ranks with CUDA parameters pad their own slots, every rank moves its writes into its peers' padded
// layouts, which travel through the byte codec), then all of them played on host memory. Every rollout
// parameter must equal its own source map's result, the same bytes must move, every copy in a padded slot
// must start at its piece's alignment, and every write must land in its receiver's region.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../support/schedule_replay.hpp"
#include "exec/segment_padding.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using namespace testing_support;

struct Layout {
  std::vector<TensorInfo> tensors;
  std::vector<SourceMap> maps;
  std::vector<Side> sides;
  Topology topology;
};

// Trainers shard every tensor by rows, rollouts by columns (transposed in their parameters half the time);
// `rollouts` / 2 rollout nodes (two by default), so all three stages run. Tensors: fp8 matrices of odd
// extents, bf16 ones, and single-element or 3-element f32 scales.
Layout odd_layout(unsigned seed, int rollouts = 4) {
  std::mt19937 rng(seed);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int per_node = 2, trainers = 2;
  Layout layout;
  for (int t = 0; t < 6; ++t) {
    switch (t % 3) {
      case 0: layout.tensors.push_back({"fp8_" + std::to_string(t), DType::kF8E4M3, {2 * pick(3, 20) + 1, 2 * pick(3, 20) + 1}}); break;
      case 1: layout.tensors.push_back({"bf16_" + std::to_string(t), DType::kBF16, {pick(2, 40), pick(2, 40)}}); break;
      default: layout.tensors.push_back({"scale_" + std::to_string(t), DType::kF32, {pick(0, 1) ? 1 : 3}}); break;
    }
  }
  for (int w = 0; w < trainers + rollouts; ++w) {
    const bool trainer = w < trainers;
    const int shards = trainer ? trainers : per_node, index = trainer ? w : (w - trainers) % per_node;
    SourceMap map;
    for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
      const Shape& shape = layout.tensors[t].shape;
      Box box = Box::whole(shape);
      const std::size_t axis = shape.size() == 2 && !trainer ? 1 : 0;
      const std::int64_t extent = shape[axis];
      if (extent >= shards) {
        box.offset[axis] = extent * index / shards;
        box.extent[axis] = extent * (index + 1) / shards - box.offset[axis];
      }
      const bool transpose = !trainer && box.ndim() == 2 && pick(0, 1) == 0;
      Shape stored = box.extent;
      if (transpose) std::swap(stored[0], stored[1]);
      const Shape strides = box.ndim() == 2 ? (transpose ? Shape{1, stored[1]} : Shape{stored[1], 1}) : Shape{1};
      map.parameters.push_back({"p" + std::to_string(t), layout.tensors[t].dtype, stored});
      map.copies.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(t), box, 0, strides});
    }
    layout.maps.push_back(std::move(map));
    layout.sides.push_back(trainer ? Side::kTrainer : Side::kRollout);
  }
  layout.topology = Topology::uniform(trainers + rollouts, per_node, 100.0, 400.0);
  return layout;
}

// Plays the schedules on host memory: pack, the writes stage by stage (a relay, lag 1, from the receive
// slot of the round before), assemble. Returns the bytes written.
std::int64_t play(const std::vector<RoundSchedule>& schedules, std::vector<std::vector<Bytes>>& params) {
  std::int64_t written = 0;
  const std::size_t workers = schedules.size();
  std::vector<Bytes> previous(workers);  // per worker: the receive slot of the round before
  for (std::size_t r = 0; r < schedules[0].rounds.size(); ++r) {
    std::vector<Bytes> send(workers), receive(workers);
    for (std::size_t w = 0; w < workers; ++w) {
      send[w].assign(static_cast<std::size_t>(schedules[w].send_slot_bytes), std::byte{0xCD});
      receive[w].assign(static_cast<std::size_t>(schedules[w].receive_slot_bytes), std::byte{0xCD});
      for (const BufferCopy& c : schedules[w].rounds[r].pack)
        for_each_element(c.copy.box, [&](std::span<const std::int64_t> i, std::int64_t ordinal) {
          std::memcpy(send[w].data() + c.buffer_offset + ordinal * c.element_bytes,
                      params[w][c.copy.parameter].data() + element_position(c.copy, i) * c.element_bytes, c.element_bytes);
        });
    }
    for (Stage stage : {Stage::kReceive, Stage::kExternalExchange, Stage::kInternalExchange})
      for (std::size_t w = 0; w < workers; ++w)
        for (const Write& write : schedules[w].rounds[r].writes) {
          if (write.stage != stage) continue;
          const auto peer = static_cast<std::size_t>(write.peer);
          const Bytes& from = stage == Stage::kReceive ? send[w] : write.lag != 0 ? previous[w] : receive[w];
          EXPECT_LE(write.local_offset + write.bytes, static_cast<std::int64_t>(from.size()));
          EXPECT_LE(write.remote_offset + write.bytes, static_cast<std::int64_t>(receive[peer].size()));
          bool inside = false;
          for (const Arrival& a : schedules[peer].rounds[r].arrivals)
            inside = inside || (a.peer == static_cast<int>(w) && a.stage == stage && write.remote_offset >= a.offset &&
                                write.remote_offset + write.bytes <= a.offset + a.bytes);
          EXPECT_TRUE(inside) << "write from " << w << " to " << peer << " in round " << r << " lands outside its regions";
          std::memcpy(receive[peer].data() + write.remote_offset, from.data() + write.local_offset,
                      static_cast<std::size_t>(write.bytes));
          written += write.bytes;
        }
    for (std::size_t w = 0; w < workers; ++w)
      for (const BufferCopy& c : schedules[w].rounds[r].assemble)
        for_each_element(c.copy.box, [&](std::span<const std::int64_t> i, std::int64_t ordinal) {
          std::memcpy(params[w][c.copy.parameter].data() + element_position(c.copy, i) * c.element_bytes,
                      receive[w].data() + c.buffer_offset + ordinal * c.element_bytes, c.element_bytes);
        });
    previous = std::move(receive);
  }
  return written;
}

// The executor's connect step for every rank at once: pads the slots of the ranks in `pads`, exchanges the
// receive layouts through their wire form, moves every schedule.
std::vector<RoundSchedule> pad_all(const std::vector<RoundSchedule>& schedules, const std::vector<bool>& pads) {
  const std::size_t workers = schedules.size();
  std::vector<exec::SlotLayout> send(workers), receive(workers);
  for (std::size_t w = 0; w < workers; ++w)
    if (pads[w]) {
      send[w] = exec::pad_send_slot(schedules[w]);
      receive[w] = exec::pad_receive_slot(schedules[w]);
    }
  std::vector<RoundSchedule> padded;
  for (std::size_t w = 0; w < workers; ++w) {
    std::map<int, exec::SlotLayout> peers;
    for (int p : schedules[w].peers) {
      const std::vector<std::byte> wire = exec::encode_layout_for(receive[static_cast<std::size_t>(p)], schedules[static_cast<std::size_t>(p)],
                                                                  static_cast<int>(w));
      peers.emplace(p, exec::decode_layout(wire, p, static_cast<int>(schedules[w].rounds.size())));
    }
    padded.push_back(exec::apply_layouts(schedules[w], send[w], receive[w], peers));
  }
  return padded;
}

void expect_aligned(const RoundSchedule& padded, const std::string& context) {
  for (std::size_t r = 0; r < padded.rounds.size(); ++r) {
    for (const BufferCopy& c : padded.rounds[r].pack)
      EXPECT_EQ(c.buffer_offset % exec::piece_alignment(c.bytes()), 0) << context << " round " << r << " pack at " << c.buffer_offset;
    for (const BufferCopy& c : padded.rounds[r].assemble)
      EXPECT_EQ(c.buffer_offset % 16, 0) << context << " round " << r << " assemble at " << c.buffer_offset;
  }
}

TEST(SegmentPadding, PaddedSchedulesMoveTheSameBytesToTheSameParametersAtAlignedOffsets) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    const Layout layout = odd_layout(seed);
    PlanOptions options;
    options.piece_bytes = 16 << (seed % 6);  // 16 B .. 512 B: many odd-sized segments
    options.min_rounds = 1 + static_cast<int>(seed % 3);
    const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
    const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
    const RoundScheduleBuilder builder(correspondence, plan);
    const std::size_t workers = layout.sides.size();
    std::vector<RoundSchedule> schedules;
    for (std::size_t w = 0; w < workers; ++w) schedules.push_back(builder.build(static_cast<int>(w)));

    const std::vector<Bytes> checkpoint = random_checkpoint(layout.tensors, seed);
    const auto fresh = [&] {
      std::vector<std::vector<Bytes>> params;
      for (std::size_t w = 0; w < workers; ++w)
        params.push_back(layout.sides[w] == Side::kTrainer
                             ? load_parameters(layout.maps[w], layout.tensors, checkpoint, std::byte{0})
                             : load_parameters(SourceMap{layout.maps[w].parameters, {}}, layout.tensors, checkpoint, std::byte{0xEE}));
      return params;
    };
    std::vector<std::vector<Bytes>> unpadded = fresh();
    const std::int64_t bytes = play(schedules, unpadded);

    // Every rank padding, only the rollouts, only the trainers, every other rank.
    const std::vector<std::vector<bool>> choices = {std::vector<bool>(workers, true),
                                                    {false, false, true, true, true, true},
                                                    {true, true, false, false, false, false},
                                                    {true, false, true, false, true, false}};
    for (std::size_t choice = 0; choice < choices.size(); ++choice) {
      const std::string context = "seed " + std::to_string(seed) + ", choice " + std::to_string(choice);
      SCOPED_TRACE(context);
      const std::vector<RoundSchedule> padded = pad_all(schedules, choices[choice]);
      for (std::size_t w = 0; w < workers; ++w) {
        if (choices[choice][w]) expect_aligned(padded[w], context + ", worker " + std::to_string(w));
        // Padded schedules are schedules: they serialize (ranges inside their slots, stages in order...).
        EXPECT_NO_THROW(serialize_round_schedule(padded[w])) << "worker " << w;
        EXPECT_EQ(padded[w].rounds.size(), schedules[w].rounds.size());
        for (std::size_t r = 0; r < padded[w].rounds.size(); ++r)
          EXPECT_EQ(padded[w].rounds[r].arrivals.size(), schedules[w].rounds[r].arrivals.size());
      }
      std::vector<std::vector<Bytes>> params = fresh();
      EXPECT_EQ(play(padded, params), bytes);
      for (std::size_t w = 0; w < workers; ++w)
        for (std::size_t p = 0; p < params[w].size(); ++p)
          ASSERT_TRUE(params[w][p] == unpadded[w][p]) << "worker " << w << " parameter " << p;
      if (HasFailure()) return;
    }
    // The unpadded replay itself is the plan's result.
    for (std::size_t w = 0; w < workers; ++w) {
      if (layout.sides[w] != Side::kRollout) continue;
      const std::vector<Bytes> expected = load_parameters(layout.maps[w], layout.tensors, checkpoint, std::byte{0xEE});
      for (std::size_t p = 0; p < expected.size(); ++p) ASSERT_TRUE(unpadded[w][p] == expected[p]);
    }
  }
}

// Relay trees (four rollout nodes, fan-out 1: a chain): a relay's writes read the previous round's receive
// slot, so they move by that round's padded layout and keep their lag.
TEST(SegmentPadding, RelaysMoveByThePreviousRoundsLayout) {
  int relays = 0;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const Layout layout = odd_layout(seed, 8);
    PlanOptions options;
    options.piece_bytes = 16 << (seed % 4);
    options.min_rounds = 2 + static_cast<int>(seed % 3);
    options.relay_fan_out = 1;
    const Correspondence correspondence = build_correspondence(layout.tensors, layout.maps, layout.sides);
    const TransferPlan plan = plan_transfer(correspondence, layout.topology, options);
    const RoundScheduleBuilder builder(correspondence, plan);
    const std::size_t workers = layout.sides.size();
    std::vector<RoundSchedule> schedules;
    for (std::size_t w = 0; w < workers; ++w) schedules.push_back(builder.build(static_cast<int>(w)));
    for (const RoundSchedule& schedule : schedules)
      for (const RoundPlan& round : schedule.rounds)
        for (const Write& write : round.writes) relays += write.lag;

    const std::vector<Bytes> checkpoint = random_checkpoint(layout.tensors, seed);
    const auto fresh = [&] {
      std::vector<std::vector<Bytes>> params;
      for (std::size_t w = 0; w < workers; ++w)
        params.push_back(layout.sides[w] == Side::kTrainer
                             ? load_parameters(layout.maps[w], layout.tensors, checkpoint, std::byte{0})
                             : load_parameters(SourceMap{layout.maps[w].parameters, {}}, layout.tensors, checkpoint, std::byte{0xEE}));
      return params;
    };
    std::vector<std::vector<Bytes>> unpadded = fresh();
    const std::int64_t bytes = play(schedules, unpadded);
    for (std::size_t w = 0; w < workers; ++w) {
      if (layout.sides[w] != Side::kRollout) continue;
      const std::vector<Bytes> expected = load_parameters(layout.maps[w], layout.tensors, checkpoint, std::byte{0xEE});
      for (std::size_t p = 0; p < expected.size(); ++p) ASSERT_TRUE(unpadded[w][p] == expected[p]) << "seed " << seed;
    }
    std::vector<bool> every(workers, true), alternate(workers, false);
    for (std::size_t w = 0; w < workers; w += 2) alternate[w] = true;
    for (const std::vector<bool>& pads : {every, alternate}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (pads == every ? ", every rank pads" : ", every other rank pads"));
      const std::vector<RoundSchedule> padded = pad_all(schedules, pads);
      for (std::size_t w = 0; w < workers; ++w) {
        EXPECT_NO_THROW(serialize_round_schedule(padded[w])) << "worker " << w;
        int lags = 0, padded_lags = 0;
        for (const RoundPlan& round : schedules[w].rounds)
          for (const Write& write : round.writes) lags += write.lag;
        for (const RoundPlan& round : padded[w].rounds)
          for (const Write& write : round.writes) padded_lags += write.lag;
        EXPECT_EQ(padded_lags > 0, lags > 0) << "worker " << w;
      }
      std::vector<std::vector<Bytes>> params = fresh();
      EXPECT_EQ(play(padded, params), bytes);
      for (std::size_t w = 0; w < workers; ++w)
        for (std::size_t p = 0; p < params[w].size(); ++p)
          ASSERT_TRUE(params[w][p] == unpadded[w][p]) << "worker " << w << " parameter " << p;
    }
  }
  EXPECT_GT(relays, 0) << "no plan relayed";
}

TEST(SegmentPadding, PiecesOfFourKibAndMoreGoToTwoHundredFiftySixBytesSmallerOnesToSixteen) {
  RoundSchedule schedule;
  schedule.rounds.resize(1);
  // A 4-byte scale, then 4 KiB, then 100 bytes, then 5000 bytes, back to back.
  std::int64_t at = 0;
  for (std::int64_t bytes : {4, 4096, 100, 5000}) {
    BufferCopy c;
    c.copy.box = Box{{0}, {bytes}};
    c.copy.strides = {1};
    c.buffer_offset = at;
    c.element_bytes = 1;
    schedule.rounds[0].pack.push_back(c);
    at += bytes;
  }
  const exec::SlotLayout layout = exec::pad_send_slot(schedule);
  ASSERT_EQ(layout.rounds[0].size(), 4u);
  EXPECT_EQ(layout.rounds[0][0].to, 0);
  EXPECT_EQ(layout.rounds[0][1].to, 256);
  EXPECT_EQ(layout.rounds[0][2].to, 256 + 4096);
  EXPECT_EQ(layout.rounds[0][3].to, 4608);  // 4452 rounded up to 256
  EXPECT_EQ(layout.slot_bytes, 4608 + 5000);
  // A byte outside every piece is no byte of the slot.
  EXPECT_EQ(layout.find(0, at), nullptr);
  EXPECT_NE(layout.find(0, 4), nullptr);
}

TEST(SegmentPadding, AMalformedLayoutIsRefusedNamingThePeer) {
  const std::vector<std::byte> garbage = {std::byte{1}, std::byte{2}};
  try {
    exec::decode_layout(garbage, 7, 3);
    FAIL() << "decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_NE(std::string(e.what()).find("rank 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wb
