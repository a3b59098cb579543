#include "weightbridge/tensor.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>
#include <utility>

#include "core/strided.hpp"
#include "core/transpose16.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

void require_host(const TensorView& view, const char* what) {
  if (view.memory != MemoryKind::kHost)
    throw Error(ErrorCode::kUnsupported, std::string(what) +
                                               ": CUDA memory is not readable on the host; copy it to host memory "
                                               "first (wb::cuda_copy)");
}

// Calls fn(dst_offset, src_offset) in elements for every row of the innermost axis, where both
// views iterate the same multi-index. The innermost axis is handled by the caller.
template <class Fn>
void for_each_outer_index(const Shape& shape, const Shape& dst_strides, const Shape& src_strides, Fn&& fn) {
  const int ndim = static_cast<int>(shape.size());
  if (ndim <= 1) {
    fn(0, 0);
    return;
  }
  for (std::int64_t extent : shape)
    if (extent == 0) return;
  std::vector<std::int64_t> index(static_cast<std::size_t>(ndim - 1), 0);
  std::int64_t dst_offset = 0, src_offset = 0;
  while (true) {
    fn(dst_offset, src_offset);
    int axis = ndim - 2;
    for (; axis >= 0; --axis) {
      ++index[static_cast<std::size_t>(axis)];
      dst_offset += dst_strides[static_cast<std::size_t>(axis)];
      src_offset += src_strides[static_cast<std::size_t>(axis)];
      if (index[static_cast<std::size_t>(axis)] < shape[static_cast<std::size_t>(axis)]) break;
      dst_offset -= dst_strides[static_cast<std::size_t>(axis)] * shape[static_cast<std::size_t>(axis)];
      src_offset -= src_strides[static_cast<std::size_t>(axis)] * shape[static_cast<std::size_t>(axis)];
      index[static_cast<std::size_t>(axis)] = 0;
    }
    if (axis < 0) return;
  }
}

using detail::coalesce;

template <std::size_t kSize>
void strided_row_copy(std::byte* dst, std::int64_t dst_stride, const std::byte* src, std::int64_t src_stride,
                      std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i)
    std::memcpy(dst + i * dst_stride * static_cast<std::int64_t>(kSize), src + i * src_stride * static_cast<std::int64_t>(kSize), kSize);
}

// A copy or comparison whose innermost axis is strided on one side (a transpose) touches one cache line
// per element on that side; in tiles along that axis and the one where that side is contiguous, both sides'
// lines stay in cache. Element by element, square tiles of 16 walked along `axis` innermost measured fastest
// for a [4096, 2048] bf16 transpose here (1.9 ns per element against 5.7 for rows of 32 and 6 for the
// row-by-row loop). In vector blocks (Block below), tiles of 512 along the axis where `a` is contiguous by 16
// along the other, walked along the long side: 0.53 ns per element, against 1.25 in 16 x 16 tiles, whose
// lines 4 or 8 KiB apart share cache sets.
constexpr std::int64_t kTile = 16;
constexpr std::int64_t kLongTile = 512;
// 2-byte transposes in 32 x 32 blocks (transpose16): tiles of 512 of b's lines by 512 elements along them,
// walked block row by block row; copies of 4 MiB and more with streaming stores where a's lines are 64-byte
// aligned. A [4096, 2048] bf16 tensor into a transposed view (lines not aligned), 16 of them: 0.63 -> 0.40 ns
// per element copied, 0.63 -> 0.50 compared (tiles of 256 x 256: 0.43-0.50 and 0.53-0.61, 1024 x 256 about
// as 512 x 512).
constexpr std::int64_t kWideLines = 512;
constexpr std::int64_t kWideWidth = 512;
constexpr std::int64_t kStreamBytes = std::int64_t{4} << 20;

// The axis other than the last along which the side that is strided innermost is contiguous, or -1.
int tile_axis(const Shape& a_strides, const Shape& b_strides) {
  const std::size_t last = a_strides.size() - 1;
  for (std::size_t k = 0; k < last; ++k)
    if ((a_strides[last] != 1 && a_strides[k] == 1) || (b_strides[last] != 1 && b_strides[k] == 1))
      return static_cast<int>(k);
  return -1;
}

