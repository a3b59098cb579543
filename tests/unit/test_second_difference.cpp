// The second-difference codec: the fast encoder against a dense reference, exact reconstruction, the
// corner property of box copies, wrap lines of low digits, every code width, limits and edge shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "layout/second_difference.hpp"
#include "layout/second_difference_lanes.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

/// Raw codes of one width, stored with the alignment the encoder requires.
struct Codes {
  int width = 2;
  std::vector<u64> storage;  // 8-byte aligned backing
  i64 numel = 0;

  Codes(int w, i64 n) : width(w), storage(static_cast<std::size_t>((n * w + 7) / 8 + 1), 0), numel(n) {}
  void* data() { return storage.data(); }
  const void* data() const { return storage.data(); }
  void set(i64 i, u64 code) {
    auto* p = reinterpret_cast<unsigned char*>(storage.data()) + i * width;
    switch (width) {
      case 1: *p = static_cast<std::uint8_t>(code); break;
      case 2: { auto v = static_cast<std::uint16_t>(code); std::memcpy(p, &v, 2); break; }
      case 4: { auto v = static_cast<std::uint32_t>(code); std::memcpy(p, &v, 4); break; }
      default: std::memcpy(p, &code, 8); break;
    }
  }
};

u64 max_code(int width) { return width == 8 ? ~u64{0} : (u64{1} << (8 * width)) - 1; }

/// A field made of affine boxes: per axis random cut points; each box is padding (code 0) or
/// base + sum_a coef_a (i_a - start_a) with random coefficients, negative and "transposed" (a stride the
/// size of another axis) included.
struct BoxField {
  Shape shape;
  std::vector<std::vector<i64>> starts;  // per axis: segment starts, beginning with 0
  u64 lo = 1;
  std::vector<i64> digits;  // the truth: code - lo, modulo 2^64
  Codes codes;

  BoxField(int width, i64 numel) : codes(width, numel) {}
};

i64 numel_of(const Shape& shape) {
  i64 n = 1;
  for (i64 e : shape) n *= e;
  return n;
}

Shape unflatten(i64 flat, const Shape& shape) {
  Shape index(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = flat % shape[a];
    flat /= shape[a];
  }
  return index;
}

