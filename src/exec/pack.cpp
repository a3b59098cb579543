// CPU pack and assemble (see pack.hpp).
//
// Compilation works in bytes. A copy becomes a "normal form": a run of `run` contiguous bytes (contiguous
// in the parameter and, the buffer being row-major, in the buffer too) repeated over outer axes with
// a parameter and a buffer stride each; unit axes are dropped and axes contiguous on both sides merged.
// Consecutive copies that continue one another are merged. Then each normal form becomes an op:
//   - a transpose when its run is one 1/2/4/8-byte element and some outer axis is contiguous in the
//     parameter (stride == run) while the innermost outer axis is contiguous in the buffer: the pair is
//     copied by a blocked transpose (SSE2 micro-kernels: 8x8 for 1 and 2 bytes, 4x4 for 4, 2x2 for 8;
//     for 2 bytes an AVX2 8x16 kernel and 32-byte streaming stores where the CPU has AVX2; 64 x 64-byte
//     tiles through an L1 scratch tile, 256 x 256-byte super-tiles, L2 prefetch), the remaining axes loop
//     around it;
//   - otherwise runs: memcpy of each run (a fixed-size copy for 1..64-byte power-of-two runs; streaming
//     stores for runs of 1 KiB and more when the program is large; source prefetch for strided runs).
// For assemble a transpose changes the order of the writes, so it is used only when the op cannot write
// an element twice (checked on the op's strides); otherwise the runs keep the row-major order of the
// definition.
//
// Measured on one core (bench/bench_pack.cpp): contiguous runs at memcpy speed, strided column boxes
// ~0.8-1x, transposes of [4096, 4096] bf16 ~0.5-0.6x of memcpy. A transpose is bound mostly by its access
// pattern (every row of a tile in the same cache set, a new DRAM page per 256 bytes): an AVX-512 32x32
// register tile, wider or narrower super-tiles, other prefetch hints and distances, a gather into a
// contiguous staging tile, and visiting the boxes of one matrix band by band all measured slower or no
// faster. Fewer instructions per tile did help: the AVX2 8x16 kernel with 32-byte streaming stores took
// bf16 pack from 0.48 to 0.52 and assemble from 0.53 to 0.59 of memcpy (medians of six interleaved runs);
// an AVX-512 8x32 kernel added only ~2% more, so 2-byte elements stop at AVX2 and the other sizes keep
// the SSE2 kernels (the baseline of x86-64).
#include "exec/pack.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "weightbridge/status.hpp"

#if defined(__SSE2__) && defined(__GNUC__)
#include <immintrin.h>
#define WB_PACK_SSE2 1
#endif

