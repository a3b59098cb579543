// Encoding throughput of the second-difference codec (elements of raw probe codes per second, one core).
//
// Target (issue 3): decode a worker holding 1 GiB of bf16 parameters in under 2 s, about 5 passes over
// 512 Mi elements, so >= 1.5 G elements/s per pass on the common case. Each case fills one parameter
// with the codes a probe pass would leave (bf16: lo 0x80, digits modulo 0x7F00; fp8 e4m3: lo 8,
// digits modulo 0x77; int8: lo 1, digits modulo 255), encodes it once, checks the reconstruction at
// the corners and at 4096 random points against the true field, and only then times.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "layout/second_difference.hpp"

namespace {

using namespace wb;
using namespace wb::layout;
using i64 = std::int64_t;
using u64 = std::uint64_t;

constexpr u64 kBf16Lo = 0x0080, kBf16Base = 0x7F00;
constexpr u64 kFp8Lo = 0x08, kFp8Base = 0x77;

struct Case {
  const char* name;
  int width;
  Shape shape;
  u64 lo;
  std::function<u64(i64, i64, i64)> digit;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // One slice copy: every row is the affine continuation of the ones before.
      {"bf16_affine_8192x8192", 2, {8192, 8192}, kBf16Lo, [](i64, i64 r, i64 c) { return u64(2 * r + c); }},
      // Eight row blocks of 1024 rows from eight tensors (say a TP-sharded embedding gathered).
      {"bf16_row_blocks_8", 2, {8192, 8192}, kBf16Lo,
       [](i64, i64 r, i64 c) { return u64(2000 * (r / 1024) + 2 * (r % 1024) + c); }},
      // A transposed copy probed with the column-major flat index, low digit: wraps every ~4 columns.
      {"bf16_transposed_colmajor_mod_D", 2, {8192, 8192}, kBf16Lo,
       [](i64, i64 r, i64 c) { return u64(c * 8192 + r) % kBf16Base; }},
      // Fused QKV: 64 row blocks of 128 rows, cycling through q, k, v with their own row offsets.
      {"bf16_fused_qkv_64", 2, {8192, 8192}, kBf16Lo,
       [](i64, i64 r, i64 c) {
         const i64 block = r / 128, tensor = block % 3, source_row = (block / 3) * 128 + r % 128;
         return u64(100 * tensor + 2 * source_row + c);
       }},
      // 64 column blocks of 128 from different tensors: no row is affine, 2 nonzeros per block per row.
      {"bf16_col_blocks_64", 2, {8192, 8192}, kBf16Lo,
       [](i64, i64 r, i64 c) { return u64((c / 128) * 397 % 16000 + r + c % 128); }},
      // MoE experts [E, 2 * 768, 4096] (E = 16 of 64, to fit memory): gate and up halves per expert.
      {"bf16_experts_16x1536x4096", 2, {16, 1536, 4096}, kBf16Lo,
       [](i64 e, i64 r, i64 c) { return u64(1000 * (2 * e + r / 768) % 20000 + r % 768 + 2 * c); }},
      // fp8 codes: a row-coordinate digit (rows wrap every 119), and a column digit (wraps every 119 columns).
      {"fp8_row_digit_8192x8192", 1, {8192, 8192}, kFp8Lo, [](i64, i64 r, i64) { return u64(r) % kFp8Base; }},
      {"fp8_col_digit_8192x8192", 1, {8192, 8192}, kFp8Lo, [](i64, i64, i64 c) { return u64(c) % kFp8Base; }},
      {"fp8_tensor_id_digit_8192x8192", 1, {8192, 8192}, kFp8Lo, [](i64, i64, i64) { return u64(42); }},
      // int8/uint8 codes span all of 1..255: chunks with the top bit set are retested in 16-bit lanes.
      {"u8_row_digit_topbit_8192x8192", 1, {8192, 8192}, 1, [](i64, i64 r, i64) { return u64(200 + r % 50); }},
      {"u8_col_digit_full_range_8192x8192", 1, {8192, 8192}, 1, [](i64, i64, i64 c) { return u64(c) % 255; }},
      // Short rows ([4 Mi, 8], say conv or router weights): the per-row overhead.
      {"bf16_short_rows_4Mx8", 2, {1 << 22, 8}, kBf16Lo, [](i64, i64 r, i64 c) { return u64((r % 4000) * 8 + c); }},
      // A 1-D flat buffer (FSDP-style), probed with the flat index: low digit wraps every 0x7F00.
      {"bf16_flat_64Mi", 2, {1 << 26}, kBf16Lo, [](i64, i64, i64 c) { return u64(c) % kBf16Base; }},
      // fp32 codes: the whole column-major index of a transposed copy fits one digit.
      {"fp32_transposed_colmajor_8192x8192", 4, {8192, 8192}, 0x00800000,
       [](i64, i64 r, i64 c) { return u64(c * 8192 + r); }},
  };
  return all;
}

