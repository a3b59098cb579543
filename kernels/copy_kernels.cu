// Strided tensor copy on a CUDA device (host API in copy_kernels.hpp).
//
// The host side sorts the axes by destination stride, coalesces them (src/core/strided.hpp) and picks
// one of two kernels:
//  - rows: the innermost axis is contiguous on both sides. Each row is cut into segments of
//    lanes * kUnroll vectors; a group of `lanes` threads (a power of two, up to the block) copies one
//    segment with vector loads as wide as every row start allows (16 bytes for aligned rows); the
//    last segment of a row also copies the row's last row_bytes % vector bytes one byte at a time.
//    Groups grid-stride over (row, segment) pairs, so short rows, long rows and a single contiguous
//    run all fill the device.
//  - elements: anything else (transposes, permutations, strided innermost axes). Threads grid-stride
//    over the flat index and turn it into offsets with one division per axis.
// Index math is 32-bit when every count stays below 2^31 (headroom for the grid stride) and 64-bit
// otherwise; byte offsets are always 64-bit.

#include "kernels/copy_kernels.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "src/core/strided.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/dtype.hpp"

namespace wb::kernels {
namespace {

constexpr int kThreads = 256;  // threads per block
constexpr int kUnroll = 4;     // loads in flight per thread
constexpr int kCachedDevices = 64;
constexpr std::int64_t kNarrowLimit = std::int64_t{1} << 31;

std::atomic<bool> g_force_wide_index{false};

// ---------------------------------------------------------------------------------------------------
// Kernels. Axis 0 is the outermost; strides are in bytes.

template <class Index>
struct RowArgs {
  int outer_ndim;                                  // axes above the contiguous row
  Index outer_extent[kMaxCopyDims];
  std::int64_t dst_stride[kMaxCopyDims];
  std::int64_t src_stride[kMaxCopyDims];
  Index vectors_per_row;
  Index tail_bytes;                                // after the vectors, < sizeof(Vec)
  Index segments_per_row;                          // at least 1
  Index items;                                     // rows * segments_per_row
  int lane_bits;                                   // log2(threads per segment)
};

template <class Index>
struct ElementArgs {
  int ndim;
  Index extent[kMaxCopyDims];
  std::int64_t dst_stride[kMaxCopyDims];
  std::int64_t src_stride[kMaxCopyDims];
  Index numel;
};

// Byte offsets of the multi-index `flat` (row-major over extent[0..ndim)). The loop is unrolled so
// that the arguments are read with constant indices and stay in the parameter bank.
template <class Index>
__device__ __forceinline__ void flat_to_offsets(Index flat, int ndim, const Index* extent, const std::int64_t* dst_stride,
                                                const std::int64_t* src_stride, std::int64_t& dst_offset,
                                                std::int64_t& src_offset) {
  dst_offset = 0;
  src_offset = 0;
#pragma unroll
  for (int axis = kMaxCopyDims - 1; axis >= 0; --axis) {
    if (axis < ndim) {
      Index index = flat;
      if (axis > 0) {
        const Index quotient = flat / extent[axis];
        index = flat - quotient * extent[axis];
        flat = quotient;
      }
      dst_offset += static_cast<std::int64_t>(index) * dst_stride[axis];
      src_offset += static_cast<std::int64_t>(index) * src_stride[axis];
    }
  }
}

template <class Vec, class Index>
__global__ void __launch_bounds__(kThreads) copy_rows_kernel(char* __restrict__ dst, const char* __restrict__ src,
                                                             const RowArgs<Index> args) {
  const Index lanes = Index{1} << args.lane_bits;
  const Index groups_per_block = static_cast<Index>(kThreads) >> args.lane_bits;
  const Index lane = static_cast<Index>(threadIdx.x) & (lanes - 1);
  const Index segment_length = lanes * kUnroll;
  for (Index item = static_cast<Index>(blockIdx.x) * groups_per_block + (static_cast<Index>(threadIdx.x) >> args.lane_bits);
       item < args.items; item += static_cast<Index>(gridDim.x) * groups_per_block) {
    const Index row = item / args.segments_per_row;
    const Index segment = item - row * args.segments_per_row;
    std::int64_t dst_offset, src_offset;
    flat_to_offsets<Index>(row, args.outer_ndim, args.outer_extent, args.dst_stride, args.src_stride, dst_offset,
                           src_offset);
    Vec* __restrict__ d = reinterpret_cast<Vec*>(dst + dst_offset);
    const Vec* __restrict__ s = reinterpret_cast<const Vec*>(src + src_offset);
    const Index begin = segment * segment_length + lane;
    const Index segment_end = segment * segment_length + segment_length;
    const Index end = segment_end < args.vectors_per_row ? segment_end : args.vectors_per_row;
    Vec values[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index v = begin + static_cast<Index>(u) * lanes;
      if (v < end) values[u] = s[v];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index v = begin + static_cast<Index>(u) * lanes;
      if (v < end) d[v] = values[u];
    }
    if (args.tail_bytes != 0 && segment + 1 == args.segments_per_row) {
      const std::int64_t head = static_cast<std::int64_t>(args.vectors_per_row) * static_cast<std::int64_t>(sizeof(Vec));
      for (Index b = lane; b < args.tail_bytes; b += lanes) dst[dst_offset + head + b] = src[src_offset + head + b];
    }
  }
}

// One element: kWords words, for elements whose address is only word-aligned.
template <class Word, int kWords>
struct alignas(sizeof(Word)) ElementBits {
  Word word[kWords];
};

template <class Word, int kWords, class Index>
__global__ void __launch_bounds__(kThreads) copy_elements_kernel(char* __restrict__ dst, const char* __restrict__ src,
                                                                 const ElementArgs<Index> args) {
  using Element = ElementBits<Word, kWords>;
  const Index stride = static_cast<Index>(gridDim.x) * (kThreads * kUnroll);
  for (Index base = static_cast<Index>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x; base < args.numel;
       base += stride) {
    Element values[kUnroll];
    std::int64_t dst_offset[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + static_cast<Index>(u) * kThreads;
      if (i < args.numel) {
        std::int64_t src_offset;
        flat_to_offsets<Index>(i, args.ndim, args.extent, args.dst_stride, args.src_stride, dst_offset[u], src_offset);
        values[u] = *reinterpret_cast<const Element*>(src + src_offset);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const Index i = base + static_cast<Index>(u) * kThreads;
      if (i < args.numel) *reinterpret_cast<Element*>(dst + dst_offset[u]) = values[u];
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Host side.

std::string describe(const TensorView& view) {
  return std::string(dtype_name(view.dtype)) + shape_to_string(view.shape) + " strides " + shape_to_string(view.strides) +
         (view.memory == MemoryKind::kCuda ? " on cuda:" + std::to_string(view.device) : std::string(" in host memory"));
}

Status invalid(const std::string& what) {
  return Status(ErrorCode::kInvalidArgument, "wb::kernels::copy_tensor: " + what);
}

// The largest power of two that divides every value, capped at `cap` (a power of two).
int common_alignment(std::initializer_list<std::uint64_t> values, std::span<const std::int64_t> more, int cap) {
  std::uint64_t bits = static_cast<std::uint64_t>(cap);
  for (std::uint64_t v : values) bits |= v;
  for (std::int64_t v : more) bits |= static_cast<std::uint64_t>(v < 0 ? -v : v);
  return static_cast<int>(bits & (~bits + 1));  // lowest set bit
}

// Blocks of kKernel that the current device (`device`) runs at once: one full wave. A grid-stride
// kernel needs no more, and a second, partial wave would only start when whole blocks of the first
// finish. Queried once per kernel and device; the fallbacks only size the grid.
template <auto kKernel>
std::int64_t wave_blocks(int device) {
  static std::atomic<int> cache[kCachedDevices] = {};
  const bool cacheable = device >= 0 && device < kCachedDevices;
  if (cacheable) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();
    sms = 132;  // H100/H200
  }
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0) != cudaSuccess || per_sm <= 0) {
    (void)cudaGetLastError();
    per_sm = 4;
  }
  const int blocks = sms * per_sm;
  if (cacheable) cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

// Launches kKernel on `work_blocks` blocks' worth of work, at most one wave of them.
template <auto kKernel, class... Args>
void launch_kernel(std::int64_t work_blocks, int device, cudaStream_t stream, const Args&... args) {
  const dim3 grid(static_cast<unsigned>(std::clamp<std::int64_t>(work_blocks, 1, wave_blocks<kKernel>(device))));
  kKernel<<<grid, kThreads, 0, stream>>>(args...);
}

int ceil_log2(std::int64_t value) {
  int bits = 0;
  while ((std::int64_t{1} << bits) < value) ++bits;
  return bits;
}

// Makes `device` current until destroyed; never throws (update path).
class ScopedDevice {
 public:
  Status enter(int device) {
    WB_TRY_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) {
      WB_TRY_CUDA(cudaSetDevice(device));
      switched_ = true;
    }
    return Status::ok();
  }
  ~ScopedDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

template <class Index>
void launch_rows(const CopyPlan& plan, std::size_t element_bytes, char* dst, const char* src, cudaStream_t stream,
                 int device) {
  const int n = plan.ndim;
  const auto element = static_cast<std::int64_t>(element_bytes);
  const auto vector = static_cast<std::int64_t>(plan.vector_bytes);
  RowArgs<Index> args{};
  args.outer_ndim = n - 1;
  for (int axis = 0; axis + 1 < n; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    args.outer_extent[axis] = static_cast<Index>(plan.shape[a]);
    args.dst_stride[axis] = plan.dst_strides[a] * element;
    args.src_stride[axis] = plan.src_strides[a] * element;
  }
  const std::int64_t row_bytes = plan.shape.back() * element;
  const std::int64_t vectors = row_bytes / vector;
  const int lane_bits = std::min(ceil_log2((vectors + kUnroll - 1) / kUnroll), ceil_log2(kThreads));
  const std::int64_t segment_length = (std::int64_t{1} << lane_bits) * kUnroll;
  const std::int64_t segments = std::max<std::int64_t>(1, (vectors + segment_length - 1) / segment_length);
  const std::int64_t rows = shape_numel(std::span(plan.shape).first(static_cast<std::size_t>(n - 1)));
  args.vectors_per_row = static_cast<Index>(vectors);
  args.tail_bytes = static_cast<Index>(row_bytes - vectors * vector);
  args.segments_per_row = static_cast<Index>(segments);
  args.items = static_cast<Index>(rows * segments);
  args.lane_bits = lane_bits;
  const std::int64_t groups_per_block = kThreads >> lane_bits;
  const std::int64_t blocks = (rows * segments + groups_per_block - 1) / groups_per_block;
  switch (plan.vector_bytes) {
    case 16: return launch_kernel<copy_rows_kernel<uint4, Index>>(blocks, device, stream, dst, src, args);
    case 8: return launch_kernel<copy_rows_kernel<uint2, Index>>(blocks, device, stream, dst, src, args);
    case 4: return launch_kernel<copy_rows_kernel<unsigned, Index>>(blocks, device, stream, dst, src, args);
    case 2: return launch_kernel<copy_rows_kernel<unsigned short, Index>>(blocks, device, stream, dst, src, args);
    default: return launch_kernel<copy_rows_kernel<unsigned char, Index>>(blocks, device, stream, dst, src, args);
  }
}

template <class Word, int kElement, class Index>
void launch_elements_kernel(std::int64_t blocks, int device, cudaStream_t stream, char* dst, const char* src,
                            const ElementArgs<Index>& args) {
  constexpr int kWords = kElement / static_cast<int>(sizeof(Word));
  launch_kernel<copy_elements_kernel<Word, kWords, Index>>(blocks, device, stream, dst, src, args);
}

// Elements of kElement bytes, loaded as the widest word their addresses allow.
template <int kElement, class Index>
void launch_elements_sized(int word_bytes, std::int64_t blocks, int device, cudaStream_t stream, char* dst,
                           const char* src, const ElementArgs<Index>& args) {
  if constexpr (kElement >= 8)
    if (word_bytes == 8)
      return launch_elements_kernel<unsigned long long, kElement, Index>(blocks, device, stream, dst, src, args);
  if constexpr (kElement >= 4)
    if (word_bytes == 4) return launch_elements_kernel<unsigned, kElement, Index>(blocks, device, stream, dst, src, args);
  if constexpr (kElement >= 2)
    if (word_bytes == 2)
      return launch_elements_kernel<unsigned short, kElement, Index>(blocks, device, stream, dst, src, args);
  launch_elements_kernel<unsigned char, kElement, Index>(blocks, device, stream, dst, src, args);
}

template <class Index>
void launch_elements(const CopyPlan& plan, std::size_t element_bytes, char* dst, const char* src,
                       cudaStream_t stream, int device) {
  ElementArgs<Index> args{};
  args.ndim = plan.ndim;
  for (int axis = 0; axis < plan.ndim; ++axis) {
    const auto a = static_cast<std::size_t>(axis);
    args.extent[axis] = static_cast<Index>(plan.shape[a]);
    args.dst_stride[axis] = plan.dst_strides[a] * static_cast<std::int64_t>(element_bytes);
    args.src_stride[axis] = plan.src_strides[a] * static_cast<std::int64_t>(element_bytes);
  }
  const std::int64_t numel = shape_numel(plan.shape);
  args.numel = static_cast<Index>(numel);
  const std::int64_t blocks = (numel + kThreads * kUnroll - 1) / (kThreads * kUnroll);
  switch (element_bytes) {
    case 8: return launch_elements_sized<8, Index>(plan.word_bytes, blocks, device, stream, dst, src, args);
    case 4: return launch_elements_sized<4, Index>(plan.word_bytes, blocks, device, stream, dst, src, args);
    case 2: return launch_elements_sized<2, Index>(plan.word_bytes, blocks, device, stream, dst, src, args);
    default: return launch_elements_sized<1, Index>(plan.word_bytes, blocks, device, stream, dst, src, args);
  }
}

// Launches the planned copy on the current device.
void launch(const CopyPlan& plan, const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  auto* d = static_cast<char*>(dst.data);
  const auto* s = static_cast<const char*>(src.data);
  const std::size_t element = dst.element_size();
  if (plan.path == CopyPlan::Path::kRows) {
    if (plan.wide_index) return launch_rows<std::uint64_t>(plan, element, d, s, stream, dst.device);
    return launch_rows<std::uint32_t>(plan, element, d, s, stream, dst.device);
  }
  if (plan.wide_index) return launch_elements<std::uint64_t>(plan, element, d, s, stream, dst.device);
  launch_elements<std::uint32_t>(plan, element, d, s, stream, dst.device);
}

Status copy_on_device(const TensorView& dst, const TensorView& src, cudaStream_t stream, bool synchronize) {
  CopyPlan plan;
  WB_RETURN_IF_ERROR(plan_copy(dst, src, &plan));
  if (plan.path == CopyPlan::Path::kNone) return Status::ok();
  ScopedDevice device;
  WB_RETURN_IF_ERROR(device.enter(dst.device));
  launch(plan, dst, src, stream);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    return make_call_error(ErrorCode::kCuda, "copy kernel launch",
                           std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc) + " (copying " +
                               describe(src) + " into " + describe(dst) + ")",
                           __FILE__, __LINE__);
  if (synchronize) WB_TRY_CUDA(cudaStreamSynchronize(stream));
  return Status::ok();
}

}  // namespace

Status plan_copy(const TensorView& dst, const TensorView& src, CopyPlan* plan) {
  *plan = CopyPlan{};
  if (dst.dtype != src.dtype)
    return invalid("dtype " + std::string(dtype_name(src.dtype)) + " into " + std::string(dtype_name(dst.dtype)));
  if (dst.shape != src.shape)
    return invalid("shape " + shape_to_string(src.shape) + " into " + shape_to_string(dst.shape));
  if (dst.strides.size() != dst.shape.size() || src.strides.size() != src.shape.size())
    return invalid("strides " + shape_to_string(src.strides) + " / " + shape_to_string(dst.strides) +
                   " do not match the shape " + shape_to_string(dst.shape));
  for (std::int64_t extent : dst.shape)
    if (extent < 0) return invalid("negative extent in shape " + shape_to_string(dst.shape));
  if (dst.memory != MemoryKind::kCuda || src.memory != MemoryKind::kCuda)
    return Status(ErrorCode::kUnsupported, "wb::kernels::copy_tensor copies CUDA memory only (" + describe(src) +
                                               " into " + describe(dst) + "); use wb::copy_tensor on the host");
  if (dst.device != src.device)
    return Status(ErrorCode::kUnsupported, "wb::kernels::copy_tensor: source on cuda:" + std::to_string(src.device) +
                                               ", destination on cuda:" + std::to_string(dst.device) +
                                               "; copies between devices go through a transport");
  const std::int64_t numel = dst.numel();
  if (numel == 0) return Status::ok();
  if (dst.data == nullptr || src.data == nullptr) return invalid("null data pointer for " + describe(dst.data ? src : dst));
  for (std::size_t a = 0; a < dst.shape.size(); ++a)
    if (dst.shape[a] > 1 && dst.strides[a] == 0)
      return invalid("destination " + describe(dst) + " writes elements more than once (stride 0 on axis " +
                     std::to_string(a) + ")");

  // Axes in the order of decreasing destination stride (then source stride), so the innermost axis is
  // the destination's densest and stores stay coalesced; any order is correct for an elementwise copy.
  std::vector<std::size_t> order(dst.shape.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    const std::int64_t dx = std::abs(dst.strides[x]), dy = std::abs(dst.strides[y]);
    if (dx != dy) return dx > dy;
    return std::abs(src.strides[x]) > std::abs(src.strides[y]);
  });
  Shape shape, dst_strides, src_strides;
  for (std::size_t a : order) {
    shape.push_back(dst.shape[a]);
    dst_strides.push_back(dst.strides[a]);
    src_strides.push_back(src.strides[a]);
  }
  detail::coalesce(shape, dst_strides, src_strides);
  const int ndim = static_cast<int>(shape.size());
  if (ndim > kMaxCopyDims)
    return Status(ErrorCode::kUnsupported, "wb::kernels::copy_tensor: " + std::to_string(ndim) +
                                               " axes after coalescing (at most " + std::to_string(kMaxCopyDims) +
                                               "): copying " + describe(src) + " into " + describe(dst));

