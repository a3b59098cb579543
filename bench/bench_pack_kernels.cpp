// The CUDA pack and assemble kernel (exec/device_copy_program.hpp, kernels/copy_work_kernel.cu) against a
// device-to-device cudaMemcpy of the same bytes.
//
// Each case moves 256 MiB per call, as one round of a large model would: segments of 4 KiB, 64 KiB or
// 1 MiB taken from every other segment of a bf16 parameter (so no two merge), or [128 x 4096] bf16 or fp8
// boxes stored transposed in their parameter. Each benchmark first checks the device result against
// exec::CopyProgram on a host copy of the same data, bit for bit, then times one launch per iteration with
// CUDA events, and the memcpy of the same bytes the same way. Reported: GB/s of payload for both, and their
// ratio (targets on an H200: at least 0.7 for 4 KiB segments, 0.9 from 64 KiB and for the transposes).
// Without CUDA, or without a device, every benchmark reports the reason as its error.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "exec/device_copy_program.hpp"
#include "exec/pack.hpp"
#endif

namespace {

using namespace wb;

#ifdef WB_HAVE_CUDA

using exec::CopyDirection;

constexpr std::int64_t kPayloadBytes = std::int64_t{256} << 20;
constexpr std::int64_t kBoxRows = 128, kBoxColumns = 4096;  // the transposed boxes
constexpr std::uint8_t kElement = 2;                         // bf16 segments

struct Layout {
  std::vector<BufferCopy> copies;
  std::int64_t parameter_bytes = 0;
};

// Segments of `segment_bytes`, every other one of the parameter, packed back to back in the buffer.
Layout segments(std::int64_t segment_bytes) {
  Layout layout;
  const std::int64_t count = kPayloadBytes / segment_bytes, elements = segment_bytes / kElement;
  layout.parameter_bytes = 2 * kPayloadBytes;
  for (std::int64_t i = 0; i < count; ++i) {
    BufferCopy c;
    c.copy.box = Box{{0}, {elements}};
    c.copy.offset = 2 * i * elements;
    c.copy.strides = {1};
    c.buffer_offset = i * segment_bytes;
    c.element_bytes = kElement;
    layout.copies.push_back(c);
  }
  return layout;
}

// [128 x 4096] boxes of `element`-byte elements; box b is columns [128 b, 128 b + 128) of a [4096, 128 n]
// parameter: transposed.
Layout transposed_boxes(std::uint8_t element) {
  Layout layout;
  const std::int64_t box_bytes = kBoxRows * kBoxColumns * element, count = kPayloadBytes / box_bytes;
  layout.parameter_bytes = kPayloadBytes;
  for (std::int64_t b = 0; b < count; ++b) {
    BufferCopy c;
    c.copy.box = Box{{0, 0}, {kBoxRows, kBoxColumns}};
    c.copy.offset = b * kBoxRows;
    c.copy.strides = {1, kBoxRows * count};
    c.buffer_offset = b * box_bytes;
    c.element_bytes = element;
    layout.copies.push_back(c);
  }
  return layout;
}

struct Timer {
  cudaEvent_t start = nullptr, stop = nullptr;
  Timer() {
    (void)cudaEventCreate(&start);
    (void)cudaEventCreate(&stop);
  }
  ~Timer() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  // Seconds between the two events, once `stop` is reached.
  double seconds() const {
    float milliseconds = 0;
    if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&milliseconds, start, stop) != cudaSuccess) return -1;
    return milliseconds / 1e3;
  }
};

std::vector<std::byte> random_bytes(std::size_t size, std::uint64_t seed) {
  std::vector<std::byte> bytes(size);
  std::mt19937_64 generator(seed);
  for (std::size_t i = 0; i + 8 <= size; i += 8) {
    const std::uint64_t word = generator();
    std::memcpy(bytes.data() + i, &word, 8);
  }
  return bytes;
}

