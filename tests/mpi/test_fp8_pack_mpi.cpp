// The trainers' FP8 pack (exec/quantized_pack.hpp) on 3 trainer ranks: flat shards whose cuts split
// blocks, a TP split off a multiple of 128, a transposed replica, copied tensors. Every rank quantizes its
// own elements, the ranks exchange the amaxes of the blocks they share, and every code and scale each rank
// would send equals, bit for bit, the FP8 form computed from the whole checkpoint (open_fp8_form).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <limits>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "comm/collectives.hpp"
#include "coord/staging.hpp"
#include "exec/round_executor.hpp"
#include "layout/source_map_exchange.hpp"
#include "plan/planned_schedules.hpp"
#include "plan/round_schedule_scatter.hpp"
#include "weightbridge/adapter.hpp"
#include "comm/max_reduce.hpp"
#include "exec/fp8_cast_program.hpp"
#include "exec/pack.hpp"
#include "exec/quantized_pack.hpp"
#include "layout/fp8_form.hpp"
#include "../support/expect_error.hpp"
#include "../support/memory_checkpoint.hpp"

namespace wb {
namespace {

using exec::BlockKey;
using exec::QuantizedPack;

constexpr std::int64_t kFlatRows = 300, kFlatCols = 200, kTpRows = 256, kTpCols = 192, kTpCut = 100;

std::uint16_t bf16_bits(float x) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16); }

// Values of every magnitude, a zero block, and one NaN in a block the flat shards split.
testing::MemoryCheckpoint make_checkpoint(std::vector<TensorInfo>& tensors, unsigned version = 0) {
  tensors = {{"a.weight", DType::kBF16, {kFlatRows, kFlatCols}},
             {"b.weight", DType::kBF16, {kTpRows, kTpCols}},
             {"norm.weight", DType::kBF16, {kFlatRows}},
             {"lm_head.weight", DType::kBF16, {64, kFlatCols}}};
  std::mt19937 random(32 + version);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 12);
  testing::MemoryCheckpoint checkpoint;
  for (const TensorInfo& t : tensors) {
    std::vector<std::uint16_t> values(static_cast<std::size_t>(t.numel()));
    for (std::uint16_t& v : values) v = bf16_bits(std::ldexp(normal(random), exponent(random) / 4));
    if (t.name == "a.weight") values[110 * kFlatCols + 3] = 0x7FC0;  // NaN in block (0, 0), which ranks 0, 1 and 2 share
    if (t.name == "b.weight")  // block (1, 1) all zero
      for (std::int64_t r = 128; r < kTpRows; ++r)
        for (std::int64_t c = 128; c < kTpCols; ++c) values[static_cast<std::size_t>(r * kTpCols + c)] = 0;
    checkpoint.add(t, std::move(values));
  }
  return checkpoint;
}

// The next version's values, as these tests make them: every bf16 with bit 6 flipped (the NaN becomes +inf,
// zeros subnormal).
void flip_to_next_version(std::vector<std::uint16_t>& values) {
  for (std::uint16_t& v : values) v = static_cast<std::uint16_t>(v ^ 0x0040u);
}

// The whole checkpoint as update `update` (0 or 1) of these tests holds it: the reference of its FP8 form.
testing::MemoryCheckpoint checkpoint_of_update(const std::vector<TensorInfo>& tensors, int update) {
  std::vector<TensorInfo> ignored;
  const testing::MemoryCheckpoint version = make_checkpoint(ignored);
  testing::MemoryCheckpoint out;
  for (const TensorInfo& t : tensors) {
    std::vector<std::uint16_t> values(static_cast<std::size_t>(t.numel()));
    version.read_box(t.name, Box{Shape(t.shape.size(), 0), t.shape}, values.data());
    if (update == 1) flip_to_next_version(values);
    out.add(t, std::move(values));
  }
  return out;
}

struct Rank {
  SourceMap map;
  std::vector<std::vector<std::uint16_t>> memory;
};

// This rank's layout: a flat shard of a.weight (cut mid-row), its part of b.weight (TP columns cut at
// 100 between ranks 0 and 1; rank 2 a transposed replica of the whole), and one copied tensor.
Rank make_rank(int rank, const std::vector<TensorInfo>& tensors) {
  Rank out;
  const std::int64_t flat = kFlatRows * kFlatCols, cuts[4] = {0, 10123, 24011, flat};
  const std::int64_t begin = cuts[rank], end = cuts[rank + 1];
  out.map.parameters.push_back({"flat", DType::kBF16, {end - begin}});
  for (std::int64_t at = begin; at < end;) {
    const std::int64_t row = at / kFlatCols, col = at % kFlatCols;
    if (col != 0 || end - at < kFlatCols) {  // a partial row
      const std::int64_t n = std::min(kFlatCols - col, end - at);
      out.map.copies.push_back({0, 0, Box{{row, col}, {1, n}}, at - begin, {kFlatCols, 1}});
      at += n;
    } else {
      const std::int64_t rows = (end - at) / kFlatCols;
      out.map.copies.push_back({0, 0, Box{{row, 0}, {rows, kFlatCols}}, at - begin, {kFlatCols, 1}});
      at += rows * kFlatCols;
    }
  }
  if (rank < 2) {
    const std::int64_t c0 = rank == 0 ? 0 : kTpCut, cols = rank == 0 ? kTpCut : kTpCols - kTpCut;
    out.map.parameters.push_back({"b", DType::kBF16, {kTpRows, cols}});
    out.map.copies.push_back({1, 1, Box{{0, c0}, {kTpRows, cols}}, 0, {cols, 1}});
  } else {
    out.map.parameters.push_back({"b_t", DType::kBF16, {kTpCols, kTpRows}});
    out.map.copies.push_back({1, 1, Box{{0, 0}, {kTpRows, kTpCols}}, 0, {1, kTpRows}});
  }
  const std::uint32_t copied = rank == 1 ? 3 : 2;
  out.map.parameters.push_back({"copied", DType::kBF16, tensors[copied].shape});
  out.map.copies.push_back({copied, 2, Box{Shape(tensors[copied].shape.size(), 0), tensors[copied].shape}, 0,
                            tensors[copied].shape.size() == 1 ? Shape{1} : Shape{kFlatCols, 1}});
  return out;
}

