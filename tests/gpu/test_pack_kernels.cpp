// The CUDA pack and assemble kernels (kernels/pack_kernels.hpp) against the CPU copy program
// (exec::CopyProgram) and the element-by-element definition (tests/support/schedule_replay.hpp).
//
// Compilation and the descriptors need no device: the host interpretation of the very descriptor array
// the kernel reads (kernels::testing::execute_on_host) runs everywhere CUDA is built, on random copy lists
// and on the cases that decide the decomposition. Tests that launch the kernel skip with the reason when
// no CUDA device is usable, and compare the device's bytes with CopyProgram's bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "weightbridge/device.hpp"
#include "weightbridge/round_schedule.hpp"
#include "weightbridge/status.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/pack_kernels.hpp"
#include "src/exec/pack.hpp"
#include "tests/support/schedule_replay.hpp"
#endif

namespace wb {
namespace {

#ifdef WB_HAVE_CUDA

using exec::CopyDirection;
using kernels::CopyWork;
using kernels::CopyWorkItem;
using Bytes = std::vector<std::byte>;

// --- copy lists ------------------------------------------------------------------------------------------

// A parameter: a tensor of `shape` (checkpoint axis order) stored with its axes in `order` (outermost
// first: a permutation is a transposed layout) and `ways` tensors interleaved along the innermost stored
// axis (a fused layout); `element` bytes per element.
struct StoredTensor {
  Shape shape;
  std::vector<int> order;
  std::int64_t ways = 1;
  int element = 2;