// Average seconds of a device-to-device copy of `bytes`, timed like the kernels.
double memcpy_seconds(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  Timer timer;
  for (int i = 0; i < 3; ++i) (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  constexpr int kRepeats = 20;
  (void)cudaEventRecord(timer.start, stream);
  for (int i = 0; i < kRepeats; ++i) (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  (void)cudaEventRecord(timer.stop, stream);
  return timer.seconds() / kRepeats;
}

void copy_benchmark(benchmark::State& state, CopyDirection direction, std::int64_t segment_bytes) {
  if (cuda_device_count() == 0) {
    state.SkipWithError(("no CUDA device: " + cuda_unavailable_reason()).c_str());
    return;
  }
  const bool pack = direction == CopyDirection::kPack;
  // A segment size <= 0 stands for transposed boxes of -segment_bytes-byte elements.
  const Layout layout = segment_bytes > 0 ? segments(segment_bytes) : transposed_boxes(static_cast<std::uint8_t>(-segment_bytes));
  const std::vector<std::int64_t> parameter_bytes{layout.parameter_bytes};

  // Sources random, destinations a fill pattern; the same on the host, where CopyProgram gives the expected bytes.
  const auto parameter_size = static_cast<std::size_t>(layout.parameter_bytes);
  const auto buffer_size = static_cast<std::size_t>(kPayloadBytes);
  std::vector<std::byte> host_parameter = pack ? random_bytes(parameter_size, 1) : std::vector<std::byte>(parameter_size, std::byte{0xEE});
  std::vector<std::byte> host_buffer = pack ? std::vector<std::byte>(buffer_size, std::byte{0xCD}) : random_bytes(buffer_size, 2);
  DeviceBuffer device_parameter(parameter_size), device_buffer(buffer_size);
  cuda_copy(device_parameter.data(), host_parameter.data(), parameter_size);
  cuda_copy(device_buffer.data(), host_buffer.data(), buffer_size);

  std::vector<std::byte*> device_parameters{static_cast<std::byte*>(device_parameter.data())};
  exec::DeviceCopyProgram program;
  try {
    program = exec::DeviceCopyProgram(exec::compile_copy_work(direction, layout.copies, device_parameters, parameter_bytes,
                                                              static_cast<std::byte*>(device_buffer.data()), kPayloadBytes),
                                      0);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    state.SkipWithError("cudaStreamCreateWithFlags failed");
    return;
  }

  // Validate first: the device result against CopyProgram on the host.
  Status status = program.execute(stream);
  if (status.is_ok() && cudaStreamSynchronize(stream) != cudaSuccess) status = Status(ErrorCode::kCuda, "the kernel failed");
  if (!status.is_ok()) {
    state.SkipWithError(status.to_string().c_str());
    (void)cudaStreamDestroy(stream);
    return;
  }
  {
    std::vector<std::byte*> host_parameters{host_parameter.data()};
    exec::CopyProgram(direction, layout.copies, parameter_bytes, kPayloadBytes).execute(host_parameters, host_buffer.data());
    const std::vector<std::byte>& expected = pack ? host_buffer : host_parameter;
    std::vector<std::byte> actual(expected.size());
    cuda_copy(actual.data(), pack ? device_buffer.data() : device_parameter.data(), actual.size());
    if (actual != expected) {
      state.SkipWithError("the device result differs from exec::CopyProgram's");
      (void)cudaStreamDestroy(stream);
      return;
    }
  }

  const double memcpy_time = memcpy_seconds(device_buffer.data(), device_parameter.data(), buffer_size, stream);
  Timer timer;
  double total = 0;
  for (auto _ : state) {
    (void)cudaEventRecord(timer.start, stream);
    status = program.execute(stream);
    (void)cudaEventRecord(timer.stop, stream);
    const double seconds = timer.seconds();
    if (!status.is_ok() || seconds < 0) {
      state.SkipWithError(status.is_ok() ? "timing the kernel failed" : status.to_string().c_str());
      break;
    }
    state.SetIterationTime(seconds);
    total += seconds;
  }
  (void)cudaStreamDestroy(stream);
  if (state.iterations() == 0 || total <= 0 || memcpy_time <= 0) return;

  const double gigabytes = static_cast<double>(kPayloadBytes) / 1e9;
  const double kernel_rate = gigabytes * static_cast<double>(state.iterations()) / total;
  const double memcpy_rate = gigabytes / memcpy_time;
  state.SetBytesProcessed(state.iterations() * kPayloadBytes);
  state.counters["GB/s"] = kernel_rate;
  state.counters["memcpy_GB/s"] = memcpy_rate;
  state.counters["ratio"] = kernel_rate / memcpy_rate;
  state.counters["items"] = static_cast<double>(program.stats().items);
  state.counters["blocks"] = program.blocks();
}

void BM_Pack(benchmark::State& state, std::int64_t segment_bytes) { copy_benchmark(state, CopyDirection::kPack, segment_bytes); }
void BM_Assemble(benchmark::State& state, std::int64_t segment_bytes) {
  copy_benchmark(state, CopyDirection::kAssemble, segment_bytes);
}

#define WB_PACK_BENCHMARKS(function)                                                                    \
  BENCHMARK_CAPTURE(function, segments_4KiB, std::int64_t{4} << 10)->UseManualTime()->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(function, segments_64KiB, std::int64_t{64} << 10)->UseManualTime()->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(function, segments_1MiB, std::int64_t{1} << 20)->UseManualTime()->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(function, transposed_128x4096_bf16, std::int64_t{-2})->UseManualTime()->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(function, transposed_128x4096_fp8, std::int64_t{-1})->UseManualTime()->Unit(benchmark::kMicrosecond)

WB_PACK_BENCHMARKS(BM_Pack);
WB_PACK_BENCHMARKS(BM_Assemble);

#else  // !WB_HAVE_CUDA

void BM_PackKernels(benchmark::State& state) {
  state.SkipWithError(("no CUDA device: " + cuda_unavailable_reason()).c_str());
}
BENCHMARK(BM_PackKernels);

#endif

}  // namespace

BENCHMARK_MAIN();
