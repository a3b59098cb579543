// CPU pack and assemble (src/exec/pack.hpp) against the element-by-element definition: random copy lists
// over parameters of random shapes and layouts (contiguous, padded rows, strided, interleaved, transposed,
// permuted, reversed axes; 1-D to 4-D; 1, 2, 4, 8-byte elements; padding around every parameter) pack to
// the same buffer bytes and assemble to the same parameter bytes, bytes outside the boxes untouched, with
// ordinary and streaming stores; overlapping destinations keep the list's order (the later copy wins)
// while disjoint ones run in parameter order; copies that continue one another merge, also when listed out
// of buffer order; compile-time validation names the copy. Digesting while copying (verify) gives every
// segment the digest of its bytes, at every alignment, with copies merged across segments, read twice or
// written over.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../support/expect_error.hpp"
#include "../support/schedule_replay.hpp"
#include "exec/digest.hpp"
#include "exec/pack.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

using wb::testing::expect_error;

using ::testing::HasSubstr;
using testing_support::element_position;
using testing_support::for_each_element;
using i64 = std::int64_t;
using Bytes = std::vector<std::byte>;

constexpr std::byte kParameterFill{0xA5};
constexpr std::byte kBufferFill{0xCD};

class Random {
 public:
  explicit Random(unsigned seed) : rng_(seed) {}
  i64 in(i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::mt19937_64& engine() { return rng_; }
  Bytes bytes(std::size_t n) {
    Bytes out(n);
    for (auto& b : out) b = static_cast<std::byte>(rng_());
    return out;
  }

 private:
  std::mt19937_64 rng_;
};

// ---- the definition, element by element -------------------------------------------------------------

void reference_pack(std::span<const BufferCopy> copies, const std::vector<Bytes>& params, Bytes& buffer) {
  for (const BufferCopy& c : copies)
    for_each_element(c.copy.box, [&](std::span<const i64> i, i64 ordinal) {
      std::memcpy(buffer.data() + c.buffer_offset + ordinal * c.element_bytes,
                  params[c.copy.parameter].data() + element_position(c.copy, i) * c.element_bytes, c.element_bytes);
    });
}

void reference_assemble(std::span<const BufferCopy> copies, const Bytes& buffer, std::vector<Bytes>& params) {
  for (const BufferCopy& c : copies)
    for_each_element(c.copy.box, [&](std::span<const i64> i, i64 ordinal) {
      std::memcpy(params[c.copy.parameter].data() + element_position(c.copy, i) * c.element_bytes,
                  buffer.data() + c.buffer_offset + ordinal * c.element_bytes, c.element_bytes);
    });
}

std::vector<i64> sizes_of(const std::vector<Bytes>& params) {
  std::vector<i64> sizes;
  for (const Bytes& p : params) sizes.push_back(static_cast<i64>(p.size()));
  return sizes;
}

std::vector<std::byte*> pointers(std::vector<Bytes>& params) {
  std::vector<std::byte*> out;
  for (Bytes& p : params) out.push_back(p.data());
  return out;
}

// ---- random layouts and copies ----------------------------------------------------------------------

/// One parameter holding a logical tensor in some physical arrangement.
struct Layout {
  int element_bytes = 2;
  Shape logical;   // extents
  Shape strides;   // per logical axis, in elements; may be negative (a reversed axis)
  i64 base = 0;    // element of logical index (0, ..., 0)
  i64 size = 0;    // elements of the parameter, padding included
};

enum class Arrangement { kContiguous, kPaddedRows, kTransposed, kPermuted, kInterleaved };

Layout random_layout(Random& r, int element_bytes, Arrangement arrangement) {
  static constexpr i64 kMaxExtent[] = {0, 3000, 90, 24, 10};
  Layout l;
  l.element_bytes = element_bytes;
  const auto ndim = static_cast<std::size_t>(r.in(1, 4));
  for (std::size_t a = 0; a < ndim; ++a) l.logical.push_back(r.chance(0.1) ? 1 : r.in(1, kMaxExtent[ndim]));
  std::vector<std::size_t> order(ndim);  // physical axes, outermost first, as logical axes
  std::iota(order.begin(), order.end(), std::size_t{0});
  Shape physical = l.logical;
  i64 step = 1;
  switch (arrangement) {
    case Arrangement::kContiguous: break;
    case Arrangement::kPaddedRows:
      for (auto& e : physical) e += r.chance(0.5) ? r.in(1, 5) : 0;
      break;
    case Arrangement::kTransposed: std::reverse(order.begin(), order.end()); break;
    case Arrangement::kPermuted:
      std::shuffle(order.begin(), order.end(), r.engine());
      for (auto& e : physical) e += r.chance(0.3) ? r.in(1, 3) : 0;
      break;
    case Arrangement::kInterleaved: step = r.in(2, 3); break;
  }
  l.strides.assign(ndim, 0);
  i64 stride = step;
  for (std::size_t k = ndim; k-- > 0;) {
    l.strides[order[k]] = stride;
    stride *= physical[order[k]];
  }
  const i64 pad_before = r.chance(0.5) ? r.in(1, 7) : 0;
  i64 span = 1;
  for (std::size_t a = 0; a < ndim; ++a) span += (physical[a] - 1) * l.strides[a];
  l.base = pad_before;
  if (r.chance(0.1)) {  // a reversed axis: the base points at its last element
    const auto a = static_cast<std::size_t>(r.in(0, static_cast<i64>(ndim) - 1));
    l.base += (l.logical[a] - 1) * l.strides[a];
    l.strides[a] = -l.strides[a];
  }
  l.size = pad_before + span + (r.chance(0.5) ? r.in(1, 7) : 0);
  return l;
}

/// A copy of a random box of the layout's logical tensor.
SliceCopy random_box_copy(Random& r, const Layout& l, std::uint32_t parameter) {
  SliceCopy c;
  c.parameter = parameter;
  c.offset = l.base;
  const bool whole = r.chance(0.25);
  for (std::size_t a = 0; a < l.logical.size(); ++a) {
    const i64 begin = whole ? 0 : r.in(0, l.logical[a] - 1);
    const i64 extent = whole ? l.logical[a] : r.in(1, l.logical[a] - begin);
    c.box.offset.push_back(begin);
    c.box.extent.push_back(extent);
    c.offset += begin * l.strides[a];
  }
  c.strides = l.strides;
  return c;
}

/// Splits a copy along one axis into consecutive pieces (as a plan cuts a tensor into rounds' pieces).
std::vector<SliceCopy> split(Random& r, const SliceCopy& c) {
  const auto axis = static_cast<std::size_t>(r.in(0, c.box.ndim() - 1));
  std::vector<SliceCopy> pieces;
  i64 at = 0;
  while (at < c.box.extent[axis]) {
    SliceCopy p = c;
    const i64 extent = std::min(c.box.extent[axis] - at, r.in(1, std::max<i64>(1, c.box.extent[axis] / 2)));
    p.box.offset[axis] += at;
    p.box.extent[axis] = extent;
    p.offset += at * c.strides[axis];
    pieces.push_back(p);
    at += extent;
  }
  return pieces;
}

struct Case {
  std::vector<Bytes> params;
  std::vector<BufferCopy> copies;
  i64 buffer_bytes = 0;
};

/// Parameters of random layouts and a list of copies out of them, placed one after the other in the
/// buffer (now and then a gap), possibly overlapping one another in the parameters.
Case random_case(Random& r) {
  Case c;
  std::vector<Layout> layouts;
  const i64 parameters = r.in(1, 4);
  for (i64 p = 0; p < parameters; ++p) {
    static constexpr int kSizes[] = {1, 2, 4, 8};
    const int es = kSizes[r.in(0, 3)];
    const auto arrangement = static_cast<Arrangement>(r.in(0, 4));
    layouts.push_back(random_layout(r, es, arrangement));
    c.params.push_back(r.bytes(static_cast<std::size_t>(layouts.back().size * es)));
  }
  i64 cursor = r.chance(0.3) ? r.in(1, 9) : 0;
  const i64 boxes = r.in(1, 8);
  for (i64 b = 0; b < boxes; ++b) {
    const auto p = static_cast<std::uint32_t>(r.in(0, parameters - 1));
    const Layout& l = layouts[p];
    const SliceCopy box = random_box_copy(r, l, p);
    std::vector<SliceCopy> pieces = r.chance(0.4) ? split(r, box) : std::vector<SliceCopy>{box};
    const bool gaps = r.chance(0.3);
    for (const SliceCopy& piece : pieces) {
      BufferCopy bc{piece, 0, static_cast<std::uint8_t>(l.element_bytes)};
      if (gaps) cursor += r.in(0, 9);
      bc.buffer_offset = cursor;
      cursor += bc.bytes();
      c.copies.push_back(bc);
    }
  }
  c.buffer_bytes = cursor + (r.chance(0.5) ? r.in(1, 16) : 0);
  return c;
}

void expect_pack_matches(const Case& c, CopyProgramOptions options, const std::string& what) {
  const CopyProgram program(CopyDirection::kPack, c.copies, sizes_of(c.params), c.buffer_bytes, options);
  Bytes expected(static_cast<std::size_t>(c.buffer_bytes), kBufferFill), actual = expected;
  reference_pack(c.copies, c.params, expected);
  std::vector<Bytes> params = c.params;
  program.execute(pointers(params), actual.data());
  ASSERT_EQ(actual, expected) << what << ": " << program.stats().ops << " ops";
  ASSERT_EQ(params, c.params) << what << ": pack wrote into a parameter";
}

void expect_assemble_matches(const Case& c, Random& r, CopyProgramOptions options, const std::string& what) {
  const CopyProgram program(CopyDirection::kAssemble, c.copies, sizes_of(c.params), c.buffer_bytes, options);
  const Bytes buffer = r.bytes(static_cast<std::size_t>(c.buffer_bytes));
  std::vector<Bytes> expected, actual;
  for (const Bytes& p : c.params) expected.emplace_back(p.size(), kParameterFill);
  actual = expected;
  reference_assemble(c.copies, buffer, expected);
  Bytes input = buffer;
  program.execute(pointers(actual), input.data());
  ASSERT_EQ(input, buffer) << what << ": assemble wrote into the buffer";
  for (std::size_t p = 0; p < expected.size(); ++p) ASSERT_EQ(actual[p], expected[p]) << what << ", parameter " << p;
}

CopyProgram compile(CopyDirection direction, const Case& c) {
  return CopyProgram(direction, c.copies, sizes_of(c.params), c.buffer_bytes);
}

/// The ops in buffer order (a pack program runs them in parameter order).
std::vector<CopyProgram::Op> ops_by_buffer(const CopyProgram& program) {
  std::vector<CopyProgram::Op> ops(program.ops().begin(), program.ops().end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.buffer_offset < b.buffer_offset; });
  return ops;
}

