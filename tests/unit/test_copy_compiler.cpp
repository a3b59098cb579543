// The copy compiler (exec/copy_compiler.hpp), the one front end of the CPU copy programs and the CUDA
// descriptors: its validation and the words of its errors, its verdict on the destinations (disjoint,
// overlapping and where, undecided), and the order it leaves the copies in. What the back ends make of
// the result is tested with them (tests/unit/test_pack.cpp, tests/unit/test_copy_work.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../support/copy_lists.hpp"
#include "exec/copy_compiler.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using namespace testing_support;
using exec::compile_copies;
using exec::CompiledCopies;
using exec::Destinations;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CopyCompiler, InvalidCopiesAreRejectedNamingTheCopy) {
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
  const std::vector<std::int64_t> parameter_bytes{128};
  for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble})
    for (const Bad& b : bad) {
      SCOPED_TRACE(std::string(name_of(direction)) + ": " + b.why);
      const std::vector<BufferCopy> copies = {good, b.copy};
      try {
        compile_copies(direction, copies, parameter_bytes, 64);
        ADD_FAILURE() << "compiled";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        const std::string message = e.status().message();
        EXPECT_THAT(message, HasSubstr(b.why));
        EXPECT_THAT(message, StartsWith(std::string(name_of(direction)) + " copy 1 (parameter "));
        EXPECT_THAT(message, HasSubstr("box " + b.copy.copy.box.to_string()));
      }
    }
}

CompiledCopies compile_list(CopyDirection direction, const std::vector<BufferCopy>& copies, std::int64_t bytes) {
  return compile_copies(direction, copies, std::vector<std::int64_t>{bytes}, bytes);
}

TEST(CopyCompiler, OverlappingBufferRangesOfAPackAreNamed) {
  const StoredTensor t = tensor({16, 16}, {0, 1}, 2);
  std::vector<BufferCopy> copies = {t.copy_of(0, Box{{0, 0}, {4, 16}}, 0), t.copy_of(0, Box{{4, 0}, {4, 16}}, 0)};
  copies[1].buffer_offset = 100;  // [100, 228) overlaps [0, 128)
  CompiledCopies compiled = compile_list(CopyDirection::kPack, copies, 512);
  EXPECT_EQ(compiled.destinations, Destinations::kOverlap);
  EXPECT_THAT(compiled.overlap, StartsWith("pack copy 1"));
  EXPECT_THAT(compiled.overlap, HasSubstr("overlaps that of pack copy 0"));
  EXPECT_THAT(compiled.overlap, HasSubstr("buffer bytes [100, 128)"));
  // Side by side they are disjoint, and merge into one run.
  copies[1].buffer_offset = 128;
  compiled = compile_list(CopyDirection::kPack, copies, 512);
  EXPECT_EQ(compiled.destinations, Destinations::kDisjoint);
  ASSERT_EQ(compiled.copies.size(), 1u);
  EXPECT_EQ(compiled.copies[0].run, 256);
}

TEST(CopyCompiler, OverlappingParameterWritesOfAnAssembleAreNamed) {
  const StoredTensor t = tensor({16, 16}, {0, 1}, 2);
  // Two boxes sharing row 3.
  std::vector<BufferCopy> copies = {t.copy_of(0, Box{{0, 0}, {4, 16}}, 0), t.copy_of(0, Box{{3, 0}, {4, 16}}, 0)};
  copies[1].buffer_offset = 128;
  CompiledCopies compiled = compile_list(CopyDirection::kAssemble, copies, 512);
  EXPECT_EQ(compiled.destinations, Destinations::kOverlap);
  EXPECT_THAT(compiled.overlap, HasSubstr("overlaps that of assemble copy 0"));
  EXPECT_THAT(compiled.overlap, HasSubstr("parameter 0 bytes [96, 128)"));
  // Transposed boxes crossing each other.
  const StoredTensor tt = tensor({16, 16}, {1, 0}, 2);
  copies = {tt.copy_of(0, Box{{0, 0}, {8, 16}}, 0), tt.copy_of(0, Box{{0, 5}, {16, 2}}, 0)};
  copies[1].buffer_offset = 256;
  EXPECT_EQ(compile_list(CopyDirection::kAssemble, copies, 512).destinations, Destinations::kOverlap);
  // One copy writing an element twice (stride 0).
  BufferCopy twice = t.copy_of(0, Box{{0, 0}, {2, 16}}, 0);
  twice.copy.strides[0] = 0;
  compiled = compile_list(CopyDirection::kAssemble, {twice}, 512);
  EXPECT_EQ(compiled.destinations, Destinations::kOverlap);
  EXPECT_THAT(compiled.overlap, HasSubstr("more than once"));
  // A pack only reads it twice.
  EXPECT_EQ(compile_list(CopyDirection::kPack, {twice}, 512).destinations, Destinations::kDisjoint);
}

TEST(CopyCompiler, InterleavedDisjointWritesAreDisjoint) {
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
  const CompiledCopies compiled = compile_copies(CopyDirection::kAssemble, list.copies, list.parameter_bytes, list.buffer_bytes);
  EXPECT_EQ(compiled.destinations, Destinations::kDisjoint);
  EXPECT_EQ(compiled.input_copies, 4);
}

TEST(CopyCompiler, DisjointCopiesRunInParameterOrderOverlappingOnesInTheListsOrder) {
  // Rows of one parameter listed last to first: disjoint, so merged into one run in parameter order.
  const StoredTensor t = tensor({8, 64}, {0, 1}, 4);
  std::vector<BufferCopy> copies;
  for (std::int64_t row = 7; row >= 0; --row) {
    copies.push_back(t.copy_of(0, Box{{row, 0}, {1, 64}}, 0));
    copies.back().buffer_offset = row * 256;
  }
  CompiledCopies compiled = compile_list(CopyDirection::kAssemble, copies, 2048);
  EXPECT_EQ(compiled.destinations, Destinations::kDisjoint);
  ASSERT_EQ(compiled.copies.size(), 1u);
  EXPECT_EQ(compiled.copies[0].run, 2048);
  EXPECT_EQ(compiled.bytes, 2048);
  // The same row twice at the end: the list's order, the later copy last.
  copies.push_back(t.copy_of(0, Box{{3, 0}, {1, 64}}, 0));
  copies.back().buffer_offset = 0;
  compiled = compile_list(CopyDirection::kAssemble, copies, 2048);
  EXPECT_EQ(compiled.destinations, Destinations::kOverlap);
  EXPECT_EQ(compiled.copies.back().param_offset, 3 * 256);
  EXPECT_EQ(compiled.copies.back().buffer_offset, 0);
}

TEST(CopyCompiler, EmptyBoxesAreIgnored) {
  const BufferCopy empty = tensor({4, 4}, {0, 1}, 4).copy_of(0, Box{{0, 0}, {0, 4}}, 0);
  const CompiledCopies compiled = compile_list(CopyDirection::kAssemble, {empty}, 64);
  EXPECT_TRUE(compiled.copies.empty());
  EXPECT_EQ(compiled.input_copies, 0);
  EXPECT_EQ(compiled.destinations, Destinations::kDisjoint);
}

}  // namespace
}  // namespace wb
