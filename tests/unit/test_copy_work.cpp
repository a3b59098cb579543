// The CUDA back end of the copy compiler on the host (exec/copy_work.hpp): the descriptor arrays the copy
// kernel reads, executed by the host interpretation with the kernel's own address arithmetic
// (exec/copy_work_item.hpp: run vectors and edges, tiles loaded in vectors along the source rows into a
// tile of the kernel's pitch and stored in words), against the element-by-element definition, on random
// copy lists and on the cases that decide the decomposition. Runs in every build: no device is needed
// (tests/gpu/test_copy_kernel.cpp runs the same descriptors on one).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "../support/copy_lists.hpp"
#include "exec/copy_work.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using namespace testing_support;
using exec::CopyWork;
using exec::CopyWorkItem;
using ::testing::HasSubstr;

// Compiles the list for host memory, interprets the descriptors and compares with the element-by-element
// definition. Returns the compiled work for further checks.
CopyWork expect_host_interpretation_exact(const CopyList& list, CopyDirection direction) {
  SCOPED_TRACE(list.name + " " + name_of(direction));
  Memory definition(list, direction, 42), interpreted = definition;
  reference(direction, list.copies, definition.parameters, definition.buffer);

  std::vector<std::byte*> parameters = addresses(interpreted.parameters);
  CopyWork work = exec::compile_copy_work(direction, list.copies, parameters, list.parameter_bytes,
                                          interpreted.buffer.data(), list.buffer_bytes);
  const Status status = exec::testing::execute_on_host(work);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_TRUE(same_memory(definition, interpreted, "descriptors interpreted on the host vs the definition"));
  std::int64_t bytes = 0;
  for (const BufferCopy& c : list.copies) bytes += c.bytes();
  EXPECT_EQ(work.stats.bytes, bytes);
  EXPECT_EQ(work.stats.items, static_cast<std::int64_t>(work.items.size()));
  EXPECT_EQ(work.stats.run_items + work.stats.transpose_items, work.stats.items);
  EXPECT_EQ(work.stats.descriptor_bytes, work.stats.items * 32);
  return work;
}

// Which kinds of work items some lists produced: the comparisons above cover every path of the kernel.
struct Coverage {
  std::set<int> run_widths, tile_elements, tile_loads;
  bool grouped_runs = false, narrow_tile_words = false, long_runs = false, wide_loads_of_narrow_elements = false;
  void add(const CopyWork& work) {
    for (const CopyWorkItem& item : work.items) {
      if (item.kind == CopyWorkItem::kRuns) {
        run_widths.insert(item.width);
        grouped_runs = grouped_runs || item.count > 1;
        long_runs = long_runs || (item.count == 1 && item.length >= exec::kWorkItemBytes / 2);  // pieces of long runs
      } else {
        tile_elements.insert(item.width);
        tile_loads.insert(item.load);
        narrow_tile_words = narrow_tile_words || item.access < item.width;
        wide_loads_of_narrow_elements = wide_loads_of_narrow_elements || (item.width <= 2 && item.load == 16);
      }
    }
  }
  void expect_everything() const {
    EXPECT_EQ(run_widths, (std::set<int>{1, 2, 4, 8, 16}));
    EXPECT_EQ(tile_elements, (std::set<int>{1, 2, 4, 8}));
    EXPECT_EQ(tile_loads, (std::set<int>{1, 2, 4, 8, 16}));
    EXPECT_TRUE(grouped_runs);
    EXPECT_TRUE(narrow_tile_words);
    EXPECT_TRUE(long_runs);
    EXPECT_TRUE(wide_loads_of_narrow_elements);
  }
};

TEST(CopyWork, RandomListsMatchTheDefinition) {
  Coverage coverage;
  for (const CopyList& list : random_lists(60, 2024))
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      coverage.add(expect_host_interpretation_exact(list, direction));
      if (HasFailure()) return;
    }
  coverage.expect_everything();
}

TEST(CopyWork, NamedListsMatchTheDefinition) {
  Coverage coverage;
  for (const CopyList& list : named_lists())
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      coverage.add(expect_host_interpretation_exact(list, direction));
      if (HasFailure()) return;
    }
  coverage.expect_everything();
}

TEST(CopyWork, PackMayReadOneSourceTwice) {
  CopyList list = from_tensors("twice", {tensor({40, 50}, {1, 0}, 2)}, 3, 1.0, 0, 21);
  const std::size_t n = list.copies.size();
  for (std::size_t i = 0; i < n; ++i) list.copies.push_back(list.copies[i]);
  std::mt19937_64 random(5);
  place_in_buffer(list, 9, random);
  expect_host_interpretation_exact(list, CopyDirection::kPack);
}