namespace wb::exec {
namespace {

using i64 = std::int64_t;
using Axis = CopyProgram::Axis;
using Op = CopyProgram::Op;
using Kind = CopyProgram::Kind;

constexpr std::size_t kMaxCopyAxes = 16;           // as round schedules allow
constexpr std::size_t kMaxOpAxes = kMaxCopyAxes + 1;  // merging may add one

// ---------------------------------------------------------------------------------------------------
// Compilation
// ---------------------------------------------------------------------------------------------------

struct NormalAxis {
  i64 extent;
  i64 param_stride;   // bytes
  i64 buffer_stride;  // bytes
  bool operator==(const NormalAxis&) const = default;
};

struct Normal {
  std::uint32_t parameter = 0;
  i64 param_offset = 0;   // bytes
  i64 buffer_offset = 0;  // bytes
  i64 run = 0;            // bytes, contiguous on both sides
  std::vector<NormalAxis> axes;  // outermost first; buffer-dense: axes.back().buffer_stride == run, etc.
  const BufferCopy* source = nullptr;  // the copy it was made from (before merging)
  i64 bytes() const {
    i64 b = run;
    for (const NormalAxis& a : axes) b *= a.extent;
    return b;
  }
};

const char* direction_name(CopyDirection direction) {
  return direction == CopyDirection::kPack ? "pack" : "assemble";
}

std::string join(std::span<const i64> values) { return shape_to_string(values); }

[[noreturn]] void fail(CopyDirection direction, std::size_t index, const BufferCopy& c, const std::string& why) {
  std::string message = std::string(direction_name(direction)) + " copy " + std::to_string(index) + " (parameter " +
                        std::to_string(c.copy.parameter) + ", box " + c.copy.box.to_string() + ", offset " +
                        std::to_string(c.copy.offset) + ", strides " + join(c.copy.strides) + ", buffer offset " +
                        std::to_string(c.buffer_offset) + ", element bytes " + std::to_string(c.element_bytes) +
                        "): " + why;
  throw Error(ErrorCode::kInvalidArgument, message);
}

/// Validates copy `index` and returns its normal form (nullopt-like: run == 0 when it moves nothing).
Normal normalize(CopyDirection direction, std::size_t index, const BufferCopy& c,
                 std::span<const i64> parameter_bytes, i64 buffer_bytes) {
  const SliceCopy& s = c.copy;
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

  if (s.parameter >= parameter_bytes.size())
    bad("parameter index out of range (" + std::to_string(parameter_bytes.size()) + " parameters)");
  if (c.element_bytes == 0) bad("element size 0");
  const std::size_t ndim = s.box.extent.size();
  if (ndim > kMaxCopyAxes) bad("more than " + std::to_string(kMaxCopyAxes) + " axes");
  if (s.strides.size() != ndim)
    bad(std::to_string(s.strides.size()) + " strides for " + std::to_string(ndim) + " axes");
  bool empty = false;
  for (i64 e : s.box.extent) {
    if (e < 0) bad("negative extent");
    empty = empty || e == 0;
  }
  if (c.buffer_offset < 0) bad("negative buffer offset");
  Normal n;
  if (empty) return n;

  const i64 es = c.element_bytes;
  // Parameter range, in elements: [lo, hi] around the offset.
  i64 lo = s.offset, hi = s.offset;
  for (std::size_t a = 0; a < ndim; ++a) {
    const i64 reach = mul(s.box.extent[a] - 1, s.strides[a]);
    if (reach < 0) lo = add(lo, reach); else hi = add(hi, reach);
  }
  const i64 param_size = parameter_bytes[s.parameter];
  if (lo < 0 || mul(add(hi, 1), es) > param_size)
    bad("elements [" + std::to_string(lo) + ", " + std::to_string(hi + 1) + ") of " + std::to_string(es) +
        " bytes reach outside the parameter's " + std::to_string(param_size) + " bytes");
  i64 numel = 1;
  for (i64 e : s.box.extent) numel = mul(numel, e);
  const i64 bytes = mul(numel, es);
  if (add(c.buffer_offset, bytes) > buffer_bytes)
    bad("buffer bytes [" + std::to_string(c.buffer_offset) + ", " + std::to_string(c.buffer_offset + bytes) +
        ") reach outside the buffer's " + std::to_string(buffer_bytes) + " bytes");

  n.parameter = s.parameter;
  n.source = &c;
  n.param_offset = s.offset * es;
  n.buffer_offset = c.buffer_offset;
  // Axes in bytes (products now fit: bounded by the ranges checked above), unit axes dropped, then axes
  // contiguous on both sides merged (outer stride == inner stride * inner extent).
  i64 dense = bytes;
  for (std::size_t a = 0; a < ndim; ++a) {
    const i64 extent = s.box.extent[a];
    dense /= extent;
    if (extent == 1) continue;
    const NormalAxis axis{extent, s.strides[a] * es, dense};
    if (!n.axes.empty() && n.axes.back().param_stride == extent * axis.param_stride &&
        n.axes.back().buffer_stride == extent * axis.buffer_stride) {
      n.axes.back().extent *= extent;
      n.axes.back().param_stride = axis.param_stride;
      n.axes.back().buffer_stride = axis.buffer_stride;
    } else {
      n.axes.push_back(axis);
    }
  }
  // The contiguous inner run.
  n.run = es;
  while (!n.axes.empty() && n.axes.back().param_stride == n.run) {
    n.run *= n.axes.back().extent;
    n.axes.pop_back();
  }
  return n;
}

/// Merges `b` into `a` when b continues a (same parameter, b's bytes right after a's in the buffer):
/// a longer run, a longer outermost axis, or a new outermost axis.
bool try_merge(Normal& a, const Normal& b) {
  if (a.parameter != b.parameter || b.buffer_offset != a.buffer_offset + a.bytes()) return false;
  const i64 delta = b.param_offset - a.param_offset;
  if (a.axes.empty() && b.axes.empty() && delta == a.run) {
    a.run += b.run;
    return true;
  }
  if (a.run != b.run) return false;
  // a is one slab of b's outermost axis, b the rest of it.
  if (a.axes.size() + 1 == b.axes.size() && delta == b.axes.front().param_stride &&
      std::equal(a.axes.begin(), a.axes.end(), b.axes.begin() + 1)) {
    NormalAxis outer = b.axes.front();
    outer.extent += 1;
    a.axes.insert(a.axes.begin(), outer);
    return true;
  }
  // b is a's outermost axis continued: same axes but the outermost extent, or a's inner axes exactly.
  if (!a.axes.empty()) {
    const NormalAxis& outer = a.axes.front();
    const bool continues = delta == outer.extent * outer.param_stride;
    if (continues && b.axes.size() == a.axes.size() && b.axes.front().param_stride == outer.param_stride &&
        b.axes.front().buffer_stride == outer.buffer_stride &&
        std::equal(a.axes.begin() + 1, a.axes.end(), b.axes.begin() + 1)) {
      a.axes.front().extent += b.axes.front().extent;
      return true;
    }
    if (continues && b.axes.size() + 1 == a.axes.size() && std::equal(b.axes.begin(), b.axes.end(), a.axes.begin() + 1)) {
      a.axes.front().extent += 1;
      return true;
    }
  }
  // Same shape, somewhere else in the parameter: a new outermost axis of extent 2.
  if (a.axes == b.axes && a.axes.size() < kMaxOpAxes && delta != 0) {
    const i64 bytes = a.bytes();
    a.axes.insert(a.axes.begin(), NormalAxis{2, delta, bytes});
    return true;
  }
  return false;
}

/// True when no two elements of the op land on the same parameter byte (a sufficient test: sorted by
/// |stride|, each axis steps past everything the smaller ones reach).
bool writes_each_byte_once(const Normal& n) {
  std::vector<std::pair<i64, i64>> axes;  // |stride|, extent
  for (const NormalAxis& a : n.axes) {
    if (a.param_stride == std::numeric_limits<i64>::min()) return false;
    axes.emplace_back(a.param_stride < 0 ? -a.param_stride : a.param_stride, a.extent);
  }
  std::sort(axes.begin(), axes.end());
  i64 reach = n.run;  // bytes covered by the smaller axes, from the first
  for (const auto& [stride, extent] : axes) {
    if (stride < reach) return false;
    i64 span;
    if (__builtin_mul_overflow(stride, extent - 1, &span) || __builtin_add_overflow(span, reach, &reach)) return false;
  }
  return true;
}

/// The parameter bytes [lo, hi) an op's elements lie in.
std::pair<i64, i64> param_interval(const Normal& n) {
  i64 lo = n.param_offset, hi = n.param_offset + n.run;
  for (const NormalAxis& a : n.axes) (a.param_stride < 0 ? lo : hi) += (a.extent - 1) * a.param_stride;
  return {lo, hi};
}

/// Whether d = Σ k_a·s_a + u for some |k_a| < n_a, |u| < run: then two copies of this shape `d` bytes apart
/// share a byte. `axes` are (|stride|, extent) by decreasing stride and each strides past the smaller ones
/// (writes_each_byte_once), so at most two k fit each axis; `reach[i]` is the bytes axes i.. cover.
bool difference_reachable(std::span<const std::pair<i64, i64>> axes, std::span<const i64> reach, std::size_t i,
                          i64 d, i64 run) {
  if (i == axes.size()) return d < run && -d < run;
  const auto [stride, extent] = axes[i];
  const i64 rest = reach[i + 1] - 1;  // |residual| allowed to the smaller axes
  // k with |d - k·stride| <= rest, inside (-extent, extent).
  auto floor_div = [](i64 a, i64 b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const i64 k_lo = std::max(-(extent - 1), -floor_div(-(d - rest), stride));
  const i64 k_hi = std::min(extent - 1, floor_div(d + rest, stride));
  if (k_hi - k_lo > 3) return true;  // not the separated shape assumed: be conservative
  for (i64 k = k_lo; k <= k_hi; ++k)
    if (difference_reachable(axes, reach, i + 1, d - k * stride, run)) return true;
  return false;
}

/// Two boxes of one affine map (same strides and element size, offsets that differ by the box offsets
/// times the strides: pieces of one source-map copy, whatever their shapes) that is one-to-one on the
/// boxes' bounding box: 1 when they share elements, 0 when not; -1 when the copies are not of that kind.
int boxes_of_one_map_overlap(const BufferCopy& a, const BufferCopy& b) {
  const SliceCopy &x = a.copy, &y = b.copy;
  const std::size_t ndim = x.box.extent.size();
  if (a.element_bytes != b.element_bytes || x.strides != y.strides || y.box.extent.size() != ndim ||
      x.box.offset.size() != ndim || y.box.offset.size() != ndim)
    return -1;
  i64 delta = 0;
  Normal hull;  // the bounding box's footprint shape, to test the map is one-to-one on it
  hull.run = a.element_bytes;
  bool disjoint = false;
  for (std::size_t i = 0; i < ndim; ++i) {
    const i64 xb = x.box.offset[i], yb = y.box.offset[i];
    i64 xe, ye, step, extent;
    if (__builtin_add_overflow(xb, x.box.extent[i], &xe) || __builtin_add_overflow(yb, y.box.extent[i], &ye) ||
        __builtin_sub_overflow(yb, xb, &step) || __builtin_mul_overflow(step, x.strides[i], &step) ||
        __builtin_add_overflow(delta, step, &delta) || __builtin_sub_overflow(std::max(xe, ye), std::min(xb, yb), &extent) ||
        __builtin_mul_overflow(x.strides[i], i64{a.element_bytes}, &step))
      return -1;
    if (extent > 1) hull.axes.push_back(NormalAxis{extent, step, 0});
    disjoint = disjoint || xe <= yb || ye <= xb;
  }
  if (delta != y.offset - x.offset || !writes_each_byte_once(hull)) return -1;
  return disjoint ? 0 : 1;
}

/// False only when the two ops certainly write no common parameter byte.
bool may_overlap(const Normal& a, const Normal& b) {
  if (a.parameter != b.parameter) return false;
  const auto [alo, ahi] = param_interval(a);
  const auto [blo, bhi] = param_interval(b);
  if (ahi <= blo || bhi <= alo) return false;
  if (a.source && b.source) {
    const int boxes = boxes_of_one_map_overlap(*a.source, *b.source);
    if (boxes >= 0) return boxes == 1;
  }
  // Translates of one shape (pieces of one tensor cut along an axis it is not contiguous on, as boxes
  // of a transposed matrix): exact test.
  if (a.run != b.run || a.axes.size() != b.axes.size()) return true;
  for (std::size_t i = 0; i < a.axes.size(); ++i)
    if (a.axes[i].extent != b.axes[i].extent || a.axes[i].param_stride != b.axes[i].param_stride) return true;
  if (!writes_each_byte_once(a)) return true;
  std::vector<std::pair<i64, i64>> axes;
  for (const NormalAxis& x : a.axes) axes.emplace_back(x.param_stride < 0 ? -x.param_stride : x.param_stride, x.extent);
  std::sort(axes.begin(), axes.end(), std::greater<>());
  std::vector<i64> reach(axes.size() + 1, a.run);
  for (std::size_t i = axes.size(); i-- > 0;) reach[i] = reach[i + 1] + (axes[i].second - 1) * axes[i].first;
  return difference_reachable(axes, reach, 0, b.param_offset - a.param_offset, a.run);
}

/// True when no two ops write a common parameter byte (so an assemble may run them in any order). Gives up
/// (false) past a budget of pairwise tests.
bool parameter_writes_disjoint(const std::vector<Normal>& normals) {
  std::vector<std::size_t> order(normals.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<std::pair<i64, i64>> intervals(normals.size());
  for (std::size_t i = 0; i < normals.size(); ++i) intervals[i] = param_interval(normals[i]);
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return normals[x].parameter != normals[y].parameter ? normals[x].parameter < normals[y].parameter
                                                        : intervals[x].first < intervals[y].first;
  });
  std::vector<std::size_t> active;  // same parameter, interval still open
  std::int64_t budget = 1 << 22;
  for (std::size_t i : order) {
    std::erase_if(active, [&](std::size_t j) {
      return normals[j].parameter != normals[i].parameter || intervals[j].second <= intervals[i].first;
    });
    for (std::size_t j : active) {
      if (--budget < 0 || may_overlap(normals[j], normals[i])) return false;
    }
    active.push_back(i);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Execution kernels
// ---------------------------------------------------------------------------------------------------

/// Calls inner(src, dst) at every point of the axes (outermost first).
template <class Inner>
inline void for_each_point(const Axis* axes, std::size_t count, const std::byte* src, std::byte* dst, Inner&& inner) {
  if (count == 0) {
    inner(src, dst);
    return;
  }
  const Axis last = axes[count - 1];
  if (count == 1) {
    for (i64 i = 0; i < last.extent; ++i, src += last.src_stride, dst += last.dst_stride) inner(src, dst);
    return;
  }
  i64 index[kMaxOpAxes] = {};
  for (;;) {
    const std::byte* s = src;
    std::byte* d = dst;
    for (i64 i = 0; i < last.extent; ++i, s += last.src_stride, d += last.dst_stride) inner(s, d);
    std::size_t a = count - 1;
    while (a-- > 0) {
      src += axes[a].src_stride;
      dst += axes[a].dst_stride;
      if (++index[a] < axes[a].extent) break;
      src -= axes[a].extent * axes[a].src_stride;
      dst -= axes[a].extent * axes[a].dst_stride;
      index[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) return;
  }
}

/// memcpy with streaming stores (whole 64-byte lines), ordinary stores for the unaligned head and tail.
#if WB_PACK_SSE2
void stream_copy_sse2(std::byte* dst, const std::byte* src, std::size_t n) {
  std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 64; n -= 64, dst += 64, src += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, n);
}

// 32-byte streaming stores where the CPU has AVX2 (chosen at run time; the build targets baseline x86-64).
__attribute__((target("avx2"))) void stream_copy_avx2(std::byte* dst, const std::byte* src, std::size_t n) {
  std::size_t head = (64 - (reinterpret_cast<std::uintptr_t>(dst) & 63)) & 63;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 128; n -= 128, dst += 128, src += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
  }
  if (n >= 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    dst += 64, src += 64, n -= 64;
  }
  std::memcpy(dst, src, n);
}

using StreamCopy = void (*)(std::byte*, const std::byte*, std::size_t);
const StreamCopy stream_copy = [] {
  __builtin_cpu_init();  // static initialization may run before libgcc's own
  return __builtin_cpu_supports("avx2") ? stream_copy_avx2 : stream_copy_sse2;
}();
#else
void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); }
#endif

template <std::size_t N>
void runs_fixed(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
  for_each_point(axes, op.axis_count, src, dst, [](const std::byte* s, std::byte* d) { std::memcpy(d, s, N); });
}

void execute_runs(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
  switch (op.run) {
    case 1: return runs_fixed<1>(op, axes, src, dst);
    case 2: return runs_fixed<2>(op, axes, src, dst);
    case 4: return runs_fixed<4>(op, axes, src, dst);
    case 8: return runs_fixed<8>(op, axes, src, dst);
    case 16: return runs_fixed<16>(op, axes, src, dst);
    case 32: return runs_fixed<32>(op, axes, src, dst);
    case 64: return runs_fixed<64>(op, axes, src, dst);
    default: break;
  }
  const auto run = static_cast<std::size_t>(op.run);
  // Runs that start a new source page or row each time (a column box): the hardware prefetchers ramp up
  // too late for a run of a few hundred bytes, so prefetch the source `op.prefetch_runs` runs ahead.
  if (op.prefetch_runs > 0) {
    const i64 ahead = op.prefetch_runs * axes[op.axis_count - 1].src_stride;
    const i64 lines = (op.run + 63) / 64 + 1;
    auto prefetch = [ahead, lines](const std::byte* s) {
      for (i64 i = 0; i < lines; ++i) __builtin_prefetch(s + ahead + i * 64, 0, 3);
    };
    if (op.streaming)
      for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
        prefetch(s);
        stream_copy(d, s, run);
      });
    else
      for_each_point(axes, op.axis_count, src, dst, [&](const std::byte* s, std::byte* d) {
        prefetch(s);
        std::memcpy(d, s, run);
      });
    return;
  }
  if (op.streaming)
    for_each_point(axes, op.axis_count, src, dst, [run](const std::byte* s, std::byte* d) { stream_copy(d, s, run); });
  else
    for_each_point(axes, op.axis_count, src, dst, [run](const std::byte* s, std::byte* d) { std::memcpy(d, s, run); });
}

