// The FP8 quantize kernels (exec/fp8_kernel_launch.hpp): amax, scales and codes of bf16 device parameters,
// each the host's arithmetic (core/fp8.hpp, core/fp8.cpp) on the device, so that codes and scales are the
// same bits. Launch: 256 threads per block; an item's elements are strided over by the blocks given to it
// (blockIdx.y picks the item), each thread folding the amax of consecutive elements of one block before
// one atomic max.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "exec/fp8_kernel_launch.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;

constexpr int kThreads = 256;
constexpr unsigned kBlocksPerItem = 64;  // grid x: enough to fill the device with a few large items
constexpr std::uint32_t kCanonicalNan = 0x7FC00000u;  // what the host's NaN arithmetic gives

__device__ __forceinline__ float bf16_to_float(std::uint16_t bits) { return __uint_as_float(std::uint32_t{bits} << 16); }

// core/fp8.hpp e4m3_from_float, on the device: the same integer rounding, __float2int_rn for nearbyint.
__device__ __forceinline__ std::uint8_t e4m3_from_float(float x) {
  const std::uint32_t bits = __float_as_uint(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t a = bits & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);
  if (a >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);
  if (a >= 0x3C800000u) {
    const std::uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
    return static_cast<std::uint8_t>(sign | ((rounded >> 20) - ((127u - 7u) << 3)));
  }
  return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(__float2int_rn(__uint_as_float(a) * 512.0f)));
}

// Element k of an item (row-major over its box): its parameter element and its block.
__device__ __forceinline__ void locate(const Fp8CopyItem& item, i64 k, i64& element, i64& block) {
  const i64 i = k / item.cols, j = k % item.cols;
  element = item.offset + i * item.stride0 + j * item.stride1;
  block = (item.row0 + i) / item.block_rows * item.scale_cols + (item.col0 + j) / item.block_cols;
}

__global__ void __launch_bounds__(kThreads) amax_kernel(const Fp8CopyItem* __restrict__ items) {
  const Fp8CopyItem item = items[blockIdx.y];
  const i64 n = item.rows * item.cols;
  const i64 step = static_cast<i64>(gridDim.x) * kThreads;
  // Each thread takes a contiguous share of the elements, so that its run mostly stays in one block.
  const i64 share = (n + step - 1) / step;
  const i64 first = (static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x) * share;
  const i64 last = first + share < n ? first + share : n;
  i64 current = -1;
  std::uint32_t running = 0;
  for (i64 k = first; k < last; ++k) {
    i64 element = 0, block = 0;
    locate(item, k, element, block);
    const std::uint32_t magnitude = __float_as_uint(bf16_to_float(item.source[element])) & 0x7FFFFFFFu;
    if (block != current) {
      if (current >= 0) atomicMax(item.amax_bits + current, running);
      current = block;
      running = 0;
    }
    running = magnitude > running ? magnitude : running;
  }
  if (current >= 0) atomicMax(item.amax_bits + current, running);
}

// core/fp8.cpp ceil_power_of_two: the smallest power of two >= m, from the bits.
__device__ __forceinline__ float ceil_power_of_two(float m) {
  const std::uint32_t bits = __float_as_uint(m);
  std::uint32_t exponent = (bits >> 23) & 0xFFu;
  if (exponent == 0) return ldexpf(1.0f, static_cast<int>(ceil(log2(static_cast<double>(m)))));
  if ((bits & 0x7FFFFFu) != 0) ++exponent;
  return __uint_as_float(exponent << 23);
}

__global__ void __launch_bounds__(kThreads) scale_kernel(const std::uint32_t* __restrict__ amax_bits, float* __restrict__ scales,
                                                        float* __restrict__ factors, i64 blocks, fp8::ScaleRule rule) {
  const i64 b = static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= blocks) return;
  const std::uint32_t bits = amax_bits[b];
  if (bits > 0x7F800000u) {  // a NaN element: the host's scale and factor are its canonical NaN
    scales[b] = __uint_as_float(kCanonicalNan);
    factors[b] = __uint_as_float(kCanonicalNan);
    return;
  }
  const float amax = __uint_as_float(bits);
  const float a = amax > fp8::kAmaxFloor ? amax : fp8::kAmaxFloor;
  switch (rule) {
    case fp8::ScaleRule::kPlain: {
      const float s = amax == 0.0f ? 1.0f : __fdiv_rn(amax, fp8::kE4m3Max);
      scales[b] = s;
      factors[b] = s;
      break;
    }
    case fp8::ScaleRule::kPerBlockCast:
      scales[b] = __fdiv_rn(a, fp8::kE4m3Max);
      factors[b] = __fdiv_rn(fp8::kE4m3Max, a);
      break;
    case fp8::ScaleRule::kUe8m0: {
      const float s = ceil_power_of_two(__fdiv_rn(a, fp8::kE4m3Max));
      scales[b] = s;
      factors[b] = __fdiv_rn(1.0f, s);
      break;
    }
  }
}

__global__ void __launch_bounds__(kThreads) cast_kernel(const Fp8CopyItem* __restrict__ items, fp8::ScaleRule rule) {
  const Fp8CopyItem item = items[blockIdx.y];
  const i64 n = item.rows * item.cols;
  const bool divide = rule == fp8::ScaleRule::kPlain;
  for (i64 k = static_cast<i64>(blockIdx.x) * kThreads + threadIdx.x; k < n; k += static_cast<i64>(gridDim.x) * kThreads) {
    i64 element = 0, block = 0;
    locate(item, k, element, block);
    const float x = bf16_to_float(item.source[element]);
    const float f = item.factors[block];
    // A NaN element keeps its own sign, as on the host (x86 returns a NaN first operand); the device's
    // canonical NaN otherwise, positive like the host's.
    item.codes[element] = e4m3_from_float(isnan(x) ? x : divide ? __fdiv_rn(x, f) : __fmul_rn(x, f));
  }
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
