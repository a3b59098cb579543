// The ibverbs transport's device-free logic, on any machine: the factory's "no RDMA device" answer (so the
// caller can choose another transport), the settings (WB_IB_DEVICES include/exclude lists, switches,
// P_Key, address ranges, queue sizes), the wire records (endpoint records and memory keys: round trip,
// validation naming the peer as "rank N", truncation and corruption, GID type and family mismatches),
// addressing (GID choice by RoCE version, family and range without link-local GIDs; FLIDs; P_Key
// index; GRH and DLID of a route), the rails (write checks with owners, striping, send queue, completion
// credits, batches, arrivals, receive budget), failed completions and asynchronous events in words, the
// GPU registration and flush decisions, and NIC locality over canned PCI paths. test_ibverbs_fake.cpp
// runs the transport itself over a fake libibverbs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>  // enum values only

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <tuple>

#include "../support/expect_error.hpp"
#include "core/settings.hpp"
#include "ibverbs_test_support.hpp"
#include "transport/ibverbs/ibverbs_addressing.hpp"
#include "transport/ibverbs/ibverbs_config.hpp"
#include "transport/ibverbs/ibverbs_errors.hpp"
#include "transport/ibverbs/ibverbs_gpu_policy.hpp"
#include "transport/ibverbs/ibverbs_rails.hpp"
#include "transport/ibverbs/ibverbs_topology.hpp"
#include "transport/ibverbs/ibverbs_transport.hpp"
#include "transport/ibverbs/ibverbs_wire.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

using wb::testing::expect_error;

using ::testing::AnyOf;
using testing::SettingScope;
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
    // find no device, or devices without an active port, or libibverbs may not be installed.
    EXPECT_THAT(e.what(), AnyOf(HasSubstr("ibv_get_device_list failed: "), HasSubstr("returned no device"),
                                HasSubstr("no usable active port"), HasSubstr("cannot load")));
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
    // Only the absence of a device is a reason to skip; any other error on a machine with one is a failure.
    if (e.code() == ErrorCode::kUnsupported && std::string_view(e.what()).find("no RDMA device") != std::string_view::npos)
      GTEST_SKIP() << e.what();
    FAIL() << "an RDMA device may be here, but the transport failed: " << e.what();
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
  EXPECT_EQ(timeout->range_text(), "[1, 31]");  // declared with the setting, shown in --help
  expect_error([&] { timeout->override_from_text("99"); }, ErrorCode::kInvalidArgument,
               {"WB_IB_TIMEOUT", "'99' is not in [1, 31]"});
  EXPECT_EQ(timeout->value_text(), before) << "a refused value leaves the setting as it was";
  const Config config = read_config();
  EXPECT_EQ(config.timeout, 20);
  EXPECT_EQ(config.sq_depth, 512u);
  EXPECT_TRUE(config.devices.entries.empty());
  EXPECT_EQ(config.library, "libibverbs.so.1");
  EXPECT_TRUE(config.fork_safe);
  EXPECT_EQ(config.qps_per_connection, 1);
  EXPECT_EQ(config.relaxed_ordering, Switch::kAuto);  // on where supported
  EXPECT_EQ(config.adaptive_routing, Switch::kAuto);
  EXPECT_EQ(config.dmabuf, Switch::kAuto);
  EXPECT_EQ(config.pkey, 0);
}