class Fp8PackMpi : public ::testing::TestWithParam<fp8::ScaleRule> {};

TEST_P(Fp8PackMpi, EveryCodeAndScaleEqualsTheFormOfTheWholeCheckpoint) {
  // The first 3 ranks of the world, as trainers.
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm trainers = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank < 3 ? 0 : MPI_UNDEFINED, world_rank, &trainers);
  if (trainers == MPI_COMM_NULL) return;
  int rank = 0, size = 0;
  MPI_Comm_rank(trainers, &rank);
  MPI_Comm_size(trainers, &size);
  ASSERT_EQ(size, 3);
  std::vector<TensorInfo> tensors;
  testing::MemoryCheckpoint checkpoint = make_checkpoint(tensors);
  layout::QuantizationConfig config;
  config.rule = GetParam();
  config.modules_to_not_convert = {"lm_head"};
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);
  ASSERT_EQ(form.tensors.size(), 6u);  // a, a_scale_inv, b, b_scale_inv, norm, lm_head

  Rank mine = make_rank(rank, tensors);
  validate_source_map(mine.map, tensors);
  ParameterSet params;
  for (const TensorInfo& p : mine.map.parameters) {
    mine.memory.emplace_back(static_cast<std::size_t>(p.numel()), 0);
    params.add(p.name, TensorView::contiguous(mine.memory.back().data(), p.dtype, p.shape));
  }
  apply_source_map(mine.map, checkpoint, params);

  QuantizedPack pack(mine.map, form);
  // The partial blocks' union, once (what connect does); then every update's exchange.
  const comm::Waiter waiter = comm::Waiter::from_settings();
  const auto& partial = pack.partial_blocks();
  const auto all = comm::allgather(std::as_bytes(std::span(partial)), trainers, waiter, "partial blocks");
  std::vector<BlockKey> shared;
  for (const auto& bytes : all) {
    const auto* keys = reinterpret_cast<const BlockKey*>(bytes.data());
    shared.insert(shared.end(), keys, keys + bytes.size() / sizeof(BlockKey));
  }
  pack.set_shared_blocks(shared);
  // Flat cuts at 10123 and 24011 (rows 50 and 120) split a.weight's block row 0 between all three ranks;
  // the TP cut at 100 splits the first block column of b.weight for ranks 0 and 1 (rank 2 holds it whole,
  // and takes part all the same).
  ASSERT_GT(pack.shared_blocks().size(), 2u);
  EXPECT_EQ(pack.exchange_bytes(), static_cast<std::int64_t>(4 * pack.shared_blocks().size()));

  std::vector<std::byte*> bases;
  for (auto& m : mine.memory) bases.push_back(reinterpret_cast<std::byte*>(m.data()));
  int exchanges = 0;
  for (int update = 0; update < 2; ++update) {
    if (update == 1)  // new values, as the next version brings
      for (auto& m : mine.memory) flip_to_next_version(m);
    const Status quantized = pack.quantize(bases, [&](std::span<std::uint32_t> bits) {
      ++exchanges;
      return comm::reduce_max(bits, trainers, waiter, "FP8 amax exchange");
    });
    ASSERT_TRUE(quantized.ok()) << quantized.message();
    // The reference: the whole checkpoint of this version, quantized block by block.
    const testing::MemoryCheckpoint whole = checkpoint_of_update(tensors, update);
    const auto reference = layout::open_fp8_form(whole, form);
    const std::vector<std::byte*> memory = pack.form_memory(bases);
    std::int64_t checked = 0;
    for (const SliceCopy& copy : pack.form_map().copies) {
      const TensorInfo& t = form.tensors[copy.tensor];
      const std::size_t element = dtype_size(t.dtype);
      std::vector<std::byte> expected(static_cast<std::size_t>(copy.numel()) * element);
      reference->read_box(t.name, copy.box, expected.data());
      const std::int64_t cols = copy.box.extent.size() == 2 ? copy.box.extent[1] : copy.box.extent[0];
      const std::int64_t rows = copy.box.extent.size() == 2 ? copy.box.extent[0] : 1;
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) {
          const std::int64_t position =
              copy.offset + (copy.box.extent.size() == 2 ? i * copy.strides[0] + j * copy.strides[1] : j * copy.strides[0]);
          ASSERT_EQ(std::memcmp(memory[copy.parameter] + position * static_cast<std::int64_t>(element),
                                expected.data() + (i * cols + j) * static_cast<std::int64_t>(element), element),
                    0)
              << "rank " << rank << " update " << update << ": " << t.name << " element (" << copy.box.offset[0] + i
              << ", " << (copy.box.extent.size() == 2 ? copy.box.offset[1] + j : j) << ") differs from the reference";
          ++checked;
        }
    }
    EXPECT_GT(checked, 0);
  }
  EXPECT_EQ(exchanges, 2);
  MPI_Comm_free(&trainers);
}

