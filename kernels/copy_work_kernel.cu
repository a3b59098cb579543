// The CUDA copy kernel: performs a descriptor array of exec/copy_work_item.hpp (built on the host by
// exec/copy_work.cpp) in one launch. Reached only through the two host functions of
// exec/copy_kernel_launch.hpp.
//
// Launch: 256 threads per block, each warp a worker that strides over the items (warp w takes items w,
// w + W, ...), W = every warp of one wave of blocks (multiprocessors x resident blocks): neighbouring items,
// the pieces of one tensor, run at the same time. A warp loads its next descriptor before it copies the
// current one. A lane keeps eight 16-byte loads in flight in a run item; in a tile, the source rows go
// into shared memory in vectors of up to 16 bytes along the rows (for bf16, four lanes a row and eight
// rows per instruction), and lane r writes source row r down the destination. Programs without tiles use
// an instantiation without shared memory, which more blocks fit beside.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/checks.hpp"
#include "exec/copy_kernel_launch.hpp"
#include "exec/copy_work_item.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kUnroll = 8;      // vectors in flight per lane in a run item
constexpr int kTileGroup = 8;   // vectors in flight per lane while a tile is loaded
// Resident blocks per multiprocessor the kernel is compiled for: 4 caps registers at 64 per thread (32
// warps per multiprocessor, each with 4 KiB of loads in flight); tiles need a few more registers.
constexpr int kMinBlocksPerSm = 4;
constexpr int kMinBlocksPerSmWithTiles = 3;

template <int kBytes>
struct Vector;
template <>
struct Vector<16> { using type = uint4; };
template <>
struct Vector<8> { using type = unsigned long long; };
template <>
struct Vector<4> { using type = unsigned int; };
template <>
struct Vector<2> { using type = unsigned short; };
template <>
struct Vector<1> { using type = unsigned char; };

// --- run items ---------------------------------------------------------------------------------------

template <int kWidth>
__device__ __forceinline__ void copy_runs(const CopyWorkItem& item, const char* __restrict__ src, char* __restrict__ dst,
                                          unsigned lane) {
  using V = typename Vector<kWidth>::type;
  const RunGeometry g = run_geometry(item, reinterpret_cast<u64>(src));
  const std::uint32_t vectors = item.count * g.body;
  if (item.count == 1) {
    // One run (most bytes: pieces of long runs). The lane's vectors are at fixed distances from one
    // pointer, so the loads and stores take immediate offsets and few registers.
    const V* from = reinterpret_cast<const V*>(src + g.head) + lane;
    V* to = reinterpret_cast<V*>(dst + g.head) + lane;
#pragma unroll 1
    for (std::uint32_t base = lane; base < vectors; base += 32 * kUnroll, from += 32 * kUnroll, to += 32 * kUnroll) {
      V values[kUnroll] = {};  // defined on every path: else the compiler carries them across items
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + 32u * u < vectors) values[u] = from[32 * u];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (base + 32u * u < vectors) to[32 * u] = values[u];
    }
  } else {
    // Several runs: each vector's run and offset, recomputed for the stores rather than kept in
    // registers; half as many in flight, since every one needs its own address.
    constexpr int kInFlight = kUnroll / 2;
#pragma unroll 1
    for (std::uint32_t base = lane; base < vectors; base += 32 * kInFlight) {
      V values[kInFlight] = {};
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (base + 32u * u < vectors) {
          std::uint32_t run, offset;
          vector_position(item, g, base + 32u * u, run, offset);
          values[u] = *reinterpret_cast<const V*>(src + static_cast<i64>(run) * item.src_stride + offset);
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (base + 32u * u < vectors) {
          std::uint32_t run, offset;
          vector_position(item, g, base + 32u * u, run, offset);
          *reinterpret_cast<V*>(dst + static_cast<i64>(run) * item.dst_stride + offset) = values[u];
        }
      }
    }
  }
  if (g.head + g.tail == 0) return;
  const std::uint32_t edges = item.count * (g.head + g.tail);
#pragma unroll 1
  for (std::uint32_t e = lane; e < edges; e += 32) {
    std::uint32_t run, offset;
    edge_position(item, g, e, run, offset);
    dst[static_cast<i64>(run) * item.dst_stride + offset] = src[static_cast<i64>(run) * item.src_stride + offset];
  }
}