// Calls fn(a_offset, b_offset, rows, columns) for every tile of up to `tile_rows` rows along `axis` by
// `tile_columns` columns along the last axis, over every index of the other axes, until fn returns false;
// returns false if it did.
template <class Fn>
bool for_each_tile(const Shape& shape, const Shape& a_strides, const Shape& b_strides, int axis,
                   std::int64_t tile_rows, std::int64_t tile_columns, Fn&& fn) {
  Shape outer, outer_a, outer_b;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i)
    if (static_cast<int>(i) != axis) {
      outer.push_back(shape[i]);
      outer_a.push_back(a_strides[i]);
      outer_b.push_back(b_strides[i]);
    }
  outer.push_back(1);  // for_each_outer_index leaves the last axis to its caller
  outer_a.push_back(0);
  outer_b.push_back(0);
  const auto k = static_cast<std::size_t>(axis);
  const std::int64_t rows = shape[k], columns = shape.back();
  bool more = true;
  for_each_outer_index(outer, outer_a, outer_b, [&](std::int64_t a0, std::int64_t b0) {
    for (std::int64_t r = 0; r < rows && more; r += tile_rows)
      for (std::int64_t c = 0; c < columns && more; c += tile_columns)
        more = fn(a0 + r * a_strides[k] + c * a_strides.back(), b0 + r * b_strides[k] + c * b_strides.back(),
                  std::min(tile_rows, rows - r), std::min(tile_columns, columns - c));
  });
  return more;
}

// Square blocks of L = 16 / sizeof(T) elements, transposed in 16-byte vectors (GCC's vector extension: SSE2
// unpacks on x86-64): log2(L) rounds of interleaving line i with line i + L/2.
template <typename T>
struct Block {
  static constexpr int kLanes = 16 / static_cast<int>(sizeof(T));
  typedef T Lanes __attribute__((vector_size(16)));
  typedef T Mask __attribute__((vector_size(16)));  // T is an unsigned integer: the mask's lanes have its width

  // Lanes 2i and 2i + 1 take lane i (+ L/2 for the high half) of the first and of the second vector.
  template <std::size_t... I>
  static constexpr Mask interleave(bool high, std::index_sequence<I...>) {
    return Mask{static_cast<T>(I / 2 + (high ? kLanes / 2 : 0) + (I % 2 == 1 ? kLanes : 0))...};
  }

  // v[j] holds line j of the block; afterwards v[i] holds element i of every line.
  static void transpose(Lanes* v) {
    constexpr Mask lo = interleave(false, std::make_index_sequence<kLanes>()),
                   hi = interleave(true, std::make_index_sequence<kLanes>());
    for (int round = 1; round < kLanes; round *= 2) {
      Lanes w[kLanes];
      for (int i = 0; i < kLanes / 2; ++i) {
        w[2 * i] = __builtin_shuffle(v[i], v[i + kLanes / 2], lo);
        w[2 * i + 1] = __builtin_shuffle(v[i], v[i + kLanes / 2], hi);
      }
      for (int i = 0; i < kLanes; ++i) v[i] = w[i];
    }
  }
  static void load(Lanes* v, const T* first, std::int64_t line) {
    for (int j = 0; j < kLanes; ++j) std::memcpy(&v[j], first + j * line, sizeof(Lanes));
  }
};

// Whether tiles of these strides transpose one side's lines into the other's: b contiguous along the columns
// (the last axis) and a along the rows (`axis`), or the other way round.
bool transposes_lines(std::int64_t a_row, std::int64_t a_column, std::int64_t b_row, std::int64_t b_column) {
  return (a_row == 1 && b_column == 1) || (a_column == 1 && b_row == 1);
}

// One tile of elements of type T (the element's bytes as an unsigned integer): copies b into a, or compares.
// A tile that transposes lines goes in vector blocks, its edges short of a block element by element.
template <typename T>
struct Tile {
  T* a;
  const T* b;
  std::int64_t a_row, a_column, b_row, b_column, rows, columns;
  bool stream;  // a large copy: whole blocks may bypass the caches
  using B = Block<T>;