  std::int64_t bytes() const { return shape_numel(shape) * ways * element; }
  // Strides of the checkpoint axes in parameter elements, for the tensor interleaved at position 0.
  Shape strides() const {
    Shape strides(shape.size());
    std::int64_t stride = ways;
    for (std::size_t k = order.size(); k-- > 0;) {
      strides[static_cast<std::size_t>(order[k])] = stride;
      stride *= shape[static_cast<std::size_t>(order[k])];
    }
    return strides;
  }
  // Box `box` of interleaved tensor `way`, as a copy (buffer offset set later).
  BufferCopy copy_of(std::uint32_t parameter, const Box& box, std::int64_t way) const {
    BufferCopy c;
    c.copy.parameter = parameter;
    c.copy.box = box;
    c.copy.strides = strides();
    c.copy.offset = way;
    for (std::size_t a = 0; a < shape.size(); ++a) c.copy.offset += box.offset[a] * c.copy.strides[a];
    c.element_bytes = static_cast<std::uint8_t>(element);
    return c;
  }
};

struct CopyList {
  std::string name;
  std::vector<std::int64_t> parameter_bytes;
  std::vector<BufferCopy> copies;
  std::int64_t buffer_bytes = 0;
};

// Cuts `shape` into boxes along every axis (at most `pieces` per axis) and keeps each with probability
// `keep`: boxes of one tensor never share an element.
std::vector<Box> random_boxes(const Shape& shape, int pieces, double keep, std::mt19937_64& random) {
  std::vector<std::vector<std::int64_t>> cuts(shape.size());
  for (std::size_t a = 0; a < shape.size(); ++a) {
    cuts[a] = {0, shape[a]};
    const int extra = static_cast<int>(random() % static_cast<unsigned>(pieces));
    for (int i = 0; i < extra && shape[a] > 1; ++i)
      cuts[a].push_back(1 + static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(shape[a] - 1)));
    std::sort(cuts[a].begin(), cuts[a].end());
    cuts[a].erase(std::unique(cuts[a].begin(), cuts[a].end()), cuts[a].end());
  }
  std::vector<Box> boxes;
  std::vector<std::size_t> at(shape.size(), 0);
  std::uniform_real_distribution<double> coin(0, 1);
  for (;;) {
    Box box;
    for (std::size_t a = 0; a < shape.size(); ++a) {
      box.offset.push_back(cuts[a][at[a]]);
      box.extent.push_back(cuts[a][at[a] + 1] - cuts[a][at[a]]);
    }
    if (coin(random) < keep) boxes.push_back(box);
    std::size_t a = shape.size();
    while (a-- > 0) {
      if (++at[a] + 1 < cuts[a].size()) break;
      at[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) break;
  }
  return boxes;
}

// Lays the copies out in the buffer in a random order, with gaps of 0..max_gap bytes (unaligned offsets).
void place_in_buffer(CopyList& list, int max_gap, std::mt19937_64& random) {
  std::vector<std::size_t> order(list.copies.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), random);
  std::int64_t at = 0;
  for (std::size_t i : order) {
    at += max_gap > 0 ? static_cast<std::int64_t>(random() % static_cast<unsigned>(max_gap + 1)) : 0;
    list.copies[i].buffer_offset = at;
    at += list.copies[i].bytes();
  }
  list.buffer_bytes = at + 29;
}

CopyList from_tensors(std::string name, const std::vector<StoredTensor>& tensors, int pieces, double keep, int max_gap,
                      std::uint64_t seed) {
  std::mt19937_64 random(seed);
  CopyList list;
  list.name = std::move(name);
  for (std::size_t p = 0; p < tensors.size(); ++p) {
    list.parameter_bytes.push_back(tensors[p].bytes());
    for (std::int64_t way = 0; way < tensors[p].ways; ++way)
      for (const Box& box : random_boxes(tensors[p].shape, pieces, keep, random))
        list.copies.push_back(tensors[p].copy_of(static_cast<std::uint32_t>(p), box, way));
  }
  place_in_buffer(list, max_gap, random);
  return list;
}

StoredTensor random_tensor(std::mt19937_64& random, std::int64_t max_extent) {
  StoredTensor t;
  const int ndim = 1 + static_cast<int>(random() % 3);
  for (int a = 0; a < ndim; ++a) t.shape.push_back(1 + static_cast<std::int64_t>(random() % static_cast<std::uint64_t>(max_extent)));
  while (shape_numel(t.shape) > (std::int64_t{1} << 20)) *std::max_element(t.shape.begin(), t.shape.end()) /= 2;
  t.order.resize(static_cast<std::size_t>(ndim));
  std::iota(t.order.begin(), t.order.end(), 0);
  if (random() % 2) std::shuffle(t.order.begin(), t.order.end(), random);
  t.ways = random() % 3 == 0 ? 2 : 1;
  const int elements[] = {1, 2, 4, 8};
  t.element = elements[random() % 4];
  return t;
}

std::vector<CopyList> random_lists(int count, std::uint64_t seed) {
  std::vector<CopyList> lists;
  std::mt19937_64 random(seed);
  for (int i = 0; i < count; ++i) {
    std::vector<StoredTensor> tensors(1 + random() % 4);
    const std::int64_t max_extent = i % 3 == 0 ? 7 : i % 3 == 1 ? 70 : 300;
    for (StoredTensor& t : tensors) t = random_tensor(random, max_extent);
    lists.push_back(from_tensors("random_" + std::to_string(i), tensors, 4, 0.85, i % 2 ? 19 : 0, seed + 97 * i));
  }
  return lists;
}

StoredTensor tensor(Shape shape, std::vector<int> order, int element, std::int64_t ways = 1) {
  return {std::move(shape), std::move(order), ways, element};
}

// Cases that decide the decomposition, small and multi-MiB.
std::vector<CopyList> named_lists() {
  std::vector<CopyList> lists;
  lists.push_back(from_tensors("contiguous_4mib", {tensor({4 << 20}, {0}, 1)}, 3, 1.0, 0, 1));
  lists.push_back(from_tensors("contiguous_unaligned", {tensor({(3 << 20) + 5}, {0}, 1)}, 4, 1.0, 13, 2));
  lists.push_back(from_tensors("rows_bf16", {tensor({512, 1024}, {0, 1}, 2)}, 3, 1.0, 0, 3));
  lists.push_back(from_tensors("column_boxes_bf16", {tensor({256, 4096}, {0, 1}, 2)}, 6, 0.7, 6, 4));
  lists.push_back(from_tensors("transposed_bf16_3mib", {tensor({1024, 1536}, {1, 0}, 2)}, 1, 1.0, 0, 5));
  lists.push_back(from_tensors("transposed_boxes_bf16", {tensor({128, 4096}, {1, 0}, 2)}, 4, 1.0, 2, 6));
  lists.push_back(from_tensors("transposed_u8", {tensor({333, 517}, {1, 0}, 1)}, 3, 1.0, 5, 7));
  lists.push_back(from_tensors("transposed_f32_unaligned", {tensor({130, 200}, {1, 0}, 4)}, 3, 1.0, 3, 8));
  lists.push_back(from_tensors("transposed_f64", {tensor({300, 700}, {1, 0}, 8)}, 2, 1.0, 0, 9));
  lists.push_back(from_tensors("transposed_f64_odd_offsets", {tensor({65, 47}, {1, 0}, 8)}, 3, 1.0, 7, 10));
  lists.push_back(from_tensors("permuted_3d_f32_4mib", {tensor({8, 256, 520}, {2, 0, 1}, 4)}, 3, 1.0, 0, 11));
  lists.push_back(from_tensors("permuted_3d_bf16", {tensor({12, 33, 70}, {1, 2, 0}, 2)}, 3, 1.0, 4, 12));
  lists.push_back(from_tensors("fused_interleaved", {tensor({64, 96}, {0, 1}, 2, 2), tensor({40, 48}, {1, 0}, 4, 2)}, 3, 1.0, 0, 13));
  lists.push_back(from_tensors("mixed_parameters",
                               {tensor({3}, {0}, 8), tensor({1000, 3}, {0, 1}, 1), tensor({77, 5, 9}, {2, 1, 0}, 2),
                                tensor({1, 1}, {0, 1}, 4), tensor({2048, 1}, {1, 0}, 2)},
                               3, 0.9, 11, 14));
  return lists;
}

// --- references ------------------------------------------------------------------------------------------

Bytes random_bytes(std::size_t size, std::uint64_t seed) {
  Bytes bytes(size);
  std::mt19937_64 random(seed);
  for (auto& b : bytes) b = static_cast<std::byte>(random());
  return bytes;
}

std::vector<std::byte*> addresses(std::vector<Bytes>& parameters) {
  std::vector<std::byte*> out;
  for (Bytes& p : parameters) out.push_back(p.data());
  return out;
}

// The element-by-element definition: copies in list order, element by element.
void reference(CopyDirection direction, const std::vector<BufferCopy>& copies, std::vector<Bytes>& parameters, Bytes& buffer) {
  for (const BufferCopy& c : copies)
    testing_support::for_each_element(c.copy.box, [&](std::span<const std::int64_t> index, std::int64_t ordinal) {
      std::byte* param = parameters[c.copy.parameter].data() + testing_support::element_position(c.copy, index) * c.element_bytes;
      std::byte* buf = buffer.data() + c.buffer_offset + ordinal * c.element_bytes;
      if (direction == CopyDirection::kPack)
        std::memcpy(buf, param, c.element_bytes);
      else
        std::memcpy(param, buf, c.element_bytes);
    });
}

::testing::AssertionResult same_bytes(const Bytes& expected, const Bytes& actual, const std::string& what) {
  if (expected.size() != actual.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  const auto [e, a] = std::mismatch(expected.begin(), expected.end(), actual.begin());
  if (e == expected.end()) return ::testing::AssertionSuccess();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) wrong += expected[i] != actual[i];
  return ::testing::AssertionFailure() << what << ": " << wrong << " of " << expected.size() << " bytes differ, first at byte "
                                       << (e - expected.begin()) << " (expected " << int(*e) << ", got " << int(*a) << ")";
}

// The state before a copy: random sources, a fill pattern in the destinations (it must survive in gaps).
struct Memory {
  std::vector<Bytes> parameters;
  Bytes buffer;
  Memory(const CopyList& list, CopyDirection direction, std::uint64_t seed) {
    const bool pack = direction == CopyDirection::kPack;
    for (std::size_t p = 0; p < list.parameter_bytes.size(); ++p)
      parameters.push_back(pack ? random_bytes(static_cast<std::size_t>(list.parameter_bytes[p]), seed + p)
                                : Bytes(static_cast<std::size_t>(list.parameter_bytes[p]), std::byte{0xEE}));
    buffer = pack ? Bytes(static_cast<std::size_t>(list.buffer_bytes), std::byte{0xCD})
                  : random_bytes(static_cast<std::size_t>(list.buffer_bytes), seed + 1000);
  }
};

::testing::AssertionResult same_memory(const Memory& expected, const Memory& actual, const std::string& what) {
  for (std::size_t p = 0; p < expected.parameters.size(); ++p)
    if (auto r = same_bytes(expected.parameters[p], actual.parameters[p], what + ", parameter " + std::to_string(p)); !r)
      return r;
  return same_bytes(expected.buffer, actual.buffer, what + ", buffer");
}

const char* name_of(CopyDirection direction) { return direction == CopyDirection::kPack ? "pack" : "assemble"; }

// Compiles the list for host memory, interprets the descriptors, and compares with CopyProgram and with
// the element-by-element definition. Returns the compiled work for further checks.
CopyWork expect_host_interpretation_exact(const CopyList& list, CopyDirection direction) {
  SCOPED_TRACE(list.name + " " + name_of(direction));
  Memory cpu(list, direction, 42), definition = cpu, interpreted = cpu;

  exec::CopyProgram program(direction, list.copies, list.parameter_bytes, list.buffer_bytes);
  program.execute(addresses(cpu.parameters), cpu.buffer.data());
  reference(direction, list.copies, definition.parameters, definition.buffer);
  EXPECT_TRUE(same_memory(definition, cpu, "CopyProgram vs the definition"));

  std::vector<std::byte*> parameters = addresses(interpreted.parameters);
  CopyWork work = kernels::compile_copy_work(direction, list.copies, parameters, list.parameter_bytes,
                                             interpreted.buffer.data(), list.buffer_bytes);
  const Status status = kernels::testing::execute_on_host(work);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_TRUE(same_memory(definition, interpreted, "descriptors interpreted on the host vs the definition"));
  EXPECT_EQ(work.stats.bytes, program.bytes());
  EXPECT_EQ(work.stats.items, static_cast<std::int64_t>(work.items.size()));
  EXPECT_EQ(work.stats.run_items + work.stats.transpose_items, work.stats.items);
  EXPECT_EQ(work.stats.descriptor_bytes, work.stats.items * 32);
  return work;
}

// --- host: the descriptors against CopyProgram -----------------------------------------------------------

// Which kinds of work items some lists produced: the comparisons above cover every path of the kernel.
struct Coverage {
  std::set<int> run_widths, tile_elements;
  bool grouped_runs = false, narrow_tile_words = false, long_runs = false;
  void add(const CopyWork& work) {
    for (const CopyWorkItem& item : work.items) {
      if (item.kind == CopyWorkItem::kRuns) {
        run_widths.insert(item.width);
        grouped_runs = grouped_runs || item.count > 1;
        long_runs = long_runs || item.length >= kernels::kWorkItemBytes;
      } else {
        tile_elements.insert(item.width);
        narrow_tile_words = narrow_tile_words || item.access < item.width;
      }
    }
  }
  void expect_everything() const {
    EXPECT_EQ(run_widths, (std::set<int>{1, 2, 4, 8, 16}));
    EXPECT_EQ(tile_elements, (std::set<int>{1, 2, 4, 8}));
    EXPECT_TRUE(grouped_runs);
    EXPECT_TRUE(narrow_tile_words);
    EXPECT_TRUE(long_runs);
  }
};

TEST(PackKernelsHost, RandomListsMatchCopyProgram) {
  Coverage coverage;
  for (const CopyList& list : random_lists(60, 2024))
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      coverage.add(expect_host_interpretation_exact(list, direction));
      if (HasFailure()) return;
    }
  coverage.expect_everything();
}