__device__ __forceinline__ void dispatch_runs(const CopyWorkItem& item, const char* src, char* dst, unsigned lane) {
  switch (item.width) {
    case 16: return copy_runs<16>(item, src, dst, lane);
    case 8: return copy_runs<8>(item, src, dst, lane);
    case 4: return copy_runs<4>(item, src, dst, lane);
    case 2: return copy_runs<2>(item, src, dst, lane);
    default: return copy_runs<1>(item, src, dst, lane);
  }
}

// --- transpose items ---------------------------------------------------------------------------------

// A loaded vector into the tile, as 4-byte words (the tile's rows are 4-byte aligned, not 16).
template <int kLoad>
__device__ __forceinline__ void put_words(char* at, const typename Vector<kLoad>::type& value) {
  if constexpr (kLoad == 16) {
    auto* words = reinterpret_cast<unsigned int*>(at);
    words[0] = value.x, words[1] = value.y, words[2] = value.z, words[3] = value.w;
  } else if constexpr (kLoad == 8) {
    auto* words = reinterpret_cast<unsigned int*>(at);
    words[0] = static_cast<unsigned int>(value), words[1] = static_cast<unsigned int>(value >> 32);
  } else {
    *reinterpret_cast<typename Vector<kLoad>::type*>(at) = value;
  }
}

// Phase 1 of a tile: its source rows into shared memory, lanes taking consecutive vectors along the rows.
template <int kLoad>
__device__ __forceinline__ void load_tile(const CopyWorkItem& item, const char* __restrict__ src, unsigned lane,
                                          char* tile) {
  using V = typename Vector<kLoad>::type;
  const std::uint32_t vectors = tile_vectors(item);
  const std::uint32_t pitch = static_cast<std::uint32_t>(tile_pitch(item.width));
#pragma unroll 1
  for (std::uint32_t base = lane; base < vectors; base += 32 * kTileGroup) {
    V values[kTileGroup] = {};
#pragma unroll
    for (int u = 0; u < kTileGroup; ++u) {
      if (base + 32u * u < vectors) {
        std::uint32_t row, byte;
        tile_vector_position(item, base + 32u * u, row, byte);
        values[u] = *reinterpret_cast<const V*>(src + static_cast<i64>(row) * item.src_stride + byte);
      }
    }
#pragma unroll
    for (int u = 0; u < kTileGroup; ++u) {
      if (base + 32u * u < vectors) {
        std::uint32_t row, byte;
        tile_vector_position(item, base + 32u * u, row, byte);
        put_words<kLoad>(tile + row * pitch + byte, values[u]);
      }
    }
  }
}

// Phase 2: lane r writes the elements of source row r along the destination rows, in kAccess-byte words;
// reading a column of the tile hits 32 different banks (tile_pitch).
template <int kElement, int kAccess>
__device__ __forceinline__ void store_tile(const CopyWorkItem& item, char* __restrict__ dst, unsigned lane,
                                           const char* tile) {
  using Word = typename Vector<kAccess>::type;
  constexpr int kWords = kElement / kAccess;
  constexpr int kColumns = tile_columns(kElement);
  constexpr int kPitch = tile_pitch(kElement);
  const int row = static_cast<int>(lane);
  if (row >= item.count) return;
#pragma unroll 8
  for (int c = 0; c < kColumns; ++c) {
    if (c < item.length) {
      const Word* cell = reinterpret_cast<const Word*>(tile + row * kPitch + c * kElement);
      Word* out = reinterpret_cast<Word*>(dst + static_cast<i64>(c) * item.dst_stride + row * kElement);
#pragma unroll
      for (int w = 0; w < kWords; ++w) out[w] = cell[w];
    }
  }
}