  const auto element = static_cast<std::int64_t>(dst.element_size());
  const auto dst_address = reinterpret_cast<std::uintptr_t>(dst.data);
  const auto src_address = reinterpret_cast<std::uintptr_t>(src.data);
  plan->ndim = ndim;
  std::int64_t largest_count = numel;
  if (dst_strides.back() == 1 && src_strides.back() == 1) {
    plan->path = CopyPlan::Path::kRows;
    Shape outer_bytes;
    for (int a = 0; a + 1 < ndim; ++a) {
      outer_bytes.push_back(dst_strides[static_cast<std::size_t>(a)] * element);
      outer_bytes.push_back(src_strides[static_cast<std::size_t>(a)] * element);
    }
    const std::int64_t row_bytes = shape.back() * element;
    int vector = common_alignment({dst_address, src_address}, outer_bytes, 16);
    while (vector > row_bytes) vector /= 2;  // rows shorter than a vector use narrower ones
    plan->vector_bytes = vector;
    // rows * segments <= rows * max(vectors, 1): bounds every index the kernel forms.
    largest_count = numel / shape.back() * std::max<std::int64_t>(1, row_bytes / vector);
  } else {
    plan->path = CopyPlan::Path::kElements;
    plan->word_bytes = common_alignment({dst_address, src_address}, {}, static_cast<int>(element));
  }
  plan->wide_index = largest_count >= kNarrowLimit || g_force_wide_index.load(std::memory_order_relaxed);
  plan->shape = std::move(shape);
  plan->dst_strides = std::move(dst_strides);
  plan->src_strides = std::move(src_strides);
  return Status::ok();
}

Status copy_tensor_async(const TensorView& dst, const TensorView& src, void* stream) {
  return copy_on_device(dst, src, static_cast<cudaStream_t>(stream), false);
}

Status copy_tensor(const TensorView& dst, const TensorView& src) { return copy_on_device(dst, src, nullptr, true); }

namespace testing {
void force_wide_index(bool force) { g_force_wide_index.store(force, std::memory_order_relaxed); }
}  // namespace testing

}  // namespace wb::kernels