TEST(PackKernelsHost, NamedListsMatchCopyProgram) {
  Coverage coverage;
  for (const CopyList& list : named_lists())
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      coverage.add(expect_host_interpretation_exact(list, direction));
      if (HasFailure()) return;
    }
  coverage.expect_everything();
}

TEST(PackKernelsHost, PackMayReadOneSourceTwice) {
  CopyList list = from_tensors("twice", {tensor({40, 50}, {1, 0}, 2)}, 3, 1.0, 0, 21);
  const std::size_t n = list.copies.size();
  for (std::size_t i = 0; i < n; ++i) list.copies.push_back(list.copies[i]);
  std::mt19937_64 random(5);
  place_in_buffer(list, 9, random);
  expect_host_interpretation_exact(list, CopyDirection::kPack);
}

// --- host: the decomposition -----------------------------------------------------------------------------

// The work of one copy of `shape` (stored in `order`) with the buffer offset given, host addresses of a
// 256-byte-aligned allocation.
struct OneCopy {
  StoredTensor stored;
  std::vector<Bytes> parameters;
  Bytes buffer;
  std::vector<BufferCopy> copies;
  CopyWork work;

  OneCopy(StoredTensor t, Box box, std::int64_t buffer_offset, CopyDirection direction, std::int64_t parameter_shift = 0)
      : stored(std::move(t)) {
    parameters.emplace_back(static_cast<std::size_t>(stored.bytes() + 256));
    BufferCopy copy = stored.copy_of(0, box, 0);
    copy.copy.offset += parameter_shift;
    copy.buffer_offset = buffer_offset;
    buffer.resize(static_cast<std::size_t>(buffer_offset + copy.bytes() + 256));
    copies.push_back(copy);
    // Both allocations 128-byte aligned, so the offsets alone decide vector widths.
    std::vector<std::byte*> bases{align(parameters[0].data())};
    const std::vector<std::int64_t> sizes{stored.bytes() + 128};
    work = kernels::compile_copy_work(direction, copies, bases, sizes, align(buffer.data()),
                                      static_cast<std::int64_t>(buffer.size()) - 128);
  }
  static std::byte* align(std::byte* p) { return p + (128 - reinterpret_cast<std::uintptr_t>(p) % 128) % 128; }
};

