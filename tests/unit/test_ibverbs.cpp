// The ibverbs transport without an RDMA device: the factory's "no RDMA device" answer (so the caller can
// choose another transport), and the device-independent logic the transport is built from: endpoint
// records and memory keys (round trip, validation naming the peer, truncation and corruption), the
// WB_IB_DEVICES syntax, the GID choice, write range checks, striping and splitting a batch over rails,
// send-queue accounting, matching completions and arrivals across rails, and the text of a failed work
// completion. Queue pairs, memory registration and the data path run in the MPI conformance suite where
// a device exists.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>  // enum values only

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <tuple>

#include "transport/ibverbs/ibverbs_internal.hpp"
#include "transport/ibverbs/ibverbs_logic.hpp"
#include "transport/ibverbs/ibverbs_transport.hpp"
#include "weightbridge/settings.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/transport.hpp"

namespace wb::ibv {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

// --- the factory -------------------------------------------------------------------------------------

void expect_no_device(const std::function<void()>& make) {
  try {
    make();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("no RDMA device"));
    // Here ibv_get_device_list fails with ENOSYS ("failed: Function not implemented"); elsewhere it may
    // find no device, or devices without an active port.
    EXPECT_THAT(e.what(), AnyOf(HasSubstr("ibv_get_device_list failed: "), HasSubstr("returned no device"),
                                HasSubstr("no active port")));
    return;
  }
  GTEST_SKIP() << "an RDMA device with an active port exists here: the device tests are in the MPI conformance suite";
}

TEST(IbverbsFactory, NoDeviceIsUnsupportedWithTheReason) {
  expect_no_device([] { (void)make_ibverbs_transport(0); });
}

TEST(IbverbsFactory, MakeTransportPassesTheReasonOn) {
  expect_no_device([] { (void)make_transport(TransportKind::kIbverbs, 3); });
}

TEST(IbverbsFactory, WhenADeviceExistsTheCapabilitiesAreThoseOfIbverbs) {
  std::unique_ptr<Transport> transport;
  try {
    transport = make_ibverbs_transport(0);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_EQ(transport->kind(), TransportKind::kIbverbs);
  const TransportCapabilities caps = transport->capabilities();
  EXPECT_TRUE(caps.host_memory);
  EXPECT_TRUE(caps.between_machines);
#ifdef WB_HAVE_CUDA
  EXPECT_TRUE(caps.cuda_memory);
#else
  EXPECT_FALSE(caps.cuda_memory);
#endif
  EXPECT_GT(caps.max_writes_per_batch, 0u);
}

TEST(IbverbsSettings, OutOfRangeValuesNameTheVariable) {
  SettingBase* timeout = find_setting("ib_timeout");
  ASSERT_NE(timeout, nullptr);
  const std::string before = timeout->value_text();
  timeout->override_from_text("99");
  try {
    (void)read_config();
    ADD_FAILURE() << "WB_IB_TIMEOUT=99 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("WB_IB_TIMEOUT=99 is out of range [1, 31]"));
  }
  timeout->override_from_text(before);
  const Config config = read_config();
  EXPECT_EQ(config.timeout, 20);
  EXPECT_EQ(config.sq_depth, 512u);
  EXPECT_TRUE(config.devices.empty());
}

// --- endpoint records --------------------------------------------------------------------------------

NicAddress roce_nic(const std::string& device, std::uint8_t last_octet) {
  NicAddress nic;
  nic.device = device;
  nic.port = 1;
  nic.link_layer = LinkLayer::kEthernet;
  nic.gid = Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last_octet};
  nic.gid_index = 3;
  nic.mtu = 5;  // 4096
  nic.max_message = 1u << 30;
  return nic;
}

NicAddress ib_nic(const std::string& device, std::uint16_t lid) {
  NicAddress nic;
  nic.device = device;
  nic.port = 2;
  nic.link_layer = LinkLayer::kInfiniBand;
  nic.lid = lid;
  nic.gid = Gid{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0, 0, static_cast<std::uint8_t>(lid)};
  nic.mtu = 4;
  nic.max_message = std::uint64_t{1} << 31;
  return nic;
}

