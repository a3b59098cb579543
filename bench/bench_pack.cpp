// CPU pack and assemble (src/exec/pack.hpp) on one core, against memcpy of the same bytes.
//
// One round's worth of a realistic segment mix, ~254 MiB per call, in shuffled order in the buffer (as a
// plan interleaves destinations and tensors, so pieces of one tensor seldom sit next to each other):
//   contiguous  MoE expert slices, 4 KiB .. 3.5 MiB: row boxes of [1536, 2048] and [512, 7168] bf16
//               matrices (158 MiB)
//   transposed  [128, 4096] boxes of [4096, 4096] bf16 attention matrices the parameter stores transposed
//               (64 MiB)
//   strided     column boxes of a [4096, 4096] bf16 matrix: 1024 rows of 128..1024 columns (32 MiB)
// BM_{Pack,Assemble}Mix run the whole mix, the others one kind; *CachedStores without streaming stores.
// Each compiles its CopyProgram once, checks the result against the element-by-element definition, and
// only then times. Every iteration runs the program (the reported time) and then a memcpy of the same
// bytes between two buffers of that size: counters GBps and memcpy_GBps are the medians of the two,
// vs_memcpy = memcpy median / program median. Interleaving keeps the ratio meaningful on a loaded
// machine. BM_*Digesting: the same programs digesting as they copy (verify), against the plain ones.
// BM_Memcpy alone: memcpy of the whole mix's bytes. (glibc switches memcpy to streaming stores
// above ~127 MiB on the development machine, so the smaller per-kind memcpy's use ordinary stores.)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "exec/digest.hpp"  // private (wb_private_headers)
#include "exec/pack.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace {

using namespace wb;
using namespace wb::exec;
using i64 = std::int64_t;
using Clock = std::chrono::steady_clock;

/// Page-aligned host memory, filled once.
struct Memory {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte[], Free> data;
  i64 size = 0;
  explicit Memory(i64 bytes, std::uint64_t seed = 0) : size(bytes) {
    const auto rounded = static_cast<std::size_t>((bytes + 4095) / 4096 * 4096);
    data.reset(static_cast<std::byte*>(std::aligned_alloc(4096, std::max<std::size_t>(rounded, 4096))));
    std::mt19937_64 generator(seed);
    for (i64 i = 0; i + 8 <= bytes; i += 8) {
      const std::uint64_t word = generator();
      std::memcpy(data.get() + i, &word, 8);
    }
    for (i64 i = bytes / 8 * 8; i < bytes; ++i) data[static_cast<std::size_t>(i)] = std::byte{0x5A};
  }
  std::byte* get() const { return data.get(); }
};

enum Kind { kContiguous = 1, kTransposed = 2, kStrided = 4, kMix = 7 };

struct Segment {
  Kind kind;
  BufferCopy copy;
};

/// The parameters and the segment list (buffer offsets assigned per case).
struct Fixture {
  std::vector<Memory> parameters;
  std::vector<i64> parameter_bytes;
  std::vector<std::byte*> pointers;
  std::vector<Segment> segments;  // shuffled

  std::uint32_t add_parameter(i64 rows, i64 cols) {
    parameters.emplace_back(rows * cols * 2, parameters.size() + 1);
    parameter_bytes.push_back(rows * cols * 2);
    pointers.push_back(parameters.back().get());
    return static_cast<std::uint32_t>(parameters.size() - 1);
  }
  void add(Kind kind, std::uint32_t parameter, Box box, i64 offset, Shape strides) {
    segments.push_back({kind, BufferCopy{SliceCopy{0, parameter, std::move(box), offset, std::move(strides)}, 0, 2}});
  }

