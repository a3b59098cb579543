// The ibverbs transport itself, without an RDMA device: it loads a fake libibverbs (tests/fake_ibverbs, a
// loopback fabric inside this process) through WB_IB_LIBRARY, and two or three transports of this process
// connect to each other as ranks would. What is checked here is what the transport asks of the library
// and what it makes of the answers: the order of ibv_fork_init, skipping bad devices and ports, GID,
// P_Key and route choices as passed to ibv_modify_qp, rails and adaptive routing as the work requests
// posted, completion queue room when a queue pair fails and flushes everything, the return of those
// entries, asynchronous events, import ids and receive sizing. What only hardware can prove (that a
// real HCA accepts these attributes, that packets route, relaxed ordering's effect, dma-buf) is not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>  // enum values only
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "../support/expect_error.hpp"
#include "comm/backoff.hpp"
#include "ibverbs_test_support.hpp"
#include "transport/ibverbs/ibverbs_internal.hpp"
#include "transport/ibverbs/ibverbs_library.hpp"
#include "transport/ibverbs/ibverbs_transport.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

using wb::testing::expect_error;

using ::testing::HasSubstr;
using testing::FakeQpInfo;
using testing::FakeVerbs;
using testing::SettingScope;

FakeVerbs& fake() {
  static FakeVerbs library(WB_FAKE_IBVERBS);
  return library;
}