/// extra_starts[a], when given, adds these segment starts along axis a.
BoxField make_box_field(std::mt19937_64& rng, const Shape& shape, int width, int max_cuts = 3,
                        const std::vector<std::vector<i64>>& extra_starts = {}, u64 forced_lo = 0) {
  const i64 numel = numel_of(shape);
  BoxField f(width, numel);
  f.shape = shape;
  const std::size_t n = shape.size();
  f.starts.resize(n);
  for (std::size_t a = 0; a < n; ++a) {
    f.starts[a] = {0};
    const int cuts = static_cast<int>(rng() % static_cast<u64>(max_cuts + 1));
    for (int c = 0; c < cuts && shape[a] > 1; ++c) f.starts[a].push_back(1 + static_cast<i64>(rng() % static_cast<u64>(shape[a] - 1)));
    if (a < extra_starts.size())
      for (i64 start : extra_starts[a])
        if (start > 0 && start < shape[a]) f.starts[a].push_back(start);
    std::sort(f.starts[a].begin(), f.starts[a].end());
    f.starts[a].erase(std::unique(f.starts[a].begin(), f.starts[a].end()), f.starts[a].end());
  }
  // Sometimes a lo that puts codes across the top bit, so the encoder's exact fallback is exercised.
  const u64 top = max_code(width);
  f.lo = rng() % 3 == 0 ? top / 2 - 40 : 1 + rng() % 7;
  if (width == 8) f.lo = rng() % 2 ? (u64{1} << 40) : 3;
  if (forced_lo != 0) f.lo = forced_lo;
  const u64 room = (width == 8 ? (u64{1} << 61) : top - f.lo);

  // One affine map per box, drawn lazily by box index.
  std::vector<std::size_t> boxes_per_axis(n);
  std::size_t num_boxes = 1;
  for (std::size_t a = 0; a < n; ++a) num_boxes *= (boxes_per_axis[a] = f.starts[a].size());
  struct Map {
    bool padding;
    u64 base;
    std::vector<i64> coef;
  };
  std::vector<Map> maps(num_boxes);
  for (std::size_t b = 0; b < num_boxes; ++b) {
    Map& m = maps[b];
    m.padding = rng() % 7 == 0;
    m.coef.resize(n);
    // Box extents, for the range.
    std::size_t rest = b;
    std::vector<i64> len(n);
    for (std::size_t a = n; a-- > 0;) {
      const std::size_t s = rest % boxes_per_axis[a];
      rest /= boxes_per_axis[a];
      const i64 end = s + 1 < f.starts[a].size() ? f.starts[a][s + 1] : shape[a];
      len[a] = end - f.starts[a][s];
    }
    for (int attempt = 0;; ++attempt) {
      i64 lo_sum = 0, hi_sum = 0;
      for (std::size_t a = 0; a < n; ++a) {
        const int kind = static_cast<int>(rng() % 6);
        i64 c = static_cast<i64>(rng() % 7) - 3;
        if (kind == 0 && n > 1) c = shape[(a + 1) % n];  // a transposed stride
        if (kind == 1 && n > 1) c = -shape[(a + 1) % n];
        if (attempt > 4) c = static_cast<i64>(rng() % 3) - 1;
        if (attempt > 8) c = 0;
        m.coef[a] = c;
        (c < 0 ? lo_sum : hi_sum) += c * (len[a] - 1);
      }
      const u64 range = static_cast<u64>(hi_sum - lo_sum);
      if (range > room) continue;
      m.base = static_cast<u64>(-lo_sum) + rng() % (room - range + 1);
      break;
    }
  }
  f.digits.resize(static_cast<std::size_t>(numel));
  for (i64 i = 0; i < numel; ++i) {
    const Shape index = unflatten(i, shape);
    std::size_t box = 0;
    Shape local(n);
    for (std::size_t a = 0; a < n; ++a) {
      const auto it = std::upper_bound(f.starts[a].begin(), f.starts[a].end(), index[a]) - 1;
      box = box * boxes_per_axis[a] + static_cast<std::size_t>(it - f.starts[a].begin());
      local[a] = index[a] - *it;
    }
    const Map& m = maps[box];
    u64 code = 0;
    if (!m.padding) {
      u64 digit = m.base;
      for (std::size_t a = 0; a < n; ++a) digit += static_cast<u64>(m.coef[a] * local[a]);
      code = digit + f.lo;
    }
    f.codes.set(i, code);
    f.digits[static_cast<std::size_t>(i)] = static_cast<i64>(code - f.lo);
  }
  return f;
}

void expect_same(const SparseField& a, const SparseField& b) {
  ASSERT_EQ(a.shape, b.shape);
  ASSERT_EQ(a.flat_positions, b.flat_positions);
  ASSERT_EQ(a.values, b.values);
}

/// Every element through evaluate_grid (whole grid), evaluate_points and, for small fields, evaluate.
void expect_reconstructs(const SparseField& field, const std::vector<i64>& digits) {
  const std::size_t n = field.shape.size();
  std::vector<std::vector<i64>> all(n);
  for (std::size_t a = 0; a < n; ++a)
    for (i64 c = 0; c < field.shape[a]; ++c) all[a].push_back(c);
  ASSERT_EQ(evaluate_grid(field, all), digits);
  std::vector<i64> points;
  for (i64 i = 0; i < static_cast<i64>(digits.size()); ++i) {
    const Shape index = unflatten(i, field.shape);
    points.insert(points.end(), index.begin(), index.end());
    if (digits.size() <= 4096 || i % 97 == 0) {
      ASSERT_EQ(evaluate(field, index), digits[static_cast<std::size_t>(i)]) << i;
    }
  }
  if (n > 0) {
    ASSERT_EQ(evaluate_points(field, points), digits);
  }
}

Shape random_shape(std::mt19937_64& rng, int ndim, i64 max_extent) {
  Shape shape(static_cast<std::size_t>(ndim));
  for (auto& e : shape) e = 1 + static_cast<i64>(rng() % static_cast<u64>(max_extent));
  return shape;
}

