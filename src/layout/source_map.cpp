#include "weightbridge/source_map.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "core/byte_codec.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

// Strides of axes with extent 1 do not matter; zero makes equal copies compare equal.
void canonicalize_strides(SliceCopy& copy) {
  for (std::size_t a = 0; a < copy.strides.size(); ++a)
    if (copy.box.extent[a] == 1) copy.strides[a] = 0;
}

// Can `next` continue `copy` along `axis`? On success returns the stride along that axis.
bool continues(const SliceCopy& copy, const SliceCopy& next, std::size_t axis, std::int64_t& stride) {
  if (next.box.offset[axis] != copy.box.offset[axis] + copy.box.extent[axis]) return false;
  const std::int64_t a = copy.box.extent[axis], b = next.box.extent[axis];
  if (a > 1 && b > 1 && copy.strides[axis] != next.strides[axis]) return false;
  stride = a > 1 ? copy.strides[axis] : (b > 1 ? next.strides[axis] : (next.offset - copy.offset));
  return stride != 0 && next.offset == copy.offset + a * stride;
}

// Orders copies by what must agree for them to join along `axis` (parameter, tensor, rank, then the offsets,
// extents and strides of every other axis, in that order): <0, 0 or >0. Compared in place, without building
// a key per copy (a million small vectors at 100,000 tensors).
int compare_across(const SliceCopy& x, const SliceCopy& y, std::size_t axis) {
  if (x.parameter != y.parameter) return x.parameter < y.parameter ? -1 : 1;
  if (x.tensor != y.tensor) return x.tensor < y.tensor ? -1 : 1;
  const std::size_t n = x.box.extent.size();
  if (n != y.box.extent.size()) return n < y.box.extent.size() ? -1 : 1;
  for (const auto field : {&Box::offset, &Box::extent})
    for (std::size_t a = 0; a < n; ++a)
      if (a != axis && (x.box.*field)[a] != (y.box.*field)[a]) return (x.box.*field)[a] < (y.box.*field)[a] ? -1 : 1;
  for (std::size_t a = 0; a < n; ++a)
    if (a != axis && x.strides[a] != y.strides[a]) return x.strides[a] < y.strides[a] ? -1 : 1;
  return 0;
}

// One sweep along `axis`: copies equal on every other axis are sorted along it and merged in runs.
bool merge_along(std::vector<SliceCopy>& copies, std::size_t axis) {
  std::vector<std::size_t> order;
  order.reserve(copies.size());
  for (std::size_t i = 0; i < copies.size(); ++i)
    if (axis < copies[i].box.extent.size()) order.push_back(i);
  const auto before = [&](std::size_t x, std::size_t y) {
    const int c = compare_across(copies[x], copies[y], axis);
    if (c != 0) return c < 0;
    return copies[x].box.offset[axis] < copies[y].box.offset[axis];
  };
  // Often already in order (a probe's decoder emits its cells in the parameter's row-major order): one
  // linear check then instead of a sort (the sorted order of distinct keys is the same either way).
  if (!std::is_sorted(order.begin(), order.end(), before)) std::sort(order.begin(), order.end(), before);
  std::vector<bool> gone(copies.size(), false);
  bool merged = false;
  for (std::size_t i = 0; i < order.size();) {
    SliceCopy& head = copies[order[i]];
    std::size_t j = i + 1;
    // head changes only along `axis`, so it still compares as before.
    for (; j < order.size() && compare_across(copies[order[j]], head, axis) == 0; ++j) {
      SliceCopy& next = copies[order[j]];
      std::int64_t stride = 0;
      if (!continues(head, next, axis, stride)) break;
      head.strides[axis] = stride;
      head.box.extent[axis] += next.box.extent[axis];
      gone[order[j]] = true;
      merged = true;
    }
    i = j;
  }
  if (merged) {
    std::size_t out = 0;
    for (std::size_t i = 0; i < copies.size(); ++i) {
      if (gone[i]) continue;
      if (out != i) copies[out] = std::move(copies[i]);  // never self-move: it may empty the vectors
      ++out;
    }
    copies.resize(out);
  }
  return merged;
}

// --- compact binary form -----------------------------------------------------------------------------

constexpr std::uint32_t kMagic = 0x4d534257;  // "WBSM"
constexpr std::uint32_t kVersion = 1;

constexpr int kMaxDims = 8;

}  // namespace

