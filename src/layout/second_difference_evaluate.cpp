// Evaluating the second-difference codec's field back from its nonzeros (second_difference.hpp has the
// maths): at one index, on a grid of coordinates, at a list of points; and the coordinates of the cuts.
// Arithmetic is modulo 2^64, as in encoding.
#include <algorithm>
#include <string>

#include "layout/second_difference.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

[[noreturn]] void fail(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

}  // namespace

Shape SparseField::index_of(std::int64_t k) const {
  Shape index(shape.size());
  i64 flat = flat_positions[static_cast<std::size_t>(k)];
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = flat % shape[a];
    flat /= shape[a];
  }
  return index;
}

std::int64_t evaluate(const SparseField& field, std::span<const std::int64_t> index) {
  const std::size_t n = field.shape.size();
  if (index.size() != n) fail("evaluate: index has " + std::to_string(index.size()) + " axes, field " +
                              shape_to_string(field.shape));
  i64 flat = 0;
  for (std::size_t a = 0; a < n; ++a) {
    if (index[a] < 0 || index[a] >= field.shape[a]) fail("evaluate: index outside " + shape_to_string(field.shape));
    flat = flat * field.shape[a] + index[a];
  }
  u64 sum = 0;
  for (std::size_t k = 0; k < field.flat_positions.size() && field.flat_positions[k] <= flat; ++k) {
    i64 q = field.flat_positions[k];
    u64 weight = 1;
    bool dominated = true;
    for (std::size_t a = n; a-- > 0;) {
      const i64 qa = q % field.shape[a];
      q /= field.shape[a];
      if (qa > index[a]) {
        dominated = false;
        break;
      }
      weight *= static_cast<u64>(index[a] - qa + 1);
    }
    if (dominated) sum += weight * static_cast<u64>(field.values[k]);
  }
  return static_cast<i64>(sum);
}

std::vector<std::int64_t> evaluate_grid(const SparseField& field,
                                        const std::vector<std::vector<std::int64_t>>& coords) {
  const std::size_t n = field.shape.size();
  if (coords.size() != n) fail("evaluate_grid: coordinates for " + std::to_string(coords.size()) +
                               " axes, field " + shape_to_string(field.shape));
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t t = 0; t < coords[a].size(); ++t) {
      if (coords[a][t] < 0 || coords[a][t] >= field.shape[a] || (t > 0 && coords[a][t] <= coords[a][t - 1]))
        fail("evaluate_grid: coordinates along axis " + std::to_string(a) +
             " must increase strictly inside " + shape_to_string(field.shape));
    }
    if (coords[a].empty()) return {};
  }
  if (n == 0) return {evaluate(field, {})};

  // The nonzeros that reach some requested point, as grid indices; the grid per axis is the union of the
  // requested coordinates and theirs.
  std::vector<std::vector<i64>> grid(n);
  std::vector<i64> kept;  // multi-indices of kept nonzeros, n per nonzero
  std::vector<u64> kept_values;
  Shape q(n);
  for (std::size_t k = 0; k < field.flat_positions.size(); ++k) {
    i64 flat = field.flat_positions[k];
    bool reaches = true;
    for (std::size_t a = n; a-- > 0;) {
      q[a] = flat % field.shape[a];
      flat /= field.shape[a];
      reaches = reaches && q[a] <= coords[a].back();
    }
    if (!reaches) continue;
    kept.insert(kept.end(), q.begin(), q.end());
    kept_values.push_back(static_cast<u64>(field.values[k]));
  }
  std::vector<i64> sizes(n);
  i64 cells = 1;
  for (std::size_t a = 0; a < n; ++a) {
    grid[a] = coords[a];
    for (std::size_t k = 0; k < kept_values.size(); ++k) grid[a].push_back(kept[k * n + a]);
    std::sort(grid[a].begin(), grid[a].end());
    grid[a].erase(std::unique(grid[a].begin(), grid[a].end()), grid[a].end());
    sizes[a] = static_cast<i64>(grid[a].size());
    if (cells > (i64{1} << 31) / sizes[a]) fail("evaluate_grid: grid over 2^31 cells for " + shape_to_string(field.shape));
    cells *= sizes[a];
  }
  std::vector<u64> v(static_cast<std::size_t>(cells), 0);
  for (std::size_t k = 0; k < kept_values.size(); ++k) {
    i64 cell = 0;
    for (std::size_t a = 0; a < n; ++a) {
      const auto it = std::lower_bound(grid[a].begin(), grid[a].end(), kept[k * n + a]);
      cell = cell * sizes[a] + (it - grid[a].begin());
    }
    v[static_cast<std::size_t>(cell)] += kept_values[k];
  }
  // Double prefix sum along each axis (S1 running sum, S2 running sum of S1): between grid coordinates
  // the input is zero, so S1 is constant and S2 grows by S1 per step; then keep the requested ones only.
  std::vector<u64> next, s1, s2;
  for (std::size_t a = 0; a < n; ++a) {
    i64 outer = 1, inner = 1;
    for (std::size_t b = 0; b < a; ++b) outer *= sizes[b];
    for (std::size_t b = a + 1; b < n; ++b) inner *= sizes[b];
    const i64 len = sizes[a], kept_len = static_cast<i64>(coords[a].size());
    next.assign(static_cast<std::size_t>(outer * kept_len * inner), 0);
    s1.resize(static_cast<std::size_t>(inner));
    s2.resize(static_cast<std::size_t>(inner));
    for (i64 o = 0; o < outer; ++o) {
      std::fill(s1.begin(), s1.end(), 0);
      std::fill(s2.begin(), s2.end(), 0);
      i64 previous = -1, r = 0;
      for (i64 t = 0; t < len; ++t) {
        const u64 gap = static_cast<u64>(grid[a][t] - previous - 1);
        previous = grid[a][t];
        const u64* in = v.data() + (o * len + t) * inner;
        for (i64 i = 0; i < inner; ++i) {
          s2[i] += gap * s1[i];
          s1[i] += in[i];
          s2[i] += s1[i];
        }
        if (r < kept_len && coords[a][r] == grid[a][t]) {
          std::copy(s2.begin(), s2.end(), next.begin() + (o * kept_len + r) * inner);
          ++r;
        }
      }
    }
    sizes[a] = kept_len;
    v.swap(next);
  }
  return std::vector<i64>(v.begin(), v.end());
}

