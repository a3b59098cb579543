// Batched pack and assemble on a CUDA device (host API in pack_kernels.hpp).
//
// Compilation (host) works in bytes, as exec::CopyProgram does: a copy becomes a contiguous inner run
// repeated over outer axes (unit axes dropped, axes contiguous on both sides merged). Then:
//   - a transpose when the run is one 1/2/4/8-byte element and an outer axis is contiguous in the
//     parameter: the pair (that axis, the innermost one, contiguous in the buffer) is cut into tiles of
//     32 source rows, which a warp moves through shared memory so that both its loads and its stores walk
//     along contiguous rows (coalesced);
//   - otherwise runs: the innermost outer axis groups runs into items of at most kWorkItemBytes, a run
//     longer than that is cut into pieces; lanes move vectors as wide as the source and destination
//     alignments allow (16 bytes when they agree modulo 16), unaligned heads and tails byte by byte.
// Remaining axes are unrolled into items, so the kernel knows no axes: every item is a few KiB of
// independent work, a warp's worth.
//
// Launch: 256 threads per block, each warp a worker that strides over the items (warp w takes items w,
// w + W, ...), W = every warp of one wave of blocks (multiprocessors x resident blocks): neighbouring items,
// the pieces of one tensor, run at the same time. A lane keeps eight 16-byte loads in flight in a run item,
// sixteen elements in a tile. One launch moves the whole program; programs without tiles use an
// instantiation without shared memory, which more blocks fit beside.
#include "kernels/pack_kernels.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/checks.hpp"
#include "weightbridge/device.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::kernels {
namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kUnroll = 8;           // vectors in flight per lane in a run item
// Resident blocks per multiprocessor the kernel is compiled for: 4 caps registers at 64 per thread (32
// warps per multiprocessor, each with 4 KiB of loads in flight); tiles need a few more registers.
constexpr int kMinBlocksPerSm = 4;
constexpr int kMinBlocksPerSmWithTiles = 3;
constexpr std::size_t kMaxCopyAxes = 16;
constexpr i64 kMaxItems = std::numeric_limits<std::int32_t>::max();
// Intervals the disjointness check may list at once (24 bytes each) before it gives up with an error.
constexpr i64 kMaxCheckedIntervals = i64{1} << 24;

bool is_pack(exec::CopyDirection direction) { return static_cast<std::uint8_t>(direction) == 0; }

// ---------------------------------------------------------------------------------------------------
// The address arithmetic of an item, shared by the kernel and the host interpretation.

// tile_columns (pack_kernels.hpp) as a constant device code can use.
template <int kElement>
inline constexpr int kTileColumns = kElement == 8 ? 16 : 32;
static_assert(kTileColumns<1> == tile_columns(1) && kTileColumns<2> == tile_columns(2) &&
              kTileColumns<4> == tile_columns(4) && kTileColumns<8> == tile_columns(8));
// Bytes of a tile row in shared memory: the tile's columns plus a pad that makes the row an odd number of
// 4-byte banks (8 bytes for 8-byte elements, whose accesses go by half-warps), so that reading a column
// (one element of every row) hits 32 different banks.
template <int kElement>
inline constexpr int kTilePitch = kTileColumns<kElement> * kElement + (kElement == 8 ? 8 : 4);
constexpr int kTileBytes = kTileRows * kTilePitch<8>;  // the largest tile (8-byte elements)
static_assert(kTileBytes >= kTileRows * kTilePitch<4> && kTileBytes >= kTileRows * kTilePitch<1>);

struct RunGeometry {
  std::uint32_t head;  // bytes before the first width-aligned source byte (at most the run)
  std::uint32_t body;  // whole vectors after the head
  std::uint32_t tail;  // bytes after them
};

__host__ __device__ inline RunGeometry run_geometry(const CopyWorkItem& item, u64 source) {
  const std::uint32_t width = item.width;
  std::uint32_t head = static_cast<std::uint32_t>((width - (source & (width - 1))) & (width - 1));
  if (head > item.length) head = item.length;
  const std::uint32_t body = (item.length - head) / width;
  return {head, body, item.length - head - body * width};
}

// Vector v of a run item: its run and byte offset within that run.
__host__ __device__ inline void vector_position(const CopyWorkItem& item, const RunGeometry& g, std::uint32_t v,
                                                std::uint32_t& run, std::uint32_t& offset) {
  run = item.count == 1 ? 0 : v / g.body;
  offset = g.head + (v - run * g.body) * item.width;
}

// Edge byte e of a run item (heads and tails of every run, run after run).
__host__ __device__ inline void edge_position(const CopyWorkItem& item, const RunGeometry& g, std::uint32_t e,
                                              std::uint32_t& run, std::uint32_t& offset) {
  const std::uint32_t edge = g.head + g.tail;
  run = e / edge;
  const std::uint32_t b = e - run * edge;
  offset = b < g.head ? b : g.head + g.body * item.width + (b - g.head);
}

