// Staging (coord/staging.hpp), the staged modes' host copies: which bytes are copied, how device copies are
// merged and pinned, and what the executor is given to read and write. Device copies themselves run on a
// GPU only (tests/gpu, scripts/gpu-check.sh); the ranges they copy are decided here, on the host.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "coord/staging.hpp"
#include "core/host_pages.hpp"
#include "host_pages_probe.hpp"
#include "plan/round_schedule.hpp"

namespace wb::coord {
namespace {

TEST(Staging, GapsUpToTheLimitAreClosedAndOthersKept) {
  const ByteRanges ranges = {{0, 100}, {150, 200}, {200, 300}, {10000, 10100}, {10200, 10300}};
  EXPECT_EQ(close_gaps(ranges, 0), (ByteRanges{{0, 100}, {150, 300}, {10000, 10100}, {10200, 10300}}));
  EXPECT_EQ(close_gaps(ranges, 50), (ByteRanges{{0, 300}, {10000, 10100}, {10200, 10300}}));
  EXPECT_EQ(close_gaps(ranges, 100), (ByteRanges{{0, 300}, {10000, 10300}}));
  EXPECT_EQ(close_gaps(ranges, kDeviceCopyGap), (ByteRanges{{0, 10300}}));
  EXPECT_TRUE(close_gaps({}, 10).empty());
}

TEST(Staging, PinnedSpansAreWholePagesAndNeverAPageNoRangeNeeds) {
  const std::int64_t page = 4096;
  // Two ranges in one page, one across a boundary, one far away.
  const ByteRanges ranges = {{10, 20}, {100, 200}, {4000, 4200}, {40960, 40961}};
  const ByteRanges spans = page_spans(ranges, page);
  EXPECT_EQ(spans, (ByteRanges{{0, 8192}, {40960, 45056}}));
  for (const auto& [first, last] : spans) {
    EXPECT_EQ(first % page, 0);
    EXPECT_EQ(last % page, 0);
  }
  // Pages 2..9 are in no range and in no span.
  for (std::int64_t p = 2; p < 10; ++p)
    for (const auto& [first, last] : spans) EXPECT_FALSE(p * page >= first && p * page < last) << "page " << p;
}

// Two byte parameters, a (10,000) and b (300), each byte a function of its index.
struct TwoParameters {
  std::vector<std::uint8_t> a = pattern(10000, 7, 1), b = pattern(300, 3, 2);
  ParameterSet params;
  TwoParameters() {
    params.add("a", TensorView::contiguous(a.data(), DType::kU8, {10000}));
    params.add("b", TensorView::contiguous(b.data(), DType::kU8, {300}));
  }
  static std::vector<std::uint8_t> pattern(std::size_t n, unsigned scale, unsigned add) {
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(i * scale + add);
    return v;
  }
};

TEST(Staging, HostCopiesMoveOnlyTheStagedRangesAndTheExecutorSeesTheStaging) {
  TwoParameters two;
  std::vector<std::uint8_t>& a = two.a;
  std::vector<std::uint8_t>& b = two.b;
  ParameterSet& params = two.params;
  std::vector<ByteRanges> ranges = {{{100, 200}, {5000, 5001}}, {}};
  Staging staging(params, ranges);
  EXPECT_EQ(staging.bytes(), 101);
  EXPECT_EQ(staging.copies_per_version(), 2u);  // host copies: one per range, gaps kept
  ASSERT_TRUE(staging.copy_from(params).is_ok());
  const ParameterMemory memory = staging.memory(params);
  EXPECT_EQ(memory.memory, MemoryKind::kHost);
  ASSERT_EQ(memory.data.size(), 2u);
  EXPECT_NE(memory.data[0], reinterpret_cast<std::byte*>(a.data()));   // staged: the executor reads the copy
  EXPECT_EQ(memory.data[1], reinterpret_cast<std::byte*>(b.data()));   // not staged: never touched
  EXPECT_EQ(memory.bytes[0], 10000u);
  EXPECT_EQ(std::memcmp(memory.data[0] + 100, a.data() + 100, 100), 0);
  EXPECT_EQ(memory.data[0][5000], std::byte{a[5000]});

  // Receiver side: what arrived in staging goes to the parameters' ranges, nothing else changes.
  std::memset(memory.data[0] + 100, 0xEE, 100);
  memory.data[0][5000] = std::byte{0xEE};
  const std::vector<std::uint8_t> before = a;
  ASSERT_TRUE(staging.copy_to(params).is_ok());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool staged = (i >= 100 && i < 200) || i == 5000;
    ASSERT_EQ(a[i], staged ? 0xEE : before[i]) << "byte " << i;
  }
}

// Ranges long enough for the streaming stores (64 KiB and more), starting and ending off 64-byte lines,
// beside short ones between them: both directions move exactly the staged bytes.
TEST(Staging, LongHostRangesOffCacheLinesAreCopiedExactlyBothWays) {
  const std::size_t n = (1 << 20) + 4099;
  std::vector<std::uint8_t> a = TwoParameters::pattern(n, 13, 5);
  ParameterSet params;
  params.add("a", TensorView::contiguous(a.data(), DType::kU8, {static_cast<std::int64_t>(n)}));
  const ByteRanges staged = {{3, 70003}, {70100, 70150}, {70201, 1000001}, {1000064, static_cast<std::int64_t>(n) - 1}};
  Staging staging(params, {staged});
  ASSERT_TRUE(staging.copy_from(params).is_ok());
  std::byte* copy = staging.memory(params).data[0];
  for (const auto& [first, last] : staged)
    ASSERT_EQ(std::memcmp(copy + first, a.data() + first, static_cast<std::size_t>(last - first)), 0) << "range at " << first;
  const std::vector<std::uint8_t> before = a;
  for (const auto& [first, last] : staged)
    for (std::int64_t i = first; i < last; ++i) copy[i] = std::byte(static_cast<std::uint8_t>(i * 7 + 1));
  ASSERT_TRUE(staging.copy_to(params).is_ok());
  std::size_t next = 0;
  for (std::size_t i = 0; i < n; ++i) {
    while (next < staged.size() && static_cast<std::int64_t>(i) >= staged[next].second) ++next;
    const bool in = next < staged.size() && static_cast<std::int64_t>(i) >= staged[next].first;
    ASSERT_EQ(a[i], in ? static_cast<std::uint8_t>(i * 7 + 1) : before[i]) << "byte " << i;
  }
}

// The parameters share one reservation (each from a page boundary), the ranges' whole 2 MiB blocks
// ask for huge pages across parameters, and a parameter staged in part gets no advice and no page beyond
// what its range touches (with the kernel's "always" mode, no block beyond its range's).
TEST(Staging, ParametersShareOneReservationWithHugePagesOnlyWhereWholeBlocksAreStaged) {
  constexpr std::int64_t kMiB = 1 << 20;
  std::vector<std::uint8_t> a(3 * kMiB, 1), b(5 * kMiB + 7, 2), c(4 * kMiB, 3), d(6 * kMiB, 4);
  ParameterSet params;
  params.add("a", TensorView::contiguous(a.data(), DType::kU8, {static_cast<std::int64_t>(a.size())}));
  params.add("b", TensorView::contiguous(b.data(), DType::kU8, {static_cast<std::int64_t>(b.size())}));
  params.add("c", TensorView::contiguous(c.data(), DType::kU8, {static_cast<std::int64_t>(c.size())}));
  params.add("d", TensorView::contiguous(d.data(), DType::kU8, {static_cast<std::int64_t>(d.size())}));
  const std::int64_t in_d = 3 * kMiB + 100;
  std::vector<ByteRanges> ranges = {{{0, 3 * kMiB}}, {{0, 5 * kMiB + 7}}, {}, {{in_d, in_d + 10}}};
  Staging staging(params, ranges);
  ASSERT_TRUE(staging.copy_from(params).is_ok());
  const ParameterMemory memory = staging.memory(params);
  const std::size_t page = page_size();
  const std::size_t after_a = (a.size() + page - 1) / page * page, after_b = (b.size() + page - 1) / page * page;
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(memory.data[0]) % kHugePageBytes, 0u);
  EXPECT_EQ(memory.data[1], memory.data[0] + after_a);  // b right after a: a and b staged as one span
  EXPECT_EQ(memory.data[2], reinterpret_cast<std::byte*>(c.data()));  // c not staged: never touched
  EXPECT_EQ(memory.data[3], memory.data[1] + after_b + c.size());  // c's room reserved, never touched
  // a and b together: 8 MiB + 7 bytes from the boundary, blocks 0 to 3 whole.
  EXPECT_TRUE(asks_for_huge_pages(memory.data[0]));
  EXPECT_TRUE(asks_for_huge_pages(memory.data[1] + kMiB));  // a's last MiB and b's first: one block
  EXPECT_TRUE(asks_for_huge_pages(memory.data[0] + 4 * kHugePageBytes - 1));
  EXPECT_FALSE(asks_for_huge_pages(memory.data[0] + 4 * kHugePageBytes));
  EXPECT_FALSE(asks_for_huge_pages(memory.data[3] + in_d));
  EXPECT_EQ(std::memcmp(memory.data[1], b.data(), b.size()), 0);
  EXPECT_EQ(memory.data[3][in_d + 9], std::byte{4});
  // d: only the page of its range, or with the kernel's "always" that page's block.
  const std::size_t resident = resident_pages(memory.data[3], d.size());
  if (huge_pages_always()) EXPECT_LE(resident, kHugePageBytes / page + 1);
  else EXPECT_EQ(resident, 1u);
}