TEST(SecondDifference, RandomBoxesMatchReferenceAndReconstruct) {
  std::mt19937_64 rng(7);
  for (int width : {1, 2, 4, 8}) {
    for (int ndim = 1; ndim <= 4; ++ndim) {
      for (int trial = 0; trial < 25; ++trial) {
        const i64 max_extent = ndim == 1 ? 700 : ndim == 2 ? 40 : ndim == 3 ? 14 : 7;
        Shape shape = random_shape(rng, ndim, max_extent);
        if (trial % 5 == 0) shape.back() = 250 + static_cast<i64>(rng() % 400);  // the chunked row paths
        const BoxField f = make_box_field(rng, shape, width);
        SCOPED_TRACE("width " + std::to_string(width) + " shape " + shape_to_string(shape));
        const SparseField fast = second_differences(f.codes.data(), width, shape, f.lo);
        EXPECT_TRUE(fast.complete);
        EXPECT_EQ(fast.covered, numel_of(shape));
        expect_same(fast, second_differences_reference(f.codes.data(), width, shape, f.lo));
        ASSERT_TRUE(std::is_sorted(fast.flat_positions.begin(), fast.flat_positions.end()));
        for (i64 v : fast.values) ASSERT_NE(v, 0);
        expect_reconstructs(fast, f.digits);
      }
    }
  }
}

// Column cuts at and around chunk boundaries of the encoder (2 + 256 k, 2 + 32 k, the overlapped tail),
// over many rows, so rows that continue the two before them take the path that copies their
// differences instead of scanning; plus short rows, where runs of continuing rows are skipped at once.
TEST(SecondDifference, ColumnCutsAtChunkBoundariesOverManyRows) {
  std::mt19937_64 rng(21);
  std::vector<i64> boundaries;
  for (i64 base : {2, 34, 66, 258, 290, 514, 770})
    for (i64 delta : {-2, -1, 0, 1, 2}) boundaries.push_back(base + delta);
  for (int width : {1, 2, 4, 8}) {
    for (int trial = 0; trial < 12; ++trial) {
      const Shape shape{3 + static_cast<i64>(rng() % 40), 200 + static_cast<i64>(rng() % 700)};
      std::vector<i64> columns;
      for (i64 b : boundaries) if (rng() % 3 == 0) columns.push_back(b);
      columns.push_back(shape[1] - 1 - static_cast<i64>(rng() % 40));  // inside the tail chunk
      const BoxField f = make_box_field(rng, shape, width, 2, {{}, columns});
      SCOPED_TRACE("width " + std::to_string(width) + " shape " + shape_to_string(shape));
      const SparseField field = second_differences(f.codes.data(), width, shape, f.lo);
      expect_same(field, second_differences_reference(f.codes.data(), width, shape, f.lo));
      expect_reconstructs(field, f.digits);
    }
    for (int trial = 0; trial < 12; ++trial) {
      const Shape shape{1 + static_cast<i64>(rng() % 5), 3 + static_cast<i64>(rng() % 600), 1 + static_cast<i64>(rng() % 40)};
      const BoxField f = make_box_field(rng, shape, width, 3);
      SCOPED_TRACE("width " + std::to_string(width) + " shape " + shape_to_string(shape));
      const SparseField field = second_differences(f.codes.data(), width, shape, f.lo);
      expect_same(field, second_differences_reference(f.codes.data(), width, shape, f.lo));
      expect_reconstructs(field, f.digits);
    }
  }
}

// Staggered layouts: column blocks, each with its own row cuts (a concatenation of differently
// sharded parts), so a row can continue the rows before it in some columns and not in others.
TEST(SecondDifference, StaggeredColumnBlocks) {
  std::mt19937_64 rng(33);
  for (int width : {1, 2, 4, 8}) {
    for (int trial = 0; trial < 16; ++trial) {
      const i64 rows = 3 + static_cast<i64>(rng() % 30);
      std::vector<i64> starts = {0};
      for (i64 b : {34, 66, 258, 290, 514})
        if (rng() % 2) starts.push_back(b + static_cast<i64>(rng() % 5) - 2);
      const i64 columns = starts.back() + 1 + static_cast<i64>(rng() % 300);
      const Shape shape{rows, columns};
      const u64 lo = width == 8 ? 3 : (rng() % 2 ? 5 : max_code(width) / 2 - 40);
      Codes codes(width, rows * columns);
      std::vector<i64> digits(static_cast<std::size_t>(rows * columns));
      for (std::size_t k = 0; k < starts.size(); ++k) {
        const i64 begin = starts[k], end = k + 1 < starts.size() ? starts[k + 1] : columns;
        const BoxField part = make_box_field(rng, {rows, end - begin}, width, 4, {}, lo);
        for (i64 r = 0; r < rows; ++r)
          for (i64 j = begin; j < end; ++j) {
            const i64 d = part.digits[static_cast<std::size_t>(r * (end - begin) + j - begin)];
            codes.set(r * columns + j, static_cast<u64>(d) + lo);
            digits[static_cast<std::size_t>(r * columns + j)] = d;
          }
      }
      SCOPED_TRACE("width " + std::to_string(width) + " shape " + shape_to_string(shape));
      const SparseField field = second_differences(codes.data(), width, shape, lo);
      expect_same(field, second_differences_reference(codes.data(), width, shape, lo));
      expect_reconstructs(field, digits);
    }
  }
}