// ---------------------------------------------------------------------------------------------------
// The kernel.

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

// One tile: source rows into shared memory (each step, lanes read along a source row), then destination
// rows out of it (lane r writes the element of source row r: lanes write along a destination row).
template <int kElement, int kAccess>
__device__ __forceinline__ void copy_tile(const CopyWorkItem& item, const char* __restrict__ src, char* __restrict__ dst,
                                          unsigned lane, char* tile) {
  using Word = typename Vector<kAccess>::type;
  constexpr int kWords = kElement / kAccess;
  constexpr int kColumns = kTileColumns<kElement>;
  constexpr int kRowsPerStep = 32 / kColumns;
  constexpr int kSteps = kTileRows / kRowsPerStep;
  constexpr int kPitch = kTilePitch<kElement>;
  // Loads in flight per lane: elements in one access each, fewer when an element takes several.
  constexpr int kGroup = kWords == 1 ? 16 : 2;
  static_assert(kSteps % kGroup == 0);
  const int rows = item.count;
  const int column = static_cast<int>(lane) % kColumns;
  const int first_row = static_cast<int>(lane) / kColumns;
  const bool column_inside = column < item.length;
  // Row `first_row + k * kRowsPerStep` of the tile is `k * step_bytes` after `from`.
  const char* from = src + static_cast<i64>(first_row) * item.src_stride + column * kElement;
  const i64 step_bytes = static_cast<i64>(kRowsPerStep) * item.src_stride;
  char* into = tile + first_row * kPitch + column * kElement;
#pragma unroll 1
  for (int step0 = 0; step0 < kSteps; step0 += kGroup) {
    Word values[kGroup][kWords] = {};  // defined on every path: else the compiler carries them across items
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (column_inside && (step0 + u) * kRowsPerStep + first_row < rows) {
        const Word* word = reinterpret_cast<const Word*>(from + (step0 + u) * step_bytes);
#pragma unroll
        for (int w = 0; w < kWords; ++w) values[u][w] = word[w];
      }
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (column_inside && (step0 + u) * kRowsPerStep + first_row < rows) {
        Word* word = reinterpret_cast<Word*>(into + (step0 + u) * kRowsPerStep * kPitch);
#pragma unroll
        for (int w = 0; w < kWords; ++w) word[w] = values[u][w];
      }
    }
  }
  __syncwarp();
  const int row = static_cast<int>(lane);
  if (row < rows) {
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
  __syncwarp();  // the next item's loads overwrite the tile
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

__device__ __forceinline__ void dispatch_tile(const CopyWorkItem& item, const char* src, char* dst, unsigned lane,
                                              char* tile) {
  const int access = item.access;
  switch (item.width) {
    case 8:
      if (access == 8) return copy_tile<8, 8>(item, src, dst, lane, tile);
      if (access == 4) return copy_tile<8, 4>(item, src, dst, lane, tile);
      if (access == 2) return copy_tile<8, 2>(item, src, dst, lane, tile);
      return copy_tile<8, 1>(item, src, dst, lane, tile);
    case 4:
      if (access == 4) return copy_tile<4, 4>(item, src, dst, lane, tile);
      if (access == 2) return copy_tile<4, 2>(item, src, dst, lane, tile);
      return copy_tile<4, 1>(item, src, dst, lane, tile);
    case 2:
      if (access == 2) return copy_tile<2, 2>(item, src, dst, lane, tile);
      return copy_tile<2, 1>(item, src, dst, lane, tile);
    default: return copy_tile<1, 1>(item, src, dst, lane, tile);
  }
}

// Every item of the program. `src_base` and `dst_base` are added to the items' addresses: 0 on the
// parameter side (absolute), the buffer's address on the other. Programs without transposes use the
// instantiation without shared memory, which leaves more room for resident blocks.
template <bool kTransposes>
__global__ void __launch_bounds__(kThreads, kTransposes ? kMinBlocksPerSmWithTiles : kMinBlocksPerSm)
    copy_work_kernel(const CopyWorkItem* __restrict__ items, unsigned count, u64 src_base, u64 dst_base) {
  __shared__ alignas(16) char tiles[kTransposes ? kWarpsPerBlock : 1][kTransposes ? kTileBytes : 16];
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned workers = gridDim.x * kWarpsPerBlock;
  for (unsigned i = blockIdx.x * kWarpsPerBlock + warp; i < count; i += workers) {
    // Every lane reads the whole descriptor: one broadcast per 16 bytes.
    const uint4* raw = reinterpret_cast<const uint4*>(items + i);
    const uint4 halves[2] = {__ldg(raw), __ldg(raw + 1)};
    CopyWorkItem item;
    memcpy(&item, halves, sizeof item);
    const char* src = reinterpret_cast<const char*>(src_base + item.src);
    char* dst = reinterpret_cast<char*>(dst_base + item.dst);
    if constexpr (kTransposes) {
      if (item.kind == CopyWorkItem::kTranspose) {
        dispatch_tile(item, src, dst, lane, tiles[warp]);
        continue;
      }
    }
    dispatch_runs(item, src, dst, lane);
  }
}

// ---------------------------------------------------------------------------------------------------
// Compilation.

struct NormalAxis {
  i64 extent;
  i64 param_stride;   // bytes
  i64 buffer_stride;  // bytes
};

// A copy in bytes: `run` contiguous bytes on both sides, repeated over `axes` (outermost first).
struct Normal {
  std::size_t index = 0;  // in the input list, for errors
  std::uint32_t parameter = 0;
  i64 param_offset = 0;   // bytes from the parameter's base
  i64 buffer_offset = 0;
  i64 run = 0;            // 0: the copy moves nothing
  i64 bytes = 0;
  std::vector<NormalAxis> axes;
};

const char* direction_name(exec::CopyDirection direction) { return is_pack(direction) ? "pack" : "assemble"; }

std::string box_text(const CopyDescription& c) {
  std::string text = "[";
  for (std::size_t a = 0; a < c.extent.size(); ++a) {
    const i64 begin = a < c.box_offset.size() ? c.box_offset[a] : 0;
    text += (a ? ", " : "") + std::to_string(begin) + ":" + std::to_string(begin + c.extent[a]);
  }
  return text + "]";
}

std::string copy_text(exec::CopyDirection direction, std::size_t index, const CopyDescription& c) {
  return std::string(direction_name(direction)) + " copy " + std::to_string(index) + " (parameter " +
         std::to_string(c.parameter) + ", box " + box_text(c) + ", offset " + std::to_string(c.offset) + ", strides " +
         shape_to_string(c.strides) + ", buffer offset " + std::to_string(c.buffer_offset) + ", element bytes " +
         std::to_string(c.element_bytes) + ")";
}

[[noreturn]] void fail(exec::CopyDirection direction, std::size_t index, const CopyDescription& c, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, copy_text(direction, index, c) + ": " + why);
}