TEST(PackKernelsHost, LongAlignedRunsAreCutIntoFourKibPiecesOfSixteenByteVectors) {
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
    OneCopy c(tensor({1 << 20}, {0}, 1), Box{{0}, {1 << 20}}, 0, direction);
    ASSERT_EQ(c.work.items.size(), std::size_t{(1 << 20) / kernels::kWorkItemBytes});
    for (const CopyWorkItem& item : c.work.items) {
      EXPECT_EQ(item.kind, CopyWorkItem::kRuns);
      EXPECT_EQ(item.width, 16);
      EXPECT_EQ(item.count, 1);
      EXPECT_EQ(item.length, kernels::kWorkItemBytes);
    }
    EXPECT_FALSE(c.work.has_transposes);
  }
}

TEST(PackKernelsHost, VectorWidthFollowsTheRelativeAlignment) {
  // Source and destination 3 bytes apart modulo 16: bytes; 8 apart: 8-byte vectors; 16 apart: 16 bytes,
  // whatever the absolute alignment (the head goes byte by byte).
  const std::pair<std::int64_t, int> cases[] = {{3, 1}, {2, 2}, {12, 4}, {8, 8}, {16, 16}, {48, 16}};
  for (const auto& [offset, width] : cases) {
    OneCopy c(tensor({20000}, {0}, 1), Box{{5}, {10000}}, offset + 5, CopyDirection::kPack, 0);
    SCOPED_TRACE("buffer offset " + std::to_string(offset + 5));
    for (const CopyWorkItem& item : c.work.items) EXPECT_EQ(item.width, width);
    // The first piece absorbs the unaligned head: later pieces start at a 16-byte-aligned source.
    ASSERT_GE(c.work.items.size(), 2u);
    EXPECT_GT(c.work.items[0].length, kernels::kWorkItemBytes);
    EXPECT_EQ((c.work.items[1].src) % 16, 0u);
  }
}