// Micro-kernels: an M x M block, dst[c][r] = src[r][c]; strides in bytes.
template <std::size_t E>
struct Micro;

#if WB_PACK_SSE2
inline __m128i load(const std::byte* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void store(std::byte* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
inline __m128i load8(const std::byte* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
inline void store8(std::byte* p, __m128i v) { _mm_storel_epi64(reinterpret_cast<__m128i*>(p), v); }

template <>
struct Micro<1> {
  static constexpr i64 M = 8;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i b0 = _mm_unpacklo_epi8(load8(s), load8(s + ss));
    const __m128i b1 = _mm_unpacklo_epi8(load8(s + 2 * ss), load8(s + 3 * ss));
    const __m128i b2 = _mm_unpacklo_epi8(load8(s + 4 * ss), load8(s + 5 * ss));
    const __m128i b3 = _mm_unpacklo_epi8(load8(s + 6 * ss), load8(s + 7 * ss));
    const __m128i c0 = _mm_unpacklo_epi16(b0, b1), c1 = _mm_unpackhi_epi16(b0, b1);
    const __m128i c2 = _mm_unpacklo_epi16(b2, b3), c3 = _mm_unpackhi_epi16(b2, b3);
    const __m128i d0 = _mm_unpacklo_epi32(c0, c2), d1 = _mm_unpackhi_epi32(c0, c2);
    const __m128i d2 = _mm_unpacklo_epi32(c1, c3), d3 = _mm_unpackhi_epi32(c1, c3);
    store8(d, d0), store8(d + ds, _mm_unpackhi_epi64(d0, d0));
    store8(d + 2 * ds, d1), store8(d + 3 * ds, _mm_unpackhi_epi64(d1, d1));
    store8(d + 4 * ds, d2), store8(d + 5 * ds, _mm_unpackhi_epi64(d2, d2));
    store8(d + 6 * ds, d3), store8(d + 7 * ds, _mm_unpackhi_epi64(d3, d3));
  }
};

template <>
struct Micro<2> {
  static constexpr i64 M = 8;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i a0 = load(s), a1 = load(s + ss), a2 = load(s + 2 * ss), a3 = load(s + 3 * ss);
    const __m128i a4 = load(s + 4 * ss), a5 = load(s + 5 * ss), a6 = load(s + 6 * ss), a7 = load(s + 7 * ss);
    const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    const __m128i b4 = _mm_unpacklo_epi16(a4, a5), b5 = _mm_unpackhi_epi16(a4, a5);
    const __m128i b6 = _mm_unpacklo_epi16(a6, a7), b7 = _mm_unpackhi_epi16(a6, a7);
    const __m128i c0 = _mm_unpacklo_epi32(b0, b2), c1 = _mm_unpackhi_epi32(b0, b2);
    const __m128i c2 = _mm_unpacklo_epi32(b1, b3), c3 = _mm_unpackhi_epi32(b1, b3);
    const __m128i c4 = _mm_unpacklo_epi32(b4, b6), c5 = _mm_unpackhi_epi32(b4, b6);
    const __m128i c6 = _mm_unpacklo_epi32(b5, b7), c7 = _mm_unpackhi_epi32(b5, b7);
    store(d, _mm_unpacklo_epi64(c0, c4));
    store(d + ds, _mm_unpackhi_epi64(c0, c4));
    store(d + 2 * ds, _mm_unpacklo_epi64(c1, c5));
    store(d + 3 * ds, _mm_unpackhi_epi64(c1, c5));
    store(d + 4 * ds, _mm_unpacklo_epi64(c2, c6));
    store(d + 5 * ds, _mm_unpackhi_epi64(c2, c6));
    store(d + 6 * ds, _mm_unpacklo_epi64(c3, c7));
    store(d + 7 * ds, _mm_unpackhi_epi64(c3, c7));
  }
};

template <>
struct Micro<4> {
  static constexpr i64 M = 4;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i a0 = load(s), a1 = load(s + ss), a2 = load(s + 2 * ss), a3 = load(s + 3 * ss);
    const __m128i b0 = _mm_unpacklo_epi32(a0, a1), b1 = _mm_unpackhi_epi32(a0, a1);
    const __m128i b2 = _mm_unpacklo_epi32(a2, a3), b3 = _mm_unpackhi_epi32(a2, a3);
    store(d, _mm_unpacklo_epi64(b0, b2));
    store(d + ds, _mm_unpackhi_epi64(b0, b2));
    store(d + 2 * ds, _mm_unpacklo_epi64(b1, b3));
    store(d + 3 * ds, _mm_unpackhi_epi64(b1, b3));
  }
};

