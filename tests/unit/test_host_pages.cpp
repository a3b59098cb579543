// core/host_pages: the library's bulk host mappings start on a 2 MiB boundary, the huge-page advice covers
// exactly the whole blocks inside the range it is given (no page around it), and nothing is touched
// until used or populated. Read back from the kernel: the mapping's flags in /proc/self/smaps ("hg": asked
// for huge pages) and which pages are resident (mincore).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>

#include "core/host_pages.hpp"
#include "host_pages_probe.hpp"

namespace wb {
namespace {

constexpr std::size_t kBlock = kHugePageBytes;

TEST(HostPages, LargeMappingsStartOnAHugePageBoundaryAndSmallOnesArePageSized) {
  std::size_t mapped = 0;
  std::byte* large = map_host_pages(5 * kBlock + 1, mapped);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large) % kBlock, 0u);
  EXPECT_EQ(mapped, 5 * kBlock + page_size());
  large[mapped - 1] = std::byte{1};  // the whole length is writable
  EXPECT_EQ(::munmap(large, mapped), 0);

  std::byte* small = map_host_pages(10000, mapped);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(mapped, (10000 + page_size() - 1) / page_size() * page_size());
  EXPECT_EQ(::munmap(small, mapped), 0);
}

TEST(HostPages, AdviceCoversTheWholeBlocksInsideTheRangeAndTouchesNothing) {
  std::size_t mapped = 0;
  std::byte* base = map_host_pages(8 * kBlock, mapped);
  ASSERT_NE(base, nullptr);
  advise_huge_pages(base + 100, base + 6 * kBlock + 5);  // blocks 1 to 5 whole; 0 and 6 only in part
  EXPECT_FALSE(asks_for_huge_pages(base));
  EXPECT_FALSE(asks_for_huge_pages(base + kBlock - 1));
  EXPECT_TRUE(asks_for_huge_pages(base + kBlock));
  EXPECT_TRUE(asks_for_huge_pages(base + 6 * kBlock - 1));
  EXPECT_FALSE(asks_for_huge_pages(base + 6 * kBlock));
  EXPECT_EQ(resident_pages(base, mapped), 0u);

  advise_huge_pages(base + 7 * kBlock + 1, base + 8 * kBlock);  // less than a whole block: no advice
  EXPECT_FALSE(asks_for_huge_pages(base + 7 * kBlock + 4096));
  EXPECT_EQ(::munmap(base, mapped), 0);
}

TEST(HostPages, PopulateMakesTheRangeResidentAndNothingElse) {
  std::size_t mapped = 0;
  std::byte* base = map_host_pages(4 * kBlock, mapped);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(populate_host_pages(base + kBlock, kBlock));
  EXPECT_EQ(resident_pages(base + kBlock, kBlock), kBlock / page_size());
  if (!huge_pages_always()) {  // with the kernel's "always", a touch may bring a neighbour's whole block
    EXPECT_EQ(resident_pages(base, kBlock), 0u);
    EXPECT_EQ(resident_pages(base + 2 * kBlock, 2 * kBlock), 0u);
  }
  for (std::size_t i = 0; i < kBlock; i += 4096) ASSERT_EQ(base[kBlock + i], std::byte{0}) << "byte " << i;
  EXPECT_EQ(::munmap(base, mapped), 0);
}

}  // namespace
}  // namespace wb