const CopyProgramOptions kCached{StoreHint::kCached, {}};
const CopyProgramOptions kStreaming{StoreHint::kStreaming, {}};

// ---- random lists ------------------------------------------------------------------------------------

TEST(Pack, RandomCopiesMatchTheDefinition) {
  CopyProgramStats total;
  for (unsigned seed = 0; seed < 400; ++seed) {
    Random r(seed);
    const Case c = random_case(r);
    for (const CopyProgramOptions& options : {kCached, kStreaming}) {
      expect_pack_matches(c, options, "seed " + std::to_string(seed));
      if (::testing::Test::HasFatalFailure()) return;
    }
    const CopyProgram program(CopyDirection::kPack, c.copies, sizes_of(c.params), c.buffer_bytes);
    total.ops += program.stats().ops;
    total.copies += program.stats().copies;
    total.transpose_ops += program.stats().transpose_ops;
  }
  // The generator covers transposes and merging.
  EXPECT_GT(total.transpose_ops, 50);
  EXPECT_LT(total.ops, total.copies);
}

TEST(Assemble, RandomCopiesMatchTheDefinitionAndLeaveOtherBytesAlone) {
  int reordered = 0, kept = 0;
  for (unsigned seed = 1000; seed < 1400; ++seed) {
    Random r(seed);
    const Case c = random_case(r);
    for (const CopyProgramOptions& options : {kCached, kStreaming}) {
      expect_assemble_matches(c, r, options, "seed " + std::to_string(seed));
      if (::testing::Test::HasFatalFailure()) return;
    }
    (compile(CopyDirection::kAssemble, c).stats().reordered ? reordered : kept) += 1;
  }
  // Both kinds of lists occur: destinations disjoint (run in parameter order) and overlapping.
  EXPECT_GT(reordered, 50);
  EXPECT_GT(kept, 50);
}