  Fixture() {
    std::mt19937_64 generator(2024);
    auto log_uniform = [&](i64 lo, i64 hi) {
      std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi + 1)));
      return std::min<i64>(hi, static_cast<i64>(std::exp(u(generator))));
    };
    // MoE experts: each matrix cut into row pieces of 1 .. 768 (2048 wide) or 1 .. 256 rows (7168 wide).
    for (auto [count, rows, cols, max_rows] : {std::tuple<int, i64, i64, i64>{10, 1536, 2048, 768}, {14, 512, 7168, 256}})
      for (int m = 0; m < count; ++m) {
        const std::uint32_t p = add_parameter(rows, cols);
        for (i64 row = 0; row < rows;) {
          const i64 n = std::min(rows - row, log_uniform(1, max_rows));
          add(kContiguous, p, Box{{row, 0}, {n, cols}}, row * cols, {cols, 1});
          row += n;
        }
      }
    // Attention [4096, 4096] stored transposed: element (r, c) at c * 4096 + r.
    for (int m = 0; m < 2; ++m) {
      const std::uint32_t p = add_parameter(4096, 4096);
      for (i64 row = 0; row < 4096; row += 128) add(kTransposed, p, Box{{row, 0}, {128, 4096}}, row, {1, 4096});
    }
    // Column boxes of a row-major [4096, 4096]: 4 row blocks of 1024, each cut into column blocks.
    {
      const std::uint32_t p = add_parameter(4096, 4096);
      for (i64 row = 0; row < 4096; row += 1024)
        for (i64 col = 0; col < 4096;) {
          const i64 n = std::min<i64>(4096 - col, i64{128} << (generator() % 4));
          add(kStrided, p, Box{{row, col}, {1024, n}}, row * 4096 + col, {4096, 1});
          col += n;
        }
    }
    std::shuffle(segments.begin(), segments.end(), generator);
  }
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

/// The copies of the kinds in `kinds`, one after the other in a buffer.
std::vector<BufferCopy> copies_of(int kinds, i64& buffer_bytes) {
  std::vector<BufferCopy> out;
  buffer_bytes = 0;
  for (const Segment& s : fixture().segments) {
    if (!(s.kind & kinds)) continue;
    out.push_back(s.copy);
    out.back().buffer_offset = buffer_bytes;
    buffer_bytes += out.back().bytes();
  }
  return out;
}

/// The definition, element by element (2-D boxes, as in the mix).
void reference_pack(std::span<const BufferCopy> copies, std::span<std::byte* const> params, std::byte* buffer) {
  for (const BufferCopy& c : copies) {
    const i64 rows = c.copy.box.extent[0], cols = c.copy.box.extent[1], es = c.element_bytes;
    std::byte* param = params[c.copy.parameter];
    for (i64 r = 0; r < rows; ++r)
      for (i64 k = 0; k < cols; ++k) {
        const std::byte* p = param + (c.copy.offset + r * c.copy.strides[0] + k * c.copy.strides[1]) * es;
        std::byte* b = buffer + c.buffer_offset + (r * cols + k) * es;
        std::memcpy(b, p, static_cast<std::size_t>(es));
      }
  }
}

i64 mix_bytes() {
  i64 bytes;
  copies_of(kMix, bytes);
  return bytes;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

void copy_benchmark(benchmark::State& state, CopyDirection direction, int kinds, StoreHint stores = StoreHint::kAuto) {
  Fixture& f = fixture();
  i64 buffer_bytes;
  const std::vector<BufferCopy> copies = copies_of(kinds, buffer_bytes);
  const auto t_compile = Clock::now();
  const CopyProgram program(direction, copies, f.parameter_bytes, buffer_bytes, CopyProgramOptions{stores, {}});
  const double compile_seconds = std::chrono::duration<double>(Clock::now() - t_compile).count();
  // Buffers of the mix's size made once and shared (prefixes), so no benchmark maps fresh memory.
  static Memory buffer(mix_bytes(), 7), memcpy_from(mix_bytes(), 5), memcpy_to(mix_bytes(), 6), check(mix_bytes(), 8);

  // Validate first. Pack: its buffer against the definition's. Assemble (of random buffer bytes): the
  // boxes cover every parameter element once, so packing the assembled parameters by the definition must
  // give the buffer back. Either way: execute, then pack by the definition and compare.
  {
    program.execute(f.pointers, buffer.get());
    reference_pack(copies, f.pointers, check.get());
    if (std::memcmp(check.get(), buffer.get(), static_cast<std::size_t>(buffer_bytes)) != 0) {
      state.SkipWithError("result differs from the element-by-element definition");
      return;
    }
  }

  // Each iteration times the program, then (untimed for the benchmark) a memcpy of the same bytes between
  // two buffers of that size: interleaved, both see the same machine, and the ratio of the medians is
  // robust to other load.
  std::vector<double> program_seconds, memcpy_seconds;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    program.execute(f.pointers, buffer.get());
    benchmark::ClobberMemory();
    const auto t1 = Clock::now();
    std::memcpy(memcpy_to.get(), memcpy_from.get(), static_cast<std::size_t>(buffer_bytes));
    benchmark::ClobberMemory();
    const auto t2 = Clock::now();
    program_seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    memcpy_seconds.push_back(std::chrono::duration<double>(t2 - t1).count());
    state.SetIterationTime(program_seconds.back());
  }
  const double program_median = median(program_seconds), memcpy_median = median(memcpy_seconds);
  state.SetBytesProcessed(state.iterations() * buffer_bytes);
  state.counters["payload_MiB"] = static_cast<double>(buffer_bytes) / (1 << 20);
  state.counters["copies"] = static_cast<double>(program.stats().copies);
  state.counters["ops"] = static_cast<double>(program.stats().ops);
  state.counters["reordered"] = program.stats().reordered ? 1 : 0;
  state.counters["compile_ms"] = compile_seconds * 1e3;
  state.counters["GBps"] = static_cast<double>(buffer_bytes) / program_median / 1e9;
  state.counters["memcpy_GBps"] = static_cast<double>(buffer_bytes) / memcpy_median / 1e9;
  state.counters["vs_memcpy"] = memcpy_median / program_median;
}