// --- the decomposition -----------------------------------------------------------------------------------

// The work of one copy of `shape` (stored in `order`) with the buffer offset given, host addresses of a
// 128-byte-aligned allocation.
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
    work = exec::compile_copy_work(direction, copies, bases, sizes, align(buffer.data()),
                                   static_cast<std::int64_t>(buffer.size()) - 128);
  }
  static std::byte* align(std::byte* p) { return p + (128 - reinterpret_cast<std::uintptr_t>(p) % 128) % 128; }
};

TEST(CopyWork, LongAlignedRunsAreCutIntoFourKibPiecesOfSixteenByteVectors) {
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
    OneCopy c(tensor({1 << 20}, {0}, 1), Box{{0}, {1 << 20}}, 0, direction);
    ASSERT_EQ(c.work.items.size(), std::size_t{(1 << 20) / exec::kWorkItemBytes});
    for (const CopyWorkItem& item : c.work.items) {
      EXPECT_EQ(item.kind, CopyWorkItem::kRuns);
      EXPECT_EQ(item.width, 16);
      EXPECT_EQ(item.count, 1);
      EXPECT_EQ(item.length, exec::kWorkItemBytes);
    }
    EXPECT_FALSE(c.work.has_transposes);
  }
}

TEST(CopyWork, LongRunsAreCutIntoEqualPieces) {
  // 10,000 bytes, 4096 + 4096 + 1808 before; now three pieces within 16 bytes of each other (plus the
  // unaligned head in the first), every later piece starting at a 16-byte-aligned source.
  for (const std::int64_t shift : {0, 5}) {
    OneCopy c(tensor({20000}, {0}, 1), Box{{shift}, {10000}}, 0, CopyDirection::kPack);
    SCOPED_TRACE("source offset " + std::to_string(shift));
    ASSERT_EQ(c.work.items.size(), 3u);
    const std::int64_t head = (16 - shift % 16) % 16;
    std::int64_t total = 0, shortest = 1 << 20, longest = 0;
    for (std::size_t i = 0; i < c.work.items.size(); ++i) {
      const std::int64_t length = c.work.items[i].length - (i == 0 ? head : 0);
      shortest = std::min(shortest, length), longest = std::max(longest, length);
      total += c.work.items[i].length;
      if (i > 0) {
        EXPECT_EQ(c.work.items[i].src % 16, 0u);
      }
    }
    EXPECT_EQ(total, 10000);
    EXPECT_LE(longest - shortest, 16);
    EXPECT_LE(longest, exec::kWorkItemBytes);
  }
  // A run just past one item: two halves, not 4096 and a few bytes.
  OneCopy c(tensor({8192}, {0}, 1), Box{{0}, {4100}}, 0, CopyDirection::kPack);
  ASSERT_EQ(c.work.items.size(), 2u);
  EXPECT_EQ(c.work.items[0].length, 2048);
  EXPECT_EQ(c.work.items[1].length, 2052);
}

TEST(CopyWork, VectorWidthFollowsTheRelativeAlignment) {
  // Source and destination 3 bytes apart modulo 16: bytes; 8 apart: 8-byte vectors; 16 apart: 16 bytes,
  // whatever the absolute alignment (the head goes byte by byte).
  const std::pair<std::int64_t, int> cases[] = {{3, 1}, {2, 2}, {12, 4}, {8, 8}, {16, 16}, {48, 16}};
  for (const auto& [offset, width] : cases) {
    OneCopy c(tensor({20000}, {0}, 1), Box{{5}, {10000}}, offset + 5, CopyDirection::kPack, 0);
    SCOPED_TRACE("buffer offset " + std::to_string(offset + 5));
    for (const CopyWorkItem& item : c.work.items) EXPECT_EQ(item.width, width);
    // The first piece absorbs the unaligned head: later pieces start at a 16-byte-aligned source.
    ASSERT_GE(c.work.items.size(), 2u);
    EXPECT_EQ((c.work.items[1].src) % 16, 0u);
  }
}

