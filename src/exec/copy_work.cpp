// The descriptor arrays of the CUDA copy kernel (see copy_work.hpp). From the compiled copies:
//   - a transpose when the run is one 1/2/4/8-byte element and an outer axis is contiguous in the
//     parameter: the pair (that axis, the innermost one, contiguous in the buffer) is cut into tiles of
//     32 source rows, which a warp reads along the source rows in vectors of up to 16 bytes into shared
//     memory and writes along the destination rows (both coalesced);
//   - otherwise runs: the innermost outer axis groups runs into items of at most kWorkItemBytes, a run
//     longer than that is cut into equal pieces; lanes move vectors as wide as the source and destination
//     alignments allow (16 bytes when they agree modulo 16), unaligned heads and tails byte by byte.
// Remaining axes are unrolled into items, so the kernel knows no axes: every item is a few KiB of
// independent work, a warp's worth. Items follow the compiled copies' order (parameter order), so
// neighbouring items, which neighbouring warps run at the same time, are pieces of one tensor.
#include "exec/copy_work.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/checks.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

constexpr i64 kMaxItems = std::numeric_limits<std::int32_t>::max();

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

  void push(const CopyWorkItem& item) {
    if (static_cast<i64>(work.items.size()) >= kMaxItems)
      throw Error(ErrorCode::kUnsupported, std::string(direction_name(work.direction)) + ": more than " +
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

  // One run in equal pieces of about kWorkItemBytes: a last piece of a few bytes would be a warp's whole
  // item for nothing. The first piece also takes the bytes up to a 16-byte-aligned source address, and
  // every later one starts aligned.
  void long_run(u64 src, u64 dst, i64 length) {
    const int width = common_alignment({src - dst}, 16);
    const i64 head = std::min<i64>(length, static_cast<i64>((16 - (src & 15)) & 15));
    const i64 body = length - head;
    const i64 pieces = std::max<i64>(1, (body + kWorkItemBytes - 1) / kWorkItemBytes);
    i64 begin = 0;
    for (i64 i = 1; i <= pieces; ++i) {
      // Boundaries at 16-byte multiples into the body, so the pieces differ by at most 16 bytes (and the
      // head).
      const i64 end = i == pieces ? length
                                  : head + static_cast<i64>(static_cast<__int128>(body) * i / pieces / 16 * 16);
      if (end <= begin) continue;
      CopyWorkItem item;
      item.count = 1;
      item.length = static_cast<std::uint16_t>(end - begin);
      item.src = stored_src(src + static_cast<u64>(begin));
      item.dst = stored_dst(dst + static_cast<u64>(begin));
      item.width = static_cast<std::uint8_t>(width);
      push(item);
      ++work.stats.run_items;
      begin = end;
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

void emit(const ByteCopy& n, Emitter& emitter, u64 parameter) {
  const bool pack = emitter.pack;
  const u64 param_start = parameter + static_cast<u64>(n.param_offset);
  const u64 buffer_start = emitter.buffer + static_cast<u64>(n.buffer_offset);
  const u64 src0 = pack ? param_start : buffer_start, dst0 = pack ? buffer_start : param_start;
  auto oriented = [pack](const ByteAxis& a) {
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
      u64 src_strides = 0, dst_strides = 0;
      for (const auto& axis : outer) src_strides |= static_cast<u64>(axis[1]), dst_strides |= static_cast<u64>(axis[2]);
      // Stores: words of the element as wide as the destination allows. Loads: vectors along the source
      // rows as wide as the source allows, whatever the element.
      const int access = common_alignment({dst0, static_cast<u64>(columns[2]), dst_strides}, element);
      const int load = common_alignment({src0, static_cast<u64>(rows[1]), src_strides}, 16);
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
            // A partial last column of tiles may have rows of an odd number of vectors.
            item.load = static_cast<std::uint8_t>(common_alignment({static_cast<u64>(item.length) * static_cast<u64>(element)}, load));
            emitter.push(item);
            ++emitter.work.stats.transpose_items;
          }
      });
      emitter.work.stats.transposed_bytes += n.bytes();
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

}  // namespace

CopyWork compile_copy_work(const CompiledCopies& compiled, std::span<std::byte* const> parameters, std::byte* buffer) {
  switch (compiled.destinations) {
    case Destinations::kDisjoint: break;
    case Destinations::kOverlap:
      throw Error(ErrorCode::kInvalidArgument,
                  compiled.overlap + "; the kernel runs copies in any order, so destinations must be disjoint");
    case Destinations::kUndecided: throw Error(ErrorCode::kUnsupported, compiled.overlap);
  }
  CopyWork work;
  work.direction = compiled.direction;
  work.buffer = reinterpret_cast<u64>(buffer);
  work.stats.copies = compiled.input_copies;
  work.stats.bytes = compiled.bytes;
  Emitter emitter{work, compiled.direction == CopyDirection::kPack, work.buffer};
  for (const ByteCopy& n : compiled.copies) {
    if (n.parameter >= parameters.size())
      throw Error(ErrorCode::kInvalidArgument, std::string(direction_name(compiled.direction)) + ": no base address for parameter " +
                                                   std::to_string(n.parameter) + " (" + std::to_string(parameters.size()) +
                                                   " given)");
    emit(n, emitter, reinterpret_cast<u64>(parameters[n.parameter]));
  }
  work.stats.items = static_cast<i64>(work.items.size());
  work.stats.descriptor_bytes = work.stats.items * static_cast<i64>(sizeof(CopyWorkItem));
  return work;
}

CopyWork compile_copy_work(CopyDirection direction, std::span<const BufferCopy> copies,
                           std::span<std::byte* const> parameters, std::span<const std::int64_t> parameter_bytes,
                           std::byte* buffer, std::int64_t buffer_bytes) {
  return compile_copy_work(compile_copies(direction, copies, parameter_bytes, buffer_bytes), parameters, buffer);
}

std::string malformed_item(const CopyWorkItem& item, std::uint64_t src, std::uint64_t dst) {
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
  const u64 access = item.access, load = item.load;
  if (access == 0 || access > width || width % access != 0) return "access " + std::to_string(access);
  if (load != 1 && load != 2 && load != 4 && load != 8 && load != 16) return "load " + std::to_string(load);
  if (item.count == 0 || item.count > kTileRows || item.length == 0 || item.length > tile_columns(static_cast<int>(width)))
    return "tile of " + std::to_string(item.count) + " x " + std::to_string(item.length);
  if ((static_cast<u64>(item.length) * width) % load != 0) return "rows not a whole number of loads";
  if ((src | static_cast<u64>(item.src_stride)) & (load - 1)) return "source rows not aligned to the load";
  if ((dst | static_cast<u64>(item.dst_stride)) & (access - 1)) return "destination not aligned to the access word";
  return {};
}

Status check_buffer_alignment(const CopyWork& work, const std::byte* buffer) {
  const u64 base = buffer == nullptr ? work.buffer : reinterpret_cast<u64>(buffer);
  if (((base - work.buffer) & 15) == 0) return Status::ok();
  return Status(ErrorCode::kInvalidArgument, std::string(direction_name(work.direction)) +
                                                 " program compiled for a buffer at 16-byte alignment " +
                                                 std::to_string(work.buffer & 15) + " executed on one at " +
                                                 std::to_string(base & 15));
}

namespace testing {

Status execute_on_host(const CopyWork& work, std::byte* buffer) {
  WB_RETURN_IF_ERROR(check_buffer_alignment(work, buffer));
  const u64 base = buffer == nullptr ? work.buffer : reinterpret_cast<u64>(buffer);
  const bool pack = work.direction == CopyDirection::kPack;
  const u64 src_base = pack ? 0 : base, dst_base = pack ? base : 0;
  alignas(16) std::byte tile[kTileBytes];
  for (std::size_t i = 0; i < work.items.size(); ++i) {
    const CopyWorkItem& item = work.items[i];
    const u64 src = src_base + item.src, dst = dst_base + item.dst;
    if (const std::string why = malformed_item(item, src, dst); !why.empty())
      return Status(ErrorCode::kInvalidArgument, "work item " + std::to_string(i) + ": " + why);
    const auto* s = reinterpret_cast<const std::byte*>(src);
    auto* d = reinterpret_cast<std::byte*>(dst);
    if (item.kind == CopyWorkItem::kTranspose) {
      // The kernel's two phases: source rows into the tile in load-byte vectors (each aligned in the
      // source, and stored as 4-byte words or narrower into the tile), then lane r writes source row r's
      // elements down the destination in access-byte words.
      const std::uint32_t pitch = static_cast<std::uint32_t>(tile_pitch(item.width));
      const std::uint32_t word = std::min<std::uint32_t>(item.load, 4);
      for (std::uint32_t q = 0; q < tile_vectors(item); ++q) {
        std::uint32_t row, byte;
        tile_vector_position(item, q, row, byte);
        const u64 from = src + static_cast<u64>(static_cast<i64>(row) * item.src_stride) + byte;
        const std::uint32_t into = row * pitch + byte;
        if (from % item.load != 0 || into % word != 0 || into + item.load > sizeof tile)
          return Status(ErrorCode::kInvalidArgument, "work item " + std::to_string(i) + ": tile vector " +
                                                         std::to_string(q) + " misaligned");
        std::memcpy(tile + into, reinterpret_cast<const std::byte*>(from), item.load);
      }
      for (std::uint32_t r = 0; r < item.count; ++r)
        for (std::uint32_t c = 0; c < item.length; ++c)
          for (std::uint32_t w = 0; w < item.width; w += item.access)
            std::memcpy(d + static_cast<i64>(c) * item.dst_stride + r * item.width + w, tile + r * pitch + c * item.width + w,
                        item.access);
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

}  // namespace wb::exec
