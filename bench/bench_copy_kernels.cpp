// The CUDA strided copy (kernels/copy_kernels.hpp) against a device-to-device memcpy of the same bytes.
//
// Shapes are bf16 and sized like the slices a pack or assemble call moves: a whole contiguous tensor,
// a column box (half of every row: a tensor-parallel shard), rows of 64 bytes (small slices), and a
// transpose. Each benchmark first checks its copy against the host copy (wb::copy_tensor) of the same
// data, and only then times synchronous copies (launch + wait; the wait costs a few microseconds of the
// hundreds each copy takes). Bytes per second count the payload once, like the D2D memcpy rate.
// Without CUDA, or without a device, every benchmark reports the reason as its error.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/device.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

#ifdef WB_HAVE_CUDA
#include "../kernels/copy_kernels.hpp"  // the kernels' host API is not installed; bench/ only links weightbridge
#endif

namespace {

using namespace wb;

#ifdef WB_HAVE_CUDA

constexpr std::int64_t kRows = 8192, kCols = 8192;  // bf16: 128 MiB

/// The source tensor on the device and its host mirror, made on first use.
struct Fixture {
  std::vector<std::byte> host;
  DeviceBuffer device;

  Fixture() : host(static_cast<std::size_t>(kRows * kCols) * 2), device(host.size()) {
    std::mt19937_64 generator(7);
    for (std::size_t i = 0; i + 8 <= host.size(); i += 8) {
      const std::uint64_t word = generator();
      std::memcpy(host.data() + i, &word, 8);
    }
    cuda_copy(device.data(), host.data(), host.size());
  }
  TensorView source(MemoryKind memory) const {
    return TensorView::contiguous(memory == MemoryKind::kCuda ? device.data() : const_cast<std::byte*>(host.data()),
                                  DType::kBF16, {kRows, kCols}, memory);
  }
};

Fixture& fixture() {
  static Fixture instance;
  return instance;
}

// A view of `parent` with the layout of the case; applied alike to host and device views.
using Select = TensorView (*)(const TensorView& parent);

TensorView whole(const TensorView& parent) { return parent; }
TensorView column_half(const TensorView& parent) { return parent.box(Box{{0, kCols / 4}, {kRows, kCols / 2}}); }
// The first 64 bytes of every 128: [8192, 128, 32] with strides [8192, 64, 1].
TensorView rows_of_64_bytes(const TensorView& parent) { return parent.unflatten(1, kCols / 64).narrow(2, 0, 32); }
TensorView transposed(const TensorView& parent) { return parent.transpose(0, 1); }

void copy_benchmark(benchmark::State& state, Select select) {
  if (cuda_device_count() == 0) {
    state.SkipWithError(("no CUDA device: " + cuda_unavailable_reason()).c_str());
    return;
  }
  Fixture& f = fixture();
  const TensorView device_src = select(f.source(MemoryKind::kCuda));
  const TensorView host_src = select(f.source(MemoryKind::kHost));
  DeviceBuffer dst_buffer(device_src.nbytes());
  const TensorView dst = TensorView::contiguous(dst_buffer.data(), device_src.dtype, device_src.shape, MemoryKind::kCuda);

  // Validate first: the device copy against the host copy of the same data.
  Status status = kernels::copy_tensor(dst, device_src);
  if (!status.is_ok()) {
    state.SkipWithError(status.to_string().c_str());
    return;
  }
  std::vector<std::byte> expected(device_src.nbytes()), actual(device_src.nbytes());
  copy_tensor(TensorView::contiguous(expected.data(), host_src.dtype, host_src.shape), host_src);
  cuda_copy(actual.data(), dst_buffer.data(), actual.size());
  if (expected != actual) {
    state.SkipWithError("device copy differs from the host copy");
    return;
  }

  for (auto _ : state) {
    status = kernels::copy_tensor(dst, device_src);
    if (!status.is_ok()) {
      state.SkipWithError(status.to_string().c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(device_src.nbytes()));
  state.counters["payload_MiB"] = static_cast<double>(device_src.nbytes()) / (1 << 20);
}

void BM_CudaMemcpyD2D(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    state.SkipWithError(("no CUDA device: " + cuda_unavailable_reason()).c_str());
    return;
  }
  Fixture& f = fixture();
  DeviceBuffer dst(f.device.size());
  for (auto _ : state) cuda_copy(dst.data(), f.device.data(), f.device.size());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(f.device.size()));
  state.counters["payload_MiB"] = static_cast<double>(f.device.size()) / (1 << 20);
}

void BM_CopyContiguous(benchmark::State& state) { copy_benchmark(state, whole); }
void BM_CopyColumnBox(benchmark::State& state) { copy_benchmark(state, column_half); }
void BM_CopyRowsOf64Bytes(benchmark::State& state) { copy_benchmark(state, rows_of_64_bytes); }
void BM_CopyTransposed(benchmark::State& state) { copy_benchmark(state, transposed); }

BENCHMARK(BM_CudaMemcpyD2D)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CopyContiguous)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CopyColumnBox)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CopyRowsOf64Bytes)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CopyTransposed)->UseRealTime()->Unit(benchmark::kMicrosecond);

#else  // !WB_HAVE_CUDA

void BM_CopyKernels(benchmark::State& state) {
  state.SkipWithError(("no CUDA device: " + cuda_unavailable_reason()).c_str());
}
BENCHMARK(BM_CopyKernels);

#endif

}  // namespace

BENCHMARK_MAIN();