std::int64_t SourceMap::copied_elements() const {
  std::int64_t total = 0;
  for (const SliceCopy& copy : copies) total += copy.numel();
  return total;
}

SourceMap normalize_source_map(SourceMap map) {
  for (SliceCopy& copy : map.copies) canonicalize_strides(copy);
  std::size_t max_axes = 0;
  for (const SliceCopy& copy : map.copies) max_axes = std::max(max_axes, copy.box.extent.size());
  // Innermost axis first, repeated until nothing merges: rows join into blocks, blocks into tensors.
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t axis = max_axes; axis-- > 0;) changed = merge_along(map.copies, axis) || changed;
  }
  for (SliceCopy& copy : map.copies) canonicalize_strides(copy);
  std::sort(map.copies.begin(), map.copies.end(), [](const SliceCopy& x, const SliceCopy& y) {
    return std::tie(x.parameter, x.offset, x.tensor, x.box.offset, x.box.extent, x.strides) <
           std::tie(y.parameter, y.offset, y.tensor, y.box.offset, y.box.extent, y.strides);
  });
  return map;
}

std::vector<std::byte> serialize_source_map(const SourceMap& map) {
  codec::ByteWriter out;
  out.varint(kMagic);
  out.varint(kVersion);
  out.varint(map.parameters.size());
  for (const TensorInfo& p : map.parameters) {
    out.text(p.name);
    out.varint(static_cast<std::uint64_t>(p.dtype));
    out.varint(p.shape.size());
    for (std::int64_t e : p.shape) out.varint(static_cast<std::uint64_t>(e));
  }
  out.varint(map.copies.size());
  // Deltas against the previous copy keep consecutive copies of one parameter to a few bytes.
  std::int64_t tensor = 0, parameter = 0, offset = 0;
  for (const SliceCopy& c : map.copies) {
    out.signed_varint(static_cast<std::int64_t>(c.tensor) - tensor);
    out.signed_varint(static_cast<std::int64_t>(c.parameter) - parameter);
    out.signed_varint(codec::wrapping_sub(c.offset, offset));
    tensor = c.tensor;
    parameter = c.parameter;
    offset = c.offset;
    out.varint(c.box.extent.size());
    for (std::size_t a = 0; a < c.box.extent.size(); ++a) {
      out.varint(static_cast<std::uint64_t>(c.box.offset[a]));
      out.varint(static_cast<std::uint64_t>(c.box.extent[a]));
      out.signed_varint(c.strides[a]);
    }
  }
  return out.take();
}

SourceMap deserialize_source_map(std::span<const std::byte> bytes) {
  codec::ByteReader in(bytes, "source map");
  if (in.varint() != kMagic) in.fail("not a source map (bad magic)");
  if (const auto version = in.varint(); version != kVersion) in.fail("unsupported version " + std::to_string(version));
  SourceMap map;
  // Each parameter takes at least 3 bytes (name length, dtype, rank), each copy at least 4.
  const std::uint64_t parameters = in.count(3, "parameter count");
  map.parameters.resize(parameters);
  for (TensorInfo& p : map.parameters) {
    p.name = in.text();
    p.dtype = static_cast<DType>(in.bounded(kNumDTypes - 1, "dtype"));
    p.shape.resize(in.bounded(kMaxDims, "rank"));
    std::int64_t elements = 1;  // numel() must not overflow later
    for (std::int64_t& e : p.shape) {
      e = static_cast<std::int64_t>(in.bounded(std::uint64_t{1} << 48, "extent"));
      if (__builtin_mul_overflow(elements, e, &elements)) in.fail("parameter " + p.name + " has too many elements");
    }
  }
  const std::uint64_t copies = in.count(4, "copy count");
  map.copies.resize(copies);
  std::int64_t tensor = 0, parameter = 0, offset = 0;
  for (SliceCopy& c : map.copies) {
    tensor = codec::wrapping_add(tensor, in.signed_varint());  // corrupt deltas must not overflow
    parameter = codec::wrapping_add(parameter, in.signed_varint());
    offset = codec::wrapping_add(offset, in.signed_varint());
    if (tensor < 0 || tensor > 0xffffffffLL || parameter < 0 || parameter >= static_cast<std::int64_t>(parameters))
      in.fail("copy index out of range");
    c.tensor = static_cast<std::uint32_t>(tensor);
    c.parameter = static_cast<std::uint32_t>(parameter);
    c.offset = offset;
    const auto axes = in.bounded(kMaxDims, "rank");
    c.box.offset.resize(axes);
    c.box.extent.resize(axes);
    c.strides.resize(axes);
    for (std::size_t a = 0; a < axes; ++a) {
      c.box.offset[a] = static_cast<std::int64_t>(in.bounded(std::uint64_t{1} << 48, "box offset"));
      c.box.extent[a] = static_cast<std::int64_t>(in.bounded(std::uint64_t{1} << 48, "box extent"));
      c.strides[a] = in.signed_varint();
    }
  }
  if (!in.done()) in.fail("trailing bytes");
  return map;
}