template <>
struct Micro<8> {
  static constexpr i64 M = 2;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    const __m128i a0 = load(s), a1 = load(s + ss);
    store(d, _mm_unpacklo_epi64(a0, a1));
    store(d + ds, _mm_unpackhi_epi64(a0, a1));
  }
};
#else
template <std::size_t E>
struct Micro {
  static constexpr i64 M = 4;
  static void run(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
    for (i64 r = 0; r < M; ++r)
      for (i64 c = 0; c < M; ++c) std::memcpy(d + c * ds + r * static_cast<i64>(E), s + r * ss + c * static_cast<i64>(E), E);
  }
};
#endif

/// Tiles are 64 bytes of a row on each side (one cache line), super-tiles 256 bytes.
template <std::size_t E>
constexpr i64 kTile = 64 / static_cast<i64>(E);
template <std::size_t E>
constexpr i64 kSuperTile = 256 / static_cast<i64>(E);

/// Writes one 64-byte tile row from the scratch tile (streaming stores when asked).
template <bool kStream>
inline void write_tile_row(std::byte* dst, const std::byte* row) {
#if WB_PACK_SSE2
  if constexpr (kStream) {
    for (int i = 0; i < 64; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_load_si128(reinterpret_cast<const __m128i*>(row + i)));
    return;
  }
#endif
  std::memcpy(dst, row, 64);
}