// ---- each element size and kind, at sizes around the tiles -------------------------------------------

// A [rows, cols] box of a [R, C] tensor that the parameter stores transposed ([C, R], row pitch R + pad).
TEST(Pack, TransposesEveryElementSizeAtEdgeSizes) {
  Random r(7);
  for (int es : {1, 2, 4, 8}) {
    for (auto [rows, cols] : {std::pair<i64, i64>{1, 1}, {3, 5}, {8, 8}, {9, 17}, {37, 45}, {64, 64}, {130, 67},
                              {257, 129}, {16, 300}, {300, 2}}) {
      const i64 pitch = rows + 3;  // parameter row pitch (elements) of the transposed storage
      const i64 param_elements = cols * pitch + 5;
      Case c;
      c.params.push_back(r.bytes(static_cast<std::size_t>(param_elements * es)));
      SliceCopy copy{0, 0, Box{{0, 0}, {rows, cols}}, 2, {1, pitch}};
      c.copies.push_back(BufferCopy{copy, 3, static_cast<std::uint8_t>(es)});
      c.buffer_bytes = 3 + rows * cols * es + 4;
      const std::string what = std::to_string(es) + "-byte " + std::to_string(rows) + "x" + std::to_string(cols);
      for (const CopyProgramOptions& options : {kCached, kStreaming}) {
        expect_pack_matches(c, options, what);
        expect_assemble_matches(c, r, options, what);
        if (::testing::Test::HasFatalFailure()) return;
      }
      const CopyProgram program(CopyDirection::kPack, c.copies, sizes_of(c.params), c.buffer_bytes);
      if (rows > 1 && cols > 1) {
        EXPECT_EQ(program.stats().transpose_ops, 1) << what;
      }
    }
  }
}

TEST(Pack, FourDimensionalPermutationsAndBatchedTransposes) {
  Random r(11);
  // [B, H, S, D] stored as [B, S, H, D] (axes 1 and 2 swapped) and as [B, D, S, H] (a batched transpose).
  const i64 B = 3, H = 5, S = 7, D = 16;
  for (int es : {1, 2, 4, 8}) {
    for (const Shape& strides : {Shape{S * H * D, D, H * D, 1}, Shape{D * S * H, 1, H, S * H}}) {
      Case c;
      c.params.push_back(r.bytes(static_cast<std::size_t>(B * H * S * D * es)));
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0, 0, 0}, {B, H, S, D}}, 0, strides}, 0,
                                    static_cast<std::uint8_t>(es)});
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{1, 1, 2, 3}, {2, 3, 4, 9}},
                                              strides[0] + strides[1] + 2 * strides[2] + 3 * strides[3], strides},
                                    B * H * S * D * es, static_cast<std::uint8_t>(es)});
      c.buffer_bytes = (B * H * S * D + 2 * 3 * 4 * 9) * es;
      expect_pack_matches(c, kCached, "4-D pack");
      expect_assemble_matches(c, r, kCached, "4-D assemble");
    }
  }
}

TEST(Pack, OddElementSizesUseRuns) {
  Random r(5);
  for (int es : {3, 6, 16, 24}) {
    Case c;
    c.params.push_back(r.bytes(static_cast<std::size_t>(40 * 50 * es)));
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {10, 20}}, 7, {1, 40}}, 0, static_cast<std::uint8_t>(es)});
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {10, 20}}, 1000, {50, 1}}, 200 * es, static_cast<std::uint8_t>(es)});
    c.buffer_bytes = 400 * es;
    expect_pack_matches(c, kCached, "odd pack");
    expect_assemble_matches(c, r, kCached, "odd assemble");
  }
}

// ---- overlap: the later write wins, as in the definition ----------------------------------------------

TEST(Assemble, OverlappingWritesKeepTheDefinitionsOrder) {
  Random r(3);
  Case c;
  c.params.push_back(r.bytes(64 * 64 * 2));
  const std::uint8_t es = 2;
  // Two transposed boxes over the same elements, then a contiguous box over part of them, then a box whose
  // axes land on the same elements (stride 0: only its last row survives), then a self-overlapping one.
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {32, 32}}, 0, {1, 64}}, 0, es});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {32, 32}}, 0, {1, 64}}, 2048, es});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {8, 40}}, 100, {64, 1}}, 4096, es});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {5, 16}}, 300, {0, 1}}, 4096 + 640, es});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {16, 16}}, 1000, {1, 3}}, 4096 + 800, es});
  c.buffer_bytes = 4096 + 800 + 512;
  EXPECT_FALSE(compile(CopyDirection::kAssemble, c).stats().reordered);
  expect_assemble_matches(c, r, kCached, "overlapping");
  expect_assemble_matches(c, r, kStreaming, "overlapping, streaming");
  expect_pack_matches(c, kCached, "overlapping reads");
}