std::vector<std::int64_t> evaluate_points(const SparseField& field, std::span<const std::int64_t> points) {
  const std::size_t n = field.shape.size();
  if (n == 0) return std::vector<i64>(points.empty() ? 0 : 1, evaluate(field, {}));
  if (points.size() % n != 0) fail("evaluate_points: " + std::to_string(points.size()) + " values for " +
                                   std::to_string(n) + "-axis points");
  const std::size_t m = points.size() / n;
  std::vector<i64> result(m);
  if (m == 0) return result;
  std::vector<std::vector<i64>> coords(n);
  for (std::size_t p = 0; p < m; ++p)
    for (std::size_t a = 0; a < n; ++a) coords[a].push_back(points[p * n + a]);
  double cells = 1;  // an upper bound of the grid's size: requested plus nonzero coordinates per axis
  for (std::size_t a = 0; a < n; ++a) {
    std::sort(coords[a].begin(), coords[a].end());
    coords[a].erase(std::unique(coords[a].begin(), coords[a].end()), coords[a].end());
    cells *= static_cast<double>(coords[a].size() + field.flat_positions.size());
  }
  const double k = static_cast<double>(field.flat_positions.size());
  if (cells <= 8.0 * (k + static_cast<double>(m)) + 65536.0) {
    const std::vector<i64> values = evaluate_grid(field, coords);
    for (std::size_t p = 0; p < m; ++p) {
      i64 cell = 0;
      for (std::size_t a = 0; a < n; ++a) {
        const i64 c = points[p * n + a];
        const auto it = std::lower_bound(coords[a].begin(), coords[a].end(), c);
        cell = cell * static_cast<i64>(coords[a].size()) + (it - coords[a].begin());
      }
      result[p] = values[static_cast<std::size_t>(cell)];
    }
    return result;
  }
  for (std::size_t p = 0; p < m; ++p) result[p] = evaluate(field, points.subspan(p * n, n));
  return result;
}

std::vector<std::int64_t> nonzero_coordinates(const SparseField& field, int axis) {
  if (axis < 0 || axis >= field.ndim()) fail("nonzero_coordinates: no axis " + std::to_string(axis) + " in " +
                                             shape_to_string(field.shape));
  i64 inner = 1;
  for (std::size_t b = static_cast<std::size_t>(axis) + 1; b < field.shape.size(); ++b) inner *= field.shape[b];
  std::vector<i64> result;
  result.reserve(field.flat_positions.size());
  for (i64 flat : field.flat_positions) result.push_back((flat / inner) % field.shape[static_cast<std::size_t>(axis)]);
  std::sort(result.begin(), result.end());
  result.erase(std::unique(result.begin(), result.end()), result.end());
  return result;
}

}  // namespace wb::layout