// The error of setting `name` to `value` and reading the configuration: a value out of a numeric
// setting's range is refused as it is set, anything else when read_config validates it.
std::string config_error(const char* name, const std::string& value) {
  SettingScope scope;
  try {
    scope.set(name, value);
    (void)read_config();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "accepted";
}

TEST(IbverbsSettings, EveryNewSettingIsValidatedNamingItsVariable) {
  EXPECT_THAT(config_error("ib_qps_per_connection", "17"), HasSubstr("(WB_IB_QPS_PER_CONNECTION / --ib-qps-per-connection): '17' is not in [1, 16]"));
  EXPECT_THAT(config_error("ib_roce_version", "3"), HasSubstr("(WB_IB_ROCE_VERSION / --ib-roce-version): '3' is not in [0, 2]"));
  EXPECT_THAT(config_error("ib_addr_family", "AF_UNIX"), HasSubstr("WB_IB_ADDR_FAMILY='AF_UNIX'"));
  EXPECT_THAT(config_error("ib_addr_range", "10.0.0.0"), HasSubstr("WB_IB_ADDR_RANGE='10.0.0.0': no '/'"));
  EXPECT_THAT(config_error("ib_addr_range", "10.0.0.0/33"), HasSubstr("at most 32 bits"));
  EXPECT_THAT(config_error("ib_pkey", "0x10000"), HasSubstr("WB_IB_PKEY='0x10000' is not a P_Key"));
  EXPECT_THAT(config_error("ib_pkey", "-1"), HasSubstr("WB_IB_PKEY='-1'"));
  EXPECT_THAT(config_error("ib_relaxed_ordering", "maybe"), HasSubstr("WB_IB_RELAXED_ORDERING='maybe' is not auto, on or off"));
  EXPECT_THAT(config_error("ib_adaptive_routing", "2"), HasSubstr("WB_IB_ADAPTIVE_ROUTING"));
  EXPECT_THAT(config_error("ib_dmabuf", "x"), HasSubstr("WB_IB_DMABUF"));
  EXPECT_THAT(config_error("ib_nic_locality", "closest"), HasSubstr("WB_IB_NIC_LOCALITY='closest'"));
  EXPECT_THAT(config_error("ib_sq_depth", "1"), HasSubstr("(WB_IB_SQ_DEPTH / --ib-sq-depth): '1' is not in [2, 65536]"));
  EXPECT_THAT(config_error("ib_batches_in_flight", "0"), HasSubstr("(WB_IB_BATCHES_IN_FLIGHT / --ib-batches-in-flight): '0' is not in [1, 65536]"));
  {
    SettingScope scope;
    scope.set("ib_addr_family", "ipv6");
    EXPECT_THAT(config_error("ib_addr_range", "10.0.0.0/8"), HasSubstr("is an IPv4 range, but WB_IB_ADDR_FAMILY asks for IPv6"));
  }
  SettingScope scope;
  scope.set("ib_pkey", "0x8001");
  scope.set("ib_relaxed_ordering", "0");  // a boolean from before keeps its meaning
  scope.set("ib_addr_family", "AF_INET6");
  scope.set("ib_addr_range", "fd00::/8");
  const Config config = read_config();
  EXPECT_EQ(config.pkey, 0x8001);
  EXPECT_EQ(config.relaxed_ordering, Switch::kOff);
  EXPECT_EQ(config.gid.family, AddressFamily::kIpv6);
  EXPECT_EQ(config.gid.range.bits, 8);
}

TEST(IbverbsSettings, SwitchesAndPKeysParse) {
  for (const char* on : {"on", "ON", "1", "true", "yes"}) EXPECT_EQ(parse_switch(on, "X"), Switch::kOn) << on;
  for (const char* off : {"off", "0", "false", "No"}) EXPECT_EQ(parse_switch(off, "X"), Switch::kOff) << off;
  EXPECT_EQ(parse_switch("", "X"), Switch::kAuto);
  EXPECT_EQ(parse_switch(" auto ", "X"), Switch::kAuto);
  EXPECT_EQ(parse_pkey("0xffff"), 0xffff);
  EXPECT_EQ(parse_pkey("32769"), 0x8001);
  EXPECT_EQ(parse_pkey(" 0 "), 0);
  for (const char* bad : {"", "0x", "12ab", "65536", "+1"}) EXPECT_THROW((void)parse_pkey(bad), Error) << bad;
}

TEST(IbverbsSettings, QueueSizesFollowTheDeviceAndTheSettings) {
  Config config;
  config.sq_depth = 512;
  // Auto: the device's receives up to 16384, the completion queue for them and 16 send queues.
  QueueSizes sizes = choose_queue_sizes(config, 32767, 4194303, "mlx5_0:1");
  EXPECT_EQ(sizes.srq, kAutoSrqDepth);
  EXPECT_EQ(sizes.cq, kAutoSrqDepth + 16 * 512);
  // A small device: its limits, as long as one full send queue still fits.
  sizes = choose_queue_sizes(config, 1024, 4096, "rxe0:1");
  EXPECT_EQ(sizes.srq, 1024u);
  EXPECT_EQ(sizes.cq, 4096u);
  EXPECT_THAT([&] {
    try {
      (void)choose_queue_sizes(config, 4000, 4096, "rxe0:1");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  }(), HasSubstr("rxe0:1 allows 4096 completion queue entries"));
  config.srq_depth = 2048;
  EXPECT_THROW((void)choose_queue_sizes(config, 1024, 4194303, "mlx5_0:1"), Error) << "more receives than the device has";
  config.srq_depth = 100;
  config.cq_depth = 50;  // too small: raised to the receives plus one send queue and its drain marker
  sizes = choose_queue_sizes(config, 1024, 4194303, "mlx5_0:1");
  EXPECT_EQ(sizes.srq, 100u);
  EXPECT_EQ(sizes.cq, 100u + 512 + 2);
  config.cq_depth = 5000;
  EXPECT_THROW((void)choose_queue_sizes(config, 1024, 4096, "mlx5_0:1"), Error) << "an explicit depth beyond the device";
  EXPECT_TRUE(adaptive_routing_on(Switch::kAuto, LinkLayer::kInfiniBand));
  EXPECT_FALSE(adaptive_routing_on(Switch::kAuto, LinkLayer::kEthernet));
  EXPECT_TRUE(adaptive_routing_on(Switch::kOn, LinkLayer::kEthernet));
  EXPECT_FALSE(adaptive_routing_on(Switch::kOff, LinkLayer::kInfiniBand));
}

// --- endpoint records --------------------------------------------------------------------------------

NicAddress roce_nic(const std::string& device, std::uint8_t last_octet) {
  NicAddress nic;
  nic.device = device;
  nic.port = 1;
  nic.link_layer = LinkLayer::kEthernet;
  nic.gid = Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last_octet};
  nic.gid_index = 3;
  nic.gid_type = GidType::kRoceV2;
  nic.family = AddressFamily::kIpv4;
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
  nic.gid_type = GidType::kIb;
  nic.family = AddressFamily::kIpv6;
  nic.mtu = 4;
  nic.max_message = std::uint64_t{1} << 31;
  return nic;
}

EndpointRecord record(int rank, int peer, std::vector<NicAddress> nics, int qps_per_nic = 1) {
  EndpointRecord r;
  r.rank = rank;
  r.peer = peer;
  r.qps_per_nic = qps_per_nic;
  r.batches_in_flight = 64;
  for (std::size_t i = 0; i < nics.size() * static_cast<std::size_t>(qps_per_nic); ++i)
    r.qps.push_back(QueuePairAddress{static_cast<std::uint32_t>(0x100 + 17 * i + rank), static_cast<std::uint32_t>(0xabcde0 + i)});
  r.nics = std::move(nics);
  return r;
}

TEST(IbverbsEndpoint, RoundTrips) {
  const EndpointRecord original = record(7, 2, {roce_nic("mlx5_0", 1), ib_nic("mlx5_1", 0x1234)});
  const std::vector<std::byte> bytes = serialize_endpoint(original);
  EXPECT_LT(bytes.size(), 120u);  // a few dozen bytes a NIC
  EXPECT_EQ(parse_endpoint(bytes, 7), original);
  // Several queue pairs per NIC, and what the receiver needs to size its receives.
  EndpointRecord multi = record(1, 0, {roce_nic("mlx5_0", 1), roce_nic("mlx5_1", 2)}, 3);
  multi.batches_in_flight = 1000;
  multi.nics[1].gid_type = GidType::kRoceV1;
  EXPECT_EQ(parse_endpoint(serialize_endpoint(multi), 1), multi);
}

TEST(IbverbsEndpoint, EveryTruncationIsAClearErrorNamingThePeer) {
  const std::vector<std::byte> bytes = serialize_endpoint(record(4, 0, {roce_nic("mlx5_0", 1), roce_nic("mlx5_1", 2)}));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    try {
      (void)parse_endpoint(std::span(bytes).first(n), 4);
      ADD_FAILURE() << "a record cut to " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_THAT(e.code(), AnyOf(ErrorCode::kCorruptData, ErrorCode::kInvalidArgument));
      EXPECT_THAT(e.what(), HasSubstr("ibverbs endpoint record of rank 4"));
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
  expect_error([&] { (void)parse_endpoint(foreign, 1); }, ErrorCode::kInvalidArgument, {"made by another transport"});
  bytes[4] = std::byte{kEndpointVersion + 1};
  try {
    (void)parse_endpoint(bytes, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("format version 3; this build reads version 2"));
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
  EXPECT_EQ(check_connectable(mine, record(1, 0, {roce_nic("mlx5_4", 3)}), 1).rails(), 1);
  EXPECT_EQ(check_connectable(mine, record(1, 0, {roce_nic("a", 3), roce_nic("b", 4), roce_nic("c", 5)}), 1).rails(), 2);
  const Connection four = check_connectable(record(0, 1, {roce_nic("mlx5_0", 1), roce_nic("mlx5_1", 2)}, 2),
                                            record(1, 0, {roce_nic("a", 3), roce_nic("b", 4)}, 2), 1);
  EXPECT_EQ(four.nic_pairs, 2);
  EXPECT_EQ(four.qps_per_nic, 2);
  EXPECT_EQ(four.rails(), 4);
  // Rails alternate NICs first: rail r runs over NIC pair r % 2, on that NIC's queue pair r / 2.
  EXPECT_EQ(rail_nic(0, 2), 0);
  EXPECT_EQ(rail_nic(1, 2), 1);
  EXPECT_EQ(rail_nic(2, 2), 0);
  EXPECT_EQ(rail_qp_on_nic(2, 2), 1);
  EXPECT_EQ(rail_qp_on_nic(3, 2), 1);
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
  EXPECT_THAT(message(record(6, 0, {roce_nic("x", 2)})), HasSubstr("given for rank 5 was made by rank 6"));
  EXPECT_THAT(message(record(5, 3, {roce_nic("x", 2)})), HasSubstr("made for rank 3, not for this rank 0"));
  const std::string layers = message(record(5, 0, {ib_nic("mlx5_7", 4)}));
  EXPECT_THAT(layers, HasSubstr("cannot connect to rank 5"));
  EXPECT_THAT(layers, HasSubstr("local mlx5_0:1"));
  EXPECT_THAT(layers, HasSubstr("rank 5's mlx5_7:2"));
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
  // RoCE v1 and v2, IPv4 and IPv6 GIDs do not talk: an error at connect, not a retry-exceeded later.
  NicAddress v1 = roce_nic("x", 2);
  v1.gid_type = GidType::kRoceV1;
  const std::string versions = message(record(5, 0, {v1}));
  EXPECT_THAT(versions, HasSubstr("pairs a RoCE v2 GID (index 3) with a RoCE v1 GID (index 3)"));
  EXPECT_THAT(versions, HasSubstr("WB_IB_ROCE_VERSION"));
  NicAddress v6 = roce_nic("x", 2);
  v6.gid = Gid{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9};
  v6.family = AddressFamily::kIpv6;
  const std::string families = message(record(5, 0, {v6}));
  EXPECT_THAT(families, HasSubstr("pairs an IPv4 GID (::ffff:10.0.0.1) with an IPv6 GID (fd00:"));
  EXPECT_THAT(families, HasSubstr("WB_IB_ADDR_FAMILY"));
  try {
    (void)check_connectable(record(0, 5, {roce_nic("a", 1)}, 2), record(5, 0, {roce_nic("b", 2)}, 1), 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 5: it opens 1 queue pair(s) per NIC, this rank 2; set WB_IB_QPS_PER_CONNECTION"));
  }
}

// --- memory keys -------------------------------------------------------------------------------------

TEST(IbverbsMemoryKey, RoundTripsAndChecksTheOwner) {
  MemoryKey key{3, 0x7f0000001000, 1 << 20, {0x1234, 0xdeadbeef}};
  const std::vector<std::byte> bytes = serialize_memory_key(key);
  EXPECT_EQ(parse_memory_key(bytes, 3), key);
  expect_error([&] { (void)parse_memory_key(bytes, 4); }, ErrorCode::kInvalidArgument,
               {"imported from rank 4 was registered by rank 3"});
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

TEST(IbverbsDeviceList, IncludesExcludesPrefixesAndPorts) {
  EXPECT_TRUE(parse_device_filter("").entries.empty());
  EXPECT_TRUE(parse_device_filter(" , ").entries.empty());
  EXPECT_TRUE(parse_device_filter("").admits("anything", 3));
  const DeviceFilter some = parse_device_filter(" mlx5_0 , mlx5_1:2,mlx5_0");
  EXPECT_EQ(some.entries, (std::vector<DeviceSpec>{{"mlx5_0", false, 0}, {"mlx5_1", false, 2}}));
  EXPECT_FALSE(some.exclude);
  EXPECT_TRUE(some.admits("mlx5_0", 1));
  EXPECT_TRUE(some.admits("mlx5_1", 2));
  EXPECT_FALSE(some.admits("mlx5_1", 1));
  EXPECT_FALSE(some.admits("mlx5_10", 1)) << "a name is not a prefix unless it ends in *";
  const DeviceFilter prefix = parse_device_filter("mlx5_*");
  EXPECT_TRUE(prefix.admits("mlx5_10", 1));
  EXPECT_FALSE(prefix.admits("bnxt_re0", 1));
  const DeviceFilter exclude = parse_device_filter("^mlx5_2,mlx5_3:2");
  EXPECT_TRUE(exclude.exclude);
  EXPECT_TRUE(exclude.admits("mlx5_0", 1));
  EXPECT_FALSE(exclude.admits("mlx5_2", 1));
  EXPECT_TRUE(exclude.admits("mlx5_3", 1));
  EXPECT_FALSE(exclude.admits("mlx5_3", 2));
  for (const char* bad : {":1", "mlx5_0:", "mlx5_0:x", "mlx5_0:0", "mlx5_0:256", "mlx5_0:1:2", "^", "ml*x5", "a^b"}) {
    expect_error([&] { (void)parse_device_filter(bad); }, ErrorCode::kInvalidArgument, {"WB_IB_DEVICES"});
  }
}

TEST(IbverbsGid, FormatsIpv4MappedAndFullGids) {
  EXPECT_EQ(format_gid(roce_nic("x", 7).gid), "::ffff:10.0.0.7");
  EXPECT_EQ(format_gid(ib_nic("x", 1).gid), "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
}

GidPreferences prefer(int version = 0, AddressFamily family = AddressFamily::kAny, const std::string& range = "",
                      std::int64_t requested = -1) {
  GidPreferences p;
  p.requested = requested;
  p.roce_version = version;
  p.family = family;
  p.range = parse_address_range(range, "WB_IB_ADDR_RANGE");
  return p;
}

TEST(IbverbsGid, NeverLinkLocalAndByVersionFamilyAndRange) {
  const Gid v6{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  const Gid link_local{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  const Gid v4{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2};
  const Gid v4_other{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
  const std::vector<GidEntry> full{{0, GidType::kRoceV1, link_local}, {1, GidType::kRoceV2, link_local},
                                   {2, GidType::kRoceV1, v4},         {3, GidType::kRoceV2, v4},
                                   {4, GidType::kRoceV2, v6},         {5, GidType::kRoceV2, v4_other}};
  const LinkLayer eth = LinkLayer::kEthernet;
  EXPECT_EQ(choose_gid_index(full, eth, prefer(), "mlx5_0:1"), 3u) << "RoCE v2, IPv4, lowest index";
  EXPECT_EQ(choose_gid_index(full, eth, prefer(1), "mlx5_0:1"), 2u) << "RoCE v1 asked for";
  EXPECT_EQ(choose_gid_index(full, eth, prefer(0, AddressFamily::kIpv6), "mlx5_0:1"), 4u) << "IPv6 asked for";
  EXPECT_EQ(choose_gid_index(full, eth, prefer(0, AddressFamily::kAny, "10.0.0.0/8"), "mlx5_0:1"), 5u) << "in the range";
  EXPECT_EQ(choose_gid_index(full, eth, prefer(0, AddressFamily::kAny, "2001:db8::/32"), "mlx5_0:1"), 4u);
  EXPECT_EQ(choose_gid_index(full, eth, prefer(0, AddressFamily::kAny, "", 1), "mlx5_0:1"), 1u) << "an index as requested";
  // Only link-local GIDs: none is usable (they do not route), whatever the version.
  const std::vector<GidEntry> only_link_local{{0, GidType::kRoceV1, link_local}, {1, GidType::kRoceV2, link_local}};
  expect_error([&] { (void)choose_gid_index(only_link_local, eth, prefer(), "mlx5_3:1"); }, ErrorCode::kUnsupported,
               {"mlx5_3:1 is an Ethernet (RoCE) port without a usable GID (RoCE v1 or v2, not link-local", "1 (RoCE v2 fe80:0000:0000:0000:0102:0304:0506:0708)"});
  try {
    (void)choose_gid_index(full, eth, prefer(2, AddressFamily::kIpv4, "172.16.0.0/12"), "mlx5_3:1");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("RoCE v2, IPv4, in WB_IB_ADDR_RANGE"));
  }
  expect_error([&] { (void)choose_gid_index(full, eth, prefer(0, AddressFamily::kAny, "", 9), "mlx5_0:1"); }, ErrorCode::kInvalidArgument,
               {"WB_IB_GID_INDEX=9: mlx5_0:1 has no GID at that index", "3 (RoCE v2 ::ffff:192.168.1.2)"});
  // InfiniBand: index 0, or the GID with a FLID (routable between subnets).
  EXPECT_EQ(choose_gid_index({}, LinkLayer::kInfiniBand, prefer(), "mlx5_0:1"), 0u);
  const Gid ib_port{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0, 0, 1};
  const Gid ib_flid{0xfe, 0xc0, 0, 0, 0x00, 0x2a, 0x00, 0x01, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0, 0, 1};
  const std::vector<GidEntry> ib{{0, GidType::kIb, ib_port}, {1, GidType::kIb, ib_flid}};
  EXPECT_EQ(choose_gid_index(ib, LinkLayer::kInfiniBand, prefer(), "mlx5_0:1"), 1u);
}

TEST(IbverbsGid, FamiliesRangesFlidsSubnetsAndSysfsTypes) {
  const Gid v4{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
  const Gid v6{0xfd, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(gid_family(v4), AddressFamily::kIpv4);
  EXPECT_EQ(gid_family(v6), AddressFamily::kIpv6);
  EXPECT_TRUE(gid_is_link_local(Gid{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9}));
  EXPECT_FALSE(gid_is_link_local(Gid{0xfe, 0x80, 0, 0, 0, 0, 0, 1, 9, 9, 9, 9, 9, 9, 9, 9})) << "fe80::/64 only";
  EXPECT_FALSE(gid_is_link_local(v6));
  const AddressRange ten = parse_address_range("10.0.0.0/8", "X");
  EXPECT_TRUE(ten.contains(v4));
  EXPECT_FALSE(ten.contains(v6));
  EXPECT_FALSE(parse_address_range("10.2.0.0/16", "X").contains(v4));
  EXPECT_TRUE(parse_address_range("10.1.2.3/32", "X").contains(v4));
  EXPECT_TRUE(parse_address_range("fd00::/8", "X").contains(v6));
  EXPECT_TRUE(parse_address_range("fd12::/15", "X").contains(v6));
  EXPECT_FALSE(parse_address_range("fd13::/16", "X").contains(v6));
  EXPECT_TRUE(parse_address_range("", "X").contains(v6));
  for (const char* bad : {"10.0.0.0/", "10.0.0.0/x", "nonsense/8", "fd00::/129"}) EXPECT_THROW((void)parse_address_range(bad, "X"), Error) << bad;
  // FLID form: fec0::/10 with 22 zero bits, then the FLID and the local subnet prefix.
  const Gid a{0xfe, 0xc0, 0, 0, 0x00, 0x05, 0x00, 0x01, 1, 1, 1, 1, 1, 1, 1, 1};
  const Gid b{0xfe, 0xc0, 0, 0, 0x00, 0x07, 0x00, 0x01, 2, 2, 2, 2, 2, 2, 2, 2};
  const Gid c{0xfe, 0xc0, 0, 0, 0x00, 0x09, 0x00, 0x02, 3, 3, 3, 3, 3, 3, 3, 3};
  EXPECT_EQ(gid_flid(a), 5);
  EXPECT_EQ(gid_flid(Gid{0xfe, 0x80, 0, 0, 0x00, 0x05, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}), 0) << "not the FLID form";
  EXPECT_EQ(gid_flid(Gid{0xfe, 0xc0, 0, 1, 0x00, 0x05, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}), 0) << "the 22 bits must be zero";
  EXPECT_TRUE(same_ib_subnet(a, b)) << "different FLIDs, one local subnet";
  EXPECT_FALSE(same_ib_subnet(a, c));
  const Gid p1{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  const Gid p2{0xfe, 0x80, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2};
  EXPECT_TRUE(same_ib_subnet(p1, Gid{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9, 9, 9}));
  EXPECT_FALSE(same_ib_subnet(p1, p2));
  EXPECT_EQ(parse_gid_type_text("RoCE v2\n"), GidType::kRoceV2);
  EXPECT_EQ(parse_gid_type_text("IB/RoCE v1\n"), GidType::kRoceV1);
  EXPECT_EQ(parse_gid_type_text(""), std::nullopt);
  EXPECT_EQ(parse_gid_type_text("RoCE v3"), std::nullopt);
}

TEST(IbverbsPKey, TheIndexOfThePartitionFullMembersFirst) {
  const std::vector<std::uint16_t> table{0xffff, 0x0005, 0x8005, 0x8001, 0};
  EXPECT_EQ(choose_pkey_index(table, 0, "mlx5_0:1"), 0) << "the default partition";
  EXPECT_EQ(choose_pkey_index(table, 0x8005, "mlx5_0:1"), 2) << "full member";
  EXPECT_EQ(choose_pkey_index(table, 0x0005, "mlx5_0:1"), 2) << "the membership bit is not part of the match";
  EXPECT_EQ(choose_pkey_index(std::vector<std::uint16_t>{0xffff, 0x0007}, 0x8007, "x"), 1) << "a limited member when that is all";
  expect_error([&] { (void)choose_pkey_index(table, 0x8777, "mlx5_0:1"); }, ErrorCode::kInvalidArgument,
               {"WB_IB_PKEY=0x8777: mlx5_0:1 is not a member of that partition (P_Key table 0: 0xffff, 1: 0x0005"});
}

TEST(IbverbsRoute, GrhAndDlidFromThePorts) {
  const Gid g1{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  const Gid g2{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2};
  const RoutePort local{LinkLayer::kInfiniBand, 7, g1, false};
  const RoutePort remote{LinkLayer::kInfiniBand, 9, g2, false};
  Route r = choose_route(local, remote, false, "rank 3");
  EXPECT_FALSE(r.global) << "one subnet, no GRH needed";
  EXPECT_EQ(r.dlid, 9);
  RoutePort vf = local;
  vf.grh_required = true;  // SR-IOV virtual function
  r = choose_route(vf, remote, false, "rank 3");
  EXPECT_TRUE(r.global);
  EXPECT_EQ(r.dlid, 9);
  EXPECT_THAT(r.reason, HasSubstr("IBV_QPF_GRH_REQUIRED"));
  EXPECT_TRUE(choose_route(local, remote, true, "rank 3").global) << "WB_IB_GID_INDEX set";
  // Between subnets: a GRH and the peer's FLID as DLID.
  const RoutePort flid_local{LinkLayer::kInfiniBand, 7, Gid{0xfe, 0xc0, 0, 0, 0, 0x05, 0, 0x01, 1, 1, 1, 1, 1, 1, 1, 1}, false};
  const RoutePort flid_remote{LinkLayer::kInfiniBand, 9, Gid{0xfe, 0xc0, 0, 0, 0x01, 0x07, 0, 0x02, 2, 2, 2, 2, 2, 2, 2, 2}, false};
  r = choose_route(flid_local, flid_remote, false, "rank 3");
  EXPECT_TRUE(r.global);
  EXPECT_EQ(r.dlid, 0x0107);
  // Another subnet without a FLID: refused clearly, not a retry-exceeded later.
  const RoutePort other_subnet{LinkLayer::kInfiniBand, 9, Gid{0xfe, 0x80, 0, 0, 0, 0, 0, 0x02, 2, 2, 2, 2, 2, 2, 2, 2}, false};
  expect_error([&] { (void)choose_route(local, other_subnet, false, "rank 3"); }, ErrorCode::kInvalidArgument,
               {"rank 3 is in another InfiniBand subnet", "carries no FLID"});
  // RoCE: always a GRH.
  const RoutePort roce{LinkLayer::kEthernet, 0, Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}, false};
  EXPECT_TRUE(choose_route(roce, roce, false, "rank 3").global);
}

// --- write checks and striping -----------------------------------------------------------------------

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
  EXPECT_EQ(rail_work_requests(rails[0], false), 4u) << "the immediate rides on the last piece";
  EXPECT_EQ(rail_work_requests(rails[0], true), 5u) << "adaptive routing: a zero-length immediate after the bytes";
}

TEST(IbverbsStripes, AnEmptyBatchStillEndsEveryRailWithTheImmediate) {
  std::vector<std::vector<Piece>> rails;
  StripeOptions options;
  options.rails = 3;
  plan_stripes({}, options, rails);
  ASSERT_EQ(rails.size(), 3u);
  for (const auto& pieces : rails) {
    EXPECT_TRUE(pieces.empty());
    EXPECT_EQ(rail_work_requests(pieces, false), 1u);  // a zero-length WRITE_WITH_IMM
    EXPECT_EQ(rail_work_requests(pieces, true), 1u);
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
  EXPECT_THAT(wrong.message(), HasSubstr("oldest batch in flight is number 100"));
  ASSERT_TRUE(sq.complete(100, freed).is_ok());
  EXPECT_EQ(freed, 5u);
  EXPECT_TRUE(sq.fits(6));
  ASSERT_TRUE(sq.complete(101, freed).is_ok());
  EXPECT_EQ(sq.outstanding(), 0u);
  EXPECT_EQ(sq.complete(102, freed).code(), ErrorCode::kInternal);
}

// A failed queue pair completes every posted work request (flushed), signalled or not: the completion
// queue must have had room for all of them, and the drain gives them all back.
TEST(IbverbsSendQueue, ADrainFreesEveryOutstandingWorkRequest) {
  SendQueue sq(64);
  CompletionCredits credits;
  credits.reset(100);
  for (std::uint64_t b = 0; b < 3; ++b) {
    ASSERT_TRUE(credits.take(20));  // a batch of 20 work requests holds 20 entries, not one
    sq.push(b, 20);
  }
  EXPECT_EQ(credits.available(), 40u);
  EXPECT_FALSE(credits.take(41)) << "nothing taken when there is not room for all";
  EXPECT_EQ(credits.available(), 40u);
  std::uint32_t freed = 0;
  ASSERT_TRUE(sq.complete(0, freed).is_ok());
  credits.give(freed);
  EXPECT_EQ(credits.available(), 60u);
  credits.give(sq.drain());
  EXPECT_EQ(credits.available(), 100u);
  EXPECT_EQ(sq.outstanding(), 0u);
  EXPECT_EQ(sq.batches_in_flight(), 0u);
  EXPECT_TRUE(sq.fits(64));
  // Work request ids: a batch's sequence number never collides with a receive or a drain marker.
  EXPECT_LT(kMaxBatchSequence, kDrainWrId);
  EXPECT_NE(kDrainWrId, kReceiveWrId);
}

TEST(IbverbsReceives, TheBudgetCoversEveryWritersBatchesInFlight) {
  ReceiveBudget budget(1024);
  EXPECT_TRUE(budget.fits());
  for (int w = 0; w < 8; ++w) EXPECT_TRUE(budget.add_writer(64, 2)) << "writer " << w;  // 64 batches on 2 rails here
  EXPECT_EQ(budget.needed(), 1024u);
  EXPECT_TRUE(budget.fits()) << "exactly full still fits";
  EXPECT_EQ(budget.shortfall("mlx5_0:1"), "");
  EXPECT_FALSE(budget.add_writer(64, 2)) << "the ninth writer's receives do not fit";
  const std::string text = budget.shortfall("mlx5_0:1");
  EXPECT_THAT(text, HasSubstr("mlx5_0:1: 9 connected writer(s) may have 1152 batches' immediates"));
  EXPECT_THAT(text, HasSubstr("holds 1024 receives"));
  EXPECT_THAT(text, HasSubstr("WB_IB_SRQ_DEPTH"));
  EXPECT_THAT(text, HasSubstr("WB_IB_BATCHES_IN_FLIGHT"));
}

TEST(IbverbsBatches, ABatchCompletesWhenEveryRailHas) {
  BatchTracker batches;
  batches.reset(2, 4);
  // Sequence numbers 7 and 8; the callers' tokens are whatever they chose (here near the top of 64 bits).
  batches.push(7, ~std::uint64_t{0});
  batches.push(8, 1234);
  std::uint64_t found = 0;
  ASSERT_TRUE(batches.token_of(8, found));
  EXPECT_EQ(found, 1234u);
  EXPECT_FALSE(batches.token_of(9, found));
  std::uint64_t token = 0;
  ASSERT_TRUE(batches.rail_done(1, 7).is_ok());
  ASSERT_TRUE(batches.rail_done(1, 8).is_ok());  // rail 1 runs ahead
  EXPECT_FALSE(batches.pop_complete(token));
  ASSERT_TRUE(batches.rail_done(0, 7).is_ok());
  ASSERT_TRUE(batches.pop_complete(token));
  EXPECT_EQ(token, ~std::uint64_t{0});
  EXPECT_FALSE(batches.pop_complete(token));
  EXPECT_EQ(batches.rail_done(0, 9).code(), ErrorCode::kInternal);  // 8 was next on rail 0
  ASSERT_TRUE(batches.rail_done(0, 8).is_ok());
  ASSERT_TRUE(batches.pop_complete(token));
  EXPECT_EQ(token, 1234u);
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

TEST(IbverbsMessages, AFailedWriteNamesRankNicStatusOpcodeVendorErrorAndToken) {
  CompletionError e;
  e.peer = 3;
  e.nic = "mlx5_0:1";
  e.rail = 1;
  e.status = IBV_WC_RETRY_EXC_ERR;
  e.opcode = IBV_WC_RDMA_WRITE;
  e.vendor_err = 0x81;
  e.token = 42;
  const std::string text = describe_completion_error(e);
  EXPECT_THAT(text, HasSubstr("RDMA write to rank 3 failed on mlx5_0:1 (rail 1): transport retry counter exceeded"));
  EXPECT_THAT(text, HasSubstr("opcode RDMA_WRITE"));
  EXPECT_THAT(text, HasSubstr("vendor_err 0x81"));
  EXPECT_THAT(text, HasSubstr("batch token 42"));
  EXPECT_THAT(text, HasSubstr("dead, unreachable"));

  e.receive = true;
  e.status = IBV_WC_LOC_LEN_ERR;
  const std::string receive = describe_completion_error(e);
  EXPECT_THAT(receive, HasSubstr("RDMA receive of an immediate from rank 3"));
  EXPECT_THAT(receive, HasSubstr("local length error"));
  EXPECT_THAT(receive, Not(HasSubstr("token")));
  EXPECT_EQ(wc_opcode_name(IBV_WC_RECV_RDMA_WITH_IMM), "RECV_RDMA_WITH_IMM");
  EXPECT_EQ(wc_opcode_name(77), "opcode 77");
  EXPECT_EQ(wc_status_name(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error");
  EXPECT_EQ(wc_status_name(99), "unknown status 99");
  EXPECT_THAT(completion_error_hint(IBV_WC_REM_ACCESS_ERR), HasSubstr("rkey"));
  EXPECT_EQ(completion_error_hint(IBV_WC_SUCCESS), "");
}

TEST(IbverbsEvents, EachFatalEventFailsWhatItConcerns) {
  using Scope = AsyncEventKind::Scope;
  using Effect = AsyncEventKind::Effect;
  struct Expected {
    int type;
    Scope scope;
    Effect effect;
  };
  const Expected table[] = {
      {IBV_EVENT_QP_FATAL, Scope::kQueuePair, Effect::kFail},
      {IBV_EVENT_QP_REQ_ERR, Scope::kQueuePair, Effect::kFail},
      {IBV_EVENT_QP_ACCESS_ERR, Scope::kQueuePair, Effect::kFail},
      {IBV_EVENT_PATH_MIG_ERR, Scope::kQueuePair, Effect::kFail},
      {IBV_EVENT_COMM_EST, Scope::kQueuePair, Effect::kIgnore},
      {IBV_EVENT_QP_LAST_WQE_REACHED, Scope::kQueuePair, Effect::kIgnore},
      {IBV_EVENT_CQ_ERR, Scope::kCompletionQueue, Effect::kFail},
      {IBV_EVENT_SRQ_ERR, Scope::kSharedReceiveQueue, Effect::kFail},
      {IBV_EVENT_SRQ_LIMIT_REACHED, Scope::kSharedReceiveQueue, Effect::kWarn},
      {IBV_EVENT_PORT_ERR, Scope::kPort, Effect::kFail},
      {IBV_EVENT_LID_CHANGE, Scope::kPort, Effect::kFail},
      {IBV_EVENT_GID_CHANGE, Scope::kPort, Effect::kCheckGid},
      {IBV_EVENT_PORT_ACTIVE, Scope::kPort, Effect::kWarn},
      {IBV_EVENT_PKEY_CHANGE, Scope::kPort, Effect::kWarn},
      {IBV_EVENT_SM_CHANGE, Scope::kPort, Effect::kWarn},
      {IBV_EVENT_CLIENT_REREGISTER, Scope::kPort, Effect::kWarn},
      {IBV_EVENT_DEVICE_FATAL, Scope::kDevice, Effect::kFail},
      {IBV_EVENT_WQ_FATAL, Scope::kNone, Effect::kIgnore},
      {1000, Scope::kDevice, Effect::kWarn},
  };
  for (const Expected& e : table) {
    const AsyncEventKind kind = async_event_kind(e.type);
    EXPECT_EQ(kind.scope, e.scope) << kind.name;
    EXPECT_EQ(kind.effect, e.effect) << kind.name;
    EXPECT_STRNE(kind.meaning, "") << kind.name;
  }
  EXPECT_STREQ(async_event_kind(IBV_EVENT_PORT_ERR).name, "PORT_ERR");
}

// --- GPU memory ---------------------------------------------------------------------------------------

TEST(IbverbsGpu, DmabufOrPeermemAsTheSwitchAndTheLibrariesAllow) {
  GpuRegistrationPlan plan = plan_gpu_registration(Switch::kAuto, true, true);
  EXPECT_TRUE(plan.dmabuf);
  EXPECT_TRUE(plan.peermem) << "auto falls back where the kernel refuses the dma-buf";
  plan = plan_gpu_registration(Switch::kAuto, false, true);
  EXPECT_FALSE(plan.dmabuf);
  EXPECT_THAT(plan.why_not_dmabuf, HasSubstr("rdma-core < 34"));
  plan = plan_gpu_registration(Switch::kAuto, true, false);
  EXPECT_THAT(plan.why_not_dmabuf, HasSubstr("cuMemGetHandleForAddressRange"));
  plan = plan_gpu_registration(Switch::kOff, true, true);
  EXPECT_FALSE(plan.dmabuf);
  EXPECT_TRUE(plan.peermem);
  plan = plan_gpu_registration(Switch::kOn, true, true);
  EXPECT_TRUE(plan.dmabuf);
  EXPECT_FALSE(plan.peermem) << "on means dma-buf only";
  expect_error([&] { (void)plan_gpu_registration(Switch::kOn, false, true); }, ErrorCode::kUnsupported,
               {"WB_IB_DMABUF=on, but libibverbs has no ibv_reg_dmabuf_mr"});
}

TEST(IbverbsGpu, TheFlushDecisionFollowsTheDevicesOrdering) {
  GpuFlushDecision d = gpu_flush_decision(0, 100, 0);  // ordered for the owner: nothing to do
  EXPECT_FALSE(d.flush);
  EXPECT_FALSE(d.risky);
  EXPECT_THAT(d.text, HasSubstr("CUDA device 0: the GPU orders incoming RDMA writes"));
  d = gpu_flush_decision(1, 200, 1);
  EXPECT_FALSE(d.flush);
  d = gpu_flush_decision(2, 0, 1);  // not ordered, flushable from the host
  EXPECT_TRUE(d.flush);
  EXPECT_FALSE(d.risky);
  EXPECT_THAT(d.text, HasSubstr("cudaDeviceFlushGPUDirectRDMAWrites"));
  d = gpu_flush_decision(3, 0, 0);  // neither
  EXPECT_FALSE(d.flush);
  EXPECT_TRUE(d.risky);
  EXPECT_THAT(d.text, HasSubstr("neither ordered"));
}

// --- NIC locality -------------------------------------------------------------------------------------

TEST(IbverbsTopology, TheNicsNearestTheGpuInThePciTree) {
  // Socket 0 (NUMA node 0): host bridge pci0000:00 with a PCIe switch holding GPU 0, NIC 0 and NIC 1, and
  // another switch with GPU 1 and NIC 2; host bridge pci0000:40 with NIC 3. Socket 1: NIC 4.
  const std::string sw0 = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
  const std::string sw1 = "/sys/devices/pci0000:00/0000:00:02.0/0000:11:00.0";
  const PciPlace gpu0{sw0 + "/0000:02:00.0/0000:03:00.0", 0};
  const PciPlace gpu1{sw1 + "/0000:12:00.0/0000:13:00.0", 0};
  const std::vector<PciPlace> nics{
      {sw0 + "/0000:02:01.0/0000:04:00.0", 0},                         // NIC 0: under GPU 0's switch
      {sw0 + "/0000:02:02.0/0000:05:00.0", 0},                         // NIC 1: the same
      {sw1 + "/0000:12:01.0/0000:14:00.0", 0},                         // NIC 2: GPU 1's switch
      {"/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0", 0},        // NIC 3: another host bridge, same socket
      {"/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", 1},        // NIC 4: the other socket
  };
  EXPECT_EQ(pci_distance(gpu0, gpu0), 0);
  EXPECT_EQ(pci_distance(nics[0], gpu0), 4);
  EXPECT_LT(pci_distance(nics[0], gpu0), pci_distance(nics[2], gpu0)) << "another switch";
  EXPECT_LT(pci_distance(nics[2], gpu0), pci_distance(nics[3], gpu0)) << "another host bridge";
  EXPECT_LT(pci_distance(nics[3], gpu0), pci_distance(nics[4], gpu0)) << "another socket";
  EXPECT_EQ(pci_distance(PciPlace{}, gpu0), -1);
  EXPECT_EQ(nearest_nics(nics, gpu0), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(nearest_nics(nics, gpu1), (std::vector<std::size_t>{2}));
  EXPECT_EQ(nearest_nics(nics, PciPlace{}), (std::vector<std::size_t>{0, 1, 2, 3, 4})) << "no GPU: every NIC";
  const std::vector<PciPlace> unknown{{}, {}};
  EXPECT_EQ(nearest_nics(unknown, gpu0), (std::vector<std::size_t>{0, 1})) << "no NIC's place known: every NIC";
  const std::vector<PciPlace> one_known{{}, nics[4]};
  EXPECT_EQ(nearest_nics(one_known, gpu0), (std::vector<std::size_t>{1}));
  EXPECT_EQ(normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("0001:3b:00.0"), "0001:3b:00.0");
  EXPECT_TRUE(read_pci_place("/nonexistent/wb").path.empty());
}

}  // namespace
}  // namespace wb::ibv