// ---- merging -----------------------------------------------------------------------------------------


TEST(Pack, RowsOfAContiguousTensorMergeIntoOneRun) {
  Random r(1);
  Case c;
  c.params.push_back(r.bytes(100 * 64 * 2));
  for (i64 row = 0; row < 100; ++row)
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{row, 0}, {1, 64}}, row * 64, {64, 1}}, row * 128, 2});
  c.buffer_bytes = 100 * 128;
  const CopyProgram program = compile(CopyDirection::kPack, c);
  EXPECT_EQ(program.stats().copies, 100);
  ASSERT_EQ(program.stats().ops, 1);
  EXPECT_EQ(program.ops()[0].run, 100 * 128);
  EXPECT_EQ(program.ops()[0].axis_count, 0);
  expect_pack_matches(c, kCached, "rows");
  expect_assemble_matches(c, r, kCached, "rows");
}

TEST(Pack, PiecesOfAColumnBoxMergeIntoOneStridedOp) {
  Random r(2);
  Case c;
  c.params.push_back(r.bytes(64 * 256 * 4));
  // Box [64, 100] at column 30 of a [64, 256] fp32 tensor, in pieces of 1..9 rows, then one row at a time
  // with rows 2 apart (a new outer axis).
  i64 row = 0, at = 0;
  while (row < 64) {
    const i64 rows = std::min<i64>(64 - row, 1 + row % 9);
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{row, 30}, {rows, 100}}, row * 256 + 30, {256, 1}}, at, 4});
    at += rows * 400, row += rows;
  }
  for (i64 k = 0; k < 20; ++k) {
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{2 * k, 0}, {1, 50}}, 2 * k * 256, {256, 1}}, at, 4});
    at += 200;
  }
  c.buffer_bytes = at;
  const CopyProgram program = compile(CopyDirection::kPack, c);
  ASSERT_EQ(program.stats().ops, 2);
  const auto ops = ops_by_buffer(program);
  EXPECT_EQ(ops[0].run, 400);
  ASSERT_EQ(ops[0].axis_count, 1);
  EXPECT_EQ(program.axes(ops[0])[0].extent, 64);
  EXPECT_EQ(ops[1].run, 200);
  ASSERT_EQ(ops[1].axis_count, 1);
  EXPECT_EQ(program.axes(ops[1])[0].extent, 20);
  EXPECT_EQ(program.axes(ops[1])[0].src_stride, 2 * 256 * 4);
  EXPECT_EQ(compile(CopyDirection::kAssemble, c).stats().ops, 2);
  expect_pack_matches(c, kCached, "column box");
  expect_assemble_matches(c, r, kCached, "column box");
}

TEST(Pack, PiecesOfATransposedBoxMergeIntoOneTranspose) {
  Random r(4);
  Case c;
  c.params.push_back(r.bytes(512 * 512 * 2));
  // Rows 0..127 of a [512, 512] bf16 tensor stored transposed, in pieces of 16 checkpoint rows.
  for (i64 k = 0; k < 8; ++k)
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{16 * k, 0}, {16, 512}}, 16 * k, {1, 512}}, k * 16 * 1024, 2});
  c.buffer_bytes = 128 * 1024;
  const CopyProgram pack = compile(CopyDirection::kPack, c), assemble = compile(CopyDirection::kAssemble, c);
  ASSERT_EQ(pack.stats().ops, 1);
  EXPECT_EQ(pack.stats().transpose_ops, 1);
  EXPECT_EQ(pack.ops()[0].rows, 512);
  EXPECT_EQ(pack.ops()[0].cols, 128);
  EXPECT_EQ(assemble.stats().transpose_ops, 1);
  expect_pack_matches(c, kCached, "transposed pieces");
  expect_assemble_matches(c, r, kCached, "transposed pieces");
}

TEST(Pack, CopiesThatDoNotContinueStaySeparate) {
  Random r(6);
  Case c;
  c.params.push_back(r.bytes(4096));
  c.params.push_back(r.bytes(4096));
  // Contiguous in the buffer but in another parameter; then a gap in the buffer; then another run size.
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0}, {100}}, 0, {1}}, 0, 1});
  c.copies.push_back(BufferCopy{SliceCopy{0, 1, Box{{100}, {100}}, 100, {1}}, 100, 1});
  c.copies.push_back(BufferCopy{SliceCopy{0, 1, Box{{200}, {100}}, 200, {1}}, 204, 1});
  c.copies.push_back(BufferCopy{SliceCopy{0, 1, Box{{0, 0}, {4, 10}}, 1000, {20, 1}}, 304, 1});
  c.copies.push_back(BufferCopy{SliceCopy{0, 1, Box{{0, 0}, {4, 12}}, 1100, {20, 1}}, 344, 1});
  c.buffer_bytes = 400;
  EXPECT_EQ(compile(CopyDirection::kPack, c).stats().ops, 5);
  expect_pack_matches(c, kCached, "separate");
  expect_assemble_matches(c, r, kCached, "separate");
}