TEST(PackKernelsHost, ShortRowsAreGroupedIntoOneItem) {
  // 64 rows of 16 bf16 (32 bytes) out of rows of 1024: one item of 64 runs.
  OneCopy c(tensor({64, 1024}, {0, 1}, 2), Box{{0, 256}, {64, 16}}, 0, CopyDirection::kPack);
  ASSERT_EQ(c.work.items.size(), 1u);
  const CopyWorkItem& item = c.work.items[0];
  EXPECT_EQ(item.kind, CopyWorkItem::kRuns);
  EXPECT_EQ(item.count, 64);
  EXPECT_EQ(item.length, 32);
  EXPECT_EQ(item.src_stride, 2048);
  EXPECT_EQ(item.dst_stride, 32);
  EXPECT_EQ(item.width, 16);
  // 300 rows of 32 bytes: 128 runs (4 KiB) per item.
  OneCopy more(tensor({300, 1024}, {0, 1}, 2), Box{{0, 256}, {300, 16}}, 0, CopyDirection::kAssemble);
  ASSERT_EQ(more.work.items.size(), 3u);
  EXPECT_EQ(more.work.items[0].count, 128);
  EXPECT_EQ(more.work.items[2].count, 300 - 256);
}

TEST(PackKernelsHost, TransposedBoxesBecomeTiles) {
  // [128 x 4096] bf16 stored transposed: 4 x 128 tiles of 32 x 32.
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
    OneCopy c(tensor({128, 4096}, {1, 0}, 2), Box{{0, 0}, {128, 4096}}, 0, direction);
    EXPECT_TRUE(c.work.has_transposes);
    EXPECT_EQ(c.work.stats.transpose_items, 4 * 128);
    EXPECT_EQ(c.work.stats.transposed_bytes, 128 * 4096 * 2);
    for (const CopyWorkItem& item : c.work.items) {
      ASSERT_EQ(item.kind, CopyWorkItem::kTranspose);
      EXPECT_EQ(item.width, 2);
      EXPECT_EQ(item.access, 2);
      EXPECT_EQ(item.count, 32);
      EXPECT_EQ(item.length, 32);
    }
  }
  // 8-byte elements: tiles of 32 rows (along the 40 buffer-contiguous elements) by 16 columns (along the
  // 70 parameter-contiguous ones), partial at the edges.
  OneCopy f64(tensor({70, 40}, {1, 0}, 8), Box{{0, 0}, {70, 40}}, 0, CopyDirection::kPack);
  EXPECT_EQ(f64.work.stats.transpose_items, 2 * 5);
  for (const CopyWorkItem& item : f64.work.items) EXPECT_LE(item.length, 16);
  // A buffer offset of 2 bytes: 4-byte elements move in 2-byte words.
  OneCopy odd(tensor({64, 64}, {1, 0}, 4), Box{{0, 0}, {64, 64}}, 2, CopyDirection::kPack);
  for (const CopyWorkItem& item : odd.work.items) EXPECT_EQ(item.access, 2);
}

TEST(PackKernelsHost, EmptyBoxesAreIgnored) {
  CopyList list;
  list.parameter_bytes = {64};
  BufferCopy empty = tensor({4, 4}, {0, 1}, 4).copy_of(0, Box{{0, 0}, {0, 4}}, 0);
  list.copies = {empty};
  list.buffer_bytes = 0;
  std::byte parameter[64];
  std::byte* parameters[] = {parameter};
  const CopyWork work =
      kernels::compile_copy_work(CopyDirection::kAssemble, list.copies, parameters, list.parameter_bytes, nullptr, 0);
  EXPECT_TRUE(work.items.empty());
  EXPECT_EQ(work.stats.copies, 0);
  // An empty program needs no device and launches nothing.
  kernels::DeviceCopyProgram program(work, 0);
  EXPECT_TRUE(program.empty());
  EXPECT_TRUE(program.execute(nullptr).is_ok());
}