TEST(CopyWork, ShortRowsAreGroupedIntoOneItem) {
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

TEST(CopyWork, TransposedBoxesBecomeTilesLoadedInSixteenByteVectors) {
  // [128 x 4096] bf16 stored transposed: 4 x 128 tiles of 32 x 32, each source row of 64 bytes read in
  // four 16-byte vectors.
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
    OneCopy c(tensor({128, 4096}, {1, 0}, 2), Box{{0, 0}, {128, 4096}}, 0, direction);
    EXPECT_TRUE(c.work.has_transposes);
    EXPECT_EQ(c.work.stats.transpose_items, 4 * 128);
    EXPECT_EQ(c.work.stats.transposed_bytes, 128 * 4096 * 2);
    for (const CopyWorkItem& item : c.work.items) {
      ASSERT_EQ(item.kind, CopyWorkItem::kTranspose);
      EXPECT_EQ(item.width, 2);
      EXPECT_EQ(item.access, 2);
      EXPECT_EQ(item.load, 16);
      EXPECT_EQ(item.count, 32);
      EXPECT_EQ(item.length, 32);
      EXPECT_EQ(exec::tile_vectors(item), 32u * 4u);
    }
  }
  // fp8: rows of 32 bytes, two vectors each.
  OneCopy fp8(tensor({64, 256}, {1, 0}, 1), Box{{0, 0}, {64, 256}}, 0, CopyDirection::kPack);
  for (const CopyWorkItem& item : fp8.work.items) {
    EXPECT_EQ(item.load, 16);
    EXPECT_EQ(exec::tile_vectors(item), 32u * 2u);
  }
  // 8-byte elements: tiles of 32 rows (along the 40 buffer-contiguous elements) by 16 columns (along the
  // 70 parameter-contiguous ones), partial at the edges.
  OneCopy f64(tensor({70, 40}, {1, 0}, 8), Box{{0, 0}, {70, 40}}, 0, CopyDirection::kPack);
  EXPECT_EQ(f64.work.stats.transpose_items, 2 * 5);
  for (const CopyWorkItem& item : f64.work.items) EXPECT_LE(item.length, 16);
  // A buffer offset of 2 bytes: 4-byte elements stored in 2-byte words; the source (the parameter) is
  // aligned, so the loads stay wide.
  OneCopy odd(tensor({64, 64}, {1, 0}, 4), Box{{0, 0}, {64, 64}}, 2, CopyDirection::kPack);
  for (const CopyWorkItem& item : odd.work.items) {
    EXPECT_EQ(item.access, 2);
    EXPECT_EQ(item.load, 16);
  }
  // The other way, the source is the buffer: 2-byte loads, 4-byte stores.
  OneCopy back(tensor({64, 64}, {1, 0}, 4), Box{{0, 0}, {64, 64}}, 2, CopyDirection::kAssemble);
  for (const CopyWorkItem& item : back.work.items) {
    EXPECT_EQ(item.access, 4);
    EXPECT_EQ(item.load, 2);
  }
  // A partial column of tiles whose rows are 6 bytes (3 bf16): loads as wide as the rows divide.
  OneCopy edge(tensor({32, 35}, {1, 0}, 2), Box{{0, 0}, {32, 35}}, 0, CopyDirection::kAssemble);
  ASSERT_EQ(edge.work.items.size(), 2u);
  EXPECT_EQ(edge.work.items[1].length, 3);
  EXPECT_EQ(edge.work.items[1].load, 2);
}

TEST(CopyWork, EmptyBoxesAreIgnored) {
  CopyList list;
  list.parameter_bytes = {64};
  BufferCopy empty = tensor({4, 4}, {0, 1}, 4).copy_of(0, Box{{0, 0}, {0, 4}}, 0);
  list.copies = {empty};
  list.buffer_bytes = 0;
  std::byte parameter[64];
  std::byte* parameters[] = {parameter};
  const CopyWork work =
      exec::compile_copy_work(CopyDirection::kAssemble, list.copies, parameters, list.parameter_bytes, nullptr, 0);
  EXPECT_TRUE(work.items.empty());
  EXPECT_EQ(work.stats.copies, 0);
}

TEST(CopyWork, OtherBuffersOfTheSameAlignmentAreAccepted) {
  const CopyList list = from_tensors("slots", {tensor({300, 77}, {1, 0}, 2), tensor({5000}, {0}, 1)}, 3, 1.0, 7, 31);
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
    SCOPED_TRACE(name_of(direction));
    // Two slots of one allocation, 256 bytes apart modulo their size; the program compiled for the first.
    Memory expected(list, direction, 7);
    reference(direction, list.copies, expected.parameters, expected.buffer);

    Memory actual(list, direction, 7);
    const std::size_t stride = (static_cast<std::size_t>(list.buffer_bytes) + 255) / 256 * 256;
    Bytes slots(2 * stride + 256, std::byte{0});
    std::byte* first = OneCopy::align(slots.data());
    std::memcpy(first + stride, actual.buffer.data(), actual.buffer.size());
    std::vector<std::byte*> parameters = addresses(actual.parameters);
    const CopyWork work = exec::compile_copy_work(direction, list.copies, parameters, list.parameter_bytes, first,
                                                  list.buffer_bytes);
    ASSERT_TRUE(exec::testing::execute_on_host(work, first + stride).is_ok());
    std::memcpy(actual.buffer.data(), first + stride, actual.buffer.size());
    EXPECT_TRUE(same_memory(expected, actual, "second slot"));
    const Status misaligned = exec::testing::execute_on_host(work, first + 8);
    EXPECT_EQ(misaligned.code(), ErrorCode::kInvalidArgument) << misaligned.to_string();
  }
}