  // Calls fn(a's block, b's block, a's line stride, b's line stride) for every whole block, walking along a's
  // lines, until it returns false; false if it did. b's lines (contiguous in b) become a's lines.
  template <class Fn>
  bool each_block(Fn&& fn) const {
    const std::int64_t full_rows = rows - rows % B::kLanes, full_columns = columns - columns % B::kLanes;
    if (a_row == 1) {  // b's rows become a's columns
      for (std::int64_t c = 0; c < full_columns; c += B::kLanes)
        for (std::int64_t r = 0; r < full_rows; r += B::kLanes)
          if (!fn(a + r + c * a_column, b + r * b_row + c, a_column, b_row)) return false;
    } else {  // b's columns become a's rows
      for (std::int64_t r = 0; r < full_rows; r += B::kLanes)
        for (std::int64_t c = 0; c < full_columns; c += B::kLanes)
          if (!fn(a + r * a_row + c, b + r + c * b_column, a_row, b_column)) return false;
    }
    return true;
  }
  // Calls fn(a's element, b's element) for the elements that each_block leaves (all when `blocks` is false).
  template <class Fn>
  void each_element(bool blocks, Fn&& fn) const {
    const std::int64_t full_rows = blocks ? rows - rows % B::kLanes : 0;
    const std::int64_t full_columns = blocks ? columns - columns % B::kLanes : 0;
    for (std::int64_t c = 0; c < columns; ++c)
      for (std::int64_t r = c < full_columns ? full_rows : 0; r < rows; ++r)
        fn(a[r * a_row + c * a_column], b[r * b_row + c * b_column]);
  }
  // 2-byte tiles that transpose lines go in 32 x 32 blocks (transpose16) where the CPU has them: b's lines
  // are the tile's rows (a contiguous along them) or its columns. The rest, right of and below the whole
  // blocks, goes as below.
  bool wide() const {
    return sizeof(T) == 2 && transposes_lines(a_row, a_column, b_row, b_column) && transpose16::available();
  }
  template <class Whole, class Rest>
  bool in_wide_blocks(Whole&& whole, Rest&& rest) const {
    const bool b_rows = a_row == 1;
    const std::int64_t lines = b_rows ? rows : columns, width = b_rows ? columns : rows;
    const std::int64_t whole_lines = lines - lines % 32, whole_width = width - width % 32;
    const std::int64_t done_rows = b_rows ? whole_lines : whole_width, done_columns = b_rows ? whole_width : whole_lines;
    if (whole_lines > 0 && whole_width > 0 &&
        !whole(reinterpret_cast<std::uint16_t*>(a), b_rows ? a_column : a_row,
               reinterpret_cast<const std::uint16_t*>(b), b_rows ? b_row : b_column, whole_lines, whole_width))
      return false;
    Tile right = *this, below = *this;
    right.a += done_columns * a_column, right.b += done_columns * b_column;
    right.rows = done_rows, right.columns = columns - done_columns;
    below.a += done_rows * a_row, below.b += done_rows * b_row;
    below.rows = rows - done_rows;
    return rest(right) && rest(below);
  }
  void copy() const {
    if (wide()) {
      in_wide_blocks(
          [this](std::uint16_t* at, std::int64_t a_line, const std::uint16_t* bt, std::int64_t b_line, std::int64_t n,
                 std::int64_t m) {
            transpose16::copy(at, a_line, bt, b_line, n, m, stream);
            return true;
          },
          [](const Tile& t) {
            t.copy_narrow();
            return true;
          });
      return;
    }
    copy_narrow();
  }
  bool equal() const {
    if (wide())
      return in_wide_blocks(
          [](std::uint16_t* at, std::int64_t a_line, const std::uint16_t* bt, std::int64_t b_line, std::int64_t n,
             std::int64_t m) { return transpose16::equal(at, a_line, bt, b_line, n, m); },
          [](const Tile& t) { return t.equal_narrow(); });
    return equal_narrow();
  }
  void copy_narrow() const {
    const bool blocks = transposes_lines(a_row, a_column, b_row, b_column);
    if (blocks)
      each_block([](T* ab, const T* bb, std::int64_t a_line, std::int64_t b_line) {
        typename B::Lanes v[B::kLanes];
        B::load(v, bb, b_line);
        B::transpose(v);
        for (int i = 0; i < B::kLanes; ++i) std::memcpy(ab + i * a_line, &v[i], sizeof(v[i]));
        return true;
      });
    each_element(blocks, [](T& x, const T& y) { x = y; });
  }
  bool equal_narrow() const {
    const bool blocks = transposes_lines(a_row, a_column, b_row, b_column);
    if (blocks && !each_block([](const T* ab, const T* bb, std::int64_t a_line, std::int64_t b_line) {
          typename B::Lanes v[B::kLanes], w[B::kLanes];
          B::load(v, bb, b_line);
          B::load(w, ab, a_line);
          B::transpose(v);
          typename B::Lanes diff{};
          for (int i = 0; i < B::kLanes; ++i) diff |= v[i] ^ w[i];
          std::uint64_t words[2];
          std::memcpy(words, &diff, sizeof(words));
          return (words[0] | words[1]) == 0;
        }))
      return false;
    bool same = true;
    each_element(blocks, [&same](const T& x, const T& y) { same &= x == y; });
    return same;
  }
};