TEST(PackKernelsHost, OtherBuffersOfTheSameAlignmentAreAccepted) {
  const CopyList list = from_tensors("slots", {tensor({300, 77}, {1, 0}, 2), tensor({5000}, {0}, 1)}, 3, 1.0, 7, 31);
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
    SCOPED_TRACE(name_of(direction));
    // Two slots of one allocation, 256 bytes apart modulo their size; the program compiled for the first.
    Memory expected(list, direction, 7);
    exec::CopyProgram program(direction, list.copies, list.parameter_bytes, list.buffer_bytes);
    program.execute(addresses(expected.parameters), expected.buffer.data());

    Memory actual(list, direction, 7);
    const std::size_t stride = (static_cast<std::size_t>(list.buffer_bytes) + 255) / 256 * 256;
    Bytes slots(2 * stride + 256, std::byte{0});
    std::byte* first = OneCopy::align(slots.data());
    std::memcpy(first + stride, actual.buffer.data(), actual.buffer.size());
    std::vector<std::byte*> parameters = addresses(actual.parameters);
    const CopyWork work = kernels::compile_copy_work(direction, list.copies, parameters, list.parameter_bytes, first,
                                                     list.buffer_bytes);
    ASSERT_TRUE(kernels::testing::execute_on_host(work, first + stride).is_ok());
    std::memcpy(actual.buffer.data(), first + stride, actual.buffer.size());
    EXPECT_TRUE(same_memory(expected, actual, "second slot"));
    const Status misaligned = kernels::testing::execute_on_host(work, first + 8);
    EXPECT_EQ(misaligned.code(), ErrorCode::kInvalidArgument) << misaligned.to_string();
  }
}