TEST(Pack, CopiesListedOutOfBufferOrderMergeAndRunInParameterOrder) {
  Random r(12);
  Case c;
  c.params.push_back(r.bytes(64 * 1024));
  c.params.push_back(r.bytes(64 * 1024));
  // Rows of parameter 1 listed last to first (buffer in row order): one run. Then three pieces of
  // parameter 0 whose buffer order is the reverse of their parameter order: one op with a negative stride.
  for (i64 row = 31; row >= 0; --row)
    c.copies.push_back(BufferCopy{SliceCopy{0, 1, Box{{row, 0}, {1, 512}}, row * 512, {512, 1}}, row * 1024, 2});
  for (i64 k = 0; k < 3; ++k)
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{k, 0}, {1, 100}}, k * 1000, {1000, 1}}, 32 * 1024 + (2 - k) * 200, 2});
  c.buffer_bytes = 32 * 1024 + 600;
  const CopyProgram pack = compile(CopyDirection::kPack, c);
  ASSERT_EQ(pack.stats().ops, 2);
  EXPECT_EQ(pack.ops()[0].parameter, 0u);  // parameter order
  EXPECT_EQ(pack.ops()[0].param_offset, 4000);
  ASSERT_EQ(pack.ops()[0].axis_count, 1);
  EXPECT_EQ(pack.axes(pack.ops()[0])[0].extent, 3);
  EXPECT_EQ(pack.axes(pack.ops()[0])[0].src_stride, -2000);
  EXPECT_EQ(pack.ops()[1].parameter, 1u);
  EXPECT_EQ(pack.ops()[1].run, 32 * 1024);
  const CopyProgram assemble = compile(CopyDirection::kAssemble, c);  // destinations disjoint: the same
  EXPECT_TRUE(assemble.stats().reordered);
  EXPECT_EQ(assemble.stats().ops, 2);
  expect_pack_matches(c, kCached, "out of order");
  expect_assemble_matches(c, r, kCached, "out of order");
}

TEST(Assemble, BoxesOfATransposedMatrixRunInParameterOrderUnlessTheyOverlap) {
  Random r(14);
  // Column blocks of 16 of a [64, 256] fp32 tensor stored transposed ([256, 64]), listed in a shuffled
  // order: their parameter intervals all overlap, but they are translates that share no element.
  Case c;
  c.params.push_back(r.bytes(256 * 64 * 4));
  std::vector<i64> blocks(16);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), r.engine());
  i64 at = 0;
  for (i64 b : blocks) {
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 16 * b}, {64, 16}}, 16 * b * 64, {1, 64}}, at, 4});
    at += 64 * 16 * 4;
  }
  c.buffer_bytes = at;
  const CopyProgram disjoint = compile(CopyDirection::kAssemble, c);
  EXPECT_TRUE(disjoint.stats().reordered);
  EXPECT_EQ(disjoint.ops()[0].param_offset, 0);
  expect_assemble_matches(c, r, kCached, "disjoint translates");
  // One block one column wider: it shares a column with its neighbour, so the list's order is kept.
  c.copies[3].copy.box.extent[1] = 17;
  c.copies[3].copy.box.offset[1] = std::min<i64>(c.copies[3].copy.box.offset[1], 239);
  c.copies[3].copy.offset = c.copies[3].copy.box.offset[1] * 64;
  c.buffer_bytes += 64 * 4;
  for (std::size_t i = 4; i < c.copies.size(); ++i) c.copies[i].buffer_offset += 64 * 4;
  const CopyProgram overlapping = compile(CopyDirection::kAssemble, c);
  EXPECT_FALSE(overlapping.stats().reordered);
  expect_assemble_matches(c, r, kCached, "overlapping translates");
}

TEST(Assemble, BoxesOfOneMapOfDifferentShapesRunInParameterOrderUnlessTheyOverlap) {
  Random r(15);
  // Column boxes of widths 8..40 of a row-major [32, 256] bf16 tensor, two row blocks, shuffled: pieces of
  // one affine map whose parameter intervals overlap; decided exactly from their boxes.
  Case c;
  c.params.push_back(r.bytes(32 * 256 * 2));
  std::vector<Box> boxes;
  for (i64 row = 0; row < 32; row += 16)
    for (i64 col = 0; col < 256;) {
      const i64 width = std::min<i64>(256 - col, 8 * r.in(1, 5));
      boxes.push_back(Box{{row, col}, {16, width}});
      col += width;
    }
  std::shuffle(boxes.begin(), boxes.end(), r.engine());
  auto make = [&](const std::vector<Box>& list) {
    c.copies.clear();
    i64 at = 0;
    for (const Box& b : list) {
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, b, b.offset[0] * 256 + b.offset[1], {256, 1}}, at, 2});
      at += b.numel() * 2;
    }
    c.buffer_bytes = at;
  };
  make(boxes);
  const CopyProgram disjoint = compile(CopyDirection::kAssemble, c);
  EXPECT_TRUE(disjoint.stats().reordered);
  expect_assemble_matches(c, r, kCached, "disjoint boxes");
  // One more box over the corner of two others: the list's order is kept.
  boxes.push_back(Box{{10, 20}, {10, 30}});
  make(boxes);
  const CopyProgram overlapping = compile(CopyDirection::kAssemble, c);
  EXPECT_FALSE(overlapping.stats().reordered);
  expect_assemble_matches(c, r, kCached, "overlapping boxes");
}

TEST(Assemble, CopiesThatOnlyLookDisjointKeepTheListsOrder) {
  Random r(16);
  for (int variant = 0; variant < 2; ++variant) {
    Case c;
    c.params.push_back(r.bytes(256 * 2));
    if (variant == 0) {
      // Disjoint boxes, same strides, but offsets that do not follow the boxes (not one map): B's rows
      // land on A's rows 1..3.
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{4, 0}, {4, 8}}, 16, {16, 1}}, 0, 2});
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {4, 8}}, 0, {16, 1}}, 64, 2});
    } else {
      // One map, disjoint boxes, but the map is not one-to-one: rows 4 elements apart, 8 wide.
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{2, 0}, {2, 8}}, 8, {4, 1}}, 0, 2});
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {2, 8}}, 0, {4, 1}}, 32, 2});
    }
    c.buffer_bytes = 128;
    EXPECT_FALSE(compile(CopyDirection::kAssemble, c).stats().reordered) << "variant " << variant;
    expect_assemble_matches(c, r, kCached, "variant " + std::to_string(variant));
  }
}