// Runs op(Tile<T>) on every tile of views a and b (a's data may be written); false as soon as op is false.
template <class Op>
bool tiled(const TensorView& a, const TensorView& b, const Shape& shape, const Shape& a_strides,
           const Shape& b_strides, int axis, Op&& op) {
  const auto k = static_cast<std::size_t>(axis);
  std::int64_t tile_rows = kTile, tile_columns = kTile;
  if (transposes_lines(a_strides[k], a_strides.back(), b_strides[k], b_strides.back())) {
    if (a.element_size() == 2 && transpose16::available()) {
      // kWideLines of b's lines by kWideWidth along them (b's lines are the rows where a is contiguous along them).
      tile_rows = a_strides[k] == 1 ? kWideLines : kWideWidth;
      tile_columns = a_strides[k] == 1 ? kWideWidth : kWideLines;
    } else {
      (a_strides[k] == 1 ? tile_rows : tile_columns) = kLongTile;  // long along a's lines
    }
  }
  const bool stream = a.numel() * static_cast<std::int64_t>(a.element_size()) >= kStreamBytes;
  const auto run = [&]<typename T>(T*) {
    return for_each_tile(shape, a_strides, b_strides, axis, tile_rows, tile_columns,
                         [&](std::int64_t ao, std::int64_t bo, std::int64_t rows, std::int64_t columns) {
                           return op(Tile<T>{static_cast<T*>(a.data) + ao, static_cast<const T*>(b.data) + bo,
                                             a_strides[k], a_strides.back(), b_strides[k], b_strides.back(), rows,
                                             columns, stream});
                         });
  };
  switch (a.element_size()) {
    case 1: return run(static_cast<std::uint8_t*>(nullptr));
    case 2: return run(static_cast<std::uint16_t*>(nullptr));
    case 4: return run(static_cast<std::uint32_t*>(nullptr));
    default: return run(static_cast<std::uint64_t*>(nullptr));
  }
}

}  // namespace

std::int64_t shape_numel(std::span<const std::int64_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

Shape contiguous_strides(std::span<const std::int64_t> shape) {
  Shape strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i > 1; --i) strides[i - 2] = strides[i - 1] * shape[i - 1];
  return strides;
}

std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

Box Box::whole(std::span<const std::int64_t> shape) {
  return Box{Shape(shape.size(), 0), Shape(shape.begin(), shape.end())};
}

bool Box::fits_in(std::span<const std::int64_t> shape) const {
  if (offset.size() != shape.size() || extent.size() != shape.size()) return false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (offset[i] < 0 || extent[i] < 0 || offset[i] + extent[i] > shape[i]) return false;
  }
  return true;
}

std::string Box::to_string() const {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < extent.size(); ++i) {
    const std::int64_t begin = i < offset.size() ? offset[i] : 0;
    out << (i ? ", " : "") << begin << ':' << begin + extent[i];
  }
  out << ']';
  return out.str();
}

TensorView TensorView::contiguous(void* data, DType dtype, Shape shape, MemoryKind memory, int device) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.strides = contiguous_strides(shape);
  view.shape = std::move(shape);
  view.memory = memory;
  view.device = device;
  return view;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // no element to lay out (PyTorch's rule too): whatever its strides say
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