TEST(PackKernelsHost, MalformedDescriptorsAreReported) {
  OneCopy c(tensor({64, 64}, {1, 0}, 4), Box{{0, 0}, {64, 64}}, 0, CopyDirection::kPack);
  CopyWork work = c.work;
  work.items[1].access = 3;
  EXPECT_EQ(kernels::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
  work = c.work;
  work.items[0].count = 33;
  EXPECT_EQ(kernels::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
  OneCopy runs(tensor({10000}, {0}, 1), Box{{0}, {10000}}, 0, CopyDirection::kPack);
  work = runs.work;
  work.items[0].src += 4;  // now 4 bytes off the destination modulo 16
  EXPECT_EQ(kernels::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
}

// --- host: validation and overlap ------------------------------------------------------------------------

std::string compile_error(CopyDirection direction, const std::vector<BufferCopy>& copies,
                          const std::vector<std::int64_t>& parameter_bytes, std::int64_t buffer_bytes, ErrorCode expected) {
  std::vector<Bytes> storage;
  for (std::int64_t b : parameter_bytes) storage.emplace_back(static_cast<std::size_t>(std::max<std::int64_t>(b, 1)));
  Bytes buffer(static_cast<std::size_t>(std::max<std::int64_t>(buffer_bytes, 1)));
  std::vector<std::byte*> parameters = addresses(storage);
  try {
    kernels::compile_copy_work(direction, copies, parameters, parameter_bytes, buffer.data(), buffer_bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.status().message();
  }
  ADD_FAILURE() << "compiled";
  return {};
}

TEST(PackKernelsValidation, SameRulesAndWordsAsCopyProgram) {
  const BufferCopy good = tensor({4, 8}, {0, 1}, 4).copy_of(0, Box{{1, 2}, {2, 3}}, 0);
  struct Bad {
    const char* why;
    BufferCopy copy;
  };
  std::vector<Bad> bad;
  auto with = [&](const char* why, auto change) {
    BufferCopy c = good;
    change(c);
    bad.push_back({why, c});
  };
  with("parameter index out of range", [](BufferCopy& c) { c.copy.parameter = 3; });
  with("element size 0", [](BufferCopy& c) { c.element_bytes = 0; });
  with("negative extent", [](BufferCopy& c) { c.copy.box.extent[1] = -1; });
  with("negative buffer offset", [](BufferCopy& c) { c.buffer_offset = -4; });
  with("strides for", [](BufferCopy& c) { c.copy.strides.pop_back(); });
  with("more than 16 axes", [](BufferCopy& c) {
    c.copy.box = Box{Shape(17, 0), Shape(17, 1)};
    c.copy.strides = Shape(17, 1);
  });
  with("reach outside the parameter", [](BufferCopy& c) { c.copy.offset = 30; });
  with("reach outside the parameter", [](BufferCopy& c) { c.copy.strides[0] = -16; });
  with("reach outside the buffer", [](BufferCopy& c) { c.buffer_offset = 1000; });
  with("overflow 64 bits", [](BufferCopy& c) {
    c.copy.box.extent = {std::int64_t{1} << 40, std::int64_t{1} << 40};
    c.copy.strides = {0, 0};
  });
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble})
    for (const Bad& b : bad) {
      SCOPED_TRACE(std::string(name_of(direction)) + ": " + b.why);
      const std::vector<BufferCopy> copies = {good, b.copy};
      const std::string message = compile_error(direction, copies, {128}, 64, ErrorCode::kInvalidArgument);
      EXPECT_NE(message.find(b.why), std::string::npos) << message;
      EXPECT_EQ(message.rfind(std::string(name_of(direction)) + " copy 1 (parameter ", 0), 0u) << message;
      EXPECT_NE(message.find("box [" + std::to_string(b.copy.copy.box.offset.empty() ? 0 : b.copy.copy.box.offset[0])),
                std::string::npos)
          << message;
      try {
        exec::CopyProgram(direction, copies, std::vector<std::int64_t>{128}, 64);
        ADD_FAILURE() << "CopyProgram accepted it";
      } catch (const Error& e) {
        EXPECT_EQ(e.status().message(), message) << "the CPU program words it otherwise";
      }
    }
}

TEST(PackKernelsValidation, OverlappingBufferRangesAreRefusedForPack) {
  const StoredTensor t = tensor({16, 16}, {0, 1}, 2);
  std::vector<BufferCopy> copies = {t.copy_of(0, Box{{0, 0}, {4, 16}}, 0), t.copy_of(0, Box{{4, 0}, {4, 16}}, 0)};
  copies[0].buffer_offset = 0;
  copies[1].buffer_offset = 100;  // [100, 228) overlaps [0, 128)
  const std::string message = compile_error(CopyDirection::kPack, copies, {512}, 512, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("pack copy 1"), std::string::npos) << message;
  EXPECT_NE(message.find("pack copy 0"), std::string::npos) << message;
  EXPECT_NE(message.find("buffer bytes [100, 128)"), std::string::npos) << message;
  // Side by side they are fine.
  copies[1].buffer_offset = 128;
  std::vector<Bytes> storage(1, Bytes(512));
  std::vector<std::byte*> parameters = addresses(storage);
  Bytes buffer(512);
  const std::vector<std::int64_t> sizes{512};
  EXPECT_NO_THROW(kernels::compile_copy_work(CopyDirection::kPack, copies, parameters, sizes, buffer.data(), 512));
}

TEST(PackKernelsValidation, OverlappingParameterWritesAreRefusedForAssemble) {
  const StoredTensor t = tensor({16, 16}, {0, 1}, 2);
  // Two boxes sharing row 3.
  std::vector<BufferCopy> copies = {t.copy_of(0, Box{{0, 0}, {4, 16}}, 0), t.copy_of(0, Box{{3, 0}, {4, 16}}, 0)};
  copies[1].buffer_offset = 128;
  std::string message = compile_error(CopyDirection::kAssemble, copies, {512}, 512, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("overlaps that of assemble copy 0"), std::string::npos) << message;
  EXPECT_NE(message.find("parameter 0 bytes [96, 128)"), std::string::npos) << message;
  // Transposed boxes crossing each other.
  const StoredTensor tt = tensor({16, 16}, {1, 0}, 2);
  copies = {tt.copy_of(0, Box{{0, 0}, {8, 16}}, 0), tt.copy_of(0, Box{{0, 5}, {16, 2}}, 0)};
  copies[1].buffer_offset = 256;
  message = compile_error(CopyDirection::kAssemble, copies, {512}, 512, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("destinations must be disjoint"), std::string::npos) << message;
  // One copy writing an element twice (stride 0).
  BufferCopy twice = t.copy_of(0, Box{{0, 0}, {2, 16}}, 0);
  twice.copy.strides[0] = 0;
  message = compile_error(CopyDirection::kAssemble, {twice}, {512}, 512, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("more than once"), std::string::npos) << message;
  // ... which a pack may do: it only reads the parameter twice.
  std::vector<Bytes> storage(1, Bytes(512));
  std::vector<std::byte*> parameters = addresses(storage);
  Bytes buffer(512);
  const std::vector<BufferCopy> pack_twice = {twice};
  const std::vector<std::int64_t> sizes{512};
  EXPECT_NO_THROW(kernels::compile_copy_work(CopyDirection::kPack, pack_twice, parameters, sizes, buffer.data(), 512));
}

TEST(PackKernelsValidation, InterleavedDisjointWritesAreAccepted) {
  // Even and odd columns of one parameter, rows of a fused tensor, other parameters at equal offsets:
  // hulls overlap, elements do not.
  CopyList list;
  const StoredTensor fused = tensor({16, 32}, {0, 1}, 2, 2);
  const StoredTensor plain = tensor({16, 32}, {1, 0}, 2, 2);
  list.parameter_bytes = {fused.bytes(), plain.bytes()};
  list.copies = {fused.copy_of(0, Box{{0, 0}, {16, 32}}, 0), fused.copy_of(0, Box{{0, 0}, {16, 32}}, 1),
                 plain.copy_of(1, Box{{0, 0}, {16, 32}}, 1), plain.copy_of(1, Box{{0, 0}, {16, 32}}, 0)};
  std::mt19937_64 random(3);
  place_in_buffer(list, 5, random);
  expect_host_interpretation_exact(list, CopyDirection::kAssemble);
}

// --- device ----------------------------------------------------------------------------------------------

class PackKernelsDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }
  cudaStream_t stream_ = nullptr;
};