/// The codes of the case in use (one at a time: each is 64-256 MiB).
struct Buffer {
  int index = -1;
  std::vector<u64> storage;
};

Buffer& buffer_for(int index) {
  static Buffer buffer;
  if (buffer.index == index) return buffer;
  const Case& c = cases()[static_cast<std::size_t>(index)];
  const i64 numel = shape_numel(c.shape);
  buffer.storage.assign(static_cast<std::size_t>((numel * c.width + 7) / 8), 0);
  // Digit functions take (i, r, c): 1-D shapes use c only, 2-D r and c.
  const std::size_t nd = c.shape.size();
  const i64 n0 = nd == 3 ? c.shape[0] : 1, n1 = nd >= 2 ? c.shape[nd - 2] : 1, n2 = c.shape[nd - 1];
  auto* bytes = reinterpret_cast<unsigned char*>(buffer.storage.data());
  i64 flat = 0;
  for (i64 a = 0; a < n0; ++a)
    for (i64 b = 0; b < n1; ++b)
      for (i64 d = 0; d < n2; ++d, ++flat) {
        const u64 code = c.digit(a, b, d) + c.lo;
        std::memcpy(bytes + flat * c.width, &code, static_cast<std::size_t>(c.width));  // little-endian
      }
  buffer.index = index;
  return buffer;
}

/// Reconstruction at every corner and 4096 random points equals the true field.
bool validate(const Case& c, const SparseField& field) {
  if (!field.complete) return false;
  std::mt19937_64 rng(1);
  std::vector<i64> points;
  const std::size_t n = c.shape.size();
  for (int p = 0; p < 4096 + (1 << n); ++p) {
    for (std::size_t a = 0; a < n; ++a) {
      const i64 extent = c.shape[a];
      points.push_back(p < (1 << n) ? ((p >> a) & 1) * (extent - 1) : static_cast<i64>(rng() % static_cast<u64>(extent)));
    }
  }
  const std::vector<i64> values = evaluate_points(field, points);
  for (std::size_t p = 0; p < values.size(); ++p) {
    const i64* q = points.data() + p * n;
    const u64 truth = n == 3 ? c.digit(q[0], q[1], q[2]) : n == 2 ? c.digit(0, q[0], q[1]) : c.digit(0, 0, q[0]);
    if (values[p] != static_cast<i64>(truth)) return false;
  }
  return true;
}

void BM_Encode(benchmark::State& state) {
  const int index = static_cast<int>(state.range(0));
  const Case& c = cases()[static_cast<std::size_t>(index)];
  state.SetLabel(c.name);
  const Buffer& buffer = buffer_for(index);
  const SparseField check = second_differences(buffer.storage.data(), c.width, c.shape, c.lo);
  if (!validate(c, check)) {
    state.SkipWithError("reconstruction does not match the field");
    return;
  }
  for (auto _ : state) {
    SparseField field = second_differences(buffer.storage.data(), c.width, c.shape, c.lo);
    benchmark::DoNotOptimize(field.flat_positions.data());
  }
  const i64 numel = shape_numel(c.shape);
  state.SetItemsProcessed(state.iterations() * numel);
  state.SetBytesProcessed(state.iterations() * numel * c.width);
  state.counters["nonzeros"] = static_cast<double>(check.size());
}

void all_cases(benchmark::internal::Benchmark* b) {
  for (std::size_t i = 0; i < cases().size(); ++i) b->Arg(static_cast<i64>(i));
}

// Evaluation on the grid of cut lines, as the decoder does for cell corners: the fused-QKV field.
void BM_EvaluateCutGrid(benchmark::State& state) {
  const int index = 3;
  const Case& c = cases()[index];
  const SparseField field = second_differences(buffer_for(index).storage.data(), c.width, c.shape, c.lo);
  std::vector<std::vector<i64>> coords(2);
  for (int a = 0; a < 2; ++a) {
    for (i64 x : nonzero_coordinates(field, a)) {
      coords[a].push_back(x);
      if (x + 1 < c.shape[static_cast<std::size_t>(a)]) coords[a].push_back(x + 1);
    }
    std::sort(coords[a].begin(), coords[a].end());
    coords[a].erase(std::unique(coords[a].begin(), coords[a].end()), coords[a].end());
  }
  for (auto _ : state) benchmark::DoNotOptimize(evaluate_grid(field, coords).data());
  state.counters["nonzeros"] = static_cast<double>(field.size());
  state.counters["cells"] = static_cast<double>(coords[0].size() * coords[1].size());
}

BENCHMARK(BM_Encode)->Apply(all_cases)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EvaluateCutGrid)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