// The same trainers casting straight into the send buffer (QuantizedPack::cast_in_pack, as connect sets it
// up for host parameters, not staged, not verified): the form map's copies packed in two rounds, whole or cut
// into pieces of 50 rows (cutting blocks), alternately in round 0 and 1, so that a block's scale is packed
// in the round that casts it whole, in one that casts only part of it, or in one that casts none of it.
// Shared blocks take the exchanged amax before the rounds; blocks a piece holds whole take theirs as the
// cast reads them. Every byte of both buffers equals the FP8 form of the whole checkpoint, in two updates.
TEST_P(Fp8PackMpi, CastsStraightIntoTheBufferEqualTheFormOfTheWholeCheckpoint) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm trainers = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank < 3 ? 0 : MPI_UNDEFINED, world_rank, &trainers);
  if (trainers == MPI_COMM_NULL) return;
  int rank = 0;
  MPI_Comm_rank(trainers, &rank);
  std::vector<TensorInfo> tensors;
  testing::MemoryCheckpoint checkpoint = make_checkpoint(tensors);
  layout::QuantizationConfig config;
  config.rule = GetParam();
  config.modules_to_not_convert = {"lm_head"};
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);
  Rank mine = make_rank(rank, tensors);
  ParameterSet params;
  for (const TensorInfo& p : mine.map.parameters) {
    mine.memory.emplace_back(static_cast<std::size_t>(p.numel()), 0);
    params.add(p.name, TensorView::contiguous(mine.memory.back().data(), p.dtype, p.shape));
  }
  std::vector<std::byte*> bases;
  for (auto& m : mine.memory) bases.push_back(reinterpret_cast<std::byte*>(m.data()));
  const comm::Waiter waiter = comm::Waiter::from_settings();

  for (const std::int64_t piece_rows : {std::int64_t{0}, std::int64_t{50}}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece_rows) + " rows (0: whole copies)");
    apply_source_map(mine.map, checkpoint, params);  // version 0 again
    QuantizedPack pack(mine.map, form);
    pack.cast_in_pack();
    {
      const auto& partial = pack.partial_blocks();
      const auto all = comm::allgather(std::as_bytes(std::span(partial)), trainers, waiter, "partial blocks");
      std::vector<BlockKey> shared;
      for (const auto& bytes : all) {
        const auto* keys = reinterpret_cast<const BlockKey*>(bytes.data());
        shared.insert(shared.end(), keys, keys + bytes.size() / sizeof(BlockKey));
      }
      pack.set_shared_blocks(shared);
    }
    const SourceMap& map = pack.form_map();
    std::vector<std::int64_t> parameter_bytes;
    for (const TensorInfo& p : map.parameters) parameter_bytes.push_back(static_cast<std::int64_t>(p.nbytes()));
    std::array<std::vector<BufferCopy>, 2> rounds;
    std::array<std::int64_t, 2> buffer_bytes{};
    std::size_t piece = 0;
    for (const SliceCopy& copy : map.copies) {
      const auto element = static_cast<std::uint8_t>(dtype_size(map.parameters[copy.parameter].dtype));
      const std::int64_t rows = copy.box.ndim() == 2 ? copy.box.extent[0] : 1;
      const std::int64_t step = piece_rows > 0 && copy.box.ndim() == 2 ? piece_rows : rows;
      for (std::int64_t r = 0; r < rows; r += step, ++piece) {
        SliceCopy part = copy;
        if (copy.box.ndim() == 2) {
          part.box.offset[0] += r;
          part.box.extent[0] = std::min(step, rows - r);
          part.offset += r * copy.strides[0];
        }
        const std::size_t round = piece % 2;
        rounds[round].push_back({part, buffer_bytes[round], element});
        buffer_bytes[round] += rounds[round].back().bytes();
      }
    }
    std::array<exec::Fp8CastProgram, 2> casts;
    std::array<exec::CopyProgram, 2> rest_programs;
    std::int64_t cast_bytes = 0;
    for (std::size_t r = 0; r < 2; ++r) {
      std::vector<BufferCopy> rest;
      casts[r] = exec::Fp8CastProgram(rounds[r], pack, buffer_bytes[r], rest);
      rest_programs[r] = exec::CopyProgram(exec::CopyDirection::kPack, rest, parameter_bytes, buffer_bytes[r]);
      cast_bytes += casts[r].bytes();
    }
    EXPECT_GT(cast_bytes, 0);
    // Rank 1 holds b.weight's second block column whole, in one copy: whole, its two blocks take their amaxes
    // in the cast; cut at 50 rows, neither does.
    if (rank == 1) {
      const std::int64_t own = casts[0].own_amax_blocks() + casts[1].own_amax_blocks();
      if (piece_rows == 0) {
        EXPECT_GE(own, 2);
      } else {
        EXPECT_EQ(own, 0);
      }
    }
    const std::vector<std::byte*> memory = pack.form_memory(bases);
    for (std::size_t p = pack.own_parameters(); p < memory.size(); ++p) {
      if (map.parameters[p].dtype == DType::kF8E4M3) {
        EXPECT_EQ(memory[p], nullptr) << "a shadow was allocated";
      }
    }
    for (int update = 0; update < 2; ++update) {
      if (update == 1)
        for (auto& m : mine.memory) flip_to_next_version(m);
      const Status quantized = pack.quantize(bases, [&](std::span<std::uint32_t> bits) {
        return comm::reduce_max(bits, trainers, waiter, "FP8 amax exchange");
      });
      ASSERT_TRUE(quantized.ok()) << quantized.message();
      std::array<std::vector<std::byte>, 2> buffers;
      for (std::size_t r = 0; r < 2; ++r) {
        buffers[r].assign(static_cast<std::size_t>(buffer_bytes[r]), std::byte{0xAB});
        casts[r].execute(memory, buffers[r].data());  // first, as the copy engine does
        rest_programs[r].execute(memory, buffers[r].data());
      }
      const testing::MemoryCheckpoint whole = checkpoint_of_update(tensors, update);
      const auto reference = layout::open_fp8_form(whole, form);
      // Counted, not asserted byte by byte: every rank goes on to the next exchange whatever it found.
      std::int64_t differ = 0;
      std::string first;
      for (std::size_t r = 0; r < 2; ++r)
        for (const BufferCopy& c : rounds[r]) {
          const TensorInfo& t = form.tensors[c.copy.tensor];
          std::vector<std::byte> expected(static_cast<std::size_t>(c.bytes()));
          reference->read_box(t.name, c.copy.box, expected.data());
          for (std::int64_t b = 0; b < c.bytes(); ++b) {
            const std::byte got = buffers[r][static_cast<std::size_t>(c.buffer_offset + b)];
            if (got == expected[static_cast<std::size_t>(b)]) continue;
            if (differ++ == 0)
              first = "round " + std::to_string(r) + ": " + t.name + " box at row " + std::to_string(c.copy.box.offset[0]) +
                      " byte " + std::to_string(b) + " is " + std::to_string(static_cast<int>(got)) + ", not " +
                      std::to_string(static_cast<int>(expected[static_cast<std::size_t>(b)]));
          }
        }
      EXPECT_EQ(differ, 0) << "rank " << rank << " update " << update << ", first " << first;
    }
  }
  MPI_Comm_free(&trainers);
}