TEST(Assemble, FarApartCheckpointCoordinatesAreHarmless) {
  Random r(17);
  // Box offsets (checkpoint coordinates, not used to copy) far apart: the overlap analysis must not
  // overflow, and falls back to the parameter elements.
  Case c;
  c.params.push_back(r.bytes(1024));
  const i64 far = std::numeric_limits<i64>::max() - 4;
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{far, 0}, {2, 8}}, 0, {16, 1}}, 0, 2});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{-far, 0}, {2, 8}}, 8, {16, 1}}, 32, 2});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {2, 8}}, 4, {16, 1}}, 64, 2});
  c.buffer_bytes = 96;
  expect_assemble_matches(c, r, kCached, "far apart");
  EXPECT_FALSE(compile(CopyDirection::kAssemble, c).stats().reordered);
}

TEST(Pack, OverlappingBufferRangesKeepTheListsOrder) {
  Random r(13);
  Case c;
  c.params.push_back(r.bytes(4096));
  c.params.push_back(r.bytes(4096));
  // Parameter 1 then parameter 0 into the same buffer bytes: the later copy (parameter 0) wins.
  c.copies.push_back(BufferCopy{SliceCopy{0, 1, Box{{0}, {300}}, 0, {1}}, 100, 4});
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0}, {200}}, 0, {1}}, 0, 4});
  c.buffer_bytes = 1400;
  const CopyProgram pack = compile(CopyDirection::kPack, c);
  ASSERT_EQ(pack.stats().ops, 2);
  EXPECT_EQ(pack.ops()[0].parameter, 1u);
  expect_pack_matches(c, kCached, "overlapping buffer ranges");
}

TEST(Pack, UnitAxesAndContiguousAxesCollapse) {
  Random r(8);
  Case c;
  c.params.push_back(r.bytes(2 * 3 * 4 * 5 * 8 + 64));
  // A whole [2, 1, 3, 4, 5] tensor (a unit axis in the middle) at an offset: one run.
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0, 0, 0, 0}, {2, 1, 3, 4, 5}}, 8, {60, 7, 20, 5, 1}}, 0, 8});
  // A [3, 4, 5] box of rows padded to 6: an outer axis of 12 rows of 5 elements.
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0, 0}, {1, 12, 5}}, 0, {999, 6, 1}}, 960, 4});
  c.buffer_bytes = 960 + 240;
  const CopyProgram program = compile(CopyDirection::kPack, c);
  ASSERT_EQ(program.stats().ops, 2);
  const auto ops = ops_by_buffer(program);
  EXPECT_EQ(ops[0].run, 960);
  EXPECT_EQ(ops[0].axis_count, 0);
  EXPECT_EQ(ops[1].run, 20);
  EXPECT_EQ(ops[1].axis_count, 1);
  expect_pack_matches(c, kCached, "collapse");
  expect_assemble_matches(c, r, kCached, "collapse");
}

// ---- empty programs and streaming ----------------------------------------------------------------------

TEST(Pack, EmptyListsAndEmptyBoxesDoNothing) {
  const CopyProgram none;
  EXPECT_TRUE(none.empty());
  none.execute({}, nullptr);

  const CopyProgram empty_list(CopyDirection::kAssemble, {}, {}, 0);
  EXPECT_TRUE(empty_list.empty());
  EXPECT_EQ(empty_list.bytes(), 0);
  empty_list.execute({}, nullptr);

  // A box with an empty axis moves nothing, wherever it points.
  std::vector<BufferCopy> copies{BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {0, 5}}, 1 << 20, {5, 1}}, 1 << 20, 2}};
  const std::vector<i64> sizes{16};
  const CopyProgram empty_box(CopyDirection::kPack, copies, sizes, 16);
  EXPECT_TRUE(empty_box.empty());
  EXPECT_EQ(empty_box.stats().copies, 0);
  Bytes param(16, kParameterFill), buffer(16, kBufferFill);
  std::vector<std::byte*> params{param.data()};
  empty_box.execute(params, buffer.data());
  EXPECT_EQ(buffer, Bytes(16, kBufferFill));
}

TEST(Pack, LargeProgramsStreamAndStayExact) {
  Random r(9);
  Case c;
  // 20 MiB out of 48: rows of 3000 bytes at odd buffer offsets (unaligned heads and tails), a transposed
  // block over some of them.
  c.params.push_back(r.bytes(std::size_t{48} << 20));
  i64 at = 1;
  for (i64 k = 0; k < 6000; ++k) {
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0}, {1500}}, k * 3001 + 1, {1}}, at, 2});
    at += 3000 + (k % 3);
  }
  c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {1024, 1024}}, 10 << 20, {1, 1024}}, at, 2});
  at += 2 << 20;
  c.buffer_bytes = at;
  const CopyProgram program = compile(CopyDirection::kPack, c);
  EXPECT_TRUE(program.stats().streaming);
  expect_pack_matches(c, {}, "streaming");
  expect_assemble_matches(c, r, {}, "streaming");
}

TEST(Pack, StreamingRunsAndTilesAtEveryAlignment) {
  Random r(10);
  // Runs of 1000..1300 bytes (heads and tails of every length around the 64-byte lines) and whole
  // transposed tiles whose destination rows are 32-byte aligned, only 16-byte aligned, or neither (shifts
  // 16 apart cover both of the first two whatever the allocator's alignment), with streaming stores.
  for (i64 shift : {0, 1, 8, 16, 32, 33, 48, 64}) {
    Case c;
    c.params.push_back(r.bytes(1 << 20));
    i64 at = shift;
    for (i64 run = 1000; run <= 1300; run += 7) {
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {3, run}}, run * 5 + shift, {run + 13, 1}}, at, 1});
      at += 3 * run;
    }
    // [64, 96] bf16 box of a [96, 64 + 3] tensor stored transposed, at a 16-byte-aligned buffer offset when
    // shift is a multiple of 16.
    at = (at + 63) / 64 * 64 + shift;
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {64, 96}}, 300000 + shift, {1, 64 + shift}}, at, 2});
    at += 64 * 96 * 2;
    c.buffer_bytes = at;
    const std::string what = "shift " + std::to_string(shift);
    expect_pack_matches(c, kStreaming, what);
    expect_assemble_matches(c, r, kStreaming, what);
    EXPECT_TRUE(CopyProgram(CopyDirection::kPack, c.copies, sizes_of(c.params), c.buffer_bytes, kStreaming).stats().streaming);
  }
}

