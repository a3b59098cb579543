// The second-difference codec of the layout probe (docs/architecture.md, component 1).
//
// After a probe pass every parameter element holds a raw code: an unsigned integer of the parameter's
// element width whose value minus a per-dtype constant lo is a digit (code 0, "no source", gives -lo).
// Inside one slice copy the digit is an affine function of the parameter's multi-index, so the composite
// second difference C = D_0 D_1 ... D_{n-1} x (D_a: x[i] - 2 x[i - e_a] + x[i - 2 e_a], zero padding before
// the start of each axis) is zero except next to the corners of the copied boxes. The codec keeps the
// nonzeros of C, and nothing else, and evaluates the field back from them:
//
//   x[p] = sum over q <= p (componentwise) of  prod_a (p_a - q_a + 1) * C[q].
//
// Arithmetic is modulo 2^64 throughout (encoding and evaluation alike), so evaluation returns every digit
// exactly, whatever the codes; C itself equals the true integer second difference whenever that fits in
// an int64 (always, for digits below 2^(62 - 2 n) on an n-D parameter).
//
// Memory: encoding reads the codes in place and keeps O(row) scratch plus the sparse results of the last
// three slices of each axis; it never materializes a per-element 64-bit field.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "weightbridge/tensor.hpp"

namespace wb::layout {

/// The nonzeros of the composite second difference of an N-D field (row-major, `shape`).
struct SparseField {
  Shape shape;
  /// Row-major flat positions of the nonzeros, strictly increasing.
  std::vector<std::int64_t> flat_positions;
  /// C at those positions (never 0).
  std::vector<std::int64_t> values;
  /// False when encoding stopped at the nonzero limit: then only flat positions below `covered` are
  /// represented, and evaluate() is exact only there.
  bool complete = true;
  std::int64_t covered = 0;

  std::int64_t size() const { return static_cast<std::int64_t>(flat_positions.size()); }
  bool empty() const { return flat_positions.empty(); }
  int ndim() const { return static_cast<int>(shape.size()); }
  /// Multi-index of nonzero k.
  Shape index_of(std::int64_t k) const;
};

struct SecondDifferenceOptions {
  /// Encoding stops (complete = false) once more nonzeros than this are held, so a load_weights that is
  /// not a copy (a scale, a conversion: nonzeros everywhere) cannot blow the memory budget. kAuto: as many
  /// as the parameter's own bytes hold at 16 bytes per nonzero, and at least 4096.
  static constexpr std::int64_t kAuto = -1;
  static constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();
  std::int64_t max_nonzeros = kAuto;
};

/// Nonzeros of C for raw probe codes: `codes` holds shape_numel(shape) contiguous row-major unsigned
/// integers of `element_bytes` (1, 2, 4 or 8) bytes, aligned to that width; digit = code - lo. Throws
/// wb::Error (kInvalidArgument) on a bad width, misaligned codes, a negative extent or over 8 axes. A 0-D
/// shape is one element; a shape with a zero extent gives an empty field.
///
/// Cost: one streaming pass over the codes, O(numel + nonzeros of the per-row differences). Rows (the
/// last axis) are tested in fixed-size chunks: 2-byte codes exactly in 16-bit lanes of the widest vectors
/// the CPU has (second_difference_lanes.hpp), the others with wrapping w-bit arithmetic that GCC
/// vectorizes at -O2 (codes with the top bit set are retested in exact lanes). A chunk that is not affine along the row
/// but continues the two rows before it (column cuts, wrap lines) takes its differences from theirs;
/// only the rest is scanned. Short rows are tested for continuation many rows at a time. The other axes
/// then work on sparse per-row results only. On one core: ~10 G elements/s for affine bf16 runs.
SparseField second_differences(const void* codes, int element_bytes, const Shape& shape, std::uint64_t lo,
                               const SecondDifferenceOptions& options = {});

/// The reference: dense, per axis, in 64-bit arithmetic. O(numel) 64-bit scratch; for tests and checks.
SparseField second_differences_reference(const void* codes, int element_bytes, const Shape& shape,
                                         std::uint64_t lo);

/// The digit at one multi-index. O(K * ndim) for K nonzeros (stops at the first nonzero past the point in
/// flat order).
std::int64_t evaluate(const SparseField& field, std::span<const std::int64_t> index);

/// The digits on a grid: coords[a] lists distinct increasing coordinates along axis a, inside the shape.
/// Returns prod_a coords[a].size() values, row-major over the grid (the last axis fastest).
///
/// Works on the grid G whose axis-a coordinates are coords[a] together with the axis-a coordinates of the
/// nonzeros that lie at or below the largest requested coordinate: one double prefix sum per axis, each
/// step jumping over the gap between neighbouring grid coordinates (the field is piecewise linear there).
/// Cost O(K (ndim + log K) + ndim * |G|) time and O(|G|) memory, |G| = prod_a |G_a| (throws past 2^31).
/// The decoder's cell corners and their neighbours corner + e_a: coords[a] = every c and c + 1 (inside
/// the shape) for c in nonzero_coordinates(field, a); G is then that same grid, so the cost is linear in
/// the number of cells.
std::vector<std::int64_t> evaluate_grid(const SparseField& field,
                                        const std::vector<std::vector<std::int64_t>>& coords);

/// The digits at M arbitrary points: `points` holds M multi-indices back to back (M * ndim values). Uses
/// evaluate_grid on the points' coordinates when that grid is at most a few times K + M cells, else
/// evaluates point by point (O(K * M) worst case, with an early stop in flat order).
std::vector<std::int64_t> evaluate_points(const SparseField& field, std::span<const std::int64_t> points);

/// The distinct coordinates along `axis` of the nonzeros, increasing: the candidate cut lines.
std::vector<std::int64_t> nonzero_coordinates(const SparseField& field, int axis);

}  // namespace wb::layout