// An FP8 engine of 2 workers (world ranks 3, 4) behind the 3 trainers: its load_weights copies fp8 weights
// and f32 scales, sharded in scale units (b.weight's columns at 128, its scales at 1) and transposed
// (rank 4 holds a.weight and its scales transposed). It is probed against its own form; after every
// version every engine parameter equals its own load_weights of the FP8 form of that version, bit for bit.
SourceMap engine_map(int worker, const layout::Fp8Form& form) {
  const auto index = [&](const std::string& name) {
    for (std::uint32_t i = 0; i < form.tensors.size(); ++i)
      if (form.tensors[i].name == name) return i;
    throw Error(ErrorCode::kNotFound, name);
  };
  const auto whole = [](const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; };
  SourceMap map;
  const Shape a = {kFlatRows, kFlatCols}, a_scales = {3, 2};
  if (worker == 0) {
    map.parameters = {{"a", DType::kF8E4M3, a}, {"a_scales", DType::kF32, a_scales}};
    map.copies = {{index("a.weight"), 0, whole(a), 0, {kFlatCols, 1}},
                  {index("a.weight_scale_inv"), 1, whole(a_scales), 0, {2, 1}}};
  } else {
    map.parameters = {{"a_t", DType::kF8E4M3, {kFlatCols, kFlatRows}}, {"a_scales_t", DType::kF32, {2, 3}}};
    map.copies = {{index("a.weight"), 0, whole(a), 0, {1, kFlatRows}},
                  {index("a.weight_scale_inv"), 1, whole(a_scales), 0, {1, 3}}};
  }
  const std::int64_t c0 = worker == 0 ? 0 : 128, cols = worker == 0 ? 128 : kTpCols - 128;
  map.parameters.push_back({"b", DType::kF8E4M3, {kTpRows, cols}});
  map.copies.push_back({index("b.weight"), 2, Box{{0, c0}, {kTpRows, cols}}, 0, {cols, 1}});
  map.parameters.push_back({"b_scales", DType::kF32, {2, 1}});
  map.copies.push_back({index("b.weight_scale_inv"), 3, Box{{0, worker}, {2, 1}}, 0, {1, 1}});
  map.parameters.push_back({"norm", DType::kBF16, {kFlatRows}});
  map.copies.push_back({index("norm.weight"), 4, whole({kFlatRows}), 0, {1}});
  map.parameters.push_back({"lm_head", DType::kBF16, {64, kFlatCols}});
  map.copies.push_back({index("lm_head.weight"), 5, whole({64, kFlatCols}), 0, {kFlatCols, 1}});
  return map;
}

struct Buffers {
  std::vector<std::vector<std::byte>> memory;
  ParameterSet params;
  explicit Buffers(const SourceMap& map) {
    for (const TensorInfo& p : map.parameters) {
      memory.emplace_back(p.nbytes(), std::byte{0});
      params.add(p.name, TensorView::contiguous(memory.back().data(), p.dtype, p.shape));
    }
  }
};

// This rank in a world of 5 (world ranks 0-2 train, 3 and 4 serve), or -1 in a world of another size.
int rank_of_five() {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size == 5 ? rank : -1;
}

// The trainers' communicator, or that of the engine numbered `engine` (from 1) that this rank serves.
MPI_Comm group_of(int rank, int engine = 1) {
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 3 ? 0 : engine, rank, &group);
  return group;
}

// A trainer's updates: versions 1..`versions` of the checkpoint, each loaded, sent, then overwritten in
// the trainer's memory (a version must not reach the engines from memory the trainer reuses).
void send_versions(SenderAdapter& sender, const Rank& layout, Buffers& buffers, unsigned versions) {
  for (unsigned v = 1; v <= versions; ++v) {
    std::vector<TensorInfo> ignored;
    apply_source_map(layout.map, make_checkpoint(ignored, v), buffers.params);
    const Status status = sender.send_weights(v);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    for (auto& m : buffers.memory) std::memset(m.data(), 0x5A, m.size());
  }
  ASSERT_TRUE(sender.shutdown().is_ok());
}