// ---- digesting while copying (verify) ------------------------------------------------------------------

TEST(Digest, PiecesInAnyOrderGiveTheDigestOfTheStream) {
  Random r(21);
  for (int trial = 0; trial < 300; ++trial) {
    const auto length = static_cast<std::size_t>(trial < 40 ? trial : r.in(0, 5000));
    const Bytes bytes = r.bytes(length);
    // Cut at random places (some 8- or 32-byte aligned, most not), added in a random order.
    std::vector<std::size_t> cuts{0, length};
    for (i64 k = r.in(0, 12); k > 0 && length > 0; --k) {
      std::size_t at = static_cast<std::size_t>(r.in(0, static_cast<i64>(length)));
      if (r.chance(0.3)) at = at / 32 * 32;
      cuts.push_back(at);
    }
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    for (std::size_t i = 1; i < cuts.size(); ++i) pieces.emplace_back(cuts[i - 1], cuts[i] - cuts[i - 1]);
    std::shuffle(pieces.begin(), pieces.end(), r.engine());
    DigestSums sums;
    for (const auto& [at, n] : pieces) sums.add(static_cast<i64>(at), bytes.data() + at, n);
    ASSERT_EQ(sums.finish(static_cast<i64>(length)), digest_bytes(bytes.data(), length)) << "length " << length;
    // In order, in pieces, through the streaming form: the same.
    Digest digest;
    for (std::size_t i = 1; i < cuts.size(); ++i) digest.update(bytes.data() + cuts[i - 1], cuts[i] - cuts[i - 1]);
    ASSERT_EQ(digest.finish(), digest_bytes(bytes.data(), length)) << "length " << length;
  }
}

/// The copies' buffer ranges as digest segments: each copy's own, or now and then a run of adjacent copies
/// as one segment (a copy program then digests several copies, merged into one op, into one digest).
std::vector<BufferRange> segments_of(Random& r, const std::vector<BufferCopy>& copies) {
  std::vector<BufferRange> ranges;
  for (const BufferCopy& c : copies)
    if (c.bytes() > 0) ranges.push_back({c.buffer_offset, c.bytes()});
  std::sort(ranges.begin(), ranges.end(), [](const BufferRange& a, const BufferRange& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes;
  });
  std::vector<BufferRange> out;
  for (const BufferRange& range : ranges) {
    if (!out.empty() && range.offset + range.bytes <= out.back().offset + out.back().bytes) continue;  // read twice
    if (!out.empty() && out.back().offset + out.back().bytes == range.offset && r.chance(0.3))
      out.back().bytes += range.bytes;
    else
      out.push_back(range);
  }
  return out;
}

/// Runs `direction`'s program with digests: the bytes are those of the definition, and each segment's
/// digest is that of its bytes in the buffer the definition leaves (pack) or reads (assemble).
void expect_digests_match(const Case& c, Random& r, CopyDirection direction, StoreHint stores, const std::string& what) {
  const std::vector<BufferRange> segments = segments_of(r, c.copies);
  CopyProgramOptions options{stores, {}};
  options.digest_segments = segments;
  const CopyProgram program(direction, c.copies, sizes_of(c.params), c.buffer_bytes, options);
  std::vector<DigestSums> sums(segments.size());
  Bytes buffer;
  if (direction == CopyDirection::kPack) {
    Bytes expected(static_cast<std::size_t>(c.buffer_bytes), kBufferFill);
    buffer = expected;
    reference_pack(c.copies, c.params, expected);
    std::vector<Bytes> params = c.params;
    program.execute(pointers(params), buffer.data(), sums.data());
    ASSERT_EQ(buffer, expected) << what << ": pack with digests";
  } else {
    buffer = r.bytes(static_cast<std::size_t>(c.buffer_bytes));
    std::vector<Bytes> expected, actual;
    for (const Bytes& p : c.params) expected.emplace_back(p.size(), kParameterFill);
    actual = expected;
    reference_assemble(c.copies, buffer, expected);
    program.execute(pointers(actual), buffer.data(), sums.data());
    for (std::size_t p = 0; p < expected.size(); ++p) ASSERT_EQ(actual[p], expected[p]) << what << ": assemble with digests, parameter " << p;
  }
  for (std::size_t i = 0; i < segments.size(); ++i)
    ASSERT_EQ(sums[i].finish(segments[i].bytes),
              digest_bytes(buffer.data() + segments[i].offset, static_cast<std::size_t>(segments[i].bytes)))
        << what << ": " << direction_name(direction) << " segment " << i << " of " << segments.size() << " (buffer offset "
        << segments[i].offset << ", " << segments[i].bytes << " bytes; " << program.stats().ops << " ops, "
        << program.stats().transpose_ops << " transposes)";
}