EndpointRecord record(int rank, int peer, std::vector<NicAddress> nics) {
  EndpointRecord r;
  r.rank = rank;
  r.peer = peer;
  for (std::size_t i = 0; i < nics.size(); ++i)
    r.qps.push_back(QueuePairAddress{static_cast<std::uint32_t>(0x100 + 17 * i + rank), static_cast<std::uint32_t>(0xabcde0 + i)});
  r.nics = std::move(nics);
  return r;
}

TEST(IbverbsEndpoint, RoundTrips) {
  const EndpointRecord original = record(7, 2, {roce_nic("mlx5_0", 1), ib_nic("mlx5_1", 0x1234)});
  const std::vector<std::byte> bytes = serialize_endpoint(original);
  EXPECT_LT(bytes.size(), 120u);  // a few dozen bytes a NIC
  EXPECT_EQ(parse_endpoint(bytes, 7), original);
}

TEST(IbverbsEndpoint, EveryTruncationIsAClearErrorNamingThePeer) {
  const std::vector<std::byte> bytes = serialize_endpoint(record(4, 0, {roce_nic("mlx5_0", 1), roce_nic("mlx5_1", 2)}));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    try {
      (void)parse_endpoint(std::span(bytes).first(n), 4);
      ADD_FAILURE() << "a record cut to " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_THAT(e.code(), AnyOf(ErrorCode::kCorruptData, ErrorCode::kInvalidArgument));
      EXPECT_THAT(e.what(), HasSubstr("ibverbs endpoint record of peer 4"));
    }
  }
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW((void)parse_endpoint(longer, 4), Error);
}

TEST(IbverbsEndpoint, ForeignOrNewerRecordsAreNamedAsSuch) {
  std::vector<std::byte> bytes = serialize_endpoint(record(1, 0, {roce_nic("mlx5_0", 1)}));
  std::vector<std::byte> foreign = bytes;
  foreign[0] = std::byte{'X'};
  try {
    (void)parse_endpoint(foreign, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("made by another transport"));
  }
  bytes[4] = std::byte{kEndpointVersion + 1};
  try {
    (void)parse_endpoint(bytes, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("format version 2; this build reads version 1"));
  }
}

TEST(IbverbsEndpoint, RandomCorruptionNeverCrashes) {
  const std::vector<std::byte> bytes = serialize_endpoint(record(3, 9, {roce_nic("mlx5_0", 1), ib_nic("mlx5_2", 9)}));
  std::mt19937 rng(11);
  int parsed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> copy = bytes;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) copy[rng() % copy.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
    try {
      const EndpointRecord r = parse_endpoint(copy, 3);
      ++parsed;
      for (std::size_t i = 0; i < r.nics.size(); ++i) {
        EXPECT_GT(mtu_bytes(r.nics[i].mtu), 0u);
        EXPECT_GT(r.qps[i].qpn, 0u);
        EXPECT_LE(r.qps[i].qpn, 0xffffffu);
        EXPECT_LE(r.qps[i].psn, 0xffffffu);
      }
    } catch (const Error&) {
    }
  }
  EXPECT_GT(parsed, 0);  // flips inside a GID, a name or a PSN still make a valid record
}

TEST(IbverbsEndpoint, ConnectableRecordsGiveTheRails) {
  const EndpointRecord mine = record(0, 1, {roce_nic("mlx5_0", 1), roce_nic("mlx5_1", 2)});
  EXPECT_EQ(check_connectable(mine, record(1, 0, {roce_nic("mlx5_4", 3)}), 1), 1);
  EXPECT_EQ(check_connectable(mine, record(1, 0, {roce_nic("a", 3), roce_nic("b", 4), roce_nic("c", 5)}), 1), 2);
}