// An engine worker's side until the trainers shut down: after each install, its parameters (`buffers`,
// filled by `map`) equal `map` applied to `form_of(version's checkpoint)`. Returns the last version installed.
std::uint64_t receive_versions(ReceiverAdapter& receiver, const SourceMap& map, const Buffers& buffers, const std::string& who,
                               const std::function<std::unique_ptr<CheckpointReader>(const testing::MemoryCheckpoint&)>& form_of) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::uint64_t installed = 0;
  for (;;) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << who << " never saw the shutdown";
      return installed;
    }
    const PollResult result = receiver.poll_requests();
    if (result.event == PollResult::Event::kFailed) {
      ADD_FAILURE() << who << ": " << result.status.to_string();
      return installed;
    }
    if (result.event == PollResult::Event::kShutdown) return installed;
    if (result.event == PollResult::Event::kInstalled) {
      installed = result.version;
      std::vector<TensorInfo> ignored;
      const testing::MemoryCheckpoint bf16 = make_checkpoint(ignored, static_cast<unsigned>(installed));
      Buffers expected(map);
      apply_source_map(map, *form_of(bf16), expected.params);
      for (std::size_t p = 0; p < map.parameters.size(); ++p)
        EXPECT_EQ(buffers.memory[p], expected.memory[p]) << who << " version " << installed << ": parameter "
                                                         << map.parameters[p].name << " differs from its load_weights of its form";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class Fp8EngineMpi : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(Fp8EngineMpi, EveryEngineParameterAndScaleEqualsItsLoaderOfTheFp8Form) {
  const int rank = rank_of_five();
  ASSERT_GE(rank, 0) << "run with 5 ranks";
  const bool trainer = rank < 3;
  MPI_Comm group = group_of(rank);
  std::vector<TensorInfo> tensors;
  make_checkpoint(tensors);
  AdapterOptions options;
  options.sender_staging = GetParam().first;
  options.receiver_staging = GetParam().second;
  options.timeout_seconds = 30;
  options.node = trainer ? 0 : 1;
  options.buffer_bytes = 64 << 10;  // several rounds
  Fp8Engine fp8;
  fp8.scale_rule = "ue8m0";
  fp8.modules_to_not_convert = {"lm_head"};
  layout::QuantizationConfig config;
  config.rule = fp8::ScaleRule::kUe8m0;
  config.modules_to_not_convert = fp8.modules_to_not_convert;
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);
  constexpr unsigned kVersions = 3;
  if (trainer) {
    const Rank layout = make_rank(rank, tensors);
    Buffers buffers(layout.map);
    const auto load = [&layout](const CheckpointReader& checkpoint, const ParameterSet& p) { apply_source_map(layout.map, checkpoint, p); };
    SenderAdapter sender(MPI_COMM_WORLD, group, buffers.params, tensors, load, options);
    sender.connect();
    // The trainers send one copy of the FP8 form: M is the form's bytes, about half the checkpoint's.
    EXPECT_EQ(sender.summary().model_bytes, static_cast<std::int64_t>(form.total_bytes()));
    std::int64_t egress = 0;
    for (std::int64_t bytes : sender.summary().node_egress_bytes) egress += bytes;
    EXPECT_EQ(egress, static_cast<std::int64_t>(form.total_bytes()));
    // The amax exchange: a.weight's flat cuts (row 50 col 123, row 120 col 11) split its blocks (0, 0) and
    // (0, 1) three ways; b.weight's TP cut at column 100 its blocks (0, 0), (1, 0) (rank 2's replica holds
    // whole blocks): 4 blocks, 4 bytes each.
    EXPECT_EQ(sender.summary().fp8_amax_bytes, 16);
    send_versions(sender, layout, buffers, kVersions);
  } else {
    const SourceMap map = engine_map(rank - 3, form);
    Buffers buffers(map);
    options.fp8 = fp8;
    const auto load = [&map](const CheckpointReader& checkpoint, const ParameterSet& p) { apply_source_map(map, checkpoint, p); };
    ReceiverAdapter receiver(MPI_COMM_WORLD, group, buffers.params, load, options);
    const std::uint64_t installed =
        receive_versions(receiver, map, buffers, "engine worker " + std::to_string(rank - 3),
                         [&form](const testing::MemoryCheckpoint& bf16) { return layout::open_fp8_form(bf16, form); });
    EXPECT_EQ(installed, kVersions);
  }
  MPI_Comm_free(&group);
}

// Bad FP8 options: one error on the rank that gave them, naming it, before any collective (so no rank waits).
TEST(Fp8EngineOptions, AnUnknownRuleOrABadBlockIsRefusedNamingTheRank) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ParameterSet params;
  const auto load = [](const CheckpointReader&, const ParameterSet&) {};
  const std::string who = "world rank " + std::to_string(rank) + ": adapter options: ";
  AdapterOptions options;
  options.fp8 = Fp8Engine{};
  options.fp8->scale_rule = "bogus";
  testing::expect_error([&] { ReceiverAdapter receiver(MPI_COMM_WORLD, MPI_COMM_SELF, params, load, options); },
                        ErrorCode::kInvalidArgument, {who, "fp8.scale_rule: unknown scale rule \"bogus\""});
  options.fp8 = Fp8Engine{};
  options.fp8->block_cols = 0;
  testing::expect_error([&] { ReceiverAdapter receiver(MPI_COMM_WORLD, MPI_COMM_SELF, params, load, options); },
                        ErrorCode::kInvalidArgument, {who, "fp8: block shape 128x0 is not positive"});
}