// Verifying (exec/verify.hpp): the program compiled with each copy's buffer range as a digest segment, so
// that it digests as it copies, timed iteration by iteration against the plain program and against the
// plain program plus a separate pass that digests each segment (before an assemble, after a pack: the
// buffer read twice). Counters: vs_plain and separate_vs_plain, the medians of the iterations' ratios.
// A loaded machine moves them by ±0.1 from run to run: compare within one run.
void digest_benchmark(benchmark::State& state, CopyDirection direction, int kinds) {
  Fixture& f = fixture();
  i64 buffer_bytes;
  const std::vector<BufferCopy> copies = copies_of(kinds, buffer_bytes);
  std::vector<BufferRange> segments;
  for (const BufferCopy& c : copies) segments.push_back({c.buffer_offset, c.bytes()});  // one after the other
  CopyProgramOptions options;
  options.digest_segments = segments;
  const CopyProgram plain(direction, copies, f.parameter_bytes, buffer_bytes);
  const CopyProgram digesting(direction, copies, f.parameter_bytes, buffer_bytes, options);
  static Memory buffer(mix_bytes(), 9), check(mix_bytes(), 10);
  std::vector<DigestSums> sums(segments.size());
  const auto separate = [&] {
    if (direction == CopyDirection::kPack) plain.execute(f.pointers, buffer.get());
    for (const BufferRange& r : segments)
      benchmark::DoNotOptimize(digest_bytes(buffer.get() + r.offset, static_cast<std::size_t>(r.bytes)));
    if (direction == CopyDirection::kAssemble) plain.execute(f.pointers, buffer.get());
  };

  // Validate first: the bytes as the definition has them (see copy_benchmark), every segment's digest.
  {
    std::fill(sums.begin(), sums.end(), DigestSums{});
    digesting.execute(f.pointers, buffer.get(), sums.data());
    reference_pack(copies, f.pointers, check.get());
    if (std::memcmp(check.get(), buffer.get(), static_cast<std::size_t>(buffer_bytes)) != 0) {
      state.SkipWithError("result differs from the element-by-element definition");
      return;
    }
    for (std::size_t i = 0; i < segments.size(); ++i)
      if (sums[i].finish(segments[i].bytes) != digest_bytes(buffer.get() + segments[i].offset, static_cast<std::size_t>(segments[i].bytes))) {
        state.SkipWithError("a segment's digest differs from the digest of its bytes");
        return;
      }
  }

  // The three in turn, the order rotating from one iteration to the next (what one leaves in the caches
  // for the next falls on each alike).
  const std::function<void()> runs[3] = {[&] { plain.execute(f.pointers, buffer.get()); },
                                         [&] {
                                           std::fill(sums.begin(), sums.end(), DigestSums{});
                                           digesting.execute(f.pointers, buffer.get(), sums.data());
                                         },
                                         separate};
  std::vector<double> ratios, separate_ratios;
  std::size_t iteration = 0;
  for (auto _ : state) {
    double seconds[3];
    for (std::size_t k = 0; k < 3; ++k) {
      const std::size_t which = (iteration + k) % 3;
      const auto t0 = Clock::now();
      runs[which]();
      benchmark::ClobberMemory();
      seconds[which] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    ++iteration;
    state.SetIterationTime(seconds[1]);
    ratios.push_back(seconds[1] / seconds[0]);
    separate_ratios.push_back(seconds[2] / seconds[0]);
  }
  state.SetBytesProcessed(state.iterations() * buffer_bytes);
  state.counters["payload_MiB"] = static_cast<double>(buffer_bytes) / (1 << 20);
  state.counters["segments"] = static_cast<double>(segments.size());
  state.counters["vs_plain"] = median(ratios);
  state.counters["separate_vs_plain"] = median(separate_ratios);
}

void BM_Memcpy(benchmark::State& state) {
  const i64 bytes = mix_bytes();
  Memory from(bytes, 1), to(bytes, 2);
  for (auto _ : state) {
    std::memcpy(to.get(), from.get(), static_cast<std::size_t>(bytes));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["payload_MiB"] = static_cast<double>(bytes) / (1 << 20);
}

void BM_PackMix(benchmark::State& state) { copy_benchmark(state, CopyDirection::kPack, kMix); }
void BM_AssembleMix(benchmark::State& state) { copy_benchmark(state, CopyDirection::kAssemble, kMix); }
void BM_PackContiguous(benchmark::State& state) { copy_benchmark(state, CopyDirection::kPack, kContiguous); }
void BM_AssembleContiguous(benchmark::State& state) { copy_benchmark(state, CopyDirection::kAssemble, kContiguous); }
void BM_PackTransposed(benchmark::State& state) { copy_benchmark(state, CopyDirection::kPack, kTransposed); }
void BM_AssembleTransposed(benchmark::State& state) { copy_benchmark(state, CopyDirection::kAssemble, kTransposed); }
void BM_PackMixCachedStores(benchmark::State& state) { copy_benchmark(state, CopyDirection::kPack, kMix, StoreHint::kCached); }
void BM_AssembleMixCachedStores(benchmark::State& state) { copy_benchmark(state, CopyDirection::kAssemble, kMix, StoreHint::kCached); }
void BM_PackStrided(benchmark::State& state) { copy_benchmark(state, CopyDirection::kPack, kStrided); }
void BM_AssembleStrided(benchmark::State& state) { copy_benchmark(state, CopyDirection::kAssemble, kStrided); }

void BM_PackMixDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kPack, kMix); }
void BM_AssembleMixDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kAssemble, kMix); }
void BM_PackContiguousDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kPack, kContiguous); }
void BM_AssembleContiguousDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kAssemble, kContiguous); }
void BM_PackTransposedDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kPack, kTransposed); }
void BM_AssembleTransposedDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kAssemble, kTransposed); }
void BM_PackStridedDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kPack, kStrided); }
void BM_AssembleStridedDigesting(benchmark::State& state) { digest_benchmark(state, CopyDirection::kAssemble, kStrided); }

BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
#define WB_PACK_BENCHMARK(name) BENCHMARK(name)->UseManualTime()->Unit(benchmark::kMillisecond)
WB_PACK_BENCHMARK(BM_PackMix);
WB_PACK_BENCHMARK(BM_AssembleMix);
WB_PACK_BENCHMARK(BM_PackMixCachedStores);
WB_PACK_BENCHMARK(BM_AssembleMixCachedStores);
WB_PACK_BENCHMARK(BM_PackContiguous);
WB_PACK_BENCHMARK(BM_AssembleContiguous);
WB_PACK_BENCHMARK(BM_PackTransposed);
WB_PACK_BENCHMARK(BM_AssembleTransposed);
WB_PACK_BENCHMARK(BM_PackStrided);
WB_PACK_BENCHMARK(BM_AssembleStrided);
WB_PACK_BENCHMARK(BM_PackMixDigesting);
WB_PACK_BENCHMARK(BM_AssembleMixDigesting);
WB_PACK_BENCHMARK(BM_PackContiguousDigesting);
WB_PACK_BENCHMARK(BM_AssembleContiguousDigesting);
WB_PACK_BENCHMARK(BM_PackTransposedDigesting);
WB_PACK_BENCHMARK(BM_AssembleTransposedDigesting);
WB_PACK_BENCHMARK(BM_PackStridedDigesting);
WB_PACK_BENCHMARK(BM_AssembleStridedDigesting);

}  // namespace

BENCHMARK_MAIN();