TEST(CopyWork, MalformedDescriptorsAreReported) {
  OneCopy c(tensor({64, 64}, {1, 0}, 4), Box{{0, 0}, {64, 64}}, 0, CopyDirection::kPack);
  CopyWork work = c.work;
  work.items[1].access = 3;
  EXPECT_EQ(exec::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
  work = c.work;
  work.items[0].count = 33;
  EXPECT_EQ(exec::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
  work = c.work;
  work.items[0].src += 4;  // no longer aligned to its 16-byte loads
  EXPECT_THAT(exec::testing::execute_on_host(work).message(), HasSubstr("aligned to the load"));
  work = c.work;
  work.items[0].load = 32;
  EXPECT_EQ(exec::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
  OneCopy runs(tensor({10000}, {0}, 1), Box{{0}, {10000}}, 0, CopyDirection::kPack);
  work = runs.work;
  work.items[0].src += 4;  // now 4 bytes off the destination modulo 16
  EXPECT_EQ(exec::testing::execute_on_host(work).code(), ErrorCode::kInvalidArgument);
}

// --- refusals ----------------------------------------------------------------------------------------------

std::string compile_error(CopyDirection direction, const std::vector<BufferCopy>& copies, std::int64_t bytes,
                          ErrorCode expected) {
  Bytes parameter(static_cast<std::size_t>(bytes)), buffer(static_cast<std::size_t>(bytes));
  std::vector<std::byte*> parameters{parameter.data()};
  const std::vector<std::int64_t> sizes{bytes};
  try {
    exec::compile_copy_work(direction, copies, parameters, sizes, buffer.data(), bytes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.status().message();
  }
  ADD_FAILURE() << "compiled";
  return {};
}

TEST(CopyWork, OverlappingDestinationsAreRefusedNamingBothCopies) {
  // The kernel runs items in any order: the compiler's verdict (tests/unit/test_copy_compiler.cpp) becomes
  // a refusal here.
  const StoredTensor t = tensor({16, 16}, {0, 1}, 2);
  std::vector<BufferCopy> copies = {t.copy_of(0, Box{{0, 0}, {4, 16}}, 0), t.copy_of(0, Box{{4, 0}, {4, 16}}, 0)};
  copies[1].buffer_offset = 100;  // [100, 228) overlaps [0, 128)
  std::string message = compile_error(CopyDirection::kPack, copies, 512, ErrorCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("pack copy 1"));
  EXPECT_THAT(message, HasSubstr("overlaps that of pack copy 0"));
  EXPECT_THAT(message, HasSubstr("buffer bytes [100, 128)"));
  EXPECT_THAT(message, HasSubstr("destinations must be disjoint"));
  // One copy writing an element twice (stride 0) into a parameter...
  BufferCopy twice = t.copy_of(0, Box{{0, 0}, {2, 16}}, 0);
  twice.copy.strides[0] = 0;
  message = compile_error(CopyDirection::kAssemble, {twice}, 512, ErrorCode::kInvalidArgument);
  EXPECT_THAT(message, HasSubstr("more than once"));
  // ... which a pack may do: it only reads the parameter twice.
  Bytes parameter(512), buffer(512);
  std::vector<std::byte*> parameters{parameter.data()};
  const std::vector<BufferCopy> pack_twice = {twice};
  const std::vector<std::int64_t> sizes{512};
  EXPECT_NO_THROW(exec::compile_copy_work(CopyDirection::kPack, pack_twice, parameters, sizes, buffer.data(), 512));
  // A compiled copy of a parameter without a base address.
  const std::vector<std::byte*> none;
  EXPECT_THROW(exec::compile_copy_work(CopyDirection::kPack, pack_twice, none, sizes, buffer.data(), 512), Error);
}

}  // namespace
}  // namespace wb