TEST(IbverbsEndpoint, MismatchesNameThePeerAndTheNics) {
  const EndpointRecord mine = record(0, 5, {roce_nic("mlx5_0", 1)});
  auto message = [&](const EndpointRecord& theirs) {
    try {
      (void)check_connectable(mine, theirs, 5);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(message(record(6, 0, {roce_nic("x", 2)})), HasSubstr("given for peer 5 was made by rank 6"));
  EXPECT_THAT(message(record(5, 3, {roce_nic("x", 2)})), HasSubstr("made for rank 3, not for this rank 0"));
  const std::string layers = message(record(5, 0, {ib_nic("mlx5_7", 4)}));
  EXPECT_THAT(layers, HasSubstr("peer 5"));
  EXPECT_THAT(layers, HasSubstr("local mlx5_0:1"));
  EXPECT_THAT(layers, HasSubstr("peer 5's mlx5_7:2"));
  EXPECT_THAT(layers, HasSubstr("Ethernet (RoCE) with InfiniBand"));
  EXPECT_THAT(layers, HasSubstr("WB_IB_DEVICES"));
  NicAddress zero_gid = roce_nic("x", 2);
  zero_gid.gid = Gid{};
  EXPECT_THAT(message(record(5, 0, {zero_gid})), HasSubstr("zero GID"));
  const EndpointRecord ib_mine = record(0, 5, {ib_nic("mlx5_0", 1)});
  try {
    (void)check_connectable(ib_mine, record(5, 0, {ib_nic("mlx5_3", 0)}), 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("LID 0"));
  }
}

// --- memory keys -------------------------------------------------------------------------------------

TEST(IbverbsMemoryKey, RoundTripsAndChecksTheOwner) {
  MemoryKey key{3, 0x7f0000001000, 1 << 20, {0x1234, 0xdeadbeef}};
  const std::vector<std::byte> bytes = serialize_memory_key(key);
  EXPECT_EQ(parse_memory_key(bytes, 3), key);
  try {
    (void)parse_memory_key(bytes, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("imported from peer 4 was registered by rank 3"));
  }
  for (std::size_t n = 0; n < bytes.size(); ++n) EXPECT_THROW((void)parse_memory_key(std::span(bytes).first(n), 3), Error);
}

TEST(IbverbsMemoryKey, ImpossibleKeysAreRejected) {
  EXPECT_THROW((void)parse_memory_key(serialize_memory_key({1, ~std::uint64_t{0} - 4, 16, {1}}), 1), Error);
  EXPECT_THROW((void)parse_memory_key(serialize_memory_key({1, 4096, 16, {}}), 1), Error);
  // An empty registration has no memory region and no rkey.
  EXPECT_EQ(parse_memory_key(serialize_memory_key({1, 0, 0, {}}), 1).bytes, 0u);
  // A cma key is not an ibverbs key.
  const std::vector<std::byte> endpoint = serialize_endpoint(record(1, 0, {roce_nic("mlx5_0", 1)}));
  EXPECT_THROW((void)parse_memory_key(endpoint, 1), Error);
}

// --- settings ----------------------------------------------------------------------------------------

TEST(IbverbsDeviceList, ParsesNamesAndPorts) {
  EXPECT_TRUE(parse_device_list("").empty());
  EXPECT_TRUE(parse_device_list(" , ").empty());
  EXPECT_EQ(parse_device_list("mlx5_0"), (std::vector<DeviceSpec>{{"mlx5_0", 0}}));
  EXPECT_EQ(parse_device_list(" mlx5_0 , mlx5_1:2,mlx5_0"), (std::vector<DeviceSpec>{{"mlx5_0", 0}, {"mlx5_1", 2}}));
  for (const char* bad : {":1", "mlx5_0:", "mlx5_0:x", "mlx5_0:0", "mlx5_0:256", "mlx5_0:1:2"}) {
    try {
      (void)parse_device_list(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("WB_IB_DEVICES"));
    }
  }
}

TEST(IbverbsGid, FormatsIpv4MappedAndFullGids) {
  EXPECT_EQ(format_gid(roce_nic("x", 7).gid), "::ffff:10.0.0.7");
  EXPECT_EQ(format_gid(ib_nic("x", 1).gid), "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
}

TEST(IbverbsGid, ChoosesRoceV2WithIpv4ThenRoceV2ThenV1) {
  const Gid v6{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  const Gid link_local{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  const Gid v4{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2};
  const std::vector<GidEntry> full{{0, GidType::kRoceV1, link_local}, {1, GidType::kRoceV2, link_local},
                                   {2, GidType::kRoceV1, v4},         {3, GidType::kRoceV2, v4},
                                   {4, GidType::kRoceV2, v6}};
  EXPECT_EQ(choose_gid_index(full, LinkLayer::kEthernet, -1, "mlx5_0:1"), 3u);
  const std::vector<GidEntry> no_v4{{0, GidType::kRoceV1, link_local}, {1, GidType::kRoceV2, link_local}};
  EXPECT_EQ(choose_gid_index(no_v4, LinkLayer::kEthernet, -1, "mlx5_0:1"), 1u);
  const std::vector<GidEntry> only_v1{{0, GidType::kRoceV1, link_local}};
  EXPECT_EQ(choose_gid_index(only_v1, LinkLayer::kEthernet, -1, "mlx5_0:1"), 0u);
  EXPECT_EQ(choose_gid_index(full, LinkLayer::kEthernet, 0, "mlx5_0:1"), 0u);  // as requested
  EXPECT_EQ(choose_gid_index({}, LinkLayer::kInfiniBand, -1, "mlx5_0:1"), 0u);
  try {
    (void)choose_gid_index(full, LinkLayer::kEthernet, 9, "mlx5_0:1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("WB_IB_GID_INDEX=9: mlx5_0:1 has no GID at that index"));
    EXPECT_THAT(e.what(), HasSubstr("3 (RoCE v2 ::ffff:192.168.1.2)"));
  }
  try {
    (void)choose_gid_index({}, LinkLayer::kEthernet, -1, "mlx5_3:1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_THAT(e.what(), HasSubstr("mlx5_3:1 is an Ethernet (RoCE) port without a usable RoCE GID"));
  }
}

// --- write checks and striping -----------------------------------------------------------------------

TEST(IbverbsWrites, RangesAreCheckedAgainstRegisteredSizes) {
  const std::vector<std::uint64_t> local{1000, 64};
  const std::vector<std::uint64_t> remote{500};
  auto check = [&](WriteRequest w) {
    const std::vector<WriteRequest> writes{WriteRequest{0, 0, 0, 0, 10}, w};
    return check_write_ranges(6, writes, local, remote);
  };
  EXPECT_TRUE(check({1, 0, 0, 436, 64}).is_ok());
  EXPECT_TRUE(check({0, 1000, 0, 500, 0}).is_ok());  // empty at the very end
  const Status local_past = check({0, 990, 0, 0, 11});
  EXPECT_EQ(local_past.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(local_past.message(), HasSubstr("post_writes to peer 6: write 1 of 2 reads local memory 0 at offset 990 + 11 bytes, past its 1000 registered bytes"));
  EXPECT_THAT(check({0, 0, 0, 490, 11}).message(), HasSubstr("writes remote memory 0 of peer 6 at offset 490 + 11 bytes, past its 500"));
  EXPECT_THAT(check({2, 0, 0, 0, 1}).message(), HasSubstr("names local memory 2, but 2 regions are registered"));
  EXPECT_THAT(check({0, 0, 1, 0, 1}).message(), HasSubstr("names remote memory 1, but 1 regions were imported from peer 6"));
  // Offsets near 2^64 do not wrap around into range.
  EXPECT_FALSE(check({0, ~std::uint64_t{0} - 1, 0, 0, 4}).is_ok());
  EXPECT_FALSE(check({0, 0, 0, 8, ~std::uint64_t{0} - 2}).is_ok());
}

/// A (local memory, local offset, remote memory, remote offset, bytes) interval.
struct Span {
  std::uint32_t local_memory;
  std::uint64_t local_offset;
  std::uint32_t remote_memory;
  std::uint64_t remote_offset;
  std::uint64_t bytes;
  bool operator==(const Span&) const = default;
};

/// Sorted by local position, adjacent intervals that continue each other on both sides merged.
std::vector<Span> normalized(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.local_memory, a.local_offset) < std::tie(b.local_memory, b.local_offset);
  });
  std::vector<Span> out;
  for (const Span& s : spans) {
    if (s.bytes == 0) continue;
    if (!out.empty()) {
      Span& last = out.back();
      if (last.local_memory == s.local_memory && last.remote_memory == s.remote_memory &&
          last.local_offset + last.bytes == s.local_offset && last.remote_offset + last.bytes == s.remote_offset) {
        last.bytes += s.bytes;
        continue;
      }
    }
    out.push_back(s);
  }
  return out;
}

/// Every byte of every write is carried exactly once, to the same place, by pieces within max_message
/// (the writes of the tests do not overlap).
void expect_exact_cover(std::span<const WriteRequest> writes, const std::vector<std::vector<Piece>>& rails,
                        std::uint64_t max_message) {
  std::vector<Span> expected;
  for (const WriteRequest& w : writes) expected.push_back({w.local_memory, w.local_offset, w.remote_memory, w.remote_offset, w.bytes});
  std::vector<Span> carried;
  for (const auto& pieces : rails) {
    for (const Piece& p : pieces) {
      ASSERT_LT(p.write, writes.size());
      EXPECT_GT(p.bytes, 0u);
      EXPECT_LE(p.bytes, max_message);
      const WriteRequest& w = writes[p.write];
      carried.push_back({w.local_memory, w.local_offset + p.offset, w.remote_memory, w.remote_offset + p.offset, p.bytes});
    }
  }
  // No two pieces overlap locally.
  std::vector<Span> sorted = carried;
  std::sort(sorted.begin(), sorted.end(), [](const Span& a, const Span& b) {
    return std::tie(a.local_memory, a.local_offset) < std::tie(b.local_memory, b.local_offset);
  });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].local_memory == sorted[i - 1].local_memory) {
      EXPECT_LE(sorted[i - 1].local_offset + sorted[i - 1].bytes, sorted[i].local_offset);
    }
  }
  EXPECT_EQ(normalized(carried), normalized(expected));
}

TEST(IbverbsStripes, OneRailCarriesEveryWriteInOrderSplitAtTheMessageLimit) {
  const std::vector<WriteRequest> writes{{0, 0, 0, 0, 100}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 250}};
  std::vector<std::vector<Piece>> rails;
  StripeOptions options;
  options.max_message = 100;
  plan_stripes(writes, options, rails);
  ASSERT_EQ(rails.size(), 1u);
  EXPECT_EQ(rails[0], (std::vector<Piece>{{0, 0, 100}, {2, 0, 100}, {2, 100, 100}, {2, 200, 50}}));
  EXPECT_EQ(rail_work_requests(rails[0]), 4u);
}

TEST(IbverbsStripes, AnEmptyBatchStillEndsEveryRailWithTheImmediate) {
  std::vector<std::vector<Piece>> rails;
  StripeOptions options;
  options.rails = 3;
  plan_stripes({}, options, rails);
  ASSERT_EQ(rails.size(), 3u);
  for (const auto& pieces : rails) {
    EXPECT_TRUE(pieces.empty());
    EXPECT_EQ(rail_work_requests(pieces), 1u);  // a zero-length WRITE_WITH_IMM
  }
}

TEST(IbverbsStripes, SmallBatchesGoToOneRotatingRail) {
  const std::vector<WriteRequest> writes{{0, 0, 0, 0, 4096}, {0, 0, 0, 0, 4096}};
  std::vector<std::vector<Piece>> rails;
  StripeOptions options;
  options.rails = 4;
  options.min_stripe_bytes = 1 << 20;
  for (int first = 0; first < 6; ++first) {
    options.first_rail = first;
    plan_stripes(writes, options, rails);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(rails[static_cast<std::size_t>(r)].size(), r == first % 4 ? 2u : 0u);
  }
}

TEST(IbverbsStripes, LargeBatchesAreSharedEvenlyOnAlignedBoundaries) {
  // 3 separate writes of 10 MiB, 6 MiB and 8 MiB over 4 rails: 6 MiB each.
  const std::uint64_t mib = 1 << 20;
  const std::vector<WriteRequest> writes{
      {0, 0, 0, 0, 10 * mib}, {0, 16 * mib, 0, 16 * mib, 6 * mib}, {0, 32 * mib, 0, 32 * mib, 8 * mib}};
  std::vector<std::vector<Piece>> rails;
  StripeOptions options;
  options.rails = 4;
  options.min_stripe_bytes = mib;
  plan_stripes(writes, options, rails);
  ASSERT_EQ(rails.size(), 4u);
  EXPECT_EQ(rails[0], (std::vector<Piece>{{0, 0, 6 * mib}}));
  EXPECT_EQ(rails[1], (std::vector<Piece>{{0, 6 * mib, 4 * mib}, {1, 0, 2 * mib}}));
  EXPECT_EQ(rails[2], (std::vector<Piece>{{1, 2 * mib, 4 * mib}, {2, 0, 2 * mib}}));
  EXPECT_EQ(rails[3], (std::vector<Piece>{{2, 2 * mib, 6 * mib}}));
  expect_exact_cover(writes, rails, options.max_message);
}

TEST(IbverbsStripes, ContiguousWritesBecomeOneWorkRequest) {
  // 2000 writes of a packed buffer: each continues the previous one on both sides.
  std::vector<WriteRequest> writes;
  for (std::uint64_t i = 0; i < 2000; ++i) writes.push_back({1, 4096 + 100 * i, 2, 8192 + 100 * i, 100});
  std::vector<std::vector<Piece>> rails;
  StripeOptions options;
  plan_stripes(writes, options, rails);
  EXPECT_EQ(rails[0], (std::vector<Piece>{{0, 0, 200000}}));
  // A gap on either side, another memory, or an empty write in between (which is skipped) decide.
  writes = {{1, 0, 2, 0, 10}, {1, 10, 2, 10, 0}, {1, 10, 2, 10, 5}, {1, 15, 2, 16, 5}, {1, 20, 2, 21, 5},
            {0, 25, 2, 26, 5}, {0, 30, 3, 31, 5}, {0, 36, 3, 36, 5}};
  plan_stripes(writes, options, rails);
  EXPECT_EQ(rails[0], (std::vector<Piece>{{0, 0, 15}, {3, 0, 10}, {5, 0, 5}, {6, 0, 5}, {7, 0, 5}}));
  expect_exact_cover(writes, rails, options.max_message);
  // Striped: the merged run is cut at the rail boundaries.
  options.rails = 2;
  options.alignment = 1;
  writes = {{0, 0, 0, 0, 60}, {0, 60, 0, 60, 40}};
  plan_stripes(writes, options, rails);
  EXPECT_EQ(rails[0], (std::vector<Piece>{{0, 0, 50}}));
  EXPECT_EQ(rails[1], (std::vector<Piece>{{0, 50, 50}}));
}

TEST(IbverbsStripes, RandomBatchesAreCoveredExactly) {
  std::mt19937_64 rng(5);
  std::vector<std::vector<Piece>> rails;
  for (int trial = 0; trial < 1000; ++trial) {
    // Writes that often continue each other, sometimes with a gap, an empty write or another memory.
    std::vector<WriteRequest> writes(rng() % 12);
    std::uint64_t total = 0, local = 0, remote = 0;
    for (WriteRequest& w : writes) {
      if (rng() % 3 == 0) local += rng() % 5000;
      if (rng() % 3 == 0) remote += rng() % 5000;
      w.local_memory = rng() % 6 == 0 ? 1 : 0;
      w.remote_memory = rng() % 6 == 0 ? 1 : 0;
      w.local_offset = local + (w.local_memory == 1 ? 1u << 30 : 0);
      w.remote_offset = remote + (w.remote_memory == 1 ? 1u << 30 : 0);
      w.bytes = rng() % 5 == 0 ? 0 : rng() % (1 << 22);
      local += w.bytes;
      remote += w.bytes;
      total += w.bytes;
    }
    StripeOptions options;
    options.rails = 1 + static_cast<int>(rng() % 4);
    options.first_rail = static_cast<int>(rng() % 8);
    options.max_message = 1 + rng() % (1 << 21);
    options.min_stripe_bytes = rng() % (1 << 20);
    options.alignment = std::uint64_t{1} << (rng() % 13);
    plan_stripes(writes, options, rails);
    ASSERT_EQ(rails.size(), static_cast<std::size_t>(options.rails));
    expect_exact_cover(writes, rails, options.max_message);
    // When striped, no rail carries much more than its share.
    const auto rails64 = static_cast<std::uint64_t>(options.rails);
    if (options.rails > 1 && total >= rails64 && total / rails64 >= options.min_stripe_bytes) {
      const std::uint64_t share = (total + rails64 - 1) / rails64 + options.alignment;
      for (const auto& pieces : rails) {
        std::uint64_t bytes = 0;
        for (const Piece& p : pieces) bytes += p.bytes;
        EXPECT_LE(bytes, share);
      }
    }
  }
}

// --- accounting --------------------------------------------------------------------------------------

TEST(IbverbsSendQueue, SlotsAreHeldUntilTheSignalledCompletion) {
  SendQueue sq(8);
  EXPECT_TRUE(sq.fits(8));
  EXPECT_FALSE(sq.fits(9));
  sq.push(100, 5);
  sq.push(101, 2);
  EXPECT_EQ(sq.free_slots(), 1u);
  EXPECT_FALSE(sq.fits(2));  // the caller returns kRetryLater with nothing posted
  std::uint32_t freed = 0;
  const Status wrong = sq.complete(101, freed);
  EXPECT_EQ(wrong.code(), ErrorCode::kInternal);
  EXPECT_THAT(wrong.message(), HasSubstr("oldest batch in flight has token 100"));
  ASSERT_TRUE(sq.complete(100, freed).is_ok());
  EXPECT_EQ(freed, 5u);
  EXPECT_TRUE(sq.fits(6));
  ASSERT_TRUE(sq.complete(101, freed).is_ok());
  EXPECT_EQ(sq.outstanding(), 0u);
  EXPECT_EQ(sq.complete(102, freed).code(), ErrorCode::kInternal);
}

TEST(IbverbsSendQueue, StaysConsistentOverManyBatches) {
  SendQueue sq(16);
  std::mt19937 rng(3);
  std::deque<std::pair<std::uint64_t, std::uint32_t>> model;
  std::uint64_t next = 0;
  std::uint32_t outstanding = 0;
  for (int step = 0; step < 10000; ++step) {
    const auto wrs = 1 + static_cast<std::uint32_t>(rng() % 6);
    if (rng() % 2 == 0 && sq.fits(wrs)) {
      sq.push(next, wrs);
      model.push_back({next++, wrs});
      outstanding += wrs;
    } else if (!model.empty()) {
      std::uint32_t freed = 0;
      ASSERT_TRUE(sq.complete(model.front().first, freed).is_ok());
      EXPECT_EQ(freed, model.front().second);
      outstanding -= freed;
      model.pop_front();
    }
    ASSERT_EQ(sq.outstanding(), outstanding);
    ASSERT_EQ(sq.batches_in_flight(), model.size());
  }
}

TEST(IbverbsBatches, ABatchCompletesWhenEveryRailHas) {
  BatchTracker batches;
  batches.reset(2, 4);
  batches.push(7);
  batches.push(8);
  std::uint64_t token = 0;
  ASSERT_TRUE(batches.rail_done(1, 7).is_ok());
  ASSERT_TRUE(batches.rail_done(1, 8).is_ok());  // rail 1 runs ahead
  EXPECT_FALSE(batches.pop_complete(token));
  ASSERT_TRUE(batches.rail_done(0, 7).is_ok());
  ASSERT_TRUE(batches.pop_complete(token));
  EXPECT_EQ(token, 7u);
  EXPECT_FALSE(batches.pop_complete(token));
  EXPECT_EQ(batches.rail_done(0, 9).code(), ErrorCode::kInternal);  // 8 was next on rail 0
  ASSERT_TRUE(batches.rail_done(0, 8).is_ok());
  ASSERT_TRUE(batches.pop_complete(token));
  EXPECT_EQ(token, 8u);
  EXPECT_EQ(batches.in_flight(), 0u);
  EXPECT_EQ(batches.rail_done(0, 8).code(), ErrorCode::kInternal);  // nothing in flight
}

TEST(IbverbsArrivals, OneRailReportsEachImmediate) {
  ArrivalMatcher arrivals;
  arrivals.reset(1);
  bool complete = false;
  std::uint32_t immediate = 0;
  for (std::uint32_t i = 0; i < 100; ++i) {
    ASSERT_TRUE(arrivals.arrive(0, i * 3, complete, immediate).is_ok());
    EXPECT_TRUE(complete);
    EXPECT_EQ(immediate, i * 3);
  }
}

TEST(IbverbsArrivals, SeveralRailsReportABatchOnceItArrivedOnAll) {
  ArrivalMatcher arrivals;
  arrivals.reset(3);
  bool complete = false;
  std::uint32_t immediate = 0;
  ASSERT_TRUE(arrivals.arrive(2, 10, complete, immediate).is_ok());
  EXPECT_FALSE(complete);
  ASSERT_TRUE(arrivals.arrive(2, 11, complete, immediate).is_ok());
  ASSERT_TRUE(arrivals.arrive(0, 10, complete, immediate).is_ok());
  EXPECT_FALSE(complete);
  ASSERT_TRUE(arrivals.arrive(1, 10, complete, immediate).is_ok());
  EXPECT_TRUE(complete);
  EXPECT_EQ(immediate, 10u);
  EXPECT_EQ(arrivals.pending(2), 1u);
  ASSERT_TRUE(arrivals.arrive(0, 11, complete, immediate).is_ok());
  EXPECT_FALSE(complete);
  const Status mismatch = arrivals.arrive(1, 12, complete, immediate);
  EXPECT_EQ(mismatch.code(), ErrorCode::kCorruptData);
  EXPECT_THAT(mismatch.message(), HasSubstr("rail 0 carried 0xb, rail 1 carried 0xc"));
}

TEST(IbverbsImmediate, TravelsBigEndian) {
  const std::uint32_t wire = immediate_to_wire(0x01020304);
  unsigned char bytes[4];
  std::memcpy(bytes, &wire, 4);
  EXPECT_EQ(bytes[0], 0x01);
  EXPECT_EQ(bytes[3], 0x04);
  EXPECT_EQ(immediate_from_wire(wire), 0x01020304u);
}

TEST(IbverbsRing, KeepsOrderWhileGrowing) {
  Ring<int> ring(2);
  for (int i = 0; i < 5; ++i) ring.push_back(i);
  ring.pop_front();
  ring.pop_front();
  for (int i = 5; i < 40; ++i) ring.push_back(i);
  for (int i = 2; i < 40; ++i) {
    ASSERT_EQ(ring.front(), i);
    ring.pop_front();
  }
  EXPECT_TRUE(ring.empty());
}

// --- messages ----------------------------------------------------------------------------------------

TEST(IbverbsMessages, AFailedWriteNamesPeerNicStatusOpcodeVendorErrorAndToken) {
  CompletionError e;
  e.peer = 3;
  e.nic = "mlx5_0:1";
  e.rail = 1;
  e.status_text = "transport retry counter exceeded";
  e.status = IBV_WC_RETRY_EXC_ERR;
  e.opcode = wc_opcode_name(IBV_WC_RDMA_WRITE);
  e.vendor_err = 0x81;
  e.wr_id = 42;
  const std::string text = describe_completion_error(e);
  EXPECT_THAT(text, HasSubstr("RDMA write to peer 3 failed on mlx5_0:1 (rail 1): transport retry counter exceeded"));
  EXPECT_THAT(text, HasSubstr("opcode RDMA_WRITE"));
  EXPECT_THAT(text, HasSubstr("vendor_err 0x81"));
  EXPECT_THAT(text, HasSubstr("batch token 42"));
  EXPECT_THAT(text, HasSubstr("dead, unreachable"));

  e.receive = true;
  e.status = IBV_WC_LOC_LEN_ERR;
  e.status_text = "local length error";
  const std::string receive = describe_completion_error(e);
  EXPECT_THAT(receive, HasSubstr("RDMA receive of an immediate from peer 3"));
  EXPECT_THAT(receive, Not(HasSubstr("token")));
  EXPECT_EQ(wc_opcode_name(IBV_WC_RECV_RDMA_WITH_IMM), "RECV_RDMA_WITH_IMM");
  EXPECT_EQ(wc_opcode_name(77), "opcode 77");
  EXPECT_THAT(completion_error_hint(IBV_WC_REM_ACCESS_ERR), HasSubstr("rkey"));
  EXPECT_EQ(completion_error_hint(IBV_WC_SUCCESS), "");
}

}  // namespace
}  // namespace wb::ibv