/// One whole tile (64 bytes of a row on each side) through a contiguous scratch tile: the source read 8
/// rows (one micro-kernel) at a time, one line per row, the destination written a full line per row
/// (streaming stores when `stream`: the destination and its row stride are 16-byte aligned).
template <std::size_t E>
void whole_tile(const std::byte* s, i64 ss, std::byte* d, i64 ds, bool stream) {
  constexpr i64 es = static_cast<i64>(E);
  constexpr i64 M = Micro<E>::M;
  constexpr i64 T = kTile<E>;
  static_assert(T % M == 0);
  alignas(64) std::byte scratch[T * 64];  // T rows of 64 bytes: the tile, transposed
  for (i64 r = 0; r < T; r += M)
    for (i64 c = 0; c < T; c += M) Micro<E>::run(s + r * ss + c * es, ss, scratch + c * 64 + r * es, 64);
  if (stream)
    for (i64 c = 0; c < T; ++c) write_tile_row<true>(d + c * ds, scratch + c * 64);
  else
    for (i64 c = 0; c < T; ++c) write_tile_row<false>(d + c * ds, scratch + c * 64);
}

using WholeTile = void (*)(const std::byte*, i64, std::byte*, i64, bool);

#if WB_PACK_SSE2
// 2-byte elements where the CPU has AVX2: the SSE2 8x8 kernel in each 128-bit lane, so one kernel moves 8
// rows x 16 columns with half the loads and shuffles; destination rows c..c+7 come from the low lanes,
// c+8..c+15 from the high ones.
__attribute__((target("avx2"))) inline void micro_2byte_avx2(const std::byte* s, i64 ss, std::byte* d, i64 ds) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + ss));
  const __m256i a2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * ss));
  const __m256i a3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 3 * ss));
  const __m256i a4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 4 * ss));
  const __m256i a5 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 5 * ss));
  const __m256i a6 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 6 * ss));
  const __m256i a7 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 7 * ss));
  const __m256i b0 = _mm256_unpacklo_epi16(a0, a1), b1 = _mm256_unpackhi_epi16(a0, a1);
  const __m256i b2 = _mm256_unpacklo_epi16(a2, a3), b3 = _mm256_unpackhi_epi16(a2, a3);
  const __m256i b4 = _mm256_unpacklo_epi16(a4, a5), b5 = _mm256_unpackhi_epi16(a4, a5);
  const __m256i b6 = _mm256_unpacklo_epi16(a6, a7), b7 = _mm256_unpackhi_epi16(a6, a7);
  const __m256i c0 = _mm256_unpacklo_epi32(b0, b2), c1 = _mm256_unpackhi_epi32(b0, b2);
  const __m256i c2 = _mm256_unpacklo_epi32(b1, b3), c3 = _mm256_unpackhi_epi32(b1, b3);
  const __m256i c4 = _mm256_unpacklo_epi32(b4, b6), c5 = _mm256_unpackhi_epi32(b4, b6);
  const __m256i c6 = _mm256_unpacklo_epi32(b5, b7), c7 = _mm256_unpackhi_epi32(b5, b7);
  const __m256i out[8] = {_mm256_unpacklo_epi64(c0, c4), _mm256_unpackhi_epi64(c0, c4),
                          _mm256_unpacklo_epi64(c1, c5), _mm256_unpackhi_epi64(c1, c5),
                          _mm256_unpacklo_epi64(c2, c6), _mm256_unpackhi_epi64(c2, c6),
                          _mm256_unpacklo_epi64(c3, c7), _mm256_unpackhi_epi64(c3, c7)};
  for (i64 k = 0; k < 8; ++k)
    _mm256_storeu2_m128i(reinterpret_cast<__m128i*>(d + (k + 8) * ds), reinterpret_cast<__m128i*>(d + k * ds), out[k]);
}

