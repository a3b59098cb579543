// The FP8 quantize kernels (exec/fp8_kernel_launch.hpp): amax, scales and codes of bf16 device parameters,
// each the host's arithmetic (core/fp8.hpp, core/fp8.cpp) on the device, so that codes and scales are the
// same bits. What each thread does is exec/fp8_kernel_body.hpp, which the host tests run as well. Launch:
// 256 threads per block; an item's elements are strided over by the blocks given to it (blockIdx.y picks
// the item), each thread folding the amax of consecutive elements of one block before one atomic max.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "exec/fp8_kernel_body.hpp"
#include "exec/fp8_kernel_launch.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;

constexpr int kThreads = 256;
constexpr unsigned kBlocksPerItem = 64;  // grid x: enough to fill the device with a few large items

// The threads of an item: blockIdx.y picks it, the blocks of grid x stride over it.
__device__ __forceinline__ i64 item_thread() { return static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x; }
__device__ __forceinline__ i64 item_threads() { return static_cast<i64>(gridDim.x) * kThreads; }

__global__ void __launch_bounds__(kThreads) amax_kernel(const Fp8CopyItem* __restrict__ items) {
  const Fp8CopyItem item = items[blockIdx.y];
  fp8_body::amax_thread(item, item_thread(), item_threads(),
                        [&](i64 block, std::uint32_t bits) { atomicMax(item.amax_bits + block, bits); });
}

__global__ void __launch_bounds__(kThreads) scale_kernel(const std::uint32_t* __restrict__ amax_bits, float* __restrict__ scales,
                                                        float* __restrict__ factors, i64 blocks, fp8::ScaleRule rule) {
  const i64 b = static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x;
  if (b < blocks) fp8_body::block_scale(amax_bits[b], rule, scales[b], factors[b]);
}

__global__ void __launch_bounds__(kThreads) cast_kernel(const Fp8CopyItem* __restrict__ items, fp8::ScaleRule rule) {
  fp8_body::cast_thread(items[blockIdx.y], item_thread(), item_threads(), rule);
}

Status launched(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return Status::ok();
  return Status(ErrorCode::kCuda, std::string(what) + ": " + cudaGetErrorString(error));
}

}  // namespace

Status launch_fp8_amax(const Fp8CopyItem* items, std::uint32_t count, void* stream) noexcept {
  if (count == 0) return Status::ok();
  (void)cudaGetLastError();  // the result is this launch's, not an earlier call's
  amax_kernel<<<dim3(kBlocksPerItem, count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(items);
  return launched("the FP8 amax kernel");
}

Status launch_fp8_scales(const std::uint32_t* amax_bits, float* scales, float* factors, i64 blocks, fp8::ScaleRule rule,
                         void* stream) noexcept {
  if (blocks == 0) return Status::ok();
  (void)cudaGetLastError();
  const auto grid = static_cast<unsigned>((blocks + kThreads - 1) / kThreads);
  scale_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(amax_bits, scales, factors, blocks, rule);
  return launched("the FP8 scale kernel");
}

Status launch_fp8_cast(const Fp8CopyItem* items, std::uint32_t count, fp8::ScaleRule rule, void* stream) noexcept {
  if (count == 0) return Status::ok();
  (void)cudaGetLastError();
  cast_kernel<<<dim3(kBlocksPerItem, count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(items, rule);
  return launched("the FP8 cast kernel");
}

}  // namespace wb::exec
