// A catch-up link's transfer buffers prepared ahead (coord/catch_up.hpp, prepare_catch_up_buffers): the
// catch-up budget each way for host parameters, none for CUDA ones, and the executor's allocation takes
// them where they are large enough (exec::allocate_transfer_buffers' `kept`), again for the next joiner.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "coord/catch_up.hpp"
#include "coord/connection.hpp"
#include "exec/transfer_memory.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::coord {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

TEST(CatchUpBuffers, HostParametersGetTheBudgetEachWayAndTheExecutorTakesThemWhereTheyFit) {
  std::vector<std::uint8_t> a(3 * kMiB), b(kMiB);
  ParameterSet params;
  params.add("a", TensorView::contiguous(a.data(), DType::kU8, {3 * kMiB}));
  params.add("b", TensorView::contiguous(b.data(), DType::kU8, {kMiB}));
  AdapterOptions given;
  given.buffer_bytes = 64 * kMiB;
  const ResolvedOptions options = resolve_options(given);
  const PreparedBuffers prepared = prepare_catch_up_buffers(params, options);
  ASSERT_TRUE(prepared.valid());
  const std::shared_ptr<const exec::TransferBuffers> kept = prepared.get();
  ASSERT_NE(kept, nullptr);
  // An eighth of the parameters, but at least 16 MiB: the catch-up link's budget, on either side.
  EXPECT_GE(kept->send->size(), static_cast<std::size_t>(16 * kMiB));
  EXPECT_GE(kept->receive->size(), static_cast<std::size_t>(16 * kMiB));

  // A plan within the budget takes both (4 slots of 2 and 3 MiB), a later one again (the next joiner).
  for (int joiner = 0; joiner < 2; ++joiner) {
    const exec::TransferBuffers taken =
        exec::allocate_transfer_buffers(MemoryKind::kHost, MemoryKind::kHost, 0, 4, 2 * kMiB, 3 * kMiB, kept.get());
    EXPECT_EQ(taken.send, kept->send) << joiner;
    EXPECT_EQ(taken.receive, kept->receive) << joiner;
    EXPECT_EQ(taken.receive_slot_stride, 3 * kMiB);
  }
  // One beyond it allocates its own.
  const exec::TransferBuffers larger =
      exec::allocate_transfer_buffers(MemoryKind::kHost, MemoryKind::kHost, 0, 4, kMiB, 8 * kMiB, kept.get());
  EXPECT_EQ(larger.send, kept->send);
  EXPECT_NE(larger.receive, kept->receive);
  EXPECT_GE(larger.receive->size(), static_cast<std::size_t>(32 * kMiB));
}

TEST(CatchUpBuffers, NoneForCudaParameters) {
  // Never touched: only the kind is looked at (device buffers are never taken over).
  std::vector<std::uint8_t> fake(256);
  ParameterSet params;
  params.add("w", TensorView::contiguous(fake.data(), DType::kU8, {256}, MemoryKind::kCuda, 0));
  EXPECT_FALSE(prepare_catch_up_buffers(params, resolve_options(AdapterOptions{})).valid());
}

}  // namespace
}  // namespace wb::coord
