// The trainers' FP8 pack (exec/quantized_pack.hpp) on 3 trainer ranks: flat shards whose cuts split
// blocks, a TP split off a multiple of 128, a transposed replica, copied tensors. Every rank quantizes its
// own elements, the ranks exchange the amaxes of the blocks they share, and every code and scale each rank
// would send equals, bit for bit, the FP8 form computed from the whole checkpoint (open_fp8_form).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "comm/collectives.hpp"
#include "comm/max_reduce.hpp"
#include "exec/quantized_pack.hpp"
#include "layout/fp8_form.hpp"
#include "../support/memory_checkpoint.hpp"

namespace wb {
namespace {

using exec::BlockKey;
using exec::QuantizedPack;

constexpr std::int64_t kFlatRows = 300, kFlatCols = 200, kTpRows = 256, kTpCols = 192, kTpCut = 100;

std::uint16_t bf16_bits(float x) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16); }

// Values of every magnitude, a zero block, and one NaN in a block the flat shards split.
testing::MemoryCheckpoint make_checkpoint(std::vector<TensorInfo>& tensors) {
  tensors = {{"a.weight", DType::kBF16, {kFlatRows, kFlatCols}},
             {"b.weight", DType::kBF16, {kTpRows, kTpCols}},
             {"norm.weight", DType::kBF16, {kFlatRows}},
             {"lm_head.weight", DType::kBF16, {64, kFlatCols}}};
  std::mt19937 random(32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 12);
  testing::MemoryCheckpoint checkpoint;
  for (const TensorInfo& t : tensors) {
    std::vector<std::uint16_t> values(static_cast<std::size_t>(t.numel()));
    for (std::uint16_t& v : values) v = bf16_bits(std::ldexp(normal(random), exponent(random) / 4));
    if (t.name == "a.weight") values[110 * kFlatCols + 3] = 0x7FC0;  // NaN in block (0, 0), which ranks 0, 1 share
    if (t.name == "b.weight")  // block (1, 1) all zero
      for (std::int64_t r = 128; r < kTpRows; ++r)
        for (std::int64_t c = 128; c < kTpCols; ++c) values[static_cast<std::size_t>(r * kTpCols + c)] = 0;
    checkpoint.add(t, std::move(values));
  }
  return checkpoint;
}

struct Rank {
  SourceMap map;
  std::vector<std::vector<std::uint16_t>> memory;
};

// This rank's layout: a flat shard of a.weight (cut mid-row), its part of b.weight (TP columns cut at
// 100 between ranks 0 and 1; rank 2 a transposed replica of the whole), and one copied tensor.
Rank make_rank(int rank, const std::vector<TensorInfo>& tensors) {
  Rank out;
  const std::int64_t flat = kFlatRows * kFlatCols, cuts[4] = {0, 20123, 40011, flat};
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
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
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
  const auto all = comm::allgather(std::as_bytes(std::span(partial)), MPI_COMM_WORLD, waiter, "partial blocks");
  std::vector<BlockKey> shared;
  for (const auto& bytes : all) {
    const auto* keys = reinterpret_cast<const BlockKey*>(bytes.data());
    shared.insert(shared.end(), keys, keys + bytes.size() / sizeof(BlockKey));
  }
  pack.set_shared_blocks(shared);
  // Flat cuts at 20123 and 40011 split a.weight's block rows 0 and 1; the TP cut at 100 splits the first
  // block column of b.weight for ranks 0 and 1 (rank 2 holds it whole, and takes part all the same).
  ASSERT_GT(pack.shared_blocks().size(), 2u);
  EXPECT_EQ(pack.exchange_bytes(), static_cast<std::int64_t>(4 * pack.shared_blocks().size()));

  std::vector<std::byte*> bases;
  for (auto& m : mine.memory) bases.push_back(reinterpret_cast<std::byte*>(m.data()));
  int exchanges = 0;
  for (int update = 0; update < 2; ++update) {
    if (update == 1) {  // new values, as the next version brings (the NaN becomes +inf, zeros subnormal)
      for (auto& m : mine.memory)
        for (std::uint16_t& v : m) v = static_cast<std::uint16_t>(v ^ 0x0040u);
    }
    const Status quantized = pack.quantize(bases, [&](std::span<std::uint32_t> bits) {
      ++exchanges;
      return comm::reduce_max(bits, MPI_COMM_WORLD, waiter, "FP8 amax exchange");
    });
    ASSERT_TRUE(quantized.ok()) << quantized.message();
    // The reference: the whole checkpoint of this version, quantized block by block.
    testing::MemoryCheckpoint version;
    {
      std::vector<TensorInfo> ignored;
      version = make_checkpoint(ignored);
    }
    testing::MemoryCheckpoint flipped;
    for (const TensorInfo& t : tensors) {
      std::vector<std::uint16_t> values(static_cast<std::size_t>(t.numel()));
      version.read_box(t.name, Box{Shape(t.shape.size(), 0), t.shape}, values.data());
      if (update == 1)
        for (std::uint16_t& v : values) v = static_cast<std::uint16_t>(v ^ 0x0040u);
      flipped.add(t, std::move(values));
    }
    const auto reference = layout::open_fp8_form(flipped, form);
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
}

INSTANTIATE_TEST_SUITE_P(Rules, Fp8PackMpi,
                         ::testing::Values(fp8::ScaleRule::kPlain, fp8::ScaleRule::kPerBlockCast, fp8::ScaleRule::kUe8m0));

}  // namespace
}  // namespace wb