TensorView TensorView::narrow(int axis, std::int64_t start, std::int64_t length) const {
  if (axis < 0 || axis >= ndim() || start < 0 || length < 0 || start + length > shape[static_cast<std::size_t>(axis)])
    throw Error(ErrorCode::kInvalidArgument, "narrow(axis " + std::to_string(axis) + ", " + std::to_string(start) +
                                                 ", " + std::to_string(length) + ") outside a tensor of shape " +
                                                 shape_to_string(shape));
  TensorView view = *this;
  view.data = static_cast<std::byte*>(data) +
              start * strides[static_cast<std::size_t>(axis)] * static_cast<std::int64_t>(element_size());
  view.shape[static_cast<std::size_t>(axis)] = length;
  return view;
}

TensorView TensorView::select(int axis, std::int64_t index) const {
  if (axis < 0 || axis >= ndim() || index < 0 || index >= shape[static_cast<std::size_t>(axis)])
    throw Error(ErrorCode::kInvalidArgument, "select(axis " + std::to_string(axis) + ", index " + std::to_string(index) +
                                                 ") outside a tensor of shape " + shape_to_string(shape));
  TensorView view = narrow(axis, index, 1);
  view.shape.erase(view.shape.begin() + axis);
  view.strides.erase(view.strides.begin() + axis);
  return view;
}

TensorView TensorView::box(const Box& b) const {
  if (!b.fits_in(shape))
    throw Error(ErrorCode::kInvalidArgument, "box " + b.to_string() + " outside a tensor of shape " + shape_to_string(shape));
  TensorView view = *this;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) offset += b.offset[i] * strides[i];
  view.data = static_cast<std::byte*>(data) + offset * static_cast<std::int64_t>(element_size());
  view.shape = b.extent;
  return view;
}

TensorView TensorView::permute(std::span<const int> order) const {
  std::vector<bool> seen(shape.size(), false);
  if (order.size() != shape.size())
    throw Error(ErrorCode::kInvalidArgument, "permute of a " + std::to_string(ndim()) + "-d tensor needs as many axes");
  TensorView view = *this;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int axis = order[i];
    if (axis < 0 || axis >= ndim() || seen[static_cast<std::size_t>(axis)])
      throw Error(ErrorCode::kInvalidArgument, "permute order is not a permutation of the axes");
    seen[static_cast<std::size_t>(axis)] = true;
    view.shape[i] = shape[static_cast<std::size_t>(axis)];
    view.strides[i] = strides[static_cast<std::size_t>(axis)];
  }
  return view;
}

TensorView TensorView::transpose(int axis_a, int axis_b) const {
  std::vector<int> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  if (axis_a < 0 || axis_b < 0 || axis_a >= ndim() || axis_b >= ndim())
    throw Error(ErrorCode::kInvalidArgument, "transpose axes outside a " + std::to_string(ndim()) + "-d tensor");
  std::swap(order[static_cast<std::size_t>(axis_a)], order[static_cast<std::size_t>(axis_b)]);
  return permute(order);
}

TensorView TensorView::unflatten(int axis, std::int64_t parts) const {
  if (axis < 0 || axis >= ndim() || parts <= 0 || shape[static_cast<std::size_t>(axis)] % parts != 0)
    throw Error(ErrorCode::kInvalidArgument, "unflatten of axis " + std::to_string(axis) + " of shape " +
                                                 shape_to_string(shape) + " into " + std::to_string(parts) + " parts");
  TensorView view = *this;
  const auto a = static_cast<std::size_t>(axis);
  const std::int64_t inner = shape[a] / parts;
  view.shape[a] = inner;
  view.shape.insert(view.shape.begin() + axis, parts);
  view.strides.insert(view.strides.begin() + axis, strides[a] * inner);
  return view;
}

std::byte* TensorView::element(std::span<const std::int64_t> index) const {
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < index.size() && i < strides.size(); ++i) offset += index[i] * strides[i];
  return static_cast<std::byte*>(data) + offset * static_cast<std::int64_t>(element_size());
}

