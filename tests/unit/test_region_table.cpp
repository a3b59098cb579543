// The registrations every transport keeps and the one check of a batch against them
// (transport/region_table.hpp): cma, cuda_ipc, ibverbs and libfabric refuse the same bad writes with the
// same words, before anything is posted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "transport/region_table.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;

TEST(RegionTable, RangesAndOwnersAreCheckedBeforeAnythingIsPosted) {
  RegionTable table("libfabric");
  EXPECT_EQ(table.add_local(1000), 0u);
  EXPECT_EQ(table.add_local(64), 1u);
  EXPECT_EQ(table.add_remote(6, 500), 0u);
  EXPECT_EQ(table.add_remote(2, 800), 1u);  // import ids are transport-wide: id 1 belongs to rank 2
  EXPECT_EQ(table.first_remote_of(2), 1);
  EXPECT_EQ(table.first_remote_of(3), -1);
  auto check = [&](WriteRequest w) {
    const std::vector<WriteRequest> writes{WriteRequest{0, 0, 0, 0, 10}, w};
    return table.check(6, writes);
  };
  EXPECT_TRUE(check({1, 0, 0, 436, 64}).is_ok());
  EXPECT_TRUE(check({0, 1000, 0, 500, 0}).is_ok());  // empty at the very end
  const Status local_past = check({0, 990, 0, 0, 11});
  EXPECT_EQ(local_past.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(local_past.message(), HasSubstr("libfabric post_writes to rank 6: write 1 of 2 reads local memory 0 at offset 990 + 11 bytes, past its 1000 registered bytes"));
  EXPECT_THAT(check({0, 0, 0, 490, 11}).message(), HasSubstr("writes remote memory 0 of rank 6 at offset 490 + 11 bytes, past its 500"));
  EXPECT_THAT(check({2, 0, 0, 0, 1}).message(), HasSubstr("names local memory 2, but 2 regions are registered"));
  EXPECT_THAT(check({0, 0, 2, 0, 1}).message(), HasSubstr("names remote memory 2, but 2 regions were imported"));
  const Status other_peer = check({0, 0, 1, 0, 1});
  EXPECT_EQ(other_peer.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(other_peer.message(), HasSubstr("names remote memory 1, which was imported from rank 2, not from rank 6"));
  // Offsets near 2^64 do not wrap around into range.
  EXPECT_FALSE(check({0, ~std::uint64_t{0} - 1, 0, 0, 4}).is_ok());
  EXPECT_FALSE(check({0, 0, 0, 8, ~std::uint64_t{0} - 2}).is_ok());
}

}  // namespace
}  // namespace wb