// Validates copy `index` (the rules of exec::CopyProgram) and returns it in bytes.
Normal normalize(exec::CopyDirection direction, std::size_t index, const CopyDescription& c,
                 std::span<const i64> parameter_bytes, i64 buffer_bytes) {
  auto bad = [&](const std::string& why) { fail(direction, index, c, why); };
  auto mul = [&](i64 a, i64 b) {
    i64 r;
    if (__builtin_mul_overflow(a, b, &r)) bad("sizes overflow 64 bits");
    return r;
  };
  auto add = [&](i64 a, i64 b) {
    i64 r;
    if (__builtin_add_overflow(a, b, &r)) bad("sizes overflow 64 bits");
    return r;
  };
  if (c.parameter >= parameter_bytes.size())
    bad("parameter index out of range (" + std::to_string(parameter_bytes.size()) + " parameters)");
  if (c.element_bytes == 0) bad("element size 0");
  const std::size_t ndim = c.extent.size();
  if (ndim > kMaxCopyAxes) bad("more than " + std::to_string(kMaxCopyAxes) + " axes");
  if (c.strides.size() != ndim) bad(std::to_string(c.strides.size()) + " strides for " + std::to_string(ndim) + " axes");
  bool empty = false;
  for (i64 e : c.extent) {
    if (e < 0) bad("negative extent");
    empty = empty || e == 0;
  }
  if (c.buffer_offset < 0) bad("negative buffer offset");
  Normal n;
  n.index = index;
  if (empty) return n;

  const i64 element = c.element_bytes;
  i64 lowest = c.offset, highest = c.offset;  // elements
  for (std::size_t a = 0; a < ndim; ++a) {
    const i64 reach = mul(c.extent[a] - 1, c.strides[a]);
    if (reach < 0) lowest = add(lowest, reach); else highest = add(highest, reach);
  }
  const i64 size = parameter_bytes[c.parameter];
  if (lowest < 0 || mul(add(highest, 1), element) > size)
    bad("elements [" + std::to_string(lowest) + ", " + std::to_string(highest + 1) + ") of " + std::to_string(element) +
        " bytes reach outside the parameter's " + std::to_string(size) + " bytes");
  i64 elements = 1;
  for (i64 e : c.extent) elements = mul(elements, e);
  n.bytes = mul(elements, element);
  if (add(c.buffer_offset, n.bytes) > buffer_bytes)
    bad("buffer bytes [" + std::to_string(c.buffer_offset) + ", " + std::to_string(c.buffer_offset + n.bytes) +
        ") reach outside the buffer's " + std::to_string(buffer_bytes) + " bytes");

  n.parameter = c.parameter;
  n.param_offset = c.offset * element;
  n.buffer_offset = c.buffer_offset;
  // The ranges checked above bound every product below.
  i64 dense = n.bytes;
  for (std::size_t a = 0; a < ndim; ++a) {
    const i64 extent = c.extent[a];
    dense /= extent;
    if (extent == 1) continue;
    const NormalAxis axis{extent, c.strides[a] * element, dense};
    if (!n.axes.empty() && n.axes.back().param_stride == extent * axis.param_stride &&
        n.axes.back().buffer_stride == extent * axis.buffer_stride) {
      n.axes.back() = {n.axes.back().extent * extent, axis.param_stride, axis.buffer_stride};
    } else {
      n.axes.push_back(axis);
    }
  }
  n.run = element;
  while (!n.axes.empty() && n.axes.back().param_stride == n.run) {
    n.run *= n.axes.back().extent;
    n.axes.pop_back();
  }
  return n;
}