void copy_tensor(const TensorView& dst, const TensorView& src) {
  require_host(dst, "copy_tensor destination");
  require_host(src, "copy_tensor source");
  if (dst.dtype != src.dtype)
    throw Error(ErrorCode::kInvalidArgument, "copy_tensor: dtype " + std::string(dtype_name(src.dtype)) + " into " +
                                                 std::string(dtype_name(dst.dtype)));
  if (dst.shape != src.shape)
    throw Error(ErrorCode::kInvalidArgument,
                "copy_tensor: shape " + shape_to_string(src.shape) + " into " + shape_to_string(dst.shape));
  if (dst.numel() == 0) return;
  Shape shape = dst.shape, dst_strides = dst.strides, src_strides = src.strides;
  coalesce(shape, dst_strides, src_strides);
  const std::size_t element = dst.element_size();
  const std::int64_t inner = shape.back();
  const std::int64_t dst_inner = dst_strides.back(), src_inner = src_strides.back();
  auto* dst_base = static_cast<std::byte*>(dst.data);
  const auto* src_base = static_cast<const std::byte*>(src.data);
  const auto esize = static_cast<std::int64_t>(element);
  if (const int axis = tile_axis(dst_strides, src_strides); axis >= 0 && element <= 8 && (element & (element - 1)) == 0) {
    tiled(dst, src, shape, dst_strides, src_strides, axis, [](const auto& tile) {
      tile.copy();
      return true;
    });
    return;
  }
  for_each_outer_index(shape, dst_strides, src_strides, [&](std::int64_t dst_offset, std::int64_t src_offset) {
    std::byte* d = dst_base + dst_offset * esize;
    const std::byte* s = src_base + src_offset * esize;
    if (dst_inner == 1 && src_inner == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(inner) * element);
      return;
    }
    switch (element) {
      case 1: strided_row_copy<1>(d, dst_inner, s, src_inner, inner); break;
      case 2: strided_row_copy<2>(d, dst_inner, s, src_inner, inner); break;
      case 4: strided_row_copy<4>(d, dst_inner, s, src_inner, inner); break;
      default: strided_row_copy<8>(d, dst_inner, s, src_inner, inner); break;
    }
  });
}

bool tensors_bitwise_equal(const TensorView& a, const TensorView& b) {
  require_host(a, "tensors_bitwise_equal");
  require_host(b, "tensors_bitwise_equal");
  if (a.dtype != b.dtype || a.shape != b.shape) return false;
  if (a.numel() == 0) return true;
  Shape shape = a.shape, a_strides = a.strides, b_strides = b.strides;
  coalesce(shape, a_strides, b_strides);
  const auto esize = static_cast<std::int64_t>(a.element_size());
  const std::int64_t inner = shape.back();
  if (const int axis = tile_axis(a_strides, b_strides); axis >= 0 && esize <= 8 && (esize & (esize - 1)) == 0)
    return tiled(a, b, shape, a_strides, b_strides, axis, [](const auto& tile) { return tile.equal(); });
  bool equal = true;
  for_each_outer_index(shape, a_strides, b_strides, [&](std::int64_t a_offset, std::int64_t b_offset) {
    if (!equal) return;
    const auto* pa = static_cast<const std::byte*>(a.data) + a_offset * esize;
    const auto* pb = static_cast<const std::byte*>(b.data) + b_offset * esize;
    if (a_strides.back() == 1 && b_strides.back() == 1) {
      equal = std::memcmp(pa, pb, static_cast<std::size_t>(inner * esize)) == 0;
      return;
    }
    for (std::int64_t i = 0; i < inner && equal; ++i)
      equal = std::memcmp(pa + i * a_strides.back() * esize, pb + i * b_strides.back() * esize,
                          static_cast<std::size_t>(esize)) == 0;
  });
  return equal;
}

void ParameterSet::add(std::string name, TensorView view) {
  if (index_.count(name) != 0)
    throw Error(ErrorCode::kInvalidArgument, "parameter '" + name + "' added twice");
  index_.emplace(name, parameters_.size());
  parameters_.push_back(Parameter{std::move(name), std::move(view)});
}

const Parameter* ParameterSet::find(std::string_view name) const {
  // The key in a reused buffer: a std::string per lookup was a heap allocation for every name longer than
  // the small-string buffer (loaders look up every parameter, in each of the probe's passes).
  thread_local std::string key;
  key.assign(name);
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &parameters_[it->second];
}

const Parameter& ParameterSet::at(std::string_view name) const {
  if (const Parameter* p = find(name)) return *p;
  throw Error(ErrorCode::kNotFound, "no parameter named '" + std::string(name) + "'");
}

std::size_t ParameterSet::total_bytes() const {
  std::size_t total = 0;
  for (const Parameter& p : parameters_) total += p.view.nbytes();
  return total;
}

}  // namespace wb