// The BF16 checkpoint with one more tensor, ids.weight, of one-byte integers: the FP8 form leaves it as it
// is (not floating), so an engine that loads it into an fp8 parameter asks for what the trainers cannot give.
class WithIds final : public CheckpointReader {
 public:
  explicit WithIds(const testing::MemoryCheckpoint& base) : base_(base), tensors_(base.tensors()) {
    tensors_.push_back(ids());
    for (std::size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<std::uint8_t>(i * 7);
  }
  static TensorInfo ids() { return {"ids.weight", DType::kU8, {16, 8}}; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    if (name != "ids.weight") return base_.read_box(name, box, destination);
    const auto whole = TensorView::contiguous(const_cast<std::uint8_t*>(data_.data()), DType::kU8, ids().shape);
    copy_tensor(TensorView::contiguous(destination, DType::kU8, box.extent), whole.box(box));
  }
  std::string source() const override { return "memory"; }

 private:
  const testing::MemoryCheckpoint& base_;
  std::vector<TensorInfo> tensors_;
  std::array<std::uint8_t, 128> data_{};
};

// Bad FP8 engines are refused at connect on every rank, the engine's message naming its rank, the tensor
// and the cause: (1) an fp8 parameter loaded from a tensor the trainers hold as integers; (2) a worker that
// loads rows of b.weight in two block rows but only the first block row's scales (its scale parameter
// shaped for a block of 256 rows); (3) two workers of one engine asking for two FP8 forms.
// An engine's refusal at connect: it connects in its first poll_requests, which fails (or throws) with
// kInvalidArgument; the message, or "" (a failure added) when it never fails within 60 s.
std::string connect_refusal(ReceiverAdapter& receiver, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  try {
    for (;;) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "rank " << rank << " never failed";
        return "";
      }
      const PollResult result = receiver.poll_requests();
      if (result.event == PollResult::Event::kInstalled || result.event == PollResult::Event::kShutdown) {
        ADD_FAILURE() << "rank " << rank << ": connected";
        return "";
      }
      if (result.event == PollResult::Event::kFailed) {
        EXPECT_EQ(result.status.code(), ErrorCode::kInvalidArgument) << result.status.to_string();
        return result.status.to_string();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    return error.what();
  }
}

TEST(Fp8EngineBadInput, ANonFloatingTensorAskedInFp8OrWeightsWithoutTheirScalesAreRefused) {
  const int rank = rank_of_five();
  ASSERT_GE(rank, 0) << "run with 5 ranks";
  const bool trainer = rank < 3;
  MPI_Comm group = group_of(rank);
  std::vector<TensorInfo> bf16_tensors;
  const testing::MemoryCheckpoint bf16 = make_checkpoint(bf16_tensors);
  const WithIds checkpoint(bf16);
  const std::vector<TensorInfo>& tensors = checkpoint.tensors();
  AdapterOptions options;
  options.timeout_seconds = 30;
  options.node = trainer ? 0 : 1;
  Fp8Engine fp8;
  fp8.modules_to_not_convert = {"lm_head"};
  layout::QuantizationConfig config;
  config.modules_to_not_convert = fp8.modules_to_not_convert;
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);
  const std::uint32_t ids = static_cast<std::uint32_t>(tensors.size() - 1);
  for (const int scenario : {1, 2, 3}) {
    SCOPED_TRACE("scenario " + std::to_string(scenario));
    std::vector<std::string> expected;
    if (scenario == 1)
      expected = {"engine 0 worker 0 (world rank 3): probing load_weights failed", "parameter ids",
                  "if it asks for FP8 of a tensor the trainers hold in a type that is not floating: the FP8 form leaves "
                  "ids.weight (u8) as they are; only bf16, f16, f32 and f64 weights are quantized"};
    else if (scenario == 3)
      expected = {"engine 0 worker 1 (world rank 4) loads the FP8 form (128x128, plain) but its leader engine 0 worker 0 "
                  "(world rank 3) loads the FP8 form (128x128, per-block-cast): every worker of an engine loads one form"};
    else
      expected = {"engine 0 worker 1 (world rank 4): its FP8 load_weights does not follow its block scales",
                  "b.weight rows [128, 256) columns [128, 192) into parameter b",
                  "not their block's scale b.weight_scale_inv[1, 1]"};
    std::string message;
    if (trainer) {
      Rank layout = make_rank(rank, bf16_tensors);
      layout.map.parameters.push_back(WithIds::ids());
      layout.map.copies.push_back({ids, static_cast<std::uint32_t>(layout.map.parameters.size() - 1),
                                   Box{{0, 0}, WithIds::ids().shape}, 0, {8, 1}});
      Buffers buffers(layout.map);
      const auto load = [&layout](const CheckpointReader& c, const ParameterSet& p) { apply_source_map(layout.map, c, p); };
      SenderAdapter sender(MPI_COMM_WORLD, group, buffers.params, tensors, load, options);
      message = testing::expect_error([&] { sender.connect(); }, ErrorCode::kInvalidArgument);
    } else {
      SourceMap map = engine_map(rank - 3, form);
      if (scenario == 2 && rank == 4) {  // b_scales [1, 1]: block row 0's scale only
        map.parameters[3].shape = {1, 1};
        map.copies[3].box = Box{{0, 1}, {1, 1}};
      }
      if (scenario == 1) map.parameters.push_back({"ids", DType::kF8E4M3, WithIds::ids().shape});
      Buffers buffers(map);
      const auto load = [&](const CheckpointReader& c, const ParameterSet& p) {
        apply_source_map(map, c, p);
        // As an engine holding fp8 as uint8 would: the bytes of ids.weight into its fp8 parameter.
        if (scenario == 1) c.read("ids.weight", p.at("ids").view.data);
      };
      options.fp8 = fp8;
      if (scenario == 3 && rank == 4) options.fp8->scale_rule = "plain";
      ReceiverAdapter receiver(MPI_COMM_WORLD, group, buffers.params, load, options);
      message = connect_refusal(receiver, rank);
    }
    for (const std::string& part : expected) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
  MPI_Comm_free(&group);
}

// Every tensor of `tensors` whole, in a parameter of its own: an engine of one worker.
SourceMap whole_map(const std::vector<TensorInfo>& tensors) {
  SourceMap map;
  for (std::uint32_t t = 0; t < tensors.size(); ++t) {
    const Shape& shape = tensors[t].shape;
    Shape strides(shape.size(), 1);
    for (std::size_t a = shape.size(); a-- > 1;) strides[a - 1] = strides[a] * shape[a];
    map.parameters.push_back(tensors[t]);
    map.copies.push_back({t, t, Box{Shape(shape.size(), 0), shape}, 0, strides});
  }
  return map;
}

// A mixed fleet: the 3 BF16 trainers behind an FP8 engine (world rank 3, its node 1) and a BF16 engine
// (world rank 4, node 2), one plan. After every version the FP8 engine's parameters equal its load_weights
// of the FP8 form and the BF16 engine's its load_weights of the checkpoint, bit for bit; M is the union of
// both forms (the tensors they share, norm and lm_head, counted once); each node receives its own form once.
class Fp8MixedFleetMpi : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(Fp8MixedFleetMpi, EachEngineGetsItsOwnFormFromOnePlan) {
  const int rank = rank_of_five();
  ASSERT_GE(rank, 0) << "run with 5 ranks";
  const bool trainer = rank < 3;
  MPI_Comm group = group_of(rank, rank);
  std::vector<TensorInfo> tensors;
  make_checkpoint(tensors);
  AdapterOptions options;
  options.sender_staging = GetParam().first;
  options.receiver_staging = GetParam().second;
  options.timeout_seconds = 30;
  options.node = trainer ? 0 : rank - 2;
  options.buffer_bytes = 64 << 10;
  Fp8Engine fp8;
  fp8.modules_to_not_convert = {"lm_head"};
  layout::QuantizationConfig config;
  config.modules_to_not_convert = fp8.modules_to_not_convert;
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);
  std::int64_t checkpoint_bytes = 0, fp8_only_bytes = 0;
  for (const TensorInfo& t : tensors) checkpoint_bytes += static_cast<std::int64_t>(t.nbytes());
  for (std::size_t t = 0; t < form.tensors.size(); ++t)
    if (form.sources[t].role != layout::FormRole::kCopied) fp8_only_bytes += static_cast<std::int64_t>(form.tensors[t].nbytes());
  constexpr unsigned kVersions = 3;
  if (trainer) {
    const Rank layout = make_rank(rank, tensors);
    Buffers buffers(layout.map);
    const auto load = [&layout](const CheckpointReader& checkpoint, const ParameterSet& p) { apply_source_map(layout.map, checkpoint, p); };
    SenderAdapter sender(MPI_COMM_WORLD, group, buffers.params, tensors, load, options);
    sender.connect();
    const TransferSummary& summary = sender.summary();
    EXPECT_EQ(summary.model_bytes, checkpoint_bytes + fp8_only_bytes);
    // Each rollout node needs its own form and receives it once.
    std::vector<std::int64_t> needs;
    for (std::size_t v = 0; v < summary.node_need_bytes.size(); ++v) {
      if (summary.node_need_bytes[v] == 0) continue;
      needs.push_back(summary.node_need_bytes[v]);
      EXPECT_EQ(summary.node_ingress_bytes[v], summary.node_need_bytes[v]) << "node " << v;
    }
    std::sort(needs.begin(), needs.end());
    EXPECT_EQ(needs, (std::vector<std::int64_t>{static_cast<std::int64_t>(form.total_bytes()), checkpoint_bytes}));
    send_versions(sender, layout, buffers, kVersions);
  } else {
    const bool in_fp8 = rank == 3;
    const SourceMap map = whole_map(in_fp8 ? form.tensors : tensors);
    Buffers buffers(map);
    if (in_fp8) options.fp8 = fp8;
    const auto load = [&map](const CheckpointReader& checkpoint, const ParameterSet& p) { apply_source_map(map, checkpoint, p); };
    ReceiverAdapter receiver(MPI_COMM_WORLD, group, buffers.params, load, options);
    const std::uint64_t installed = receive_versions(
        receiver, map, buffers, in_fp8 ? "the FP8 engine" : "the BF16 engine",
        [&form, in_fp8](const testing::MemoryCheckpoint& bf16) -> std::unique_ptr<CheckpointReader> {
          if (in_fp8) return layout::open_fp8_form(bf16, form);
          return std::make_unique<testing::MemoryCheckpoint>(bf16);
        });
    EXPECT_EQ(installed, kVersions);
  }
  MPI_Comm_free(&group);
}