// --- disjoint destinations -------------------------------------------------------------------------

struct Interval {
  i64 begin, end;     // bytes
  std::size_t copy;   // index in the input list
};

// Where an assemble copy writes in its parameter: `unit` contiguous bytes from `lowest`, repeated over
// `outer` (extent, stride > 0), smallest stride first. Axes with negative strides are walked the other
// way (the same set of bytes); axes that continue the unit contiguously are merged into it.
struct WritePattern {
  i64 lowest = 0, highest = 0;  // [lowest, highest): the hull
  i64 unit = 0;
  std::vector<std::pair<i64, i64>> outer;
  bool nested = true;  // every axis steps past everything inside it: no byte is written twice
  i64 intervals() const {
    i64 count = 1;
    for (const auto& [extent, stride] : outer) count *= extent;
    return count;
  }
};

WritePattern parameter_writes(const Normal& n) {
  WritePattern p;
  p.lowest = n.param_offset;
  std::vector<std::pair<i64, i64>> axes;  // (stride, extent), strides made positive
  for (const NormalAxis& a : n.axes) {
    if (a.param_stride < 0) p.lowest += (a.extent - 1) * a.param_stride;
    axes.emplace_back(a.param_stride < 0 ? -a.param_stride : a.param_stride, a.extent);
  }
  std::sort(axes.begin(), axes.end());
  p.unit = n.run;
  std::size_t first = 0;
  while (first < axes.size() && axes[first].first == p.unit) p.unit *= axes[first++].second;
  i64 reach = p.unit;
  for (std::size_t a = first; a < axes.size(); ++a) {
    const auto [stride, extent] = axes[a];
    p.nested = p.nested && stride >= reach;
    reach += (extent - 1) * stride;
    p.outer.emplace_back(extent, stride);
  }
  p.highest = p.lowest + reach;
  return p;
}

void list_intervals(const WritePattern& p, std::size_t copy, std::vector<Interval>& out) {
  std::vector<i64> index(p.outer.size(), 0);
  i64 at = p.lowest;
  for (;;) {
    out.push_back({at, at + p.unit, copy});
    std::size_t a = 0;
    for (; a < p.outer.size(); ++a) {
      at += p.outer[a].second;
      if (++index[a] < p.outer[a].first) break;
      at -= p.outer[a].first * p.outer[a].second;
      index[a] = 0;
    }
    if (a == p.outer.size()) return;
  }
}

// Throws unless no two bytes of `intervals` coincide (sorted here).
void require_disjoint(std::vector<Interval>& intervals, exec::CopyDirection direction, std::span<const CopyDescription> copies,
                      const char* where) {
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.begin != b.begin ? a.begin < b.begin : a.copy < b.copy; });
  for (std::size_t i = 1; i < intervals.size(); ++i) {
    const Interval& a = intervals[i - 1];
    const Interval& b = intervals[i];
    if (b.begin >= a.end) continue;
    const std::size_t later = std::max(a.copy, b.copy), earlier = std::min(a.copy, b.copy);
    const std::string range = std::string(where) + " bytes [" + std::to_string(b.begin) + ", " +
                              std::to_string(std::min(a.end, b.end)) + ")";
    fail(direction, later, copies[later],
         later == earlier ? "writes " + range + " more than once (destinations overlap)"
                          : "its destination overlaps that of " + copy_text(direction, earlier, copies[earlier]) +
                                " at " + range + "; the kernel runs copies in any order, so destinations must be disjoint");
  }
}