void validate_source_map(const SourceMap& map, const std::vector<TensorInfo>& checkpoint_tensors) {
  for (std::size_t i = 0; i < map.copies.size(); ++i) {
    const SliceCopy& c = map.copies[i];
    auto fail = [&](const std::string& why) {
      std::string where = "source map copy " + std::to_string(i);
      if (c.parameter < map.parameters.size()) where += " into parameter " + map.parameters[c.parameter].name;
      if (c.tensor < checkpoint_tensors.size()) where += " from " + checkpoint_tensors[c.tensor].name + c.box.to_string();
      throw Error(ErrorCode::kInvalidArgument, where + ": " + why);
    };
    if (c.parameter >= map.parameters.size()) fail("parameter index out of range");
    if (c.tensor >= checkpoint_tensors.size()) fail("checkpoint tensor index out of range");
    const TensorInfo& tensor = checkpoint_tensors[c.tensor];
    const TensorInfo& param = map.parameters[c.parameter];
    if (!c.box.fits_in(tensor.shape)) fail("box outside the tensor of shape " + shape_to_string(tensor.shape));
    if (c.strides.size() != c.box.extent.size()) fail("one stride per box axis expected");
    if (tensor.dtype != param.dtype)
      fail("dtype " + std::string(dtype_name(tensor.dtype)) + " into " + std::string(dtype_name(param.dtype)));
    if (c.numel() == 0) continue;
    // The first and last elements written; strides come from another rank, so overflow is checked.
    std::int64_t lowest = c.offset, highest = c.offset;
    for (std::size_t a = 0; a < c.strides.size(); ++a) {
      std::int64_t span = 0;
      if (__builtin_mul_overflow(c.box.extent[a] - 1, c.strides[a], &span) ||
          __builtin_add_overflow(span < 0 ? lowest : highest, span, span < 0 ? &lowest : &highest))
        fail("stride " + std::to_string(c.strides[a]) + " of axis " + std::to_string(a) +
             " reaches past any parameter");
    }
    if (lowest < 0 || highest >= param.numel())
      fail("writes elements [" + std::to_string(lowest) + ", " + std::to_string(highest) +
           "] outside a parameter of " + std::to_string(param.numel()));
  }
}

void apply_source_map(const SourceMap& map, const CheckpointReader& checkpoint, const ParameterSet& params) {
  validate_source_map(map, checkpoint.tensors());
  if (params.size() != map.parameters.size())
    throw Error(ErrorCode::kInvalidArgument, "apply_source_map: " + std::to_string(params.size()) +
                                                 " parameters given, the map has " +
                                                 std::to_string(map.parameters.size()));
  std::vector<std::byte> scratch;
  for (const SliceCopy& c : map.copies) {
    const Parameter& param = params[c.parameter];
    const TensorInfo& info = map.parameters[c.parameter];
    if (param.view.dtype != info.dtype || param.view.shape != info.shape || !param.view.is_contiguous())
      throw Error(ErrorCode::kInvalidArgument, "apply_source_map: parameter " + param.name +
                                                   " does not match the map's " + info.name +
                                                   shape_to_string(info.shape) + " (or is not contiguous)");
    const TensorInfo& tensor = checkpoint.tensors()[c.tensor];
    scratch.resize(static_cast<std::size_t>(c.numel()) * dtype_size(tensor.dtype));
    checkpoint.read_box(tensor.name, c.box, scratch.data());
    TensorView target = param.view;
    target.data = static_cast<std::byte*>(param.view.data) + c.offset * static_cast<std::int64_t>(param.view.element_size());
    target.shape = c.box.extent;
    target.strides = c.strides;
    copy_tensor(target, TensorView::contiguous(scratch.data(), tensor.dtype, c.box.extent));
  }
}

}  // namespace wb