// Two FP8 engines of one job (world ranks 3 and 4, nodes 1 and 2) that load two FP8 forms (rules per-block-cast
// and plain): one plan cannot hold both, so connect refuses on every rank, naming both engines; a BF16 engine
// beside one FP8 form is what a mixed fleet may hold (above).
TEST(Fp8MixedFleetBadInput, TwoFp8FormsInOneJobAreRefusedNamingBothEngines) {
  const int rank = rank_of_five();
  ASSERT_GE(rank, 0) << "run with 5 ranks";
  const bool trainer = rank < 3;
  MPI_Comm group = group_of(rank, rank);
  std::vector<TensorInfo> tensors;
  make_checkpoint(tensors);
  AdapterOptions options;
  options.timeout_seconds = 30;
  options.node = trainer ? 0 : rank - 2;
  Fp8Engine fp8;
  fp8.modules_to_not_convert = {"lm_head"};
  if (rank == 4) fp8.scale_rule = "plain";
  layout::QuantizationConfig config;
  config.modules_to_not_convert = fp8.modules_to_not_convert;
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);  // the scale rule leaves the shapes alike
  const std::string expected = "engine 1 worker 0 (world rank 4) loads the FP8 form (128x128, plain) but engine 0 worker 0 "
                               "(world rank 3) loads the FP8 form (128x128, per-block-cast): the FP8 engines of a job "
                               "load one FP8 form (BF16 engines may join them)";
  std::string message;
  if (trainer) {
    const Rank layout = make_rank(rank, tensors);
    Buffers buffers(layout.map);
    const auto load = [&layout](const CheckpointReader& c, const ParameterSet& p) { apply_source_map(layout.map, c, p); };
    SenderAdapter sender(MPI_COMM_WORLD, group, buffers.params, tensors, load, options);
    message = testing::expect_error([&] { sender.connect(); }, ErrorCode::kInvalidArgument);
  } else {
    const SourceMap map = whole_map(form.tensors);
    Buffers buffers(map);
    options.fp8 = fp8;
    const auto load = [&map](const CheckpointReader& c, const ParameterSet& p) { apply_source_map(map, c, p); };
    ReceiverAdapter receiver(MPI_COMM_WORLD, group, buffers.params, load, options);
    message = connect_refusal(receiver, rank);
  }
  EXPECT_NE(message.find(expected), std::string::npos) << "rank " << rank << ": " << message;
  MPI_Comm_free(&group);
}

