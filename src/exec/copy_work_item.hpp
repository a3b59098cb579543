// The descriptor the CUDA copy kernel reads (kernels/copy_work_kernel.cu), and the address arithmetic of
// one item, which the kernel and the host interpretation (exec/copy_work.hpp, testing::execute_on_host)
// share: the descriptors are tested here by executing them with the kernel's own arithmetic.
//
// A plain header for nvcc and the host compiler alike: no MPI, no CUDA types.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WB_HOST_DEVICE __host__ __device__
#else
#define WB_HOST_DEVICE
#endif

namespace wb::exec {

/// One work item: what one warp copies. 32 bytes, read by the kernel with two 16-byte loads.
///
/// kRuns: `count` runs of `length` bytes; run i goes from src + i * src_stride to dst + i * dst_stride.
///   `width` (1, 2, 4, 8 or 16) is the vector each lane moves: src and dst agree modulo width, and so do
///   the strides when count > 1, so every run has the same unaligned head (up to the first width-aligned
///   source byte) and tail, which go byte by byte.
/// kTranspose: a tile of `count` (<= 32) source rows by `length` (<= tile_columns(width)) source columns of
///   `width`-byte elements: element (r, c) goes from src + r * src_stride + c * width to
///   dst + c * dst_stride + r * width. The source rows are read into shared memory in `load`-byte vectors
///   along the row (up to 16 bytes: src, src_stride and the row's bytes are multiples of it); the
///   destination rows are written in `access`-byte words (dividing width), as wide as dst and dst_stride
///   allow.
/// Parameter-side addresses are absolute; buffer-side ones are relative to the buffer, so that one program
/// serves every pipeline slot of equal alignment.
struct CopyWorkItem {
  enum Kind : std::uint8_t { kRuns = 0, kTranspose = 1 };
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::int32_t src_stride = 0;
  std::int32_t dst_stride = 0;
  std::uint16_t count = 0;
  std::uint16_t length = 0;
  std::uint8_t kind = kRuns;
  std::uint8_t width = 1;
  std::uint8_t access = 1;
  std::uint8_t load = 0;  // kTranspose only
};
static_assert(sizeof(CopyWorkItem) == 32);

/// Bytes a run item moves at most (a lane's eight 16-byte vectors, times the 32 lanes of a warp); a longer
/// run is cut into equal pieces of about this size, 16-byte aligned in the source after the first.
inline constexpr std::int64_t kWorkItemBytes = 4096;
/// Source rows of a transpose tile; its columns: tile_columns(element bytes).
inline constexpr int kTileRows = 32;
WB_HOST_DEVICE constexpr int tile_columns(int element_bytes) { return element_bytes == 8 ? 16 : 32; }
/// Bytes of a tile row in shared memory: the tile's columns plus a pad that makes the row an odd number of
/// 4-byte banks (8 bytes for 8-byte elements, whose accesses go by half-warps), so that reading a column
/// (one element of every row) hits 32 different banks. A multiple of 4: loaded vectors go in as 4-byte
/// words.
WB_HOST_DEVICE constexpr int tile_pitch(int element_bytes) {
  return tile_columns(element_bytes) * element_bytes + (element_bytes == 8 ? 8 : 4);
}
/// Shared memory of one warp's tile (the largest: 8-byte elements).
inline constexpr int kTileBytes = kTileRows * tile_pitch(8);
static_assert(kTileBytes >= kTileRows * tile_pitch(4) && kTileBytes >= kTileRows * tile_pitch(2) &&
              kTileBytes >= kTileRows * tile_pitch(1));

// --- run items ---------------------------------------------------------------------------------------

struct RunGeometry {
  std::uint32_t head;  // bytes before the first width-aligned source byte (at most the run)
  std::uint32_t body;  // whole vectors after the head
  std::uint32_t tail;  // bytes after them
};

WB_HOST_DEVICE inline RunGeometry run_geometry(const CopyWorkItem& item, std::uint64_t source) {
  const std::uint32_t width = item.width;
  std::uint32_t head = static_cast<std::uint32_t>((width - (source & (width - 1))) & (width - 1));
  if (head > item.length) head = item.length;
  const std::uint32_t body = (item.length - head) / width;
  return {head, body, item.length - head - body * width};
}

/// Vector v of a run item: its run and byte offset within that run.
WB_HOST_DEVICE inline void vector_position(const CopyWorkItem& item, const RunGeometry& g, std::uint32_t v,
                                           std::uint32_t& run, std::uint32_t& offset) {
  run = item.count == 1 ? 0 : v / g.body;
  offset = g.head + (v - run * g.body) * item.width;
}

/// Edge byte e of a run item (heads and tails of every run, run after run).
WB_HOST_DEVICE inline void edge_position(const CopyWorkItem& item, const RunGeometry& g, std::uint32_t e,
                                         std::uint32_t& run, std::uint32_t& offset) {
  const std::uint32_t edge = g.head + g.tail;
  run = e / edge;
  const std::uint32_t b = e - run * edge;
  offset = b < g.head ? b : g.head + g.body * item.width + (b - g.head);
}

// --- transpose items ---------------------------------------------------------------------------------

/// Vectors of `item.load` bytes in one source row of a tile, and in the whole tile.
WB_HOST_DEVICE inline std::uint32_t tile_row_vectors(const CopyWorkItem& item) {
  return static_cast<std::uint32_t>(item.length) * item.width / item.load;
}
WB_HOST_DEVICE inline std::uint32_t tile_vectors(const CopyWorkItem& item) { return item.count * tile_row_vectors(item); }

/// Vector q of a tile's load (lanes take q = lane, lane + 32, ...): its source row and byte in the row,
/// which is also its place in the shared tile (row * tile_pitch(width) + byte).
WB_HOST_DEVICE inline void tile_vector_position(const CopyWorkItem& item, std::uint32_t q, std::uint32_t& row,
                                                std::uint32_t& byte) {
  const std::uint32_t per_row = tile_row_vectors(item);
  row = q / per_row;
  byte = (q - row * per_row) * item.load;
}

}  // namespace wb::exec
