// The second-difference codec, encoding: see second_difference.hpp for the maths and the contract (the
// field evaluated back from its nonzeros: second_difference_evaluate.cpp).
//
// Encoding walks the rows (last axis) in flat order. Each row gives its own sparse second difference y
// along the last axis; the other axes are then applied to sparse results only: at level k (axis k), the
// result G_j of the slice with index j along axis k is combined as G_j - 2 G_{j-1} + G_{j-2}, and the
// piece goes either to the output (k = 0) or into the slice being built one level up. Each level keeps
// its last three complete slices in a ring, so the scratch is O(nonzeros of three slices per axis).
//
// Rows are read once, in chunks tested with vectorizable loops over the raw codes. A chunk that is
// affine along the row costs nothing more; one that is not, but continues the two rows before it
// (x = 2 x_{r-1} - x_{r-2}: column cuts, wrap lines), takes y from theirs; only the rest is scanned.
// Short rows are tested for continuation as one flat run, many rows at a time.
#include "layout/second_difference.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "layout/second_difference_lanes.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

/// One nonzero: position (flat inside its slice) and value modulo 2^64.
struct Entry {
  i64 pos;
  u64 value;
};
using SparseList = std::vector<Entry>;

constexpr i64 kEnd = std::numeric_limits<i64>::max();

