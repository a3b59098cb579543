// The copies of a cuda_ipc batch (transport/cuda_ipc/copy_batch.hpp): one entry per write, writes that
// continue one another on both sides merged, empty writes skipped; what the batched copy call receives.
// Device-free: runs in every build.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "transport/cuda_ipc/copy_batch.hpp"

namespace wb {
namespace {

TEST(CudaIpcBatch, WritesThatContinueEachOtherBecomeOneCopy) {
  // Local regions at 0x1000 and 0x9000, remote ones at 0x100000 and 0x200000.
  const auto local = [](std::uint32_t id) { return std::uint64_t{id == 0 ? 0x1000u : 0x9000u}; };
  const auto remote = [](std::uint32_t id) { return std::uint64_t{id == 0 ? 0x100000u : 0x200000u}; };
  const std::vector<WriteRequest> writes = {
      {0, 0, 0, 0, 64},      // a
      {0, 64, 0, 64, 32},    // continues a on both sides
      {0, 96, 0, 200, 32},   // continues locally only
      {0, 128, 1, 232, 16},  // same offsets, another remote region
      {1, 0, 1, 248, 0},     // empty
      {1, 0, 1, 248, 8},     // continues the previous one remotely only (another local region)
  };
  cuda_ipc::CopyBatch batch;
  cuda_ipc::collect_copies(writes, local, remote, batch);
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(batch.sizes, (std::vector<std::size_t>{96, 32, 16, 8}));
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(batch.src[0]), 0x1000u);
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(batch.dst[0]), 0x100000u);
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(batch.dst[1]), 0x100000u + 200);
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(batch.dst[2]), 0x200000u + 232);
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(batch.src[3]), 0x9000u);
  EXPECT_EQ(batch.bytes, 152u);
  // Appends; clear starts over.
  cuda_ipc::collect_copies(std::vector<WriteRequest>{{0, 1000, 0, 5000, 4}}, local, remote, batch);
  EXPECT_EQ(batch.size(), 5u);
  batch.clear();
  EXPECT_EQ(batch.size(), 0u);
  EXPECT_EQ(batch.bytes, 0u);
}

TEST(CudaIpcBatch, AWholeBatchOfContiguousWritesIsOneCopy) {
  std::vector<WriteRequest> writes;
  for (std::uint64_t i = 0; i < 65536; ++i) writes.push_back({0, i * 128, 0, 4096 + i * 128, 128});
  cuda_ipc::CopyBatch batch;
  cuda_ipc::collect_copies(writes, [](std::uint32_t) { return std::uint64_t{0x10000}; },
                           [](std::uint32_t) { return std::uint64_t{0x7000000}; }, batch);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch.sizes[0], 65536u * 128);
}

}  // namespace
}  // namespace wb