// A nonzero needs its 3-wide backward window to straddle a cut on every axis: so it sits at s or s + 1
// for a segment start s on each axis, at most 2^n per grid vertex (<= 16 per 2-D box).
TEST(SecondDifference, NonzerosOnlyNextToBoxCorners) {
  std::mt19937_64 rng(11);
  for (int ndim = 1; ndim <= 4; ++ndim) {
    for (int trial = 0; trial < 40; ++trial) {
      const Shape shape = random_shape(rng, ndim, ndim <= 2 ? 60 : 12);
      const BoxField f = make_box_field(rng, shape, 2, 4);
      const SparseField field = second_differences(f.codes.data(), 2, shape, f.lo);
      std::size_t boxes = 1;
      for (const auto& s : f.starts) boxes *= s.size();
      EXPECT_LE(field.flat_positions.size(), boxes * (std::size_t{1} << (2 * ndim)));
      for (std::int64_t k = 0; k < field.size(); ++k) {
        const Shape q = field.index_of(k);
        for (int a = 0; a < ndim; ++a) {
          const auto& s = f.starts[static_cast<std::size_t>(a)];
          const bool near = std::find(s.begin(), s.end(), q[a]) != s.end() ||
                            std::find(s.begin(), s.end(), q[a] - 1) != s.end();
          EXPECT_TRUE(near) << "nonzero at " << shape_to_string(q) << " far from the cuts of axis " << a;
        }
      }
      for (int a = 0; a < ndim; ++a) {
        for (i64 c : nonzero_coordinates(field, a)) {
          const auto& s = f.starts[static_cast<std::size_t>(a)];
          EXPECT_TRUE(std::find(s.begin(), s.end(), c) != s.end() || std::find(s.begin(), s.end(), c - 1) != s.end());
        }
      }
    }
  }
}

// The low digit of a large coordinate wraps: x = (a + b r + c j) mod D. Nonzeros appear only where the
// backward 3x3 window contains a wrap (or at the array start), and reconstruction stays exact.
TEST(SecondDifference, WrapLinesOfLowDigits) {
  std::mt19937_64 rng(5);
  for (int width : {1, 2, 4}) {
    for (int trial = 0; trial < 12; ++trial) {
      const Shape shape{1 + static_cast<i64>(rng() % 90), 1 + static_cast<i64>(rng() % 400)};
      const i64 base_d = width == 1 ? 120 : 1000 + static_cast<i64>(rng() % 5000);
      const i64 a0 = static_cast<i64>(rng() % 1000), b = static_cast<i64>(rng() % 40), c = 1 + static_cast<i64>(rng() % 9);
      Codes codes(width, numel_of(shape));
      std::vector<i64> digits;
      auto high = [&](i64 r, i64 j) { return (a0 + b * r + c * j) / base_d; };
      for (i64 r = 0; r < shape[0]; ++r)
        for (i64 j = 0; j < shape[1]; ++j) {
          const i64 digit = (a0 + b * r + c * j) % base_d;
          codes.set(r * shape[1] + j, static_cast<u64>(digit) + 2);
          digits.push_back(digit);
        }
      const SparseField field = second_differences(codes.data(), width, shape, 2);
      expect_same(field, second_differences_reference(codes.data(), width, shape, 2));
      for (std::int64_t k = 0; k < field.size(); ++k) {
        const Shape q = field.index_of(k);
        if (q[0] < 2 && q[1] < 2) continue;
        bool wraps = false;
        for (i64 r = std::max<i64>(0, q[0] - 2); r <= q[0]; ++r)
          for (i64 j = std::max<i64>(0, q[1] - 2); j <= q[1]; ++j) wraps = wraps || high(r, j) != high(q[0], q[1]);
        // At the first two rows or columns the window is cut by the array start, which keeps a line.
        EXPECT_TRUE(wraps || q[0] < 2 || q[1] < 2) << "nonzero at " << shape_to_string(q) << " without a wrap";
      }
      expect_reconstructs(field, digits);
    }
  }
}