// Destinations must be disjoint: buffer ranges for a pack; for an assemble, parameter bytes. There, copies
// whose hulls overlap (interleaved pieces of one tensor) and copies that do not provably write each byte
// once list their written intervals, which are sorted and compared.
void check_disjoint(exec::CopyDirection direction, const std::vector<Normal>& normals,
                    std::span<const CopyDescription> copies) {
  std::vector<Interval> intervals;
  if (is_pack(direction)) {
    for (const Normal& n : normals) intervals.push_back({n.buffer_offset, n.buffer_offset + n.bytes, n.index});
    require_disjoint(intervals, direction, copies, "buffer");
    return;
  }
  std::vector<WritePattern> patterns;
  patterns.reserve(normals.size());
  for (const Normal& n : normals) patterns.push_back(parameter_writes(n));
  std::vector<std::size_t> order(normals.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (normals[a].parameter != normals[b].parameter) return normals[a].parameter < normals[b].parameter;
    return patterns[a].lowest < patterns[b].lowest;
  });
  for (std::size_t begin = 0; begin < order.size();) {
    // A cluster: copies of one parameter whose hulls chain-overlap.
    std::size_t end = begin + 1;
    i64 highest = patterns[order[begin]].highest;
    while (end < order.size() && normals[order[end]].parameter == normals[order[begin]].parameter &&
           patterns[order[end]].lowest < highest) {
      highest = std::max(highest, patterns[order[end]].highest);
      ++end;
    }
    if (end - begin > 1 || !patterns[order[begin]].nested) {
      i64 listed = 0;
      for (std::size_t k = begin; k < end; ++k) listed += patterns[order[k]].intervals();
      if (listed > kMaxCheckedIntervals)
        throw Error(ErrorCode::kUnsupported,
                    copy_text(direction, normals[order[begin]].index, copies[normals[order[begin]].index]) + " and " +
                        std::to_string(end - begin - 1) + " copies interleaved with it write " + std::to_string(listed) +
                        " separate pieces of parameter " + std::to_string(normals[order[begin]].parameter) +
                        ": too many to prove them disjoint (at most " + std::to_string(kMaxCheckedIntervals) + ")");
      intervals.clear();
      intervals.reserve(static_cast<std::size_t>(listed));
      for (std::size_t k = begin; k < end; ++k) list_intervals(patterns[order[k]], normals[order[k]].index, intervals);
      require_disjoint(intervals, direction, copies, ("parameter " + std::to_string(normals[order[begin]].parameter)).c_str());
    }
    begin = end;
  }
}

// --- work items ------------------------------------------------------------------------------------

bool fits_int32(i64 value) {
  return value >= std::numeric_limits<std::int32_t>::min() && value <= std::numeric_limits<std::int32_t>::max();
}

// The largest power of two up to `cap` that divides every value (two's complement: negative ones too).
int common_alignment(std::initializer_list<u64> values, int cap) {
  u64 bits = static_cast<u64>(cap);
  for (u64 v : values) bits |= v;
  return static_cast<int>(bits & (~bits + 1));
}

struct Emitter {
  CopyWork& work;
  bool pack;
  u64 buffer;  // absolute; items store buffer-side addresses relative to it

  u64 stored_src(u64 address) const { return pack ? address : address - buffer; }
  u64 stored_dst(u64 address) const { return pack ? address - buffer : address; }

  void push(CopyWorkItem item) {
    if (static_cast<i64>(work.items.size()) >= kMaxItems)
      throw Error(ErrorCode::kUnsupported, std::string(pack ? "pack" : "assemble") + ": more than " +
                                               std::to_string(kMaxItems) + " work items in one program");
    work.items.push_back(item);
  }

  // `count` runs of `length` bytes at src + i * src_stride -> dst + i * dst_stride (absolute addresses).
  void runs(u64 src, u64 dst, i64 count, i64 src_stride, i64 dst_stride, i64 length) {
    if (length > kWorkItemBytes || !fits_int32(src_stride) || !fits_int32(dst_stride)) {
      for (i64 i = 0; i < count; ++i) long_run(src + static_cast<u64>(i * src_stride), dst + static_cast<u64>(i * dst_stride), length);
      return;
    }
    const i64 per_item = std::min<i64>({count, kWorkItemBytes / length, std::numeric_limits<std::uint16_t>::max()});
    for (i64 first = 0; first < count; first += per_item) {
      CopyWorkItem item;
      const u64 s = src + static_cast<u64>(first * src_stride), d = dst + static_cast<u64>(first * dst_stride);
      item.count = static_cast<std::uint16_t>(std::min(per_item, count - first));
      item.length = static_cast<std::uint16_t>(length);
      item.src = stored_src(s);
      item.dst = stored_dst(d);
      item.src_stride = static_cast<std::int32_t>(src_stride);
      item.dst_stride = static_cast<std::int32_t>(dst_stride);
      item.width = static_cast<std::uint8_t>(
          item.count > 1 ? common_alignment({s - d, static_cast<u64>(src_stride), static_cast<u64>(dst_stride)}, 16)
                         : common_alignment({s - d}, 16));
      push(item);
      ++work.stats.run_items;
    }
  }

  // One run in pieces of kWorkItemBytes; the first is longer by the bytes up to a 16-byte-aligned source
  // address, so that every later piece starts aligned.
  void long_run(u64 src, u64 dst, i64 length) {
    const int width = common_alignment({src - dst}, 16);
    i64 done = 0;
    while (done < length) {
      const i64 piece = done == 0 ? std::min(length, static_cast<i64>((16 - (src & 15)) & 15) + kWorkItemBytes)
                                  : std::min(length - done, kWorkItemBytes);
      CopyWorkItem item;
      item.count = 1;
      item.length = static_cast<std::uint16_t>(piece);
      item.src = stored_src(src + static_cast<u64>(done));
      item.dst = stored_dst(dst + static_cast<u64>(done));
      item.width = static_cast<std::uint8_t>(width);
      push(item);
      ++work.stats.run_items;
      done += piece;
    }
  }
};

