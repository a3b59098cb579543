// Box reads from HDF5 and safetensors checkpoints, against memcpy of the same number of bytes; and the
// synthetic checkpoint's values (apps/emu/checkpoints/synthetic), computed per element.
//
// One bf16 tensor [8192, 4096] (64 MiB) and one [64, 1024, 512] expert stack are written once to each
// format under a fresh /tmp directory; files are in the page cache, so this measures the readers' copy
// paths, not the disk. Every benchmark first checks its box against an element-by-element extraction
// of the known data, and only then times.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "emu/checkpoints/synthetic.hpp"
#include "weightbridge/checkpoint.hpp"

namespace {

using namespace wb;

const std::vector<TensorInfo>& bench_tensors() {
  static const std::vector<TensorInfo> tensors = {{"model.embed_tokens.weight", DType::kBF16, {8192, 4096}},
                                                  {"model.layers.0.mlp.experts.w", DType::kBF16, {64, 1024, 512}}};
  return tensors;
}

/// The data, the files and a reader per format, made on first use and removed at exit.
struct Fixture {
  std::filesystem::path directory;
  std::vector<std::vector<std::byte>> data;
  std::unique_ptr<CheckpointReader> readers[2];

  Fixture() {
    directory = std::filesystem::temp_directory_path() / ("wb-bench-checkpoint-" + std::to_string(::getpid()));
    std::filesystem::create_directories(directory);
    std::mt19937_64 generator(42);
    for (const TensorInfo& info : bench_tensors()) {
      std::vector<std::byte> bytes(info.nbytes());
      for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
        const std::uint64_t word = generator();
        std::memcpy(bytes.data() + i, &word, 8);
      }
      data.push_back(std::move(bytes));
    }
    const std::string paths[2] = {(directory / "model.h5").string(), (directory / "model.safetensors").string()};
    const CheckpointFormat formats[2] = {CheckpointFormat::kHdf5, CheckpointFormat::kSafetensors};
    for (int f = 0; f < 2; ++f) {
      auto writer = create_checkpoint(paths[f], formats[f], bench_tensors());
      for (std::size_t i = 0; i < data.size(); ++i) writer->write(bench_tensors()[i].name, data[i].data());
      writer->finish();
      readers[f] = open_checkpoint(paths[f]);
    }
  }
  ~Fixture() {
    std::error_code ec;
    std::filesystem::remove_all(directory, ec);
  }
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

/// Element-by-element extraction: the independent reference each box is validated against.
std::vector<std::byte> reference_box(const std::vector<std::byte>& whole, const Shape& shape, const Box& box) {
  const std::size_t element = 2;
  std::vector<std::byte> out(static_cast<std::size_t>(box.numel()) * element);
  const Shape strides = contiguous_strides(shape);
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::size_t n = 0; n < static_cast<std::size_t>(box.numel()); ++n) {
    std::int64_t flat = 0;
    for (std::size_t a = 0; a < shape.size(); ++a) flat += (box.offset[a] + index[a]) * strides[a];
    std::memcpy(out.data() + n * element, whole.data() + flat * element, element);
    for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
      if (++index[a] < box.extent[a]) break;
      index[a] = 0;
    }
  }
  return out;
}

struct BoxCase {
  const char* label;
  std::size_t tensor;
  Box box;
};

const std::vector<BoxCase>& box_cases() {
  static const std::vector<BoxCase> cases = {
      {"whole 64MiB", 0, {{0, 0}, {8192, 4096}}},
      {"rows 16MiB (1 run)", 0, {{1024, 0}, {2048, 4096}}},
      {"columns 16MiB (4KiB runs)", 0, {{0, 1024}, {8192, 1024}}},
      {"columns 2MiB (256B runs)", 0, {{0, 2048}, {8192, 128}}},
      {"experts 8MiB (1 run)", 1, {{8, 0, 0}, {8, 1024, 512}}},
      {"expert slab 16MiB (512B runs)", 1, {{0, 256, 128}, {64, 256, 256}}},
      // What a read costs besides its bytes (the safetensors reader's check that the file did not change).
      {"one row 8KiB", 0, {{5, 0}, {1, 4096}}},
      {"one element", 0, {{5, 7}, {1, 1}}},
  };
  return cases;
}

void BM_ReadBox(benchmark::State& state) {
  const int format = static_cast<int>(state.range(0));
  const BoxCase& c = box_cases()[static_cast<std::size_t>(state.range(1))];
  Fixture& f = fixture();
  const TensorInfo& info = bench_tensors()[c.tensor];
  const std::vector<std::byte> expected = reference_box(f.data[c.tensor], info.shape, c.box);
  std::vector<std::byte> out(expected.size());
  f.readers[format]->read_box(info.name, c.box, out.data());
  if (out != expected) {
    state.SkipWithError("box read does not match the reference");
    return;
  }
  for (auto _ : state) {
    f.readers[format]->read_box(info.name, c.box, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * expected.size()));
  state.SetLabel(std::string(format == 0 ? "hdf5 " : "safetensors ") + c.label);
}

/// The ceiling: one memcpy of as many bytes as the box holds.
void BM_Memcpy(benchmark::State& state) {
  const BoxCase& c = box_cases()[static_cast<std::size_t>(state.range(0))];
  const std::size_t bytes = static_cast<std::size_t>(c.box.numel()) * 2;
  const std::vector<std::byte>& source = fixture().data[c.tensor];
  std::vector<std::byte> out(bytes);
  std::memcpy(out.data(), source.data(), bytes);
  if (std::memcmp(out.data(), source.data(), bytes) != 0) {
    state.SkipWithError("memcpy mismatch");
    return;
  }
  for (auto _ : state) {
    std::memcpy(out.data(), source.data(), bytes);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetLabel(std::string("memcpy ") + c.label);
}

void box_arguments(benchmark::internal::Benchmark* bench) {
  for (int format = 0; format < 2; ++format)
    for (int c = 0; c < static_cast<int>(box_cases().size()); ++c) bench->Args({format, c});
}

void memcpy_arguments(benchmark::internal::Benchmark* bench) {
  for (int c = 0; c < static_cast<int>(box_cases().size()); ++c) bench->Arg(c);
}

BENCHMARK(BM_ReadBox)->Apply(box_arguments)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Memcpy)->Apply(memcpy_arguments)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

// One million bf16 synthetic values of a box whose rows are not contiguous in the tensor, checked against
// one-element boxes first. Elements per second: what every test and demo that reads a synthetic checkpoint pays.
void BM_FillSynthetic(benchmark::State& state) {
  const TensorInfo info{"model.layers.0.mlp.experts.0.up_proj.weight", DType::kBF16, {4096, 2048}};
  const Box box{{1024, 512}, {1024, 1024}};
  std::vector<std::uint16_t> out(static_cast<std::size_t>(box.numel()));
  emu::fill_synthetic(info, box, 0, out.data());
  for (const std::int64_t k : {std::int64_t{0}, std::int64_t{1025}, box.numel() - 1}) {
    std::uint16_t one = 0;
    emu::fill_synthetic(info, Box{{1024 + k / 1024, 512 + k % 1024}, {1, 1}}, 0, &one);
    if (one != out[static_cast<std::size_t>(k)]) state.SkipWithError("a box differs from its elements");
  }
  for (auto _ : state) {
    emu::fill_synthetic(info, box, 0, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * box.numel());
}
BENCHMARK(BM_FillSynthetic)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