// A re-link's staging shares the old link's memory (the same parameters): what it holds is kept, its new
// ranges are faulted in without a write, a resend whose parameters are views of it leaves it as it is,
// and the memory lives until the last staging using it goes. Other parameters' sizes: not shared.
TEST(Staging, ARelinksStagingSharesTheOldMemoryAndKeepsWhatItHolds) {
  TwoParameters two;
  std::optional<Staging> old(std::in_place, two.params, std::vector<ByteRanges>{{{0, 10000}}, {{0, 300}}});
  ASSERT_TRUE(old->copy_from(two.params).is_ok());  // the version the old link sent
  const ParameterMemory held = old->memory(two.params);
  std::memset(two.a.data(), 0x55, two.a.size());  // the trainer's parameters move on

  Staging relinked(two.params, std::vector<ByteRanges>{{{200, 9000}}, {}}, &*old);
  ASSERT_TRUE(relinked.shares_memory_with(*old));
  const ParameterMemory memory = relinked.memory(two.params);
  EXPECT_EQ(memory.data[0], held.data[0]);
  EXPECT_EQ(memory.data[1], reinterpret_cast<std::byte*>(two.b.data()));  // b not staged by the new plan
  relinked.touch_at_connect(two.params, &*old);  // shared: faulted in, nothing copied
  for (std::int64_t i = 0; i < 10000; ++i)
    ASSERT_EQ(memory.data[0][i], std::byte(static_cast<std::uint8_t>(i * 7 + 1))) << "byte " << i;
  // The resend: parameters that are views of the shared memory, copied "into" it: nothing changes.
  ParameterSet views;
  views.add("a", TensorView::contiguous(held.data[0], DType::kU8, {10000}));
  views.add("b", TensorView::contiguous(held.data[1], DType::kU8, {300}));
  ASSERT_TRUE(relinked.copy_from(views).is_ok());
  EXPECT_EQ(memory.data[0][4321], std::byte(static_cast<std::uint8_t>(4321 * 7 + 1)));
  old.reset();  // the old link's hold released: the memory stays with the new staging
  ASSERT_TRUE(relinked.copy_from(two.params).is_ok());
  EXPECT_EQ(memory.data[0][200], std::byte{0x55});
  EXPECT_EQ(memory.data[0][199], std::byte(static_cast<std::uint8_t>(199 * 7 + 1)));  // outside its ranges

  std::vector<std::uint8_t> larger(20000);
  ParameterSet other;
  other.add("a", TensorView::contiguous(larger.data(), DType::kU8, {20000}));
  other.add("b", TensorView::contiguous(two.b.data(), DType::kU8, {300}));
  const Staging elsewhere(other, std::vector<ByteRanges>{{{0, 20000}}, {}}, &relinked);
  EXPECT_FALSE(elsewhere.shares_memory_with(relinked));
}