// whole_tile<2> with that kernel; the lines go out with 32-byte streaming stores where the destination and
// its row stride are 32-byte aligned.
__attribute__((target("avx2"))) void whole_tile_2byte_avx2(const std::byte* s, i64 ss, std::byte* d, i64 ds,
                                                           bool stream) {
  alignas(64) std::byte scratch[32 * 64];
  for (i64 r = 0; r < 32; r += 8)
    for (i64 c = 0; c < 32; c += 16) micro_2byte_avx2(s + r * ss + c * 2, ss, scratch + c * 64 + r * 2, 64);
  if (stream && ((reinterpret_cast<std::uintptr_t>(d) | static_cast<std::uintptr_t>(ds)) & 31) == 0) {
    for (i64 c = 0; c < 32; ++c) {
      const auto* row = reinterpret_cast<const __m256i*>(scratch + c * 64);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + c * ds), _mm256_load_si256(row));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + c * ds + 32), _mm256_load_si256(row + 1));
    }
  } else if (stream) {
    for (i64 c = 0; c < 32; ++c) write_tile_row<true>(d + c * ds, scratch + c * 64);
  } else {
    for (i64 c = 0; c < 32; ++c) write_tile_row<false>(d + c * ds, scratch + c * 64);
  }
}

const WholeTile whole_tile_2byte = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? whole_tile_2byte_avx2 : whole_tile<2>;
}();
#else
const WholeTile whole_tile_2byte = whole_tile<2>;
#endif