// Codes with the top bit set: the wrapping 16-bit test sees a, a + 2^15, a, ... as affine (the second
// difference is 2^16); the encoder must not.
TEST(SecondDifference, TopBitCodesAreExact) {
  for (int width : {1, 2, 4}) {
    const i64 n = 777;
    Codes codes(width, n);
    const u64 half = u64{1} << (8 * width - 1);
    std::vector<i64> digits;
    for (i64 i = 0; i < n; ++i) {
      const u64 code = (i % 2 ? half : 0) + 5 + (i > 500 ? 1 : 0);
      codes.set(i, code);
      digits.push_back(static_cast<i64>(code - 3));
    }
    const SparseField field = second_differences(codes.data(), width, {n}, 3);
    expect_same(field, second_differences_reference(codes.data(), width, {n}, 3));
    EXPECT_GT(field.size(), n / 2);
    expect_reconstructs(field, digits);
  }
  // The same across rows, for short rows (runs of rows skipped at once) and long ones (where a row test
  // that fails, here at a kink, consults the test across rows).
  for (int width : {1, 2, 4}) {
    for (const Shape& shape : {Shape{9, 40}, Shape{9, 600}, Shape{3, 7, 300}}) {
      const i64 rows = shape_numel(shape) / shape.back(), length = shape.back();
      Codes codes(width, rows * length);
      const u64 half = u64{1} << (8 * width - 1);
      std::vector<i64> digits;
      for (i64 r = 0; r < rows; ++r)
        for (i64 j = 0; j < length; ++j) {
          // From row 4 on (after a run that continues exactly), odd rows jump by 2^(w-1) in the part
          // of the row past length / 3: wrapping w-bit arithmetic sees the rows as continuing.
          const bool jump = r >= 4 && r % 2 == 1 && j > length / 3;
          const u64 code = (jump ? half : 0) + 5 + (j > length / 2 ? static_cast<u64>(j - length / 2) % 16 : 0);
          codes.set(r * length + j, code);
          digits.push_back(static_cast<i64>(code - 3));
        }
      SCOPED_TRACE("width " + std::to_string(width) + " shape " + shape_to_string(shape));
      const SparseField field = second_differences(codes.data(), width, shape, 3);
      expect_same(field, second_differences_reference(codes.data(), width, shape, 3));
      expect_reconstructs(field, digits);
    }
  }
}

// The 2-byte zero test in every lane width this CPU runs, against a + c = 2 b in integers: runs whose
// second differences are all zero, then one element changed at every position of runs of every length
// around the vector widths, by +-1, +-2 and by +-2^16 (what a test in wrapping 16-bit lanes takes for 0).
TEST(SecondDifference, ZeroTestIsExactInEveryLaneWidth) {
  std::mt19937_64 rng(5);
  const i64 lengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 96, 97, 128, 255, 256, 257};
  for (const DifferenceLanes lanes : {DifferenceLanes::kScalar, DifferenceLanes::kSse2, DifferenceLanes::kAvx2,
                                      DifferenceLanes::kAvx512}) {
    if (!difference_lanes_supported(lanes)) continue;
    SCOPED_TRACE("lanes " + std::to_string(static_cast<int>(lanes)));
    for (const i64 n : lengths) {
      // b random, a and c the same distance above and below it: a + c = 2 b exactly, any top bits.
      std::vector<std::uint16_t> a(static_cast<std::size_t>(n)), b(a), c(a);
      for (i64 k = 0; k < n; ++k) {
        const auto mid = static_cast<std::int32_t>(rng() % 65536);
        const std::int32_t room = std::min(mid, 65535 - mid);
        const auto d = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(room + 1));
        a[static_cast<std::size_t>(k)] = static_cast<std::uint16_t>(mid + d);
        b[static_cast<std::size_t>(k)] = static_cast<std::uint16_t>(mid);
        c[static_cast<std::size_t>(k)] = static_cast<std::uint16_t>(mid - d);
      }
      ASSERT_TRUE(zero_second_differences16(a.data(), b.data(), c.data(), n, lanes)) << "n " << n;
      for (i64 k = 0; k < n; ++k) {
        const auto i = static_cast<std::size_t>(k);
        const std::uint16_t a0 = a[i], b0 = b[i], c0 = c[i];
        // (a, b, c) with a + c - 2 b = -2^16, +2^16, +1, -1 where b is the rounded-up average, -1 at the top,
        // +-2 (b changed, a and c kept), and one that is still 0.
        const std::uint16_t cases[][3] = {{0, 32768, 0},     {65535, 32767, 65535}, {1, 0, 0},
                                          {1, 1, 0},         {65535, 65535, 65534}, {a0, static_cast<std::uint16_t>(b0 ^ 1), c0},
                                          {65533, 65534, 65535}};
        for (const auto& t : cases) {
          a[i] = t[0], b[i] = t[1], c[i] = t[2];
          const bool zero = std::int64_t{t[0]} + t[2] == 2 * std::int64_t{t[1]};
          ASSERT_EQ(zero_second_differences16(a.data(), b.data(), c.data(), n, lanes), zero)
              << "n " << n << " at " << k << ": " << t[0] << " " << t[1] << " " << t[2];
        }
        a[i] = a0, b[i] = b0, c[i] = c0;
      }
    }
  }
}

