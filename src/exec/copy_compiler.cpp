// The copy compiler (see copy_compiler.hpp): validation and the byte normal form, the disjointness of
// destinations, merging.
#include "exec/copy_compiler.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;

// Pairs of copies the exact pairwise tests may compare per compilation, and byte intervals the listing
// test may hold at once (24 bytes each), before the destinations count as undecided.
constexpr i64 kMaxPairTests = i64{1} << 22;
constexpr i64 kMaxListedIntervals = i64{1} << 24;

// A copy of the list during compilation: its normal form and where it came from (for errors, and for the
// exact test of boxes of one map).
struct Normal {
  ByteCopy copy;
  std::size_t index = 0;
  const BufferCopy* source = nullptr;
};

[[noreturn]] void fail(CopyDirection direction, std::size_t index, const BufferCopy& c, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, describe_copy(direction, index, c) + ": " + why);
}

// ---------------------------------------------------------------------------------------------------
// 1. Validation and the normal form

/// Validates copy `index` and returns its normal form (run == 0 when it moves nothing).
Normal normalize(CopyDirection direction, std::size_t index, const BufferCopy& c, std::span<const i64> parameter_bytes,
                 i64 buffer_bytes) {
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
  n.index = index;
  n.source = &c;
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

  ByteCopy& b = n.copy;
  b.parameter = s.parameter;
  b.param_offset = s.offset * es;
  b.buffer_offset = c.buffer_offset;
  // Axes in bytes (products now fit: bounded by the ranges checked above), unit axes dropped, then axes
  // contiguous on both sides merged (outer stride == inner stride * inner extent).
  i64 dense = bytes;
  for (std::size_t a = 0; a < ndim; ++a) {
    const i64 extent = s.box.extent[a];
    dense /= extent;
    if (extent == 1) continue;
    const ByteAxis axis{extent, s.strides[a] * es, dense};
    if (!b.axes.empty() && b.axes.back().param_stride == extent * axis.param_stride &&
        b.axes.back().buffer_stride == extent * axis.buffer_stride) {
      b.axes.back() = {b.axes.back().extent * extent, axis.param_stride, axis.buffer_stride};
    } else {
      b.axes.push_back(axis);
    }
  }
  // The contiguous inner run.
  b.run = es;
  while (!b.axes.empty() && b.axes.back().param_stride == b.run) {
    b.run *= b.axes.back().extent;
    b.axes.pop_back();
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------
// 2. Disjoint destinations

/// The parameter bytes [lo, hi) a copy's elements lie in.
std::pair<i64, i64> param_interval(const ByteCopy& n) {
  i64 lo = n.param_offset, hi = n.param_offset + n.run;
  for (const ByteAxis& a : n.axes) (a.param_stride < 0 ? lo : hi) += (a.extent - 1) * a.param_stride;
  return {lo, hi};
}

/// Whether d = Σ k_a·s_a + u for some |k_a| < n_a, |u| < run: then two copies of this shape `d` bytes apart
/// share a byte. `axes` are (|stride|, extent) by decreasing stride and each strides past the smaller ones
/// (writes_each_parameter_byte_once), so at most two k fit each axis; `reach[i]` is the bytes axes i.. cover.
bool difference_reachable(std::span<const std::pair<i64, i64>> axes, std::span<const i64> reach, std::size_t i, i64 d,
                          i64 run) {
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

enum class Pair : std::uint8_t { kDisjoint, kOverlap, kUnknown };

/// Two boxes of one affine map (same strides and element size, offsets that differ by the box offsets
/// times the strides: pieces of one source-map copy, whatever their shapes) that is one-to-one on the
/// boxes' bounding box share elements exactly when the boxes do. kUnknown when the copies are not of
/// that kind.
Pair boxes_of_one_map(const BufferCopy& a, const BufferCopy& b) {
  const SliceCopy &x = a.copy, &y = b.copy;
  const std::size_t ndim = x.box.extent.size();
  if (a.element_bytes != b.element_bytes || x.strides != y.strides || y.box.extent.size() != ndim ||
      x.box.offset.size() != ndim || y.box.offset.size() != ndim)
    return Pair::kUnknown;
  i64 delta = 0;
  ByteCopy hull;  // the bounding box's footprint shape, to test the map is one-to-one on it
  hull.run = a.element_bytes;
  bool disjoint = false;
  for (std::size_t i = 0; i < ndim; ++i) {
    const i64 xb = x.box.offset[i], yb = y.box.offset[i];
    i64 xe, ye, step, extent;
    if (__builtin_add_overflow(xb, x.box.extent[i], &xe) || __builtin_add_overflow(yb, y.box.extent[i], &ye) ||
        __builtin_sub_overflow(yb, xb, &step) || __builtin_mul_overflow(step, x.strides[i], &step) ||
        __builtin_add_overflow(delta, step, &delta) || __builtin_sub_overflow(std::max(xe, ye), std::min(xb, yb), &extent) ||
        __builtin_mul_overflow(x.strides[i], i64{a.element_bytes}, &step))
      return Pair::kUnknown;
    if (extent > 1) hull.axes.push_back(ByteAxis{extent, step, 0});
    disjoint = disjoint || xe <= yb || ye <= xb;
  }
  if (delta != y.offset - x.offset || !hull.writes_each_parameter_byte_once()) return Pair::kUnknown;
  return disjoint ? Pair::kDisjoint : Pair::kOverlap;
}

/// The exact pairwise tests on two copies of one parameter that each write every byte once.
Pair compare(const Normal& na, const Normal& nb) {
  const ByteCopy &a = na.copy, &b = nb.copy;
  const auto [alo, ahi] = param_interval(a);
  const auto [blo, bhi] = param_interval(b);
  if (ahi <= blo || bhi <= alo) return Pair::kDisjoint;
  if (const Pair boxes = boxes_of_one_map(*na.source, *nb.source); boxes != Pair::kUnknown) return boxes;
  // Translates of one shape (pieces of one tensor cut along an axis it is not contiguous on, as boxes of
  // a transposed matrix).
  if (a.run != b.run || a.axes.size() != b.axes.size()) return Pair::kUnknown;
  for (std::size_t i = 0; i < a.axes.size(); ++i)
    if (a.axes[i].extent != b.axes[i].extent || a.axes[i].param_stride != b.axes[i].param_stride) return Pair::kUnknown;
  std::vector<std::pair<i64, i64>> axes;
  for (const ByteAxis& x : a.axes) axes.emplace_back(x.param_stride < 0 ? -x.param_stride : x.param_stride, x.extent);
  std::sort(axes.begin(), axes.end(), std::greater<>());
  std::vector<i64> reach(axes.size() + 1, a.run);
  for (std::size_t i = axes.size(); i-- > 0;) reach[i] = reach[i + 1] + (axes[i].second - 1) * axes[i].first;
  return difference_reachable(axes, reach, 0, b.param_offset - a.param_offset, a.run) ? Pair::kOverlap : Pair::kDisjoint;
}

// Bytes [begin, end) a copy writes.
struct Interval {
  i64 begin, end;
  std::size_t copy;  // index of the copy in the input list
};

// Where an assemble copy writes in its parameter: `unit` contiguous bytes from `lowest`, repeated over
// `outer` (extent, stride > 0), smallest stride first. Axes with negative strides are walked the other
// way (the same set of bytes); axes that continue the unit contiguously are merged into it.
struct WritePattern {
  i64 lowest = 0, highest = 0;  // [lowest, highest): the hull
  i64 unit = 0;
  std::vector<std::pair<i64, i64>> outer;
  i64 intervals() const {
    i64 count = 1;
    for (const auto& [extent, stride] : outer) count *= extent;
    return count;
  }
};

WritePattern parameter_writes(const ByteCopy& n) {
  WritePattern p;
  p.lowest = n.param_offset;
  std::vector<std::pair<i64, i64>> axes;  // (stride, extent), strides made positive
  for (const ByteAxis& a : n.axes) {
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

// The verdict on a set of copies' intervals (sorted here): disjoint, or the first overlap named.
struct Verdict {
  Destinations destinations = Destinations::kDisjoint;
  std::string overlap;
};

Verdict first_overlap(std::vector<Interval>& intervals, CopyDirection direction, std::span<const BufferCopy> copies,
                      const std::string& where) {
  std::sort(intervals.begin(), intervals.end(),
            [](const Interval& a, const Interval& b) { return a.begin != b.begin ? a.begin < b.begin : a.copy < b.copy; });
  for (std::size_t i = 1; i < intervals.size(); ++i) {
    const Interval& a = intervals[i - 1];
    const Interval& b = intervals[i];
    if (b.begin >= a.end) continue;
    const std::size_t later = std::max(a.copy, b.copy), earlier = std::min(a.copy, b.copy);
    const std::string range =
        where + " bytes [" + std::to_string(b.begin) + ", " + std::to_string(std::min(a.end, b.end)) + ")";
    return {Destinations::kOverlap,
            describe_copy(direction, later, copies[later]) + ": " +
                (later == earlier ? "writes " + range + " more than once (destinations overlap)"
                                  : "its destination overlaps that of " + describe_copy(direction, earlier, copies[earlier]) +
                                        " at " + range)};
  }
  return {};
}

// Pack: the buffer ranges. Assemble: parameter bytes. There, copies whose hulls overlap (interleaved pieces
// of one tensor) are compared pairwise by the exact tests; where those cannot decide, or find an overlap
// (to name where), and for copies that do not provably write each byte once, the written intervals are
// listed, sorted and compared.
Verdict destinations(CopyDirection direction, const std::vector<Normal>& normals, std::span<const BufferCopy> copies) {
  std::vector<Interval> intervals;
  if (direction == CopyDirection::kPack) {
    for (const Normal& n : normals)
      intervals.push_back({n.copy.buffer_offset, n.copy.buffer_offset + n.copy.bytes(), n.index});
    return first_overlap(intervals, direction, copies, "buffer");
  }
  std::vector<WritePattern> patterns;
  patterns.reserve(normals.size());
  for (const Normal& n : normals) patterns.push_back(parameter_writes(n.copy));
  std::vector<std::size_t> order(normals.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (normals[a].copy.parameter != normals[b].copy.parameter) return normals[a].copy.parameter < normals[b].copy.parameter;
    return patterns[a].lowest < patterns[b].lowest;
  });
  i64 pair_budget = kMaxPairTests;
  std::vector<std::size_t> active;
  for (std::size_t begin = 0; begin < order.size();) {
    // A cluster: copies of one parameter whose hulls chain-overlap.
    const std::uint32_t parameter = normals[order[begin]].copy.parameter;
    std::size_t end = begin + 1;
    i64 highest = patterns[order[begin]].highest;
    while (end < order.size() && normals[order[end]].copy.parameter == parameter && patterns[order[end]].lowest < highest) {
      highest = std::max(highest, patterns[order[end]].highest);
      ++end;
    }
    bool proven = true;
    for (std::size_t k = begin; k < end && proven; ++k) proven = normals[order[k]].copy.writes_each_parameter_byte_once();
    active.clear();
    for (std::size_t k = begin; k < end && proven; ++k) {
      const std::size_t i = order[k];
      std::erase_if(active, [&](std::size_t j) { return patterns[j].highest <= patterns[i].lowest; });
      for (std::size_t j : active)
        if (--pair_budget < 0 || compare(normals[j], normals[i]) != Pair::kDisjoint) {
          proven = false;
          break;
        }
      active.push_back(i);
    }
    if (!proven) {
      i64 listed = 0;
      for (std::size_t k = begin; k < end; ++k) listed += patterns[order[k]].intervals();
      if (listed > kMaxListedIntervals)
        return {Destinations::kUndecided,
                describe_copy(direction, normals[order[begin]].index, copies[normals[order[begin]].index]) + " and " +
                    std::to_string(end - begin - 1) + " copies interleaved with it write " + std::to_string(listed) +
                    " separate pieces of parameter " + std::to_string(parameter) +
                    ": too many to prove them disjoint (at most " + std::to_string(kMaxListedIntervals) + ")"};
      intervals.clear();
      intervals.reserve(static_cast<std::size_t>(listed));
      for (std::size_t k = begin; k < end; ++k) list_intervals(patterns[order[k]], normals[order[k]].index, intervals);
      Verdict verdict = first_overlap(intervals, direction, copies, "parameter " + std::to_string(parameter));
      if (verdict.destinations != Destinations::kDisjoint) return verdict;
    }
    begin = end;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------------
// 3. Merging

/// Merges `b` into `a` when b continues a (same parameter, b's bytes right after a's in the buffer):
/// a longer run, a longer outermost axis, or a new outermost axis.
bool try_merge(ByteCopy& a, const ByteCopy& b) {
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
    ByteAxis outer = b.axes.front();
    outer.extent += 1;
    a.axes.insert(a.axes.begin(), outer);
    return true;
  }
  // b is a's outermost axis continued: same axes but the outermost extent, or a's inner axes exactly.
  if (!a.axes.empty()) {
    const ByteAxis& outer = a.axes.front();
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
  if (a.axes == b.axes && a.axes.size() < kMaxCompiledAxes && delta != 0) {
    const i64 bytes = a.bytes();
    a.axes.insert(a.axes.begin(), ByteAxis{2, delta, bytes});
    return true;
  }
  return false;
}

}  // namespace

const char* direction_name(CopyDirection direction) { return direction == CopyDirection::kPack ? "pack" : "assemble"; }

std::string describe_copy(CopyDirection direction, std::size_t index, const BufferCopy& c) {
  return std::string(direction_name(direction)) + " copy " + std::to_string(index) + " (parameter " +
         std::to_string(c.copy.parameter) + ", box " + c.copy.box.to_string() + ", offset " + std::to_string(c.copy.offset) +
         ", strides " + shape_to_string(c.copy.strides) + ", buffer offset " + std::to_string(c.buffer_offset) +
         ", element bytes " + std::to_string(c.element_bytes) + ")";
}

std::int64_t ByteCopy::bytes() const {
  i64 b = run;
  for (const ByteAxis& a : axes) b *= a.extent;
  return b;
}

bool ByteCopy::writes_each_parameter_byte_once() const {
  std::vector<std::pair<i64, i64>> sorted;  // |stride|, extent
  for (const ByteAxis& a : axes) {
    if (a.param_stride == std::numeric_limits<i64>::min()) return false;
    sorted.emplace_back(a.param_stride < 0 ? -a.param_stride : a.param_stride, a.extent);
  }
  std::sort(sorted.begin(), sorted.end());
  i64 reach = run;  // bytes covered by the smaller axes, from the first
  for (const auto& [stride, extent] : sorted) {
    if (stride < reach) return false;
    i64 span;
    if (__builtin_mul_overflow(stride, extent - 1, &span) || __builtin_add_overflow(span, reach, &reach)) return false;
  }
  return true;
}

CompiledCopies compile_copies(CopyDirection direction, std::span<const BufferCopy> copies,
                              std::span<const std::int64_t> parameter_bytes, std::int64_t buffer_bytes) {
  CompiledCopies out;
  out.direction = direction;
  std::vector<Normal> normals;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    Normal n = normalize(direction, i, copies[i], parameter_bytes, buffer_bytes);
    if (n.copy.run == 0) continue;
    ++out.input_copies;
    out.bytes += n.copy.bytes();
    normals.push_back(std::move(n));
  }
  Verdict verdict = destinations(direction, normals, copies);
  out.destinations = verdict.destinations;
  out.overlap = std::move(verdict.overlap);
  // Disjoint destinations may run in any order: merge in buffer order, then run in parameter order, so
  // that pieces of one tensor are read or written one after the other (DRAM pages and prefetchers stay
  // warm, while a plan interleaves tensors in the buffer). Otherwise keep the list's order and merge
  // neighbours only.
  const bool reorder = out.destinations == Destinations::kDisjoint;
  if (reorder)
    std::stable_sort(normals.begin(), normals.end(),
                     [](const Normal& a, const Normal& b) { return a.copy.buffer_offset < b.copy.buffer_offset; });
  out.copies.reserve(normals.size());
  for (Normal& n : normals) {
    if (!out.copies.empty() && try_merge(out.copies.back(), n.copy)) continue;
    out.copies.push_back(std::move(n.copy));
  }
  if (reorder)
    std::stable_sort(out.copies.begin(), out.copies.end(), [](const ByteCopy& a, const ByteCopy& b) {
      return a.parameter != b.parameter ? a.parameter < b.parameter : a.param_offset < b.param_offset;
    });
  return out;
}

}  // namespace wb::exec