/// dst[c * ds + r * E] = src[r * ss + c * E] for r < rows, c < cols.
///
/// Power-of-two row strides (a [4096, 4096] bf16 matrix: 8 KiB) map every row of a tile to the same cache
/// set, so the order of the accesses decides the speed more than the shuffles do:
///   - tiles of 64 x 64 bytes go through a contiguous scratch tile: the source is read 8 rows (one
///     micro-kernel) at a time, one line per row, and the destination written a full line per row
///     (streaming stores when asked and aligned), so neither side keeps many same-set lines in L1;
///   - tiles are visited column of tiles first inside super-tiles of 256 x 256 bytes, themselves visited
///     column first, so each destination row is written 256 bytes in a row and each source row read
///     256 bytes per super-tile (it stays in L2 meanwhile);
///   - the next super-tile's source block is prefetched into L2, a slice per tile.
/// Edge tiles (partial) are copied directly: micro-kernels, then element by element.
template <std::size_t E, bool kStream>
void transpose(const std::byte* src, i64 ss, std::byte* dst, i64 ds, i64 rows, i64 cols) {
  constexpr i64 es = static_cast<i64>(E);
  constexpr i64 M = Micro<E>::M;
  constexpr i64 T = kTile<E>;
  constexpr i64 S = kSuperTile<E>;
  static_assert(T % M == 0 && S % T == 0);
  const bool stream = kStream && ((reinterpret_cast<std::uintptr_t>(dst) | static_cast<std::uintptr_t>(ds)) & 15) == 0;
  auto scalar = [&](i64 r0, i64 r1, i64 c0, i64 c1) {
    for (i64 r = r0; r < r1; ++r)
      for (i64 c = c0; c < c1; ++c) std::memcpy(dst + c * ds + r * es, src + r * ss + c * es, E);
  };
  for (i64 C0 = 0; C0 < cols; C0 += S) {
    const i64 C1 = std::min(cols, C0 + S);
    for (i64 R0 = 0; R0 < rows; R0 += S) {
      const i64 R1 = std::min(rows, R0 + S);
      // The next super-tile (same order) to prefetch: pf_rows rows of pf_lines lines from pf_base.
      i64 nr = R0 + S, nc = C0;
      if (nr >= rows) nr = 0, nc = C0 + S;
      i64 pf_rows = 0, pf_lines = 0, pf_per_tile = 0, pf_row = 0, pf_line = 0;
      const std::byte* pf_base = src + nr * ss + nc * es;
      if (nc < cols) {
        pf_rows = std::min(rows, nr + S) - nr;
        pf_lines = ((std::min(cols, nc + S) - nc) * es + 63) / 64 + 1;  // + 1: the row may start mid-line
        const i64 tiles = ((R1 - R0 + T - 1) / T) * ((C1 - C0 + T - 1) / T);
        pf_per_tile = (pf_rows * pf_lines + tiles - 1) / tiles;
      }
      for (i64 c0 = C0; c0 < C1; c0 += T) {
        const i64 c1 = std::min(C1, c0 + T);
        for (i64 r0 = R0; r0 < R1; r0 += T) {
          const i64 r1 = std::min(R1, r0 + T);
          for (i64 k = 0; k < pf_per_tile && pf_row < pf_rows; ++k) {
            __builtin_prefetch(pf_base + pf_row * ss + pf_line * 64, 0, 2);
            if (++pf_line == pf_lines) pf_line = 0, ++pf_row;
          }
          if (r1 - r0 == T && c1 - c0 == T) {
            const std::byte* s = src + r0 * ss + c0 * es;
            std::byte* d = dst + c0 * ds + r0 * es;
            if constexpr (E == 2)
              whole_tile_2byte(s, ss, d, ds, stream);
            else
              whole_tile<E>(s, ss, d, ds, stream);
            continue;
          }
          const i64 rm = r0 + (r1 - r0) / M * M, cm = c0 + (c1 - c0) / M * M;
          for (i64 r = r0; r < rm; r += M) {
            for (i64 c = c0; c < cm; c += M) Micro<E>::run(src + r * ss + c * es, ss, dst + c * ds + r * es, ds);
            scalar(r, r + M, cm, c1);
          }
          scalar(rm, r1, c0, c1);
        }
      }
    }
  }
}

template <std::size_t E>
void transpose_op(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
  if (op.streaming)
    for_each_point(axes, op.axis_count, src, dst, [&op](const std::byte* s, std::byte* d) {
      transpose<E, true>(s, op.src_row_stride, d, op.dst_row_stride, op.rows, op.cols);
    });
  else
    for_each_point(axes, op.axis_count, src, dst, [&op](const std::byte* s, std::byte* d) {
      transpose<E, false>(s, op.src_row_stride, d, op.dst_row_stride, op.rows, op.cols);
    });
}