[[noreturn]] void fail(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

// --- rows --------------------------------------------------------------------------------------------

/// Lanes in which a second difference of T codes is exact: |x + z - 2 y| < 2^(w+1) for w-bit codes, so
/// twice the width suffices; 64-bit codes stay 64-bit (everything is modulo 2^64 anyway).
template <class T> struct Exact { using type = std::uint64_t; };
template <> struct Exact<std::uint8_t> { using type = std::uint16_t; };
template <> struct Exact<std::uint16_t> { using type = std::uint32_t; };
template <> struct Exact<std::uint32_t> { using type = std::uint64_t; };

/// c - 2 b + a (a = p[k-2], b = p[k-1], c = p[k]) in wrapping A lanes.
template <class A, class T>
inline A diff2(T a, T b, T c) {
  return static_cast<A>(static_cast<A>(c) + static_cast<A>(a) - static_cast<A>(2 * static_cast<A>(b)));
}

/// a - 2 b + c modulo 2^64.
template <class T>
inline u64 exact_at3(T a, T b, T c) {
  return u64{a} + u64{c} - 2 * u64{b};
}

/// OR over k < N of a[k] - 2 b[k] + c[k] in A lanes. For the row test a, b, c are one row shifted by
/// 0, 1, 2; for the test across rows, three consecutive rows. A fixed N lets GCC vectorize without an
/// epilogue, even under -O2's very-cheap cost model.
template <class T, class A, int N>
inline A residue(const T* a, const T* b, const T* c) {
  A acc = 0;
  for (int k = 0; k < N; ++k) acc |= diff2<A>(c[k], b[k], a[k]);
  return acc;
}

/// Whether a[k] - 2 b[k] + c[k] = 0 for all k < N, exactly. 2-byte codes (bf16, f16: most parameters) in
/// the 16-bit lanes of second_difference_lanes.hpp. The others test in T lanes first, the most per vector:
/// a wrapped w-bit value is zero exactly when the true one is, provided no code involved has its top bit set
/// (then |true| < 2^w); the top bits are ORed alongside, and a chunk that has them set is tested again in
/// exact lanes of twice the width. 64-bit codes need neither: everything is modulo 2^64 anyway.
/// kShifted: b = a - 1, c = a - 2 (the row test), so the codes involved are a[-2 .. N).
template <class T, int N, bool kShifted>
inline bool all_zero(const T* a, const T* b, const T* c) {
  if constexpr (sizeof(T) == 2) {
    return zero_second_differences16(a, b, c, N);
  } else if constexpr (sizeof(T) == 8) {
    return residue<T, T, N>(a, b, c) == 0;
  } else {
    T acc = 0, bits = 0;
    if constexpr (kShifted) bits = static_cast<T>(c[0] | c[1]);
    for (int k = 0; k < N; ++k) {
      acc |= diff2<T>(c[k], b[k], a[k]);
      if constexpr (kShifted) {
        bits |= a[k];
      } else {
        bits |= static_cast<T>(a[k] | b[k] | c[k]);
      }
    }
    if ((bits >> (8 * sizeof(T) - 1)) == 0) return acc == 0;
    return residue<T, typename Exact<T>::type, N>(a, b, c) == 0;
  }
}

/// Whether any of p[0, n) has its top bit set: then differences in T lanes cannot tell 0 from +-2^w.
template <class T>
inline bool top_bits(const T* p, i64 n) {
  if constexpr (sizeof(T) == 8) {
    return false;  // modulo 2^64 throughout
  } else {
    T bits = 0;
    for (i64 k = 0; k < n; ++k) bits |= p[k];
    return (bits >> (8 * sizeof(T) - 1)) != 0;
  }
}

/// The exact second difference at j >= 2, modulo 2^64.
template <class T>
inline u64 exact_at(const T* row, i64 j) {
  return u64{row[j]} + u64{row[j - 2]} - 2 * u64{row[j - 1]};
}

/// Appends the nonzeros of row[from, from + N) at positions >= keep. The differences go to a small
/// buffer in A lanes (vectorized; A must tell zero from nonzero exactly), then only its nonzero 8-byte
/// words are looked into, lane by lane, and the values recomputed in 64 bits.
template <class T, class A, int N>
void scan_chunk(const T* row, i64 from, i64 keep, SparseList& out) {
  const T* p = row + from;
  A d[N];
  for (int k = 0; k < N; ++k) d[k] = diff2<A>(p[k - 2], p[k - 1], p[k]);
  constexpr int kLaneBits = 8 * static_cast<int>(sizeof(A));
  constexpr int kPerWord = 64 / kLaneBits;
  constexpr u64 kLane = kLaneBits == 64 ? ~u64{0} : (u64{1} << (kLaneBits % 64)) - 1;
  static_assert(N % kPerWord == 0);
  for (int w = 0; w < N; w += kPerWord) {
    u64 word;
    std::memcpy(&word, d + w, sizeof(word));
    while (word != 0) {
      const int lane = std::countr_zero(word) / kLaneBits;
      word &= ~(kLane << (lane * kLaneBits));
      const i64 j = from + w + lane;
      if (j >= keep) out.push_back({j, exact_at(row, j)});
    }
  }
}

/// The two rows before this one in its slice (index >= 2 along axis N-2) and their D_{last} y: where
/// this row continues them affinely (x = 2 x_b - x_c), its y is 2 y_b - y_c and need not be scanned.
/// That is most rows of a copy, even rows cut into column blocks or by wrap lines of a low digit.
template <class T>
struct Previous {
  const T* b = nullptr;
  const T* c = nullptr;
  const SparseList* yb = nullptr;
  const SparseList* yc = nullptr;
  std::size_t ib = 0, ic = 0;  // cursors: chunks ask for increasing ranges

  /// Appends 2 y_b - y_c at positions [from, to).
  void append_continued(i64 from, i64 to, SparseList& out) {
    while (ib < yb->size() && (*yb)[ib].pos < from) ++ib;
    while (ic < yc->size() && (*yc)[ic].pos < from) ++ic;
    const SparseList& lb = *yb;
    const SparseList& lc = *yc;
    while (true) {
      // Mostly both rows have their nonzeros at the same columns.
      for (; ib < lb.size() && ic < lc.size() && lb[ib].pos == lc[ic].pos && lb[ib].pos < to; ++ib, ++ic)
        if (const u64 v = 2 * lb[ib].value - lc[ic].value; v != 0) out.push_back({lb[ib].pos, v});
      const i64 pb = ib < yb->size() && (*yb)[ib].pos < to ? (*yb)[ib].pos : kEnd;
      const i64 pc = ic < yc->size() && (*yc)[ic].pos < to ? (*yc)[ic].pos : kEnd;
      const i64 p = std::min(pb, pc);
      if (p == kEnd) return;
      u64 v = 0;
      if (pb == p) v += 2 * (*yb)[ib++].value;
      if (pc == p) v -= (*yc)[ic++].value;
      if (v != 0) out.push_back({p, v});
    }
  }
};

/// Appends the nonzeros of y = D_{last} row on [from, from + N) at positions >= keep (from >= 2).
/// Affine along the row: nothing. Else, continuing the previous rows on [from - 2, from + N): from
/// theirs. Else scanned.
template <class T, int N>
inline void check_chunk(const T* row, i64 from, i64 keep, SparseList& out, Previous<T>* previous) {
  const T* p = row + from;
  if (all_zero<T, N, true>(p, p - 1, p - 2)) return;
  if (previous != nullptr) {
    const T* b = previous->b + from;
    const T* c = previous->c + from;
    if (exact_at3(p[-2], b[-2], c[-2]) == 0 && exact_at3(p[-1], b[-1], c[-1]) == 0 &&
        all_zero<T, N, false>(p, b, c)) {
      previous->append_continued(std::max(from, keep), from + N, out);
      return;
    }
  }
  if (top_bits(p - 2, N + 2)) {
    scan_chunk<T, typename Exact<T>::type, N>(row, from, keep, out);
  } else {
    scan_chunk<T, T, N>(row, from, keep, out);
  }
}

/// Checks row[from, to) in chunks of N; a partial last chunk is checked overlapping the one before
/// (re-checking is harmless), keeping only its new part. Returns the first position not checked:
/// `to`, unless the row is shorter than one chunk from `from`, or the limit was passed.
template <class T, int N>
i64 check_chunks(const T* row, i64 from, i64 to, SparseList& out, std::size_t limit, Previous<T>* previous) {
  i64 j = from;
  for (; j + N <= to; j += N) {
    check_chunk<T, N>(row, j, j, out, previous);
    if (out.size() > limit) return j + N;
  }
  if (j == to || to - N < 2) return j;
  check_chunk<T, N>(row, to - N, j, out, previous);
  return to;
}

/// y = D_{last} of one row of codes, sparse, into `out` (cleared first). Returns the end of the part
/// that was processed: the length, unless more than `limit` nonzeros were found.
template <class T>
i64 row_differences(const T* row, i64 length, u64 lo, SparseList& out, std::size_t limit,
                    Previous<T>* previous = nullptr) {
  out.clear();
  const u64 x0 = u64{row[0]} - lo;
  if (x0 != 0) out.push_back({0, x0});
  if (length < 2) return length;
  const u64 y1 = u64{row[1]} - 2 * u64{row[0]} + lo;  // x1 - 2 x0: the digits, zero before the start
  if (y1 != 0) out.push_back({1, y1});
  // Long rows: 256-element chunks; short rows (heads, biases) 32; the last few elements one by one.
  i64 j = length >= 2 + 256 ? check_chunks<T, 256>(row, 2, length, out, limit, previous) : 2;
  if (out.size() > limit) return j;
  if (j < length && length >= 2 + 32) j = check_chunks<T, 32>(row, j, length, out, limit, previous);
  if (out.size() > limit) return j;
  for (; j < length; ++j)
    if (const u64 d = exact_at(row, j); d != 0) out.push_back({j, d});
  return length;
}

/// How many rows from x on (at most max_rows, of `length` each) continue the two rows before each:
/// x[i] = 2 x[i - length] - x[i - 2 length] throughout. The first row is checked on its own, in chunks of 32
/// (it usually decides, often early), the rest as one flat run in chunks of 256, so short rows cost no per-row
/// overhead.
template <class T>
i64 continued_rows(const T* x, i64 length, i64 max_rows) {
  i64 k = 0;
  for (; k + 32 <= length; k += 32)
    if (!all_zero<T, 32, false>(x + k, x + k - length, x + k - 2 * length)) return 0;
  for (; k < length; ++k)
    if (exact_at3(x[k], x[k - length], x[k - 2 * length]) != 0) return 0;
  const i64 total = max_rows * length;
  i64 i = length;
  for (; i + 256 <= total; i += 256)
    if (!all_zero<T, 256, false>(x + i, x + i - length, x + i - 2 * length)) break;
  for (; i < total; ++i)
    if (exact_at3(x[i], x[i - length], x[i - 2 * length]) != 0) break;
  return i / length;
}

// --- slices ------------------------------------------------------------------------------------------

/// Appends a - 2 b + c (b, c may be null: zero padding before the start of the axis) to `dst`, with
/// positions shifted by `offset`, dropping zeros. All inputs are sorted by position.
void combine(const SparseList& a, const SparseList* b, const SparseList* c, i64 offset, SparseList& dst) {
  if (b == nullptr) {  // the first slice of an axis: a itself
    for (const Entry& e : a) dst.push_back({e.pos + offset, e.value});
    return;
  }
  static const SparseList kEmpty;
  const SparseList& bb = *b;
  const SparseList& cc = c != nullptr ? *c : kEmpty;
  const std::size_t na = a.size(), nb = bb.size(), nc = cc.size();
  // Rows cut at the same columns (column blocks, wrap lines) share positions: take the common prefix
  // element by element, and merge only from the first difference on.
  std::size_t ia = 0;
  const std::size_t common = std::min({na, nb, nc});
  for (; ia < common && a[ia].pos == bb[ia].pos && a[ia].pos == cc[ia].pos; ++ia) {
    const u64 v = a[ia].value - 2 * bb[ia].value + cc[ia].value;
    if (v != 0) dst.push_back({a[ia].pos + offset, v});
  }
  std::size_t ib = ia, ic = ia;
  while (true) {
    const i64 pa = ia < na ? a[ia].pos : kEnd;
    const i64 pb = ib < nb ? bb[ib].pos : kEnd;
    const i64 pc = ic < nc ? cc[ic].pos : kEnd;
    const i64 p = std::min({pa, pb, pc});
    if (p == kEnd) break;
    u64 v = 0;
    if (pa == p) v += a[ia++].value;
    if (pb == p) v -= 2 * bb[ib++].value;
    if (pc == p) v += cc[ic++].value;
    if (v != 0) dst.push_back({p + offset, v});
  }
}

/// The rolling state of encoding an N-D field, N >= 2: levels k = 0 .. N-2, one per axis but the last.
class SliceCombiner {
 public:
  SliceCombiner(const Shape& shape, SparseList& output) : shape_(shape), output_(output) {
    const int levels = static_cast<int>(shape.size()) - 1;
    // slab_[k]: the element count of one slice along axis k, prod of shape[k+1 ..].
    slab_.assign(levels, shape[levels]);
    for (int k = levels - 2; k >= 0; --k) slab_[k] = slab_[k + 1] * shape[k + 1];
    ring_.resize(levels);
    building_.resize(levels);
    index_.assign(levels, 0);
  }

  /// Feeds the D_{last} of the next row (flat order); `row` is swapped with scratch and comes back cleared.
  void push_row(SparseList& row) {
    push(static_cast<int>(index_.size()) - 1, row);
    // Odometer over the row multi-index.
    for (int k = static_cast<int>(index_.size()) - 1; k >= 0; --k) {
      if (++index_[k] < shape_[k]) break;
      index_[k] = 0;
    }
  }

  /// Index of the next row along axis N-2.
  i64 next_row_index() const { return index_.back(); }

  /// The two rows before the next one in its slice and their D_{last}, when it has index >= 2 along
  /// axis N-2.
  template <class T>
  bool previous_rows(const T* next, i64 length, Previous<T>& previous) const {
    const i64 j = index_.back();
    if (j < 2) return false;
    previous = Previous<T>{next - length, next - 2 * length, &ring_.back()[(j + 2) % 3], &ring_.back()[(j + 1) % 3]};
    return true;
  }

  /// Rows of the current slice that the next one can skip to: all but its last (which completes it).
  i64 rows_skippable() const { return shape_[index_.size() - 1] - 1 - index_.back(); }

  /// Skips `count` rows (count <= rows_skippable()) that each continue the two before them affinely:
  /// their pieces are zero and their y an arithmetic progression, y_{j-1+m} = y_{j-1} + m (y_{j-1} -
  /// y_{j-2}), so only the ring's last two entries change.
  void skip_rows(i64 count) {
    const i64 j = index_.back();
    auto& ring = ring_.back();
    const SparseList& a = ring[(j + 2) % 3];  // y_{j-1}
    const SparseList& b = ring[(j + 1) % 3];  // y_{j-2}
    const i64 last = j + count;               // the next row after the skip
    // y_{last-1} = (1 + count) a - count b, y_{last-2} = count a - (count - 1) b.
    auto progression = [&](u64 wa, u64 wb, SparseList& dst) {
      dst.clear();
      std::size_t ia = 0, ib = 0;
      while (true) {
        const i64 pa = ia < a.size() ? a[ia].pos : kEnd;
        const i64 pb = ib < b.size() ? b[ib].pos : kEnd;
        const i64 p = std::min(pa, pb);
        if (p == kEnd) return;
        u64 v = 0;
        if (pa == p) v += wa * a[ia++].value;
        if (pb == p) v -= wb * b[ib++].value;
        if (v != 0) dst.push_back({p, v});
      }
    };
    const auto n = static_cast<u64>(count);
    progression(1 + n, n, scratch_[0]);
    progression(n, n - 1, scratch_[1]);
    std::swap(ring[(last + 2) % 3], scratch_[0]);
    std::swap(ring[(last + 1) % 3], scratch_[1]);
    index_.back() = last;
    if (index_.size() == 1) covered_ = last * slab_[0];
  }

  /// Entries held anywhere (for the nonzero limit).
  std::size_t held() const {
    std::size_t n = output_.size();
    for (std::size_t k = 0; k < ring_.size(); ++k) {
      n += building_[k].size();
      for (const SparseList& s : ring_[k]) n += s.size();
    }
    return n;
  }
  /// Flat positions below this are final in the output.
  i64 covered() const { return covered_; }

 private:
  void push(int k, SparseList& g) {
    const i64 j = index_[k];
    auto& ring = ring_[k];
    SparseList& dst = k == 0 ? output_ : building_[k - 1];
    combine(g, j >= 1 ? &ring[(j + 2) % 3] : nullptr, j >= 2 ? &ring[(j + 1) % 3] : nullptr, j * slab_[k], dst);
    std::swap(g, ring[j % 3]);
    g.clear();
    if (k == 0) {
      covered_ = (j + 1) * slab_[0];
    } else if (j == shape_[k] - 1) {  // the slice one level up is complete
      push(k - 1, building_[k - 1]);
    }
  }

  const Shape& shape_;
  SparseList& output_;
  std::vector<i64> slab_;
  std::vector<std::array<SparseList, 3>> ring_;
  std::vector<SparseList> building_;
  std::vector<i64> index_;
  SparseList scratch_[2];
  i64 covered_ = 0;
};

template <class T>
SparseList encode(const T* codes, const Shape& shape, u64 lo, std::size_t limit, SparseField& field) {
  SparseList out;
  const i64 numel = shape_numel(shape);
  field.complete = true;
  field.covered = numel;
  if (numel == 0) return out;
  if (shape.empty()) {
    const u64 x = u64{codes[0]} - lo;
    if (x != 0) out.push_back({0, x});
    return out;
  }
  const i64 length = shape.back();
  if (shape.size() == 1) {
    const i64 end = row_differences(codes, length, lo, out, limit);
    if (end < length) {
      field.complete = false;
      field.covered = end;
    }
    return out;
  }
  SliceCombiner combiner(shape, out);
  SparseList row;
  const i64 rows = numel / length;
  for (i64 r = 0; r < rows; ++r) {
    const T* x = codes + r * length;
    // Skip a run of rows that continue affinely in one flat pass: short rows then cost no per-row
    // overhead, and long rows no per-row entries where a wrap of a low digit cuts every row many times
    // (a parameter axis that walks the outer axis of a tensor, as a transpose does).
    if (combiner.next_row_index() >= 2) {
      const i64 skippable = std::min(combiner.rows_skippable(), rows - r);
      const i64 count = skippable > 0 ? continued_rows(x, length, skippable) : 0;
      if (count > 0) {
        combiner.skip_rows(count);
        r += count - 1;
        if (combiner.held() > limit) break;
        continue;
      }
    }
    Previous<T> previous;
    const bool has_previous = combiner.previous_rows(x, length, previous);
    const i64 end = row_differences(x, length, lo, row, limit, has_previous ? &previous : nullptr);
    if (end == length) combiner.push_row(row);
    if (r + 1 == rows && end == length) return out;
    if (end < length || combiner.held() > limit) break;
  }
  // Stopped: the output holds whole top-level slices only, all below the covered prefix.
  field.complete = false;
  field.covered = combiner.covered();
  return out;
}

void to_field(SparseList&& list, SparseField& field) {
  field.flat_positions.resize(list.size());
  field.values.resize(list.size());
  for (std::size_t k = 0; k < list.size(); ++k) {
    field.flat_positions[k] = list[k].pos;
    field.values[k] = static_cast<i64>(list[k].value);
  }
  list = SparseList();
}

void check_shape(const Shape& shape) {
  if (shape.size() > 8) fail("second differences: at most 8 axes, got " + shape_to_string(shape));
  for (i64 e : shape)
    if (e < 0) fail("second differences: negative extent in " + shape_to_string(shape));
}

void check_width(int element_bytes) {
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 && element_bytes != 8)
    fail("second differences: element width must be 1, 2, 4 or 8 bytes, got " + std::to_string(element_bytes));
}