// Calls fn(src offset, dst offset) at every point of `axes` (extent, src stride, dst stride).
template <class Fn>
void for_each_point(const std::vector<std::array<i64, 3>>& axes, Fn&& fn) {
  std::vector<i64> index(axes.size(), 0);
  i64 src = 0, dst = 0;
  for (;;) {
    fn(src, dst);
    std::size_t a = axes.size();
    while (a-- > 0) {
      src += axes[a][1];
      dst += axes[a][2];
      if (++index[a] < axes[a][0]) break;
      src -= axes[a][0] * axes[a][1];
      dst -= axes[a][0] * axes[a][2];
      index[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) return;
  }
}

void emit(const Normal& n, Emitter& emitter, u64 parameter) {
  const bool pack = emitter.pack;
  const u64 param_start = parameter + static_cast<u64>(n.param_offset);
  const u64 buffer_start = emitter.buffer + static_cast<u64>(n.buffer_offset);
  const u64 src0 = pack ? param_start : buffer_start, dst0 = pack ? buffer_start : param_start;
  auto oriented = [pack](const NormalAxis& a) {
    return pack ? std::array<i64, 3>{a.extent, a.param_stride, a.buffer_stride}
                : std::array<i64, 3>{a.extent, a.buffer_stride, a.param_stride};
  };

  // A transpose: one-element runs, and an outer axis k contiguous in the parameter besides the innermost
  // one j (contiguous in the buffer).
  std::size_t k = n.axes.size();
  if ((n.run == 1 || n.run == 2 || n.run == 4 || n.run == 8) && n.axes.size() >= 2)
    for (std::size_t a = 0; a + 1 < n.axes.size(); ++a)
      if (n.axes[a].param_stride == n.run) k = a;
  if (k < n.axes.size()) {
    const std::size_t j = n.axes.size() - 1;
    // Source rows run along the axis contiguous in the destination, source columns along the one
    // contiguous in the source.
    const std::array<i64, 3> rows = oriented(n.axes[pack ? j : k]), columns = oriented(n.axes[pack ? k : j]);
    if (fits_int32(rows[1]) && fits_int32(columns[2])) {
      std::vector<std::array<i64, 3>> outer;
      for (std::size_t a = 0; a < j; ++a)
        if (a != k) outer.push_back(oriented(n.axes[a]));
      const int element = static_cast<int>(n.run);
      u64 strides = 0;
      for (const auto& axis : outer) strides |= static_cast<u64>(axis[1]) | static_cast<u64>(axis[2]);
      const int access = common_alignment({src0, dst0, static_cast<u64>(rows[1]), static_cast<u64>(columns[2]), strides}, element);
      const i64 tile_cols = tile_columns(element);
      for_each_point(outer, [&](i64 src_offset, i64 dst_offset) {
        const u64 s = src0 + static_cast<u64>(src_offset), d = dst0 + static_cast<u64>(dst_offset);
        for (i64 r0 = 0; r0 < rows[0]; r0 += kTileRows)
          for (i64 c0 = 0; c0 < columns[0]; c0 += tile_cols) {
            CopyWorkItem item;
            item.kind = CopyWorkItem::kTranspose;
            item.src = emitter.stored_src(s + static_cast<u64>(r0 * rows[1] + c0 * element));
            item.dst = emitter.stored_dst(d + static_cast<u64>(c0 * columns[2] + r0 * element));
            item.src_stride = static_cast<std::int32_t>(rows[1]);
            item.dst_stride = static_cast<std::int32_t>(columns[2]);
            item.count = static_cast<std::uint16_t>(std::min<i64>(kTileRows, rows[0] - r0));
            item.length = static_cast<std::uint16_t>(std::min(tile_cols, columns[0] - c0));
            item.width = static_cast<std::uint8_t>(element);
            item.access = static_cast<std::uint8_t>(access);
            emitter.push(item);
            ++emitter.work.stats.transpose_items;
          }
      });
      emitter.work.stats.transposed_bytes += n.bytes;
      emitter.work.has_transposes = true;
      return;
    }
  }

  if (n.axes.empty()) return emitter.runs(src0, dst0, 1, 0, 0, n.run);
  std::vector<std::array<i64, 3>> outer;
  for (std::size_t a = 0; a + 1 < n.axes.size(); ++a) outer.push_back(oriented(n.axes[a]));
  const std::array<i64, 3> group = oriented(n.axes.back());
  for_each_point(outer, [&](i64 src_offset, i64 dst_offset) {
    emitter.runs(src0 + static_cast<u64>(src_offset), dst0 + static_cast<u64>(dst_offset), group[0], group[1], group[2], n.run);
  });
}

// ---------------------------------------------------------------------------------------------------
// Host side of the device.

Status cuda_status(cudaError_t rc, const char* call, const std::string& context) {
  return make_call_error(ErrorCode::kCuda, call,
                         std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc) + " (" + context + ")",
                         __FILE__, __LINE__);
}