// Sender staging with FP8 engines: the trainers quantize by rounds into their shadows while they copy their
// staging by rounds, and the transfer, already running, packs round r only once round r is quantized and
// staged (run_update's gate), as SenderAdapter::send_weights does. The shadows and the staging hold version 1
// (its update done); the trainers load version 2, take the shared blocks' amaxes and exchange them, start the
// update with no round ready, quantize and stage it by rounds only 300 ms later, then overwrite their
// parameters (as a trainer may once send_weights returned) before the gate opens. Every engine parameter and
// scale must be version 2's FP8 form: a round packed before its codes were final would carry version 1's.
TEST(Fp8StagedGate, RoundsArePackedOnlyOnceTheirCodesAreQuantized) {
  const int rank = rank_of_five();
  ASSERT_GE(rank, 0) << "run with 5 ranks";
  const bool trainer = rank < 3;
  MPI_Comm group = group_of(rank);
  std::vector<TensorInfo> tensors;
  make_checkpoint(tensors);
  layout::QuantizationConfig config;
  config.modules_to_not_convert = {"lm_head"};
  const layout::Fp8Form form = layout::derive_fp8_form(tensors, config);
  const comm::Waiter waiter = comm::Waiter::from_settings();
  std::vector<TensorInfo> ignored;
  const Rank layout = trainer ? make_rank(rank, tensors) : Rank{};
  std::unique_ptr<QuantizedPack> pack;
  SourceMap map;
  if (trainer) {
    pack = std::make_unique<QuantizedPack>(layout.map, form);
    map = pack->form_map();
    const auto& partial = pack->partial_blocks();
    const auto all = comm::allgather(std::as_bytes(std::span(partial)), group, waiter, "partial blocks");
    std::vector<BlockKey> shared;
    for (const auto& bytes : all) {
      const auto* keys = reinterpret_cast<const BlockKey*>(bytes.data());
      shared.insert(shared.end(), keys, keys + bytes.size() / sizeof(BlockKey));
    }
    pack->set_shared_blocks(shared);
  } else {
    map = engine_map(rank - 3, form);
  }
  Buffers buffers(trainer ? layout.map : map);
  // connect's plan, in the form's tensors: small pieces and buffers, so that there are several rounds.
  std::vector<SourceMap> maps = allgather_source_maps(map, MPI_COMM_WORLD);
  std::vector<std::vector<std::byte>> serialized;
  if (rank == 0) {
    PlanOptions options;
    options.buffer_bytes_per_worker = 16 << 10;
    options.piece_bytes = 2048;
    const Topology topology = Topology::uniform(5, 3, 25e9, 100e9);
    serialized = plan_round_schedules(form.tensors, std::move(maps), {Side::kTrainer, Side::kTrainer, Side::kTrainer,
                                                                      Side::kRollout, Side::kRollout},
                                      topology, options).schedules;
  }
  RoundSchedule schedule = scatter_round_schedules(serialized, 0, MPI_COMM_WORLD);
  ExecutorOptions executor_options;
  executor_options.timeout_seconds = 60;
  executor_options.verify = false;
  coord::Staging staging;
  ParameterMemory memory;
  if (trainer) {
    EXPECT_GT(schedule.rounds.size(), 2u) << "rank " << rank;
    apply_source_map(layout.map, make_checkpoint(ignored, 1), buffers.params);
    staging = coord::stage_for_sending(buffers.params, schedule, pack.get());  // holds version 1
    EXPECT_TRUE(pack->quantizes_by_round());
    memory = staging.memory(buffers.params);
    pack->extend_memory(memory);
  } else {
    memory = staging.memory(buffers.params);  // the parameters themselves
  }
  RoundExecutor executor(std::move(schedule), memory, MPI_COMM_WORLD, executor_options);
  Status status;
  if (trainer) {
    std::vector<std::byte*> bases;
    for (const Parameter& p : buffers.params) bases.push_back(static_cast<std::byte*>(p.view.data));
    const exec::AmaxExchange exchange = [&](std::span<std::uint32_t> bits) { return comm::reduce_max(bits, group, waiter, "FP8 amax exchange"); };
    status = pack->quantize(bases, exchange);  // version 1's codes in the shadows
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    apply_source_map(layout.map, make_checkpoint(ignored, 2), buffers.params);
    status = pack->quantize_shared(bases, exchange);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    std::atomic<int> gate{0}, staged{0};
    std::thread update([&] { status = executor.run_update({}, &gate); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const Status copied = staging.copy_from_by_round(buffers.params, staged, nullptr,
                                                     [&](std::size_t round) { pack->quantize_round(bases, round); });
    // Staged: send_weights would return, and the trainer reuses its memory; the rounds read the staging only.
    for (auto& m : buffers.memory) std::memset(m.data(), 0x5A, m.size());
    gate.store(staged.load());
    update.join();
    ASSERT_TRUE(copied.is_ok()) << copied.to_string();
  } else {
    status = executor.run_update();
  }
  ASSERT_TRUE(status.is_ok()) << "rank " << rank << ": " << status.to_string();
  if (!trainer) {
    Buffers expected(map);
    apply_source_map(map, *layout::open_fp8_form(make_checkpoint(ignored, 2), form), expected.params);
    for (std::size_t p = 0; p < map.parameters.size(); ++p)
      EXPECT_EQ(buffers.memory[p], expected.memory[p]) << "engine worker " << rank - 3 << ": parameter "
                                                       << map.parameters[p].name << " is not version 2's FP8 form";
  }
  MPI_Comm_free(&group);
}

INSTANTIATE_TEST_SUITE_P(Modes, Fp8MixedFleetMpi,
                         ::testing::Values(std::pair{false, false}, std::pair{true, false}, std::pair{false, true},
                                           std::pair{true, true}));

INSTANTIATE_TEST_SUITE_P(Modes, Fp8EngineMpi,
                         ::testing::Values(std::pair{false, false}, std::pair{true, false}, std::pair{false, true},
                                           std::pair{true, true}));

INSTANTIATE_TEST_SUITE_P(Rules, Fp8PackMpi,
                         ::testing::Values(fp8::ScaleRule::kPlain, fp8::ScaleRule::kPerBlockCast, fp8::ScaleRule::kUe8m0));

}  // namespace
}  // namespace wb