TEST(SecondDifference, LargeDigitsOfEightByteCodes) {
  const Shape shape{6, 300};
  Codes codes(8, numel_of(shape));
  const u64 lo = u64{1} << 52;
  std::vector<i64> digits;
  for (i64 r = 0; r < 6; ++r)
    for (i64 j = 0; j < 300; ++j) {
      const u64 digit = (u64{1} << 61) + static_cast<u64>(r) * (u64{1} << 40) - static_cast<u64>(j) * 977 + (j >= 200 ? 12345 : 0);
      codes.set(r * 300 + j, digit + lo);
      digits.push_back(static_cast<i64>(digit));
    }
  const SparseField field = second_differences(codes.data(), 8, shape, lo);
  expect_same(field, second_differences_reference(codes.data(), 8, shape, lo));
  expect_reconstructs(field, digits);
}

TEST(SecondDifference, AffineRunsGiveOnlyStartNonzeros) {
  // One affine op over a big 2-D parameter (a transposed copy): 4 nonzeros, at rows and columns 0 and 1.
  const Shape shape{64, 4096};
  Codes codes(2, numel_of(shape));
  for (i64 r = 0; r < 64; ++r)
    for (i64 j = 0; j < 4096; ++j) codes.set(r * 4096 + j, 0x80 + static_cast<u64>(j * 7 + r));
  const SparseField field = second_differences(codes.data(), 2, shape, 0x80);
  EXPECT_LE(field.size(), 4);
  for (i64 k = 0; k < field.size(); ++k) {
    const Shape q = field.index_of(k);
    EXPECT_LT(q[0], 2);
    EXPECT_LT(q[1], 2);
  }
  EXPECT_EQ(evaluate(field, std::vector<i64>{63, 4095}), 4095 * 7 + 63);
  EXPECT_EQ(evaluate_grid(field, {{0, 10, 63}, {1, 4095}}),
            (std::vector<i64>{7, 4095 * 7, 10 + 7, 10 + 4095 * 7, 63 + 7, 63 + 4095 * 7}));
}

TEST(SecondDifference, EdgeShapes) {
  std::mt19937_64 rng(3);
  // 0-D: one element; its digit is C itself.
  {
    Codes codes(4, 1);
    codes.set(0, 1000);
    const SparseField field = second_differences(codes.data(), 4, {}, 10);
    ASSERT_EQ(field.size(), 1);
    EXPECT_EQ(field.values[0], 990);
    EXPECT_EQ(evaluate(field, {}), 990);
    EXPECT_EQ(evaluate_grid(field, {}), std::vector<i64>{990});
  }
  // Zero-size shapes: nothing.
  for (const Shape& shape : {Shape{0}, Shape{3, 0}, Shape{0, 5, 2}}) {
    Codes codes(2, 1);
    const SparseField field = second_differences(codes.data(), 2, shape, 1);
    EXPECT_TRUE(field.empty());
    EXPECT_TRUE(field.complete);
  }
  // Extents of 1 and 2 anywhere, and up to 8 axes.
  const std::vector<Shape> shapes = {{1}, {2}, {3}, {1, 1}, {1, 300}, {300, 1}, {2, 1, 2}, {1, 2, 1, 3},
                                     {2, 2, 2, 2, 2, 2, 2, 2}, {3, 1, 2, 3, 1, 2, 3, 2}, {2, 3, 2, 1, 2, 300}};
  for (const Shape& shape : shapes) {
    for (int width : {1, 2, 8}) {
      SCOPED_TRACE(shape_to_string(shape));
      const BoxField f = make_box_field(rng, shape, width, 2);
      const SparseField field = second_differences(f.codes.data(), width, shape, f.lo);
      expect_same(field, second_differences_reference(f.codes.data(), width, shape, f.lo));
      expect_reconstructs(field, f.digits);
    }
  }
  // 8-D random boxes.
  for (int trial = 0; trial < 5; ++trial) {
    const Shape shape = random_shape(rng, 8, 4);
    const BoxField f = make_box_field(rng, shape, 2, 1);
    const SparseField field = second_differences(f.codes.data(), 2, shape, f.lo);
    expect_same(field, second_differences_reference(f.codes.data(), 2, shape, f.lo));
    expect_reconstructs(field, f.digits);
  }
}