TEST(Pack, DigestingWhileCopyingGivesEverySegmentsDigest) {
  int overlapping = 0, read_twice = 0;
  for (unsigned seed = 2000; seed < 2300; ++seed) {
    Random r(seed);
    Case c = random_case(r);
    // Now and then a copy read twice (an assemble that installs a segment in two places: digested once),
    // or written over (a pack whose destinations overlap: digested after its copies).
    if (r.chance(0.3)) {
      BufferCopy again = c.copies[static_cast<std::size_t>(r.in(0, static_cast<i64>(c.copies.size()) - 1))];
      c.copies.push_back(again);
      ++read_twice;
    }
    for (StoreHint stores : {StoreHint::kCached, StoreHint::kStreaming}) {
      const std::string what = "seed " + std::to_string(seed);
      expect_digests_match(c, r, CopyDirection::kPack, stores, what);
      expect_digests_match(c, r, CopyDirection::kAssemble, stores, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
    CopyProgramOptions options;
    const std::vector<BufferRange> segments = segments_of(r, c.copies);
    options.digest_segments = segments;
    overlapping += CopyProgram(CopyDirection::kPack, c.copies, sizes_of(c.params), c.buffer_bytes, options).digests_after();
  }
  EXPECT_GT(read_twice, 30);
  EXPECT_GT(overlapping, 30);
}

TEST(Pack, DigestingStreamingRunsAndTilesAtEveryAlignment) {
  Random r(11);
  // Runs at every alignment of the destination against the segment (copy and digest loops offset from
  // each other, or sharing their loads), rows that continue one digest stream, segments of several
  // copies, and transposed tiles.
  for (i64 shift : {0, 1, 8, 16, 24, 32, 33, 48, 64}) {
    Case c;
    c.params.push_back(r.bytes(1 << 20));
    i64 at = shift;
    for (i64 run = 200; run <= 1400; run += 37) {
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {3, run}}, run * 5 + shift, {run + 13, 1}}, at, 1});
      at += 3 * run;
    }
    for (i64 run : {4096, 4160, 5000}) {  // rows long enough to digest as they copy in either direction
      c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {3, run}}, 400000 + shift, {run + 64, 1}}, at, 1});
      at += 3 * run;
    }
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0}, {20000}}, 7 * shift, {1}}, at, 4});  // one long run
    at += 80000;
    at = (at + 63) / 64 * 64 + shift;
    c.copies.push_back(BufferCopy{SliceCopy{0, 0, Box{{0, 0}, {64, 96}}, 300000 + shift, {1, 64 + shift}}, at, 2});
    at += 64 * 96 * 2;
    c.buffer_bytes = at;
    for (StoreHint stores : {StoreHint::kCached, StoreHint::kStreaming}) {
      const std::string what = "shift " + std::to_string(shift);
      expect_digests_match(c, r, CopyDirection::kPack, stores, what);
      expect_digests_match(c, r, CopyDirection::kAssemble, stores, what);
    }
  }
}

TEST(Pack, DigestSegmentsMustBeSortedAndDisjoint) {
  const std::vector<i64> sizes{4096};
  const std::vector<BufferCopy> copies{BufferCopy{SliceCopy{0, 0, Box{{0}, {100}}, 0, {1}}, 0, 4}};
  const std::vector<BufferRange> bad{{0, 300}, {200, 200}};
  CopyProgramOptions options;
  options.digest_segments = bad;
  try {
    const CopyProgram program(CopyDirection::kAssemble, copies, sizes, 400, options);
    ADD_FAILURE() << "overlapping digest segments accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("digest segment 1"));
  }
}

// ---- validation ----------------------------------------------------------------------------------------

void expect_rejected(CopyDirection direction, const std::vector<BufferCopy>& copies, const std::vector<i64>& sizes,
                     i64 buffer_bytes, const std::string& copy_name, const std::string& cause) {
  expect_error([&] { const CopyProgram program(direction, copies, sizes, buffer_bytes); }, ErrorCode::kInvalidArgument,
               {copy_name, cause});
}

TEST(Pack, InvalidCopiesAreRejectedNamingTheCopy) {
  const std::vector<i64> sizes{1000, 64 * 64 * 2};
  const BufferCopy good{SliceCopy{0, 1, Box{{0, 0}, {4, 64}}, 0, {64, 1}}, 0, 2};
  auto with = [&](BufferCopy bad) { return std::vector<BufferCopy>{good, good, bad}; };
  std::vector<BufferCopy> list = with(good);
  list[1].buffer_offset = 512, list[2].buffer_offset = 1024;
  EXPECT_NO_THROW(CopyProgram(CopyDirection::kPack, list, sizes, 1536));

  BufferCopy c = good;
  c.copy.parameter = 2;
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2 (parameter 2, box [0:4, 0:64]",
                  "parameter index out of range");
  c = good;
  c.copy.box = Box{{60, 0}, {5, 64}};
  c.copy.offset = 60 * 64;  // rows 60..64 of 64
  expect_rejected(CopyDirection::kAssemble, with(c), sizes, 4096, "assemble copy 2 (parameter 1, box [60:65, 0:64]",
                  "reach outside the parameter's 8192 bytes");
  c = good;
  c.copy.strides = {-64, 1};  // reversed rows from row 0: row -3
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "elements [-192, 64)");
  c = good;
  c.buffer_offset = 4096 - 511;
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "reach outside the buffer's 4096 bytes");
  c = good;
  c.buffer_offset = -1;
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "negative buffer offset");
  c = good;
  c.element_bytes = 0;
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "element size 0");
  c = good;
  c.copy.strides = {64};
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "1 strides for 2 axes");
  c = good;
  c.copy.box.extent = {-1, 64};
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "negative extent");
  c = good;
  c.copy.strides = {std::int64_t{1} << 62, 1};
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "overflow");
  c = good;
  c.copy.box = Box{Shape(17, 0), Shape(17, 1)};
  c.copy.strides = Shape(17, 1);
  expect_rejected(CopyDirection::kPack, with(c), sizes, 4096, "pack copy 2", "more than 16 axes");
}

}  // namespace
}  // namespace wb::exec