Gid ib_gid(std::uint8_t id, std::uint8_t subnet = 0) {
  return Gid{0xfe, 0x80, 0, 0, 0, 0, 0, subnet, 0x02, 0x02, 0xc9, 0xff, 0xfe, 0, 0, id};
}
Gid v4_gid(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  return Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d};
}
const Gid kLinkLocal{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
const Gid kV6{0xfd, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x21};

/// One rank of the test: its transport, the memory it writes from and into, and what it imported.
struct Rank {
  int rank = 0;
  std::unique_ptr<Transport> transport;
  IbverbsTransport* ib = nullptr;
  std::vector<std::uint8_t> memory;  // first half: sources; second half: where peers write
  std::uint32_t local = 0;
  std::vector<std::byte> key;
};

class IbverbsOverFake : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake().loaded()) << fake().path();
    settings_.set("ib_library", fake().path());
    fake().reset();
  }
  void TearDown() override {
    ranks_.clear();
    fake().reset();
  }

  /// An InfiniBand device with one active port.
  int add_ib(const char* name, std::uint16_t lid, std::uint8_t flags = 0, const Gid& gid0 = Gid{}) {
    const int d = fake().add_device(name, "/nonexistent", 0, 32767, 4194303);
    fake().add_port(d, IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND, lid, flags);
    const Gid gid = gid_is_zero(gid0) ? ib_gid(static_cast<std::uint8_t>(lid)) : gid0;
    fake().set_gid(d, 1, 0, IBV_GID_TYPE_IB, gid.data());
    return d;
  }
  /// A RoCE device with one active port: link-local v1 and v2 GIDs, then an IPv4 v1 and v2 GID, then IPv6 v2.
  int add_roce(const char* name, std::uint8_t host, std::uint32_t max_srq_wr = 32767) {
    const int d = fake().add_device(name, "/nonexistent", 0, max_srq_wr, 4194303);
    fake().add_port(d, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, 0, 0);
    fake().set_gid(d, 1, 0, IBV_GID_TYPE_ROCE_V1, kLinkLocal.data());
    fake().set_gid(d, 1, 1, IBV_GID_TYPE_ROCE_V2, kLinkLocal.data());
    fake().set_gid(d, 1, 2, IBV_GID_TYPE_ROCE_V1, v4_gid(10, 0, 0, host).data());
    fake().set_gid(d, 1, 3, IBV_GID_TYPE_ROCE_V2, v4_gid(10, 0, 0, host).data());
    fake().set_gid(d, 1, 4, IBV_GID_TYPE_ROCE_V2, kV6.data());
    return d;
  }

  /// Makes the transport of `rank` with the settings in force, registers 1 MiB of host memory.
  Rank& make(int rank, std::size_t bytes = 1 << 20) {
    auto r = std::make_unique<Rank>();
    r->rank = rank;
    r->transport = make_ibverbs_transport(rank);
    r->ib = dynamic_cast<IbverbsTransport*>(r->transport.get());
    EXPECT_NE(r->ib, nullptr);
    r->memory.assign(2 * bytes, 0);
    for (std::size_t i = 0; i < bytes; ++i) r->memory[i] = static_cast<std::uint8_t>(rank * 31 + i * 7 + (i >> 11));
    const MemoryRegistration registration = r->transport->register_memory(r->memory.data(), r->memory.size(), MemoryKind::kHost, 0);
    r->local = registration.id;
    r->key = registration.remote_key;
    ranks_.push_back(std::move(r));
    return *ranks_.back();
  }

  /// Connects a and b both ways; returns the id of b's memory imported into a.
  std::uint32_t connect(Rank& a, Rank& b) {
    const std::vector<std::byte> ea = a.transport->endpoint(b.rank);
    const std::vector<std::byte> eb = b.transport->endpoint(a.rank);
    a.transport->connect(b.rank, eb);
    b.transport->connect(a.rank, ea);
    (void)b.transport->import_memory(a.rank, a.key);
    return a.transport->import_memory(b.rank, b.key);
  }

  /// The queue pair numbers a made for b (qps[n * k + j]: the j-th on NIC n).
  static std::vector<std::uint32_t> qpns(Rank& a, const Rank& b) {
    std::vector<std::uint32_t> out;
    for (const QueuePairAddress& qp : parse_endpoint(a.transport->endpoint(b.rank), a.rank).qps) out.push_back(qp.qpn);
    return out;
  }

  /// Polls every rank until `done` or `limit`; every error status goes to `errors`.
  template <class Done>
  bool poll_until(Done done, std::vector<Completion>& seen, std::vector<Status>* errors = nullptr,
                  std::chrono::milliseconds limit = std::chrono::milliseconds(2000)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    comm::Backoff backoff;
    while (!done()) {
      const std::size_t before = seen.size();
      for (auto& r : ranks_) {
        const Status s = r->transport->poll(seen);
        if (!s.is_ok() && errors != nullptr) errors->push_back(s);
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      if (seen.size() == before)
        backoff.pause();
      else
        backoff.progressed();
    }
    return true;
  }

  static std::size_t count(const std::vector<Completion>& seen, Completion::Kind kind, int peer) {
    std::size_t n = 0;
    for (const Completion& c : seen) n += c.kind == kind && c.peer == peer;
    return n;
  }

  /// `bytes` from a's sources at `from` to b's receiving half at `to`.
  static WriteRequest write(const Rank& a, std::uint32_t remote, std::uint64_t from, std::uint64_t to, std::uint64_t bytes) {
    return WriteRequest{a.local, from, remote, a.memory.size() / 2 + to, bytes};
  }
  static bool landed(const Rank& a, const Rank& b, std::uint64_t from, std::uint64_t to, std::uint64_t bytes) {
    return std::memcmp(a.memory.data() + from, b.memory.data() + b.memory.size() / 2 + to, bytes) == 0;
  }

  SettingScope settings_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

// --- the data path --------------------------------------------------------------------------------------

TEST_F(IbverbsOverFake, BatchesLandWithOneArrivalAndOneWritesDoneEach) {
  add_ib("fake0", 1);
  Rank& a = make(0);
  Rank& b = make(1);
  const std::uint32_t remote = connect(a, b);
  EXPECT_EQ(a.transport->capabilities().max_writes_per_batch, 511u) << "one send-queue slot stays for the immediate";
  std::vector<Completion> seen;
  for (std::uint32_t batch = 0; batch < 3; ++batch) {
    const std::vector<WriteRequest> writes{write(a, remote, 1000 * batch, 5000 * batch, 300),
                                           write(a, remote, 1000 * batch + 400, 5000 * batch + 2000, 100)};
    ASSERT_TRUE(a.transport->post_writes(1, writes, 0xA0 + batch, 77 + batch).is_ok());
  }
  ASSERT_TRUE(poll_until([&] { return count(seen, Completion::Kind::kArrival, 0) == 3 && count(seen, Completion::Kind::kWritesDone, 1) == 3; }, seen));
  std::vector<std::uint32_t> immediates;
  std::vector<std::uint64_t> tokens;
  for (const Completion& c : seen) (c.kind == Completion::Kind::kArrival ? immediates.push_back(c.immediate) : tokens.push_back(c.token));
  EXPECT_EQ(immediates, (std::vector<std::uint32_t>{0xA0, 0xA1, 0xA2}));
  EXPECT_EQ(tokens, (std::vector<std::uint64_t>{77, 78, 79}));
  for (std::uint32_t batch = 0; batch < 3; ++batch) {
    EXPECT_TRUE(landed(a, b, 1000 * batch, 5000 * batch, 300));
    EXPECT_TRUE(landed(a, b, 1000 * batch + 400, 5000 * batch + 2000, 100));
  }
  EXPECT_EQ(fake().overruns(), 0u);
}

TEST_F(IbverbsOverFake, FourRailsOverTwoNicsCarryOneBatchAndReportItOnce) {
  settings_.set("ib_qps_per_connection", "2");
  settings_.set("ib_stripe_min_bytes", "0");
  settings_.set("ib_adaptive_routing", "off");
  add_ib("fake0", 1);
  add_ib("fake1", 2);
  Rank& a = make(0);
  Rank& b = make(1);
  ASSERT_EQ(a.ib->nic_count(), 2u);
  const std::uint32_t remote = connect(a, b);
  const std::vector<WriteRequest> writes{write(a, remote, 0, 0, 1 << 19)};  // 512 KiB: 128 KiB a rail
  ASSERT_TRUE(a.transport->post_writes(1, writes, 0x5, 0x6).is_ok());
  std::vector<Completion> seen;
  ASSERT_TRUE(poll_until([&] { return seen.size() >= 2; }, seen));
  (void)poll_until([] { return false; }, seen, nullptr, std::chrono::milliseconds(20));  // anything more would show
  EXPECT_EQ(count(seen, Completion::Kind::kArrival, 0), 1u) << "one arrival, once every rail has landed";
  EXPECT_EQ(count(seen, Completion::Kind::kWritesDone, 1), 1u);
  EXPECT_TRUE(landed(a, b, 0, 0, 1 << 19));
  const std::vector<std::uint32_t> qps = qpns(a, b);
  ASSERT_EQ(qps.size(), 4u);
  for (const std::uint32_t qp : qps) EXPECT_STREQ(fake().opcodes(qp), "I") << "queue pair " << qp << ": one share, its immediate on it";
  FakeQpInfo info{};
  ASSERT_EQ(fake().qp_info(qps[2], &info), 0);  // the second queue pair on NIC 1
  EXPECT_EQ(info.dlid, 2);
}

TEST_F(IbverbsOverFake, AdaptiveRoutingSendsTheImmediateOnItsOwn) {
  add_ib("fake0", 1);
  add_roce("fake1", 1);
  for (const char* setting : {"auto", "off"}) {
    for (const char* device : {"fake0", "fake1"}) {
      SettingScope scope;
      scope.set("ib_adaptive_routing", setting);
      scope.set("ib_devices", device);
      Rank& a = make(0);
      Rank& b = make(1);
      const std::uint32_t remote = connect(a, b);
      const std::vector<WriteRequest> writes{write(a, remote, 0, 0, 64), write(a, remote, 100, 100, 64)};
      ASSERT_TRUE(a.transport->post_writes(1, writes, 1, 1).is_ok());
      const bool ib = std::string(device) == "fake0";
      // auto: adaptive routing on InfiniBand (bytes as RDMA_WRITE, then a zero-length WRITE_WITH_IMM), off on RoCE.
      const std::string expected = ib && std::string(setting) == "auto" ? "W W I0" : "W I";
      EXPECT_EQ(fake().opcodes(qpns(a, b)[0]), expected) << setting << " on " << device;
      std::vector<Completion> seen;
      EXPECT_TRUE(poll_until([&] { return seen.size() == 2; }, seen));
      ranks_.clear();
    }
  }
}

// --- failures -----------------------------------------------------------------------------------------

// A failed queue pair completes every work request it holds, signalled or not. The completion queue must
// have room for all of them (a batch holds one entry per work request, not one), and once the drain
// marker is back every entry is free again.
TEST_F(IbverbsOverFake, ErrorFlushesFitTheCompletionQueueAndTheirEntriesComeBack) {
  settings_.set("ib_sq_depth", "64");
  settings_.set("ib_srq_depth", "16");
  settings_.set("ib_cq_depth", "82");  // 16 receives + 66 for sends: less than the 4 x 64 the send queues hold
  settings_.set("ib_qps_per_connection", "4");
  settings_.set("ib_adaptive_routing", "off");
  add_ib("fake0", 1);
  Rank& a = make(0);
  Rank& b = make(1);
  const std::uint32_t remote = connect(a, b);
  const std::uint32_t after_queue_pairs = a.ib->nic(0).credits.available();
  EXPECT_EQ(after_queue_pairs, 66u - 4) << "each queue pair keeps one entry for its drain marker";

  // b never polls: after 16 receives (4 batches x 4 rails) its arrivals wait (RNR) and so does a's queue.
  std::vector<Completion> seen;
  std::uint64_t posted = 0;
  for (;; ++posted) {
    std::vector<WriteRequest> writes;
    for (std::uint64_t w = 0; w < 10; ++w) writes.push_back(write(a, remote, 16 * w, 16 * w, 8));  // 10 work requests
    const Status s = a.transport->post_writes(1, writes, static_cast<std::uint32_t>(posted), posted);
    if (s.code() == ErrorCode::kRetryLater) break;
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_TRUE(a.transport->poll(seen).is_ok());
    ASSERT_LT(posted, 100u) << "no back-pressure";
  }
  const std::uint32_t held = after_queue_pairs - a.ib->nic(0).credits.available();
  EXPECT_GE(held, 40u) << "the test needs many work requests waiting";

  // The first rail's next work request fails: its queue pair and the peer's others go to the error state.
  const std::vector<std::uint32_t> qps = qpns(a, b);
  fake().fail_write(qps[0], 0, IBV_WC_REM_ACCESS_ERR);
  std::vector<Status> errors;
  ASSERT_TRUE(poll_until([&] { return !errors.empty(); }, seen, &errors));
  EXPECT_EQ(errors[0].code(), ErrorCode::kIbverbs);
  EXPECT_THAT(errors[0].message(), HasSubstr("RDMA write to rank 1 failed on fake0:1 (rail 0): remote access error"));
  EXPECT_THAT(errors[0].message(), HasSubstr("batch token"));
  // Every flushed work request found room, and the drains gave every entry back (the markers' own too).
  ASSERT_TRUE(poll_until([&] { return a.ib->nic(0).credits.available() == 66u; }, seen, &errors))
      << a.ib->nic(0).credits.available() << " entries free";
  EXPECT_EQ(fake().overruns(), 0u) << "the completion queue overran";
  EXPECT_EQ(errors.size(), 1u) << "the failure is reported once";
  const WriteRequest one = write(a, remote, 0, 0, 8);
  const Status again = a.transport->post_writes(1, std::span(&one, 1), 1, 1);
  EXPECT_EQ(again.code(), ErrorCode::kIbverbs);
  EXPECT_THAT(again.message(), HasSubstr("rank 1"));
}

TEST_F(IbverbsOverFake, AFailedPeerLeavesTheOthersRunning) {
  add_ib("fake0", 1);
  Rank& a = make(0);
  Rank& b = make(1);
  Rank& c = make(2);
  const std::uint32_t to_b = connect(a, b);
  const std::uint32_t to_c = connect(a, c);
  fake().fail_write(qpns(a, b)[0], 0, IBV_WC_RETRY_EXC_ERR);
  const WriteRequest wb = write(a, to_b, 0, 0, 64);
  ASSERT_TRUE(a.transport->post_writes(1, std::span(&wb, 1), 1, 1).is_ok());
  std::vector<Completion> seen;
  std::vector<Status> errors;
  ASSERT_TRUE(poll_until([&] { return !errors.empty(); }, seen, &errors));
  EXPECT_THAT(errors[0].message(), HasSubstr("RDMA write to rank 1"));
  EXPECT_THAT(errors[0].message(), HasSubstr("dead, unreachable"));
  const WriteRequest wc = write(a, to_c, 64, 64, 64);
  ASSERT_TRUE(a.transport->post_writes(2, std::span(&wc, 1), 2, 2).is_ok());
  ASSERT_TRUE(poll_until([&] { return count(seen, Completion::Kind::kWritesDone, 2) == 1 && count(seen, Completion::Kind::kArrival, 0) >= 1; }, seen));
  EXPECT_TRUE(landed(a, c, 64, 64, 64));
  EXPECT_EQ(count(seen, Completion::Kind::kWritesDone, 1), 0u);
}

struct EventCase {
  const char* name;
  int type;
  int target;  // 0: the first queue pair to rank 1; 1: port 1; 2: the first completion queue; 3: none
  const char* expected;
};

void PrintTo(const EventCase& e, std::ostream* out) { *out << e.name; }

class IbverbsAsyncEvents : public IbverbsOverFake, public ::testing::WithParamInterface<EventCase> {};

TEST_P(IbverbsAsyncEvents, FailThePeerTheNicOrTheDeviceWithAClearMessage) {
  const EventCase& e = GetParam();
  add_ib("fake0", 1);
  Rank& a = make(0);
  Rank& b = make(1);
  const std::uint32_t remote = connect(a, b);
  const std::uint32_t number = e.target == 0 ? qpns(a, b)[0] : e.target == 1 ? 1u : 0u;
  ASSERT_GT(fake().event(0, e.type, number), 0);
  std::vector<Completion> seen;
  std::vector<Status> errors;
  const bool quiet = std::string(e.expected).empty();  // nothing should fail
  const bool failed = poll_until([&] { return !errors.empty(); }, seen, &errors,
                                 std::chrono::milliseconds(quiet ? 50 : 2000));
  const WriteRequest w = write(a, remote, 0, 0, 8);
  const Status post = a.transport->post_writes(1, std::span(&w, 1), 1, 1);
  if (quiet) {
    EXPECT_FALSE(failed) << errors.front().to_string();
    EXPECT_TRUE(post.is_ok()) << post.to_string();
    return;
  }
  ASSERT_TRUE(failed) << e.name << " was not reported";
  EXPECT_EQ(errors[0].code(), ErrorCode::kIbverbs);
  EXPECT_THAT(errors[0].message(), HasSubstr(std::string("asynchronous event ") + e.name));
  EXPECT_THAT(errors[0].message(), HasSubstr(e.expected));
  EXPECT_THAT(errors[0].message(), HasSubstr("rank 1"));
  EXPECT_FALSE(post.is_ok()) << "a failed peer takes no more writes";
  EXPECT_THAT(post.message(), HasSubstr(e.name));
}

INSTANTIATE_TEST_SUITE_P(
    Events, IbverbsAsyncEvents,
    ::testing::Values(EventCase{"QP_FATAL", IBV_EVENT_QP_FATAL, 0, "of the connection to rank 1, rail 0"},
                      EventCase{"QP_ACCESS_ERR", IBV_EVENT_QP_ACCESS_ERR, 0, "access rights"},
                      EventCase{"PORT_ERR", IBV_EVENT_PORT_ERR, 1, "fake0:1: the port went down"},
                      EventCase{"LID_CHANGE", IBV_EVENT_LID_CHANGE, 1, "LID changed"},
                      EventCase{"CQ_ERR", IBV_EVENT_CQ_ERR, 2, "completion queue overran or failed"},
                      EventCase{"DEVICE_FATAL", IBV_EVENT_DEVICE_FATAL, 3, "fake0: the device failed"},
                      EventCase{"PORT_ACTIVE", IBV_EVENT_PORT_ACTIVE, 1, ""},
                      EventCase{"COMM_EST", IBV_EVENT_COMM_EST, 0, ""}),
    [](const ::testing::TestParamInfo<EventCase>& info) { return std::string(info.param.name); });

TEST_F(IbverbsOverFake, AGidChangeFailsOnlyWhenTheAdvertisedGidMoved) {
  add_roce("fake0", 1);
  Rank& a = make(0);
  Rank& b = make(1);
  const std::uint32_t remote = connect(a, b);
  ASSERT_EQ(a.ib->nic(0).address.gid_index, 3u);
  // Another GID of the port changed: nothing this rank advertised.
  fake().set_gid(0, 1, 4, IBV_GID_TYPE_ROCE_V2, v4_gid(10, 0, 0, 77).data());
  ASSERT_GT(fake().event(0, IBV_EVENT_GID_CHANGE, 1), 0);
  std::vector<Completion> seen;
  std::vector<Status> errors;
  EXPECT_FALSE(poll_until([&] { return !errors.empty(); }, seen, &errors, std::chrono::milliseconds(50)));
  const WriteRequest w = write(a, remote, 0, 0, 8);
  EXPECT_TRUE(a.transport->post_writes(1, std::span(&w, 1), 1, 1).is_ok());
  // The advertised one moved: peers address a GID that is gone.
  fake().set_gid(0, 1, 3, IBV_GID_TYPE_ROCE_V2, v4_gid(10, 0, 0, 9).data());
  ASSERT_GT(fake().event(0, IBV_EVENT_GID_CHANGE, 1), 0);
  ASSERT_TRUE(poll_until([&] { return !errors.empty(); }, seen, &errors));
  EXPECT_THAT(errors[0].message(), HasSubstr("GID[3], which this rank advertised as ::ffff:10.0.0.1, is now ::ffff:10.0.0.9"));
  EXPECT_THAT(errors[0].message(), HasSubstr("rank"));
}

// --- set-up ---------------------------------------------------------------------------------------------

TEST_F(IbverbsOverFake, ABadDeviceOrPortIsSkippedWithAWarning) {
  fake().add_device("fake0", "/nonexistent", 1, 32767, 4194303);  // does not open
  const int down = fake().add_device("fake1", "/nonexistent", 0, 32767, 4194303);
  fake().add_port(down, IBV_PORT_DOWN, IBV_LINK_LAYER_INFINIBAND, 3, 0);
  const int good = add_ib("fake2", 4);
  fake().add_port(good, IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND, 0, 0);  // port 2: no LID
  const int no_srq = fake().add_device("fake3", "/nonexistent", 0, 0, 4194303);  // no shared receive queue
  fake().add_port(no_srq, IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND, 5, 0);
  fake().set_gid(no_srq, 1, 0, IBV_GID_TYPE_IB, ib_gid(5).data());
  Rank& a = make(0);
  ASSERT_EQ(a.ib->nic_count(), 1u);
  EXPECT_EQ(a.ib->nic(0).address.label(), "fake2:1");
  EXPECT_EQ(a.ib->nic(0).address.lid, 4);

  // Nothing usable: "no RDMA device", with every reason.
  fake().reset();
  fake().add_device("fake0", "/nonexistent", 1, 32767, 4194303);
  const int only_down = fake().add_device("fake1", "/nonexistent", 0, 32767, 4194303);
  fake().add_port(only_down, IBV_PORT_DOWN, IBV_LINK_LAYER_INFINIBAND, 3, 0);
  expect_error([&] { (void)make_ibverbs_transport(0); }, ErrorCode::kUnsupported,
               {"no RDMA device: no usable active port", "fake0: ibv_open_device(fake0) failed: Input/output error", "fake1:1 is DOWN"});
  // No device at all: what ibv_get_device_list says.
  fake().reset();
  expect_error([&] { (void)make_ibverbs_transport(0); }, ErrorCode::kUnsupported,
               {"no RDMA device: ibv_get_device_list failed: Function not implemented"});
}

TEST_F(IbverbsOverFake, DeviceListsIncludeOrExclude) {
  add_ib("fake0", 1);
  add_ib("fake1", 2);
  add_ib("other0", 3);
  settings_.set("ib_devices", "^fake1");
  EXPECT_EQ(make(0).ib->nic_count(), 2u);
  settings_.set("ib_devices", "fake*");
  Rank& r = make(1);
  ASSERT_EQ(r.ib->nic_count(), 2u);
  EXPECT_EQ(r.ib->nic(1).address.device, "fake1");
  settings_.set("ib_devices", "fake9");
  expect_error([&] { (void)make_ibverbs_transport(2); }, ErrorCode::kInvalidArgument,
               {"WB_IB_DEVICES names 'fake9', which is not an RDMA device here (devices: fake0, fake1, other0)"});
}

TEST_F(IbverbsOverFake, GrhWhereThePortRequiresItAndTheFlidBetweenSubnets) {
  add_ib("plain", 1);
  add_ib("vf", 2, IBV_QPF_GRH_REQUIRED);  // an SR-IOV virtual function
  for (const char* device : {"plain", "vf"}) {
    SettingScope scope;
    scope.set("ib_devices", device);
    Rank& a = make(0);
    Rank& b = make(1);
    (void)connect(a, b);
    FakeQpInfo info{};
    ASSERT_EQ(fake().qp_info(qpns(a, b)[0], &info), 0);
    EXPECT_EQ(info.is_global, std::string(device) == "vf" ? 1 : 0) << device;
    EXPECT_EQ(info.dlid, a.ib->nic(0).address.lid) << "one subnet: the peer's LID";
    ranks_.clear();
  }
  // Two subnets, GIDs with FLIDs (index 1): a GRH, and the peer's FLID as DLID.
  const Gid flid_a{0xfe, 0xc0, 0, 0, 0x00, 0x15, 0x00, 0x01, 1, 1, 1, 1, 1, 1, 1, 1};
  const Gid flid_b{0xfe, 0xc0, 0, 0, 0x00, 0x27, 0x00, 0x02, 2, 2, 2, 2, 2, 2, 2, 2};
  const int da = add_ib("siteA", 5, 0, ib_gid(5, 1));
  const int db = add_ib("siteB", 7, 0, ib_gid(7, 2));
  fake().set_gid(da, 1, 1, IBV_GID_TYPE_IB, flid_a.data());
  fake().set_gid(db, 1, 1, IBV_GID_TYPE_IB, flid_b.data());
  {
    SettingScope scope;
    scope.set("ib_devices", "siteA");
    Rank& a = make(0);
    scope.set("ib_devices", "siteB");
    Rank& b = make(1);
    EXPECT_EQ(a.ib->nic(0).address.gid_index, 1u) << "the GID with a FLID";
    (void)connect(a, b);
    FakeQpInfo info{};
    ASSERT_EQ(fake().qp_info(qpns(a, b)[0], &info), 0);
    EXPECT_EQ(info.is_global, 1);
    EXPECT_EQ(info.dlid, 0x27) << "the peer's FLID";
    EXPECT_EQ(info.sgid_index, 1);
    EXPECT_EQ(std::memcmp(info.dgid, flid_b.data(), 16), 0);
    ranks_.clear();
  }
  // Two subnets without FLIDs: refused at connect, naming the rank.
  fake().set_gid(da, 1, 1, IBV_GID_TYPE_IB, Gid{}.data());
  fake().set_gid(db, 1, 1, IBV_GID_TYPE_IB, Gid{}.data());
  SettingScope scope;
  scope.set("ib_devices", "siteA");
  Rank& a = make(0);
  scope.set("ib_devices", "siteB");
  Rank& b = make(1);
  const std::vector<std::byte> eb = b.transport->endpoint(0);
  (void)a.transport->endpoint(1);
  expect_error([&] { a.transport->connect(1, eb); }, ErrorCode::kInvalidArgument,
               {"ibverbs connect to rank 1, rail 0", "rank 1 is in another InfiniBand subnet"});
}

TEST_F(IbverbsOverFake, PKeyIndexFromThePortsTable) {
  const int d = add_ib("fake0", 1);
  const std::uint16_t table[] = {0xffff, 0x0005, 0x8005};
  fake().set_pkeys(d, 1, table, 3);
  settings_.set("ib_pkey", "0x8005");
  Rank& a = make(0);
  Rank& b = make(1);
  (void)connect(a, b);
  FakeQpInfo info{};
  ASSERT_EQ(fake().qp_info(qpns(a, b)[0], &info), 0);
  EXPECT_EQ(info.pkey_index, 2);
  settings_.set("ib_pkey", "0x8777");
  try {
    (void)make_ibverbs_transport(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << "a setting no port satisfies";
    EXPECT_THAT(e.what(), HasSubstr("WB_IB_PKEY=0x8777: fake0:1 is not a member of that partition"));
  }
}

TEST_F(IbverbsOverFake, RoceVersionOrAddressFamilyMismatchIsAnErrorAtConnect) {
  add_roce("fake0", 1);
  for (const auto& [setting, mine, theirs, expected] :
       {std::tuple{"ib_roce_version", "1", "2", "pairs a RoCE v1 GID (index 2) with a RoCE v2 GID (index 3)"},
        std::tuple{"ib_addr_family", "ipv4", "ipv6", "pairs an IPv4 GID (::ffff:10.0.0.1) with an IPv6 GID (fd00:"}}) {
    SettingScope scope;
    scope.set(setting, mine);
    Rank& a = make(0);
    scope.set(setting, theirs);
    Rank& b = make(1);
    const std::vector<std::byte> eb = b.transport->endpoint(0);
    (void)a.transport->endpoint(1);
    try {
      a.transport->connect(1, eb);
      ADD_FAILURE() << setting << ": connected";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("cannot connect to rank 1"));
      EXPECT_THAT(e.what(), HasSubstr(expected));
    }
    ranks_.clear();
  }
  // Never a link-local GID, whatever is asked: without a configured address the port is not usable.
  fake().reset();
  const int d = fake().add_device("bare", "/nonexistent", 0, 32767, 4194303);
  fake().add_port(d, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, 0, 0);
  fake().set_gid(d, 1, 0, IBV_GID_TYPE_ROCE_V2, kLinkLocal.data());
  try {
    (void)make_ibverbs_transport(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bare:1 is an Ethernet (RoCE) port without a usable GID"));
  }
}

TEST_F(IbverbsOverFake, ImportIdsBelongToTheirRank) {
  add_ib("fake0", 1);
  Rank& a = make(0);
  Rank& b = make(1);
  Rank& c = make(2);
  const std::uint32_t from_b = connect(a, b);
  const std::uint32_t from_c = connect(a, c);
  EXPECT_NE(from_b, from_c) << "ids are transport-wide";
  const WriteRequest wrong = write(a, from_c, 0, 0, 8);
  const Status s = a.transport->post_writes(1, std::span(&wrong, 1), 1, 1);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("post_writes to rank 1: write 0 of 1 names remote memory " + std::to_string(from_c) +
                                     ", which was imported from rank 2, not from rank 1"));
  const WriteRequest past = write(a, from_b, 0, (1 << 20) - 4, 8);
  EXPECT_THAT(a.transport->post_writes(1, std::span(&past, 1), 1, 1).message(), HasSubstr("writes remote memory 0 of rank 1"));
  EXPECT_THAT(a.transport->post_writes(7, std::span(&past, 1), 1, 1).message(), HasSubstr("not connected to rank 7"));
  const WriteRequest right = write(a, from_b, 0, 0, 8);
  EXPECT_TRUE(a.transport->post_writes(1, std::span(&right, 1), 1, 1).is_ok());
  // A key given for the wrong rank is refused at import.
  EXPECT_THROW((void)a.transport->import_memory(2, b.key), Error);
}

TEST_F(IbverbsOverFake, ReceivesAreSizedByTheWritersAndBatchesInFlightAreBounded) {
  settings_.set("ib_batches_in_flight", "40");
  add_roce("fake0", 1, 64);  // a device with 64 shared receives
  Rank& receiver = make(0);
  Rank& w1 = make(1);
  Rank& w2 = make(2);
  EXPECT_EQ(receiver.ib->nic(0).srq_depth, 64u);
  const std::uint32_t remote = w1.transport->import_memory(0, receiver.key);
  (void)connect(receiver, w1);
  EXPECT_TRUE(receiver.ib->nic(0).receives.fits()) << "40 of 64";
  (void)connect(receiver, w2);
  EXPECT_FALSE(receiver.ib->nic(0).receives.fits()) << "80 of 64: warned at connect";
  EXPECT_EQ(receiver.ib->nic(0).receives.needed(), 80u);
  // A writer keeps at most 40 batches unacknowledged to one peer: the 41st waits (kRetryLater).
  const WriteRequest w = write(w1, remote, 0, 0, 8);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(w1.transport->post_writes(0, std::span(&w, 1), i, i).is_ok()) << i;
  const Status full = w1.transport->post_writes(0, std::span(&w, 1), 40, 40);
  EXPECT_EQ(full.code(), ErrorCode::kRetryLater);
  EXPECT_THAT(full.message(), HasSubstr("WB_IB_BATCHES_IN_FLIGHT"));
  std::vector<Completion> seen;
  ASSERT_TRUE(w1.transport->poll(seen).is_ok());
  EXPECT_EQ(count(seen, Completion::Kind::kWritesDone, 0), 40u);
  EXPECT_TRUE(w1.transport->post_writes(0, std::span(&w, 1), 40, 40).is_ok());
}

TEST_F(IbverbsOverFake, RelaxedOrderingWhereTheLibraryTakesIt) {
  add_ib("fake0", 1);
  for (const char* setting : {"auto", "off"}) {
    SettingScope scope;
    scope.set("ib_relaxed_ordering", setting);
    Rank& a = make(0);
    const std::uint32_t key = parse_memory_key(a.key, 0).rkeys.at(0);
    const bool on = std::string(setting) == "auto";
    EXPECT_EQ(a.ib->relaxed_ordering(), on);
    EXPECT_EQ((fake().mr_access(key) & IBV_ACCESS_RELAXED_ORDERING) != 0, on) << setting;
    EXPECT_NE(fake().mr_access(key) & IBV_ACCESS_REMOTE_WRITE, 0);
    ranks_.clear();
  }
}

// --- an older rdma-core, a missing one, and fork ------------------------------------------------------

TEST(IbverbsOverOldLibrary, GidTypesFromSysfsAndNoRelaxedOrdering) {
  FakeVerbs old(WB_FAKE_IBVERBS_OLD);
  ASSERT_TRUE(old.loaded());
  SettingScope scope;
  scope.set("ib_library", old.path());
  old.reset();
  // The kernel's GID type files, as sysfs has them.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("wb-fake-sysfs-" + std::to_string(::getpid()));
  const std::filesystem::path types = dir / "ports" / "1" / "gid_attrs" / "types";
  std::filesystem::create_directories(types);
  const char* texts[] = {"IB/RoCE v1\n", "RoCE v2\n", "IB/RoCE v1\n", "RoCE v2\n"};
  for (int i = 0; i < 4; ++i) std::ofstream(types / std::to_string(i)) << texts[i];
  const int d = old.add_device("old0", dir.c_str(), 0, 32767, 4194303);
  old.add_port(d, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, 0, 0);
  old.set_gid(d, 1, 0, IBV_GID_TYPE_ROCE_V1, kLinkLocal.data());
  old.set_gid(d, 1, 1, IBV_GID_TYPE_ROCE_V2, kLinkLocal.data());
  old.set_gid(d, 1, 2, IBV_GID_TYPE_ROCE_V1, v4_gid(10, 0, 0, 1).data());
  old.set_gid(d, 1, 3, IBV_GID_TYPE_ROCE_V2, v4_gid(10, 0, 0, 1).data());
  old.set_gid(d, 1, 5, IBV_GID_TYPE_ROCE_V2, v4_gid(10, 0, 0, 5).data());  // no type file: skipped
  {
    std::unique_ptr<Transport> t = make_ibverbs_transport(0);
    auto* ib = dynamic_cast<IbverbsTransport*>(t.get());
    ASSERT_NE(ib, nullptr);
    EXPECT_EQ(ib->nic(0).address.gid_index, 3u) << "RoCE v2 with IPv4, its type read from sysfs";
    EXPECT_EQ(ib->nic(0).address.gid_type, GidType::kRoceV2);
    EXPECT_FALSE(ib->relaxed_ordering()) << "no ibv_reg_mr_iova2: the flag would be refused";
    std::vector<std::uint8_t> memory(4096);
    EXPECT_NO_THROW((void)t->register_memory(memory.data(), memory.size(), MemoryKind::kHost, 0));
  }
  scope.set("ib_relaxed_ordering", "on");
  expect_error([&] { (void)make_ibverbs_transport(0); }, ErrorCode::kUnsupported, {"has no ibv_reg_mr_iova2"});
  old.reset();
  std::filesystem::remove_all(dir);
}

TEST(IbverbsLibrary, AMissingLibraryOrFunctionIsUnsupportedAndCmaStillRuns) {
  SettingScope scope;
  scope.set("ib_library", "/nonexistent/libibverbs.so.1");
  expect_error([&] { (void)make_transport(TransportKind::kIbverbs, 0); }, ErrorCode::kUnsupported,
               {"no RDMA device: cannot load /nonexistent/libibverbs.so.1"});
  scope.set("ib_library", WB_FAKE_IBVERBS_NO_CREATE_QP);
  expect_error([&] { (void)make_transport(TransportKind::kIbverbs, 0); }, ErrorCode::kUnsupported,
               {"has no ibv_create_qp"});
  // The process goes on with the other transports.
  std::unique_ptr<Transport> cma;
  EXPECT_NO_THROW(cma = make_transport(TransportKind::kCma, 0));
  ASSERT_NE(cma, nullptr);
  EXPECT_EQ(cma->kind(), TransportKind::kCma);
}

// rdma-core's own library, where it is installed (this machine has rdma-core 44 without a device): every
// function resolves at the version the headers declare.
TEST(IbverbsLibrary, TheInstalledLibraryResolvesEveryFunction) {
  const VerbsLibrary* lib = nullptr;
  try {
    lib = &load_verbs_library("libibverbs.so.1", true);
  } catch (const Error& e) {
    // Skipped only where rdma-core is not installed; a library that loads but lacks a function fails.
    if (e.code() == ErrorCode::kUnsupported && std::string_view(e.what()).find("cannot load") != std::string_view::npos)
      GTEST_SKIP() << e.what();
    FAIL() << e.what();
  }
  for (const void* fn : {reinterpret_cast<const void*>(lib->get_device_list), reinterpret_cast<const void*>(lib->open_device),
                         reinterpret_cast<const void*>(lib->query_port_compat), reinterpret_cast<const void*>(lib->reg_mr),
                         reinterpret_cast<const void*>(lib->create_qp), reinterpret_cast<const void*>(lib->modify_qp),
                         reinterpret_cast<const void*>(lib->get_async_event), reinterpret_cast<const void*>(lib->fork_init)})
    EXPECT_NE(fn, nullptr);
  // Newer than rdma-core 35: all there in any current distribution.
  if (lib->missing_optional.empty()) {
    EXPECT_NE(lib->query_gid_table, nullptr);
    EXPECT_NE(lib->reg_dmabuf_mr, nullptr);
  }
  int count = 0;
  ibv_device** list = lib->get_device_list(&count);  // callable (here it fails with ENOSYS: no device)
  if (list != nullptr) lib->free_device_list(list);
}

// In a fresh process (the death-test child runs this test alone): ibv_fork_init is the first verbs call.
TEST(IbverbsLibraryDeathTest, ForkInitComesBeforeAnyVerbsObject) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        FakeVerbs& library = fake();
        find_setting("ib_library")->override_from_text(library.path());
        library.reset();
        const int d = library.add_device("fake0", "/nonexistent", 0, 32767, 4194303);
        library.add_port(d, IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND, 1, 0);
        library.set_gid(d, 1, 0, IBV_GID_TYPE_IB, ib_gid(1).data());
        const std::unique_ptr<Transport> t = make_ibverbs_transport(0);
        const std::string log = library.log();
        const bool first = log.rfind("fork_init,get_device_list", 0) == 0;
        const bool done = fork_protection().find("ibv_fork_init done") != std::string::npos;
        if (!first || !done) std::fprintf(stderr, "calls: %s; %s\n", log.c_str(), fork_protection().c_str());
        std::exit(first && done ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace wb::ibv