// A load_weights that is not a copy leaves noise: the encoder stops at the limit, keeps an exact prefix.
TEST(SecondDifference, NonzeroLimitKeepsAnExactPrefix) {
  std::mt19937_64 rng(9);
  for (const Shape& shape : {Shape{5000}, Shape{40, 100}, Shape{6, 10, 30}}) {
    const i64 numel = numel_of(shape);
    Codes codes(2, numel);
    std::vector<i64> digits;
    for (i64 i = 0; i < numel; ++i) {
      const u64 code = 1 + rng() % 30000;
      codes.set(i, code);
      digits.push_back(static_cast<i64>(code) - 1);
    }
    SecondDifferenceOptions options;
    options.max_nonzeros = 1000;
    const SparseField field = second_differences(codes.data(), 2, shape, 1, options);
    EXPECT_FALSE(field.complete);
    EXPECT_LT(field.covered, numel);
    EXPECT_LE(field.size(), 1000 + 2 * shape.back());
    const SparseField full = second_differences_reference(codes.data(), 2, shape, 1);
    std::vector<i64> prefix_positions, prefix_values;
    for (i64 k = 0; k < full.size(); ++k) {
      if (full.flat_positions[k] >= field.covered) break;
      prefix_positions.push_back(full.flat_positions[k]);
      prefix_values.push_back(full.values[k]);
    }
    EXPECT_EQ(field.flat_positions, prefix_positions);
    EXPECT_EQ(field.values, prefix_values);
    for (i64 i = 0; i < field.covered; i += 7) EXPECT_EQ(evaluate(field, unflatten(i, shape)), digits[static_cast<std::size_t>(i)]);
    // The automatic limit: a parameter's own bytes at 16 bytes per nonzero.
    const SparseField automatic = second_differences(codes.data(), 2, shape, 1);
    if (full.size() > 4096) {
      EXPECT_FALSE(automatic.complete);
    }
    options.max_nonzeros = SecondDifferenceOptions::kUnlimited;
    expect_same(second_differences(codes.data(), 2, shape, 1, options), full);
  }
}

TEST(SecondDifference, RejectsBadArguments) {
  std::vector<u64> storage(16, 0);
  EXPECT_THROW(second_differences(storage.data(), 3, {4}, 1), Error);
  EXPECT_THROW(second_differences(reinterpret_cast<unsigned char*>(storage.data()) + 1, 2, {4}, 1), Error);
  EXPECT_THROW(second_differences(storage.data(), 1, Shape(9, 1), 1), Error);
  EXPECT_THROW(second_differences(storage.data(), 1, {-1}, 1), Error);
  const SparseField field = second_differences(storage.data(), 2, {4, 4}, 0);
  EXPECT_TRUE(field.empty());
  EXPECT_THROW(evaluate(field, std::vector<i64>{4, 0}), Error);
  EXPECT_THROW(evaluate(field, std::vector<i64>{0}), Error);
  EXPECT_THROW(evaluate_grid(field, {{1, 0}, {0}}), Error);
  EXPECT_THROW(nonzero_coordinates(field, 2), Error);
  EXPECT_EQ(evaluate_grid(field, {{0, 3}, {2}}), (std::vector<i64>{0, 0}));
}

}  // namespace
}  // namespace wb::layout