TEST(Staging, ASideThatDoesNotStageHandsOverTheParametersInTheirOwnMemory) {
  std::vector<std::uint8_t> a(64);
  ParameterSet params;
  params.add("a", TensorView::contiguous(a.data(), DType::kU8, {64}));
  const Staging none;
  const ParameterMemory memory = none.memory(params);
  EXPECT_EQ(memory.memory, MemoryKind::kHost);
  EXPECT_EQ(memory.data[0], reinterpret_cast<std::byte*>(a.data()));
  // CUDA parameters (views only: nothing here dereferences them) go to the executor as device memory.
  ParameterSet device;
  device.add("a", TensorView::contiguous(reinterpret_cast<void*>(0x7000000000), DType::kBF16, {32}, MemoryKind::kCuda, 3));
  const ParameterMemory on_device = none.memory(device);
  EXPECT_EQ(on_device.memory, MemoryKind::kCuda);
  EXPECT_EQ(on_device.device, 3);
  EXPECT_EQ(on_device.bytes[0], 64u);
}

// A contiguous run of `n` one-byte elements of `parameter` from element `first`, as a round packs it.
BufferCopy run_of(std::uint32_t parameter, std::int64_t first, std::int64_t n) {
  return BufferCopy{SliceCopy{0, parameter, Box{{0}, {n}}, first, {1}}, 0, 1};
}