void execute_transpose(const Op& op, const Axis* axes, const std::byte* src, std::byte* dst) {
  switch (op.run) {
    case 1: return transpose_op<1>(op, axes, src, dst);
    case 2: return transpose_op<2>(op, axes, src, dst);
    case 4: return transpose_op<4>(op, axes, src, dst);
    default: return transpose_op<8>(op, axes, src, dst);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

CopyProgram::CopyProgram(CopyDirection direction, std::span<const BufferCopy> copies,
                         std::span<const std::int64_t> parameter_bytes, std::int64_t buffer_bytes,
                         CopyProgramOptions options)
    : direction_(direction) {
  const bool pack = direction == CopyDirection::kPack;
  std::vector<Normal> normals;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    Normal n = normalize(direction, i, copies[i], parameter_bytes, buffer_bytes);
    if (n.run == 0) continue;
    ++stats_.copies;
    stats_.bytes += n.bytes();
    normals.push_back(std::move(n));
  }
  // Copies whose destinations are disjoint may run in any order (a pack: buffer ranges; an assemble:
  // parameter elements). Then merge in buffer order (copies that continue one another need not be listed
  // one after the other) and run in parameter order, so that pieces of one tensor are read or written one
  // after the other: DRAM pages and prefetchers stay warm, while a plan interleaves tensors in the buffer.
  // Otherwise keep the list's order (where destinations overlap, the later copy wins) and merge
  // neighbours only.
  bool reorder = true;
  if (pack) {
    std::vector<std::pair<i64, i64>> ranges;
    for (const Normal& n : normals) ranges.emplace_back(n.buffer_offset, n.buffer_offset + n.bytes());
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size() && reorder; ++i) reorder = ranges[i - 1].second <= ranges[i].first;
  } else {
    reorder = parameter_writes_disjoint(normals);
  }
  if (reorder)
    std::stable_sort(normals.begin(), normals.end(),
                     [](const Normal& a, const Normal& b) { return a.buffer_offset < b.buffer_offset; });
  std::size_t merged = 0;
  for (std::size_t i = 0; i < normals.size(); ++i) {
    if (merged > 0 && try_merge(normals[merged - 1], normals[i])) continue;
    if (merged != i) normals[merged] = std::move(normals[i]);
    ++merged;
  }
  normals.resize(merged);
  if (reorder)
    std::stable_sort(normals.begin(), normals.end(), [](const Normal& a, const Normal& b) {
      return a.parameter != b.parameter ? a.parameter < b.parameter : a.param_offset < b.param_offset;
    });
  stats_.reordered = reorder;

  const bool streaming = options.stores == StoreHint::kStreaming ||
                         (options.stores == StoreHint::kAuto && stats_.bytes >= CopyProgramOptions::kStreamingProgramBytes);
  auto oriented = [pack](const NormalAxis& a) {
    return pack ? Axis{a.extent, a.param_stride, a.buffer_stride} : Axis{a.extent, a.buffer_stride, a.param_stride};
  };
  ops_.reserve(normals.size());
  for (const Normal& n : normals) {
    Op op;
    op.parameter = n.parameter;
    op.param_offset = n.param_offset;
    op.buffer_offset = n.buffer_offset;
    op.run = n.run;
    op.axis_begin = static_cast<std::uint32_t>(axes_.size());
    // A transpose: one-element runs, the innermost axis (buffer-contiguous) strided in the parameter, and
    // another axis contiguous in the parameter.
    std::size_t k = n.axes.size();
    if ((n.run == 1 || n.run == 2 || n.run == 4 || n.run == 8) && n.axes.size() >= 2 &&
        (pack || writes_each_byte_once(n))) {
      for (std::size_t a = 0; a + 1 < n.axes.size(); ++a)
        if (n.axes[a].param_stride == n.run) k = a;
    }
    if (k < n.axes.size()) {
      const NormalAxis& ax = n.axes[k];       // contiguous in the parameter
      const NormalAxis& aj = n.axes.back();   // contiguous in the buffer
      op.kind = Kind::kTranspose;
      if (pack) {  // source: the parameter, rows along j
        op.rows = aj.extent, op.cols = ax.extent;
        op.src_row_stride = aj.param_stride, op.dst_row_stride = ax.buffer_stride;
      } else {  // source: the buffer, rows along k
        op.rows = ax.extent, op.cols = aj.extent;
        op.src_row_stride = ax.buffer_stride, op.dst_row_stride = aj.param_stride;
      }
      for (std::size_t a = 0; a + 1 < n.axes.size(); ++a)
        if (a != k) axes_.push_back(oriented(n.axes[a]));
      op.streaming = streaming;
      stats_.streaming = stats_.streaming || op.streaming;
      ++stats_.transpose_ops;
      stats_.transpose_elements += n.bytes() / n.run;
    } else {
      op.kind = Kind::kRuns;
      for (const NormalAxis& a : n.axes) axes_.push_back(oriented(a));
      op.streaming = streaming && n.run >= CopyProgramOptions::kStreamingMinRunBytes;
      // Prefetch ~4 KiB ahead when the innermost loop jumps in the source (pack of a column box).
      if (!n.axes.empty() && n.run > 64 && n.run <= 4096) {
        const Axis& inner = axes_.back();
        if (inner.src_stride != n.run && inner.extent > 1)
          op.prefetch_runs = static_cast<std::int32_t>(std::max<i64>(1, 4096 / n.run));
      }
      stats_.streaming = stats_.streaming || op.streaming;
      ++stats_.run_ops;
      stats_.runs += n.bytes() / n.run;
    }
    op.axis_count = static_cast<std::uint16_t>(axes_.size() - op.axis_begin);
    ops_.push_back(op);
  }
  stats_.ops = static_cast<std::int64_t>(ops_.size());
}

void CopyProgram::execute(std::span<std::byte* const> parameters, std::byte* buffer) const noexcept {
  const bool pack = direction_ == CopyDirection::kPack;
  for (const Op& op : ops_) {
    std::byte* param = parameters[op.parameter] + op.param_offset;
    std::byte* buf = buffer + op.buffer_offset;
    const std::byte* src = pack ? param : buf;
    std::byte* dst = pack ? buf : param;
    const Axis* axes = axes_.data() + op.axis_begin;
    if (op.kind == Kind::kRuns)
      execute_runs(op, axes, src, dst);
    else
      execute_transpose(op, axes, src, dst);
  }
#if WB_PACK_SSE2
  if (stats_.streaming) _mm_sfence();
#endif
}

}  // namespace wb::exec