/// Codes as 64-bit digits (for the reference).
std::vector<u64> load_digits(const void* codes, int element_bytes, i64 numel, u64 lo) {
  std::vector<u64> x(static_cast<std::size_t>(numel));
  const auto* bytes = static_cast<const unsigned char*>(codes);
  for (i64 i = 0; i < numel; ++i) {
    u64 code = 0;
    switch (element_bytes) {
      case 1: code = bytes[i]; break;
      case 2: { std::uint16_t v; std::memcpy(&v, bytes + 2 * i, 2); code = v; break; }
      case 4: { std::uint32_t v; std::memcpy(&v, bytes + 4 * i, 4); code = v; break; }
      default: std::memcpy(&code, bytes + 8 * i, 8); break;
    }
    x[static_cast<std::size_t>(i)] = code - lo;
  }
  return x;
}

}  // namespace

// --- public ------------------------------------------------------------------------------------------

SparseField second_differences(const void* codes, int element_bytes, const Shape& shape, std::uint64_t lo,
                               const SecondDifferenceOptions& options) {
  check_width(element_bytes);
  check_shape(shape);
  const i64 numel = shape_numel(shape);
  if (numel > 0 && codes == nullptr) fail("second differences: null codes for shape " + shape_to_string(shape));
  if (reinterpret_cast<std::uintptr_t>(codes) % static_cast<std::uintptr_t>(element_bytes) != 0)
    fail("second differences: codes not aligned to their " + std::to_string(element_bytes) + "-byte width");
  i64 limit = options.max_nonzeros;
  if (limit == SecondDifferenceOptions::kAuto) limit = std::max<i64>(4096, numel * element_bytes / 16);
  const auto cap = static_cast<std::size_t>(std::max<i64>(limit, 0));

  SparseField field;
  field.shape = shape;
  SparseList list;
  switch (element_bytes) {
    case 1: list = encode(static_cast<const std::uint8_t*>(codes), shape, lo, cap, field); break;
    case 2: list = encode(static_cast<const std::uint16_t*>(codes), shape, lo, cap, field); break;
    case 4: list = encode(static_cast<const std::uint32_t*>(codes), shape, lo, cap, field); break;
    default: list = encode(static_cast<const std::uint64_t*>(codes), shape, lo, cap, field); break;
  }
  if (!field.complete) {  // keep the exact prefix only
    auto end = std::find_if(list.begin(), list.end(), [&](const Entry& e) { return e.pos >= field.covered; });
    list.erase(end, list.end());
  }
  to_field(std::move(list), field);
  return field;
}