TEST(Staging, SenderStagingByRoundCopiesEachByteOnceInTheOrderTheRoundsPackIt) {
  TwoParameters two;
  std::vector<std::uint8_t>& a = two.a;
  std::vector<std::uint8_t>& b = two.b;
  ParameterSet& params = two.params;
  // Round 0 packs a[100, 150) and a[5000]; round 1 a[120, 200) (partly staged by round 0) and b[0, 10);
  // round 2 nothing; round 3 b[5, 20).
  const std::vector<std::vector<BufferCopy>> rounds = {
      {run_of(0, 100, 50), run_of(0, 5000, 1)}, {run_of(0, 120, 80), run_of(1, 0, 10)}, {}, {run_of(1, 5, 15)}};
  std::vector<BufferCopy> all;
  for (const auto& round : rounds) all.insert(all.end(), round.begin(), round.end());
  Staging staging(params, touched_ranges(all, params.size()));
  EXPECT_EQ(staging.bytes(), 100 + 1 + 20);
  EXPECT_FALSE(staging.stages_by_round());
  std::vector<std::span<const BufferCopy>> by_round(rounds.begin(), rounds.end());
  staging.order_by_rounds(by_round);
  ASSERT_TRUE(staging.stages_by_round());

  std::atomic<int> staged{-5};
  ASSERT_TRUE(staging.copy_from_by_round(params, staged).is_ok());
  EXPECT_EQ(staged.load(), Staging::kAllRoundsStaged);
  const ParameterMemory memory = staging.memory(params);
  EXPECT_EQ(std::memcmp(memory.data[0] + 100, a.data() + 100, 100), 0);
  EXPECT_EQ(memory.data[0][5000], std::byte{a[5000]});
  EXPECT_EQ(std::memcmp(memory.data[1], b.data(), 20), 0);
  // The staging's other bytes were never written (its pages start zeroed).
  EXPECT_EQ(memory.data[0][99], std::byte{0});
  EXPECT_EQ(memory.data[0][200], std::byte{0});
  EXPECT_EQ(memory.data[1][20], std::byte{0});
  // Each byte once: what a copy by rounds moves is exactly what the staging holds.
  EXPECT_EQ(staging.copies_per_version(), 3u);

  // Changed parameters are staged again by the next copy, round by round as before.
  a[150] = static_cast<std::uint8_t>(a[150] + 1);
  b[19] = static_cast<std::uint8_t>(b[19] + 1);
  ASSERT_TRUE(staging.copy_from_by_round(params, staged).is_ok());
  EXPECT_EQ(memory.data[0][150], std::byte{a[150]});
  EXPECT_EQ(memory.data[1][19], std::byte{b[19]});
}

TEST(Staging, WithoutARoundOrderTheCopyIsWholeAndThenEveryRoundIsPackable) {
  std::vector<std::uint8_t> a(64, 9);
  ParameterSet params;
  params.add("a", TensorView::contiguous(a.data(), DType::kU8, {64}));
  Staging staging(params, {{{0, 64}}});
  std::atomic<int> staged{0};
  ASSERT_TRUE(staging.copy_from_by_round(params, staged).is_ok());
  EXPECT_EQ(staged.load(), Staging::kAllRoundsStaged);
  EXPECT_EQ(staging.memory(params).data[0][63], std::byte{9});
}

}  // namespace
}  // namespace wb::coord