// Makes a device current until destroyed, for the update path: never throws.
class CurrentDevice {
 public:
  Status enter(int device) {
    WB_TRY_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) {
      WB_TRY_CUDA(cudaSetDevice(device));
      switched_ = true;
    }
    return Status::ok();
  }
  ~CurrentDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Blocks of `kernel` one wave of `device` holds: the grid of a program with at least that much work.
template <class Kernel>
int wave_blocks(Kernel kernel, int device) {
  int sms = 0, per_sm = 0;
  WB_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  WB_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  return std::max(1, sms * std::max(1, per_sm));
}

// Checks what the kernel assumes of an item: a known kind and width, aligned vectors or words, tiles
// within bounds. Returns the reason, empty when it holds.
std::string malformed(const CopyWorkItem& item, u64 src, u64 dst) {
  const u64 width = item.width;
  if (item.kind == CopyWorkItem::kRuns) {
    if (width != 1 && width != 2 && width != 4 && width != 8 && width != 16) return "vector width " + std::to_string(width);
    if (item.count == 0 || item.length == 0) return "empty run item";
    const RunGeometry g = run_geometry(item, src);
    if (g.body == 0) return {};  // bytes only
    if (((src + g.head) | (dst + g.head)) & (width - 1)) return "source and destination disagree modulo the vector width";
    if (item.count > 1 && (static_cast<u64>(item.src_stride) | static_cast<u64>(item.dst_stride)) & (width - 1))
      return "strides not multiples of the vector width";
    return {};
  }
  if (item.kind != CopyWorkItem::kTranspose) return "kind " + std::to_string(item.kind);
  if (width != 1 && width != 2 && width != 4 && width != 8) return "element size " + std::to_string(width);
  const u64 access = item.access;
  if (access == 0 || access > width || width % access != 0) return "access " + std::to_string(access);
  if (item.count == 0 || item.count > kTileRows || item.length == 0 || item.length > tile_columns(static_cast<int>(width)))
    return "tile of " + std::to_string(item.count) + " x " + std::to_string(item.length);
  if ((src | dst | static_cast<u64>(item.src_stride) | static_cast<u64>(item.dst_stride)) & (access - 1))
    return "addresses not multiples of the access width";
  return {};
}

}  // namespace

CopyWork compile_copy_work(exec::CopyDirection direction, std::span<const CopyDescription> copies,
                           std::span<std::byte* const> parameters, std::span<const std::int64_t> parameter_bytes,
                           std::byte* buffer, std::int64_t buffer_bytes) {
  CopyWork work;
  work.direction = direction;
  work.buffer = reinterpret_cast<u64>(buffer);
  std::vector<Normal> normals;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    Normal n = normalize(direction, i, copies[i], parameter_bytes, buffer_bytes);
    if (n.run == 0) continue;
    if (n.parameter >= parameters.size())
      fail(direction, i, copies[i], "no base address for the parameter (" + std::to_string(parameters.size()) + " given)");
    ++work.stats.copies;
    work.stats.bytes += n.bytes;
    normals.push_back(std::move(n));
  }
  check_disjoint(direction, normals, copies);
  Emitter emitter{work, is_pack(direction), work.buffer};
  for (const Normal& n : normals) emit(n, emitter, reinterpret_cast<u64>(parameters[n.parameter]));
  work.stats.items = static_cast<i64>(work.items.size());
  work.stats.descriptor_bytes = work.stats.items * static_cast<i64>(sizeof(CopyWorkItem));
  return work;
}

DeviceCopyProgram::DeviceCopyProgram(CopyWork work, int device) : work_(std::move(work)), device_(device) {
  if (work_.items.empty()) return;  // nothing to launch: no device memory either
  if (cuda_device_count() == 0)
    throw Error(ErrorCode::kUnsupported, std::string("DeviceCopyProgram needs a CUDA device: ") + cuda_unavailable_reason());
  int previous = 0;
  WB_CHECK_CUDA(cudaGetDevice(&previous));
  if (previous != device) WB_CHECK_CUDA(cudaSetDevice(device));
  try {
    const std::size_t bytes = work_.items.size() * sizeof(CopyWorkItem);
    WB_CHECK_CUDA(cudaMalloc(&device_items_, bytes));
    WB_CHECK_CUDA(cudaMemcpy(device_items_, work_.items.data(), bytes, cudaMemcpyHostToDevice));
    const int wave = work_.has_transposes ? wave_blocks(copy_work_kernel<true>, device) : wave_blocks(copy_work_kernel<false>, device);
    const i64 needed = (static_cast<i64>(work_.items.size()) + kWarpsPerBlock - 1) / kWarpsPerBlock;
    blocks_ = static_cast<int>(std::min<i64>(needed, wave));
  } catch (...) {
    release();
    if (previous != device) (void)cudaSetDevice(previous);
    throw;
  }
  if (previous != device) WB_CHECK_CUDA(cudaSetDevice(previous));
}

