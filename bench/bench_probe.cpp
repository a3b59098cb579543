// The probe on a worker holding 1 GiB of bf16 parameters (the decode target: under 2 s on one
// core). Each parameter is a fused [gate; up] pair of row-sharded checkpoint tensors, or a column shard
// stored transposed, so the decoder sees concatenation, sharding and transposes. Counters: decode time
// (second differences and decoding, without load_weights), decode throughput in parameter elements per
// second summed over all passes' scans, the probe's total time, copies and extra memory, and the CPU time of
// each phase (load_weights passes, decoding, verification, saving and restoring the parameters) and of the
// whole probe, per GiB. Beside it, the probe
// checkpoint serving a large bf16 box in each pass (elements per second), checked against element-wise reads
// first.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>

#include "layout/probe.hpp"
#include "layout/probe_checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace {

using namespace wb;

struct Worker {
  std::vector<TensorInfo> checkpoint;
  std::vector<TensorInfo> params;
  std::vector<std::unique_ptr<std::uint16_t[]>> storage;
  ParameterSet set;
};

// 64 parameters of [4096, 2048] bf16 = 1 GiB.
Worker make_worker() {
  Worker w;
  constexpr std::int64_t kRows = 2048, kCols = 4096;
  for (int i = 0; i < 64; ++i) {
    w.checkpoint.push_back({"layer" + std::to_string(i) + ".gate", DType::kBF16, {kRows * 2, kCols}});
    w.checkpoint.push_back({"layer" + std::to_string(i) + ".up", DType::kBF16, {kRows * 2, kCols}});
  }
  for (int i = 0; i < 64; ++i) {
    const Shape shape = i % 4 == 3 ? Shape{kCols / 2, kRows * 2} : Shape{kRows, kCols};
    w.params.push_back({"param" + std::to_string(i), DType::kBF16, shape});
    w.storage.emplace_back(new std::uint16_t[static_cast<std::size_t>(shape_numel(shape))]());
    w.set.add(w.params.back().name, TensorView::contiguous(w.storage.back().get(), DType::kBF16, shape));
  }
  return w;
}

void load(const CheckpointReader& checkpoint, const ParameterSet& params) {
  std::vector<std::uint16_t> scratch;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorView& p = params[i].view;
    const std::string layer = "layer" + std::to_string(i);
    if (i % 4 == 3) {
      // Column shard 1 of 2 of gate, stored transposed ([in, out] for a kernel that wants it).
      const Box box{{0, 2048}, {4096, 2048}};
      scratch.resize(static_cast<std::size_t>(box.numel()));
      checkpoint.read_box(layer + ".gate", box, scratch.data());
      copy_tensor(p.transpose(0, 1), TensorView::contiguous(scratch.data(), DType::kBF16, box.extent));
    } else {
      // Fused [gate rows 1024-2048; up rows 1024-2048] of TP rank 1 of 4.
      checkpoint.read_box(layer + ".gate", Box{{1024, 0}, {1024, 4096}}, p.narrow(0, 0, 1024).data);
      checkpoint.read_box(layer + ".up", Box{{1024, 0}, {1024, 4096}}, p.narrow(0, 1024, 1024).data);
    }
  }
}

void BM_ProbeOneGiBWorker(benchmark::State& state) {
  Worker worker = make_worker();
  ProbeReport report;
  for (auto _ : state) {
    const SourceMap map = probe_source_map(worker.checkpoint, worker.set, load, {}, &report);
    if (map.copies.size() != 64 + 48) state.SkipWithError("unexpected copy count");
    benchmark::DoNotOptimize(map);
  }
  const double elements = static_cast<double>(worker.set.total_bytes() / 2);
  state.counters["parameter_GiB"] = static_cast<double>(worker.set.total_bytes()) / (1 << 30);
  state.counters["passes"] = report.passes;
  state.counters["probe_s"] = report.seconds;
  state.counters["probe_cpu_s"] = report.cpu_seconds;
  state.counters["decode_s"] = report.decode_seconds;
  state.counters["load_s"] = report.load_seconds;
  state.counters["verify_s"] = report.verify_seconds;
  state.counters["load_cpu_s"] = report.load_cpu_seconds;
  state.counters["decode_cpu_s"] = report.decode_cpu_seconds;
  state.counters["verify_cpu_s"] = report.verify_cpu_seconds;
  state.counters["save_cpu_s"] = report.save_cpu_seconds;
  state.counters["s_per_GiB"] = report.seconds / (static_cast<double>(worker.set.total_bytes()) / (1 << 30));
  state.counters["cpu_s_per_GiB"] = report.cpu_seconds / (static_cast<double>(worker.set.total_bytes()) / (1 << 30));
  state.counters["decode_elements_per_s"] = elements * (report.passes - 1) / report.decode_seconds;
  state.counters["copies"] = static_cast<double>(report.copies);
  state.counters["serialized_bytes"] = static_cast<double>(report.serialized_bytes);
  state.counters["sparse_bytes"] = static_cast<double>(report.sparse_bytes);
  state.counters["scratch_bytes"] = static_cast<double>(report.scratch_bytes);
}
BENCHMARK(BM_ProbeOneGiBWorker)->Unit(benchmark::kSecond)->Iterations(1);

// One large bf16 box (29.4 M elements, 59 MB) of an embedding-sized tensor, read in pass state.range(0)
// (one past the last pass: the verification values).
const std::vector<TensorInfo> kEmbedding = {{"embed", DType::kBF16, {163840, 7168}}};
const int kEmbeddingPasses = layout::ProbePlan(kEmbedding).num_passes();

void BM_ProbeCheckpointReadBox(benchmark::State& state) {
  layout::ProbeCheckpoint checkpoint(kEmbedding, layout::ProbePlan(kEmbedding));
  const auto pass = static_cast<int>(state.range(0));
  if (pass >= checkpoint.plan().num_passes()) checkpoint.set_verification(9);
  else checkpoint.set_pass(pass);
  const Box box{{40000, 0}, {4096, 7168}};
  std::vector<std::uint16_t> out(static_cast<std::size_t>(box.numel()));
  checkpoint.read_box("embed", box, out.data());
  // Validate first: a few elements of the box equal their own one-element reads.
  for (const std::int64_t row : {0, 1, 2047, 4095})
    for (const std::int64_t column : {0, 1, 3583, 7167}) {
      std::uint16_t one = 0;
      checkpoint.read_box("embed", Box{{40000 + row, column}, {1, 1}}, &one);
      if (one != out[static_cast<std::size_t>(row * 7168 + column)]) state.SkipWithError("box read differs from element reads");
    }
  for (auto _ : state) {
    checkpoint.read_box("embed", box, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * box.numel());
  state.SetLabel(checkpoint.source());
}
BENCHMARK(BM_ProbeCheckpointReadBox)->DenseRange(0, kEmbeddingPasses)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