__device__ __forceinline__ void copy_tile(const CopyWorkItem& item, const char* src, char* dst, unsigned lane, char* tile) {
  switch (item.load) {
    case 16: load_tile<16>(item, src, lane, tile); break;
    case 8: load_tile<8>(item, src, lane, tile); break;
    case 4: load_tile<4>(item, src, lane, tile); break;
    case 2: load_tile<2>(item, src, lane, tile); break;
    default: load_tile<1>(item, src, lane, tile); break;
  }
  __syncwarp();
  const int access = item.access;
  switch (item.width) {
    case 8:
      if (access == 8) store_tile<8, 8>(item, dst, lane, tile);
      else if (access == 4) store_tile<8, 4>(item, dst, lane, tile);
      else if (access == 2) store_tile<8, 2>(item, dst, lane, tile);
      else store_tile<8, 1>(item, dst, lane, tile);
      break;
    case 4:
      if (access == 4) store_tile<4, 4>(item, dst, lane, tile);
      else if (access == 2) store_tile<4, 2>(item, dst, lane, tile);
      else store_tile<4, 1>(item, dst, lane, tile);
      break;
    case 2:
      if (access == 2) store_tile<2, 2>(item, dst, lane, tile);
      else store_tile<2, 1>(item, dst, lane, tile);
      break;
    default: store_tile<1, 1>(item, dst, lane, tile); break;
  }
  __syncwarp();  // the next item's loads overwrite the tile
}

// --- the kernel --------------------------------------------------------------------------------------

__device__ __forceinline__ void load_descriptor(const CopyWorkItem* items, unsigned i, uint4 (&halves)[2]) {
  const uint4* raw = reinterpret_cast<const uint4*>(items + i);
  halves[0] = __ldg(raw);
  halves[1] = __ldg(raw + 1);
}

// Every item of the program. `src_base` and `dst_base` are added to the items' addresses: 0 on the
// parameter side (absolute), the buffer's address on the other.
template <bool kTransposes>
__global__ void __launch_bounds__(kThreads, kTransposes ? kMinBlocksPerSmWithTiles : kMinBlocksPerSm)
    copy_work_kernel(const CopyWorkItem* __restrict__ items, unsigned count, u64 src_base, u64 dst_base) {
  __shared__ alignas(16) char tiles[kTransposes ? kWarpsPerBlock : 1][kTransposes ? kTileBytes : 16];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned workers = gridDim.x * kWarpsPerBlock;
  unsigned i = blockIdx.x * kWarpsPerBlock + warp;
  // Every lane reads the whole descriptor (one broadcast per 16 bytes), the next one while it copies.
  uint4 next[2] = {};
  if (i < count) load_descriptor(items, i, next);
  for (; i < count; i += workers) {
    CopyWorkItem item;
    memcpy(&item, next, sizeof item);
    if (i + workers < count) load_descriptor(items, i + workers, next);
    const char* src = reinterpret_cast<const char*>(src_base + item.src);
    char* dst = reinterpret_cast<char*>(dst_base + item.dst);
    if constexpr (kTransposes) {
      if (item.kind == CopyWorkItem::kTranspose) {
        copy_tile(item, src, dst, lane, tiles[warp]);
        continue;
      }
    }
    dispatch_runs(item, src, dst, lane);
  }
}

}  // namespace

int copy_kernel_blocks(std::size_t items, bool tiles, int device) {
  int sms = 0, per_sm = 0;
  WB_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (tiles)
    WB_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_work_kernel<true>, kThreads, 0));
  else
    WB_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_work_kernel<false>, kThreads, 0));
  const std::size_t wave = static_cast<std::size_t>(std::max(1, sms * std::max(1, per_sm)));
  return static_cast<int>(std::max<std::size_t>(1, std::min(wave, (items + kWarpsPerBlock - 1) / kWarpsPerBlock)));
}

Status launch_copy_kernel(const CopyWorkItem* items, std::uint32_t count, bool tiles, std::uint64_t src_base,
                          std::uint64_t dst_base, int blocks, void* stream) noexcept {
  unsigned n = count;
  void* args[] = {&items, &n, &src_base, &dst_base};
  const void* kernel = tiles ? reinterpret_cast<const void*>(&copy_work_kernel<true>)
                             : reinterpret_cast<const void*>(&copy_work_kernel<false>);
  const cudaError_t rc =
      cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), args, 0, static_cast<cudaStream_t>(stream));
  if (rc == cudaSuccess) return Status::ok();
  (void)cudaGetLastError();  // reported here: not again to whoever checks next
  return make_call_error(ErrorCode::kCuda, "cudaLaunchKernel(copy_work_kernel)", detail::cuda_error_string(rc), __FILE__,
                         __LINE__);
}

}  // namespace wb::exec