DeviceCopyProgram::~DeviceCopyProgram() { release(); }

DeviceCopyProgram::DeviceCopyProgram(DeviceCopyProgram&& other) noexcept
    : work_(std::move(other.work_)),
      device_items_(std::exchange(other.device_items_, nullptr)),
      device_(other.device_),
      blocks_(std::exchange(other.blocks_, 0)) {
  other.work_ = CopyWork{};
}

DeviceCopyProgram& DeviceCopyProgram::operator=(DeviceCopyProgram&& other) noexcept {
  if (this != &other) {
    release();
    work_ = std::move(other.work_);
    other.work_ = CopyWork{};
    device_items_ = std::exchange(other.device_items_, nullptr);
    device_ = other.device_;
    blocks_ = std::exchange(other.blocks_, 0);
  }
  return *this;
}

void DeviceCopyProgram::release() noexcept {
  if (device_items_ == nullptr) return;
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ && cudaSetDevice(device_) == cudaSuccess;
  (void)cudaFree(device_items_);
  if (switched) (void)cudaSetDevice(previous);
  device_items_ = nullptr;
}

Status DeviceCopyProgram::execute(void* stream) const noexcept { return execute(stream, nullptr); }

Status DeviceCopyProgram::execute(void* stream, std::byte* buffer) const noexcept {
  if (work_.items.empty()) return Status::ok();
  const u64 base = buffer == nullptr ? work_.buffer : reinterpret_cast<u64>(buffer);
  if (((base - work_.buffer) & 15) != 0)
    return Status(ErrorCode::kInvalidArgument, std::string(direction_name(work_.direction)) +
                                                   " program compiled for a buffer at 16-byte alignment " +
                                                   std::to_string(work_.buffer & 15) + " executed on one at " +
                                                   std::to_string(base & 15));
  const bool pack = is_pack(work_.direction);
  const u64 src_base = pack ? 0 : base, dst_base = pack ? base : 0;
  CurrentDevice current;
  WB_RETURN_IF_ERROR(current.enter(device_));
  const auto* items = static_cast<const CopyWorkItem*>(device_items_);
  const auto count = static_cast<unsigned>(work_.items.size());
  const auto s = static_cast<cudaStream_t>(stream);
  if (work_.has_transposes)
    copy_work_kernel<true><<<blocks_, kThreads, 0, s>>>(items, count, src_base, dst_base);
  else
    copy_work_kernel<false><<<blocks_, kThreads, 0, s>>>(items, count, src_base, dst_base);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    return cuda_status(rc, "copy_work_kernel launch",
                       std::string(direction_name(work_.direction)) + " of " + std::to_string(work_.stats.bytes) +
                           " bytes in " + std::to_string(count) + " items on cuda:" + std::to_string(device_));
  return Status::ok();
}

namespace testing {

Status execute_on_host(const CopyWork& work, std::byte* buffer) {
  const u64 base = buffer == nullptr ? work.buffer : reinterpret_cast<u64>(buffer);
  if (((base - work.buffer) & 15) != 0)
    return Status(ErrorCode::kInvalidArgument, "buffer at 16-byte alignment " + std::to_string(base & 15) +
                                                   ", compiled for " + std::to_string(work.buffer & 15));
  const bool pack = is_pack(work.direction);
  const u64 src_base = pack ? 0 : base, dst_base = pack ? base : 0;
  for (std::size_t i = 0; i < work.items.size(); ++i) {
    const CopyWorkItem& item = work.items[i];
    const u64 src = src_base + item.src, dst = dst_base + item.dst;
    if (const std::string why = malformed(item, src, dst); !why.empty())
      return Status(ErrorCode::kInvalidArgument, "work item " + std::to_string(i) + ": " + why);
    const auto* s = reinterpret_cast<const std::byte*>(src);
    auto* d = reinterpret_cast<std::byte*>(dst);
    if (item.kind == CopyWorkItem::kTranspose) {
      for (i64 r = 0; r < item.count; ++r)
        for (i64 c = 0; c < item.length; ++c)
          std::memcpy(d + c * item.dst_stride + r * item.width, s + r * item.src_stride + c * item.width, item.width);
      continue;
    }
    const RunGeometry g = run_geometry(item, src);
    for (std::uint32_t v = 0; v < item.count * g.body; ++v) {
      std::uint32_t run, offset;
      vector_position(item, g, v, run, offset);
      std::memcpy(d + static_cast<i64>(run) * item.dst_stride + offset, s + static_cast<i64>(run) * item.src_stride + offset,
                  item.width);
    }
    if (g.head + g.tail == 0) continue;
    for (std::uint32_t e = 0; e < item.count * (g.head + g.tail); ++e) {
      std::uint32_t run, offset;
      edge_position(item, g, e, run, offset);
      d[static_cast<i64>(run) * item.dst_stride + offset] = s[static_cast<i64>(run) * item.src_stride + offset];
    }
  }
  return Status::ok();
}

}  // namespace testing

}  // namespace wb::kernels