SparseField second_differences_reference(const void* codes, int element_bytes, const Shape& shape,
                                         std::uint64_t lo) {
  check_width(element_bytes);
  check_shape(shape);
  const i64 numel = shape_numel(shape);
  SparseField field;
  field.shape = shape;
  field.covered = numel;
  if (numel == 0) return field;
  std::vector<u64> x = load_digits(codes, element_bytes, numel, lo);
  const Shape strides = contiguous_strides(shape);
  for (std::size_t a = 0; a < shape.size(); ++a) {
    const i64 stride = strides[a];
    // Descending flat order, so x[i - e], x[i - 2e] are still the values before this axis's pass.
    for (i64 i = numel - 1; i >= 0; --i) {
      const i64 coordinate = (i / stride) % shape[a];
      auto& xi = x[static_cast<std::size_t>(i)];
      if (coordinate >= 1) xi -= 2 * x[static_cast<std::size_t>(i - stride)];
      if (coordinate >= 2) xi += x[static_cast<std::size_t>(i - 2 * stride)];
    }
  }
  for (i64 i = 0; i < numel; ++i) {
    if (x[static_cast<std::size_t>(i)] == 0) continue;
    field.flat_positions.push_back(i);
    field.values.push_back(static_cast<i64>(x[static_cast<std::size_t>(i)]));
  }
  return field;
}

}  // namespace wb::layout