// Runs the list on the device (parameters and buffer in device memory, the buffer at `slot` of two) and
// compares every parameter and buffer byte with CopyProgram on the host.
void expect_device_exact(const CopyList& list, CopyDirection direction, cudaStream_t stream, int slot = 0) {
  SCOPED_TRACE(list.name + " " + name_of(direction) + " slot " + std::to_string(slot));
  Memory expected(list, direction, 99);
  const Memory initial = expected;
  exec::CopyProgram program(direction, list.copies, list.parameter_bytes, list.buffer_bytes);
  program.execute(addresses(expected.parameters), expected.buffer.data());

  std::vector<DeviceBuffer> parameters;
  std::vector<std::byte*> bases;
  for (const Bytes& p : initial.parameters) {
    parameters.emplace_back(std::max<std::size_t>(p.size(), 1));
    cuda_copy(parameters.back().data(), p.data(), p.size());
    bases.push_back(static_cast<std::byte*>(parameters.back().data()));
  }
  const std::size_t stride = (initial.buffer.size() + 255) / 256 * 256;
  DeviceBuffer buffer(2 * stride + 1);
  auto* first = static_cast<std::byte*>(buffer.data());
  cuda_copy(first + slot * stride, initial.buffer.data(), initial.buffer.size());

  const kernels::DeviceCopyProgram device_program(
      kernels::compile_copy_work(direction, list.copies, bases, list.parameter_bytes, first, list.buffer_bytes), 0);
  const Status status = device_program.execute(stream, first + slot * stride);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  Memory actual = initial;
  for (std::size_t p = 0; p < actual.parameters.size(); ++p)
    cuda_copy(actual.parameters[p].data(), bases[p], actual.parameters[p].size());
  cuda_copy(actual.buffer.data(), first + slot * stride, actual.buffer.size());
  EXPECT_TRUE(same_memory(expected, actual, "device vs CopyProgram"));
}

TEST_F(PackKernelsDevice, RandomListsMatchCopyProgram) {
  for (const CopyList& list : random_lists(40, 77))
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      expect_device_exact(list, direction, stream_);
      if (HasFailure()) return;
    }
}

TEST_F(PackKernelsDevice, NamedListsMatchCopyProgram) {
  for (const CopyList& list : named_lists())
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      expect_device_exact(list, direction, stream_);
      if (HasFailure()) return;
    }
}

TEST_F(PackKernelsDevice, AnotherSlotOfTheBuffer) {
  for (const CopyList& list : named_lists())
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      expect_device_exact(list, direction, stream_, 1);
      if (HasFailure()) return;
    }
}

TEST_F(PackKernelsDevice, OneKernelPerExecution) {
  // Captured into a graph, one execution of a program with runs and tiles is one kernel node.
  const CopyList list = from_tensors("capture", {tensor({300, 77}, {1, 0}, 2), tensor({50000}, {0}, 1)}, 4, 1.0, 3, 8);
  std::vector<DeviceBuffer> parameters;
  std::vector<std::byte*> bases;
  for (std::int64_t b : list.parameter_bytes) {
    parameters.emplace_back(static_cast<std::size_t>(b));
    bases.push_back(static_cast<std::byte*>(parameters.back().data()));
  }
  DeviceBuffer buffer(static_cast<std::size_t>(list.buffer_bytes));
  const kernels::DeviceCopyProgram program(
      kernels::compile_copy_work(CopyDirection::kPack, list.copies, bases, list.parameter_bytes,
                                 static_cast<std::byte*>(buffer.data()), list.buffer_bytes),
      0);
  ASSERT_TRUE(program.work().has_transposes);
  ASSERT_GT(program.stats().run_items, 0);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status status = program.execute(stream_);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  std::size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 1u);
  if (nodes == 1) {
    cudaGraphNode_t node = nullptr;
    ASSERT_EQ(cudaGraphGetNodes(graph, &node, &nodes), cudaSuccess);
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeKernel);
  }
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST(PackKernelsNoDevice, LoadingNeedsADevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is available";
  OneCopy c(tensor({1000}, {0}, 1), Box{{0}, {1000}}, 0, CopyDirection::kPack);
  try {
    kernels::DeviceCopyProgram program(c.work, 0);
    FAIL() << "loaded a program without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find(cuda_unavailable_reason()), std::string::npos) << e.what();
  }
}

#else  // !WB_HAVE_CUDA

TEST(PackKernels, NeedCuda) { GTEST_SKIP() << cuda_unavailable_reason(); }

#endif

}  // namespace
}  // namespace wb
