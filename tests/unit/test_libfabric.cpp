// The libfabric transport's decisions that need no fabric: records, provider ranking, batch completion,
// CQ data. The transport itself runs in the conformance suite (tests/transport) over tcp;ofi_rxm.
#ifdef WB_HAVE_LIBFABRIC
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../support/expect_error.hpp"
#include "core/settings.hpp"
#include "transport/libfabric/fabric_internal.hpp"
#include "transport/libfabric/fabric_records.hpp"
#include "weightbridge/status.hpp"

namespace wb::fabric {
namespace {

using wb::testing::expect_error;

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

TEST(LibfabricRecords, EndpointRoundTripsAndChecksAgreement) {
  EndpointRecord mine{3, "tcp;ofi_rxm", 2, true, bytes_of({1, 2, 3})};
  EndpointRecord theirs{5, "tcp;ofi_rxm", 2, true, bytes_of({9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 255})};
  const EndpointRecord decoded = decode_endpoint(encode_endpoint(theirs), 3, 5, mine);
  EXPECT_EQ(decoded.rank, 5);
  EXPECT_EQ(decoded.provider, "tcp;ofi_rxm");
  EXPECT_EQ(decoded.address, theirs.address);

  // Given to the wrong peer.
  EXPECT_NE(expect_error([&] { decode_endpoint(encode_endpoint(theirs), 3, 4, mine); }, ErrorCode::kInvalidArgument)
                .find("made by rank 5"),
            std::string::npos);
  // Another provider: names both ranks and the setting.
  EndpointRecord efa = theirs;
  efa.provider = "efa";
  const std::string text = expect_error([&] { decode_endpoint(encode_endpoint(efa), 3, 5, mine); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(text.find("rank 5 uses provider 'efa' but rank 3 uses 'tcp;ofi_rxm'"), std::string::npos) << text;
  EXPECT_NE(text.find("WB_FI_PROVIDER"), std::string::npos) << text;
  EndpointRecord source = theirs;
  source.rank_in_cq_data = false;
  expect_error([&] { decode_endpoint(encode_endpoint(source), 3, 5, mine); }, ErrorCode::kInvalidArgument);
  EndpointRecord ipv6 = theirs;
  ipv6.address_format = 3;
  expect_error([&] { decode_endpoint(encode_endpoint(ipv6), 3, 5, mine); }, ErrorCode::kInvalidArgument);
}

TEST(LibfabricRecords, MalformedRecordsAreCorruptNotCrashes) {
  EndpointRecord mine{0, "tcp;ofi_rxm", 2, true, bytes_of({1})};
  const std::vector<std::byte> good = encode_endpoint({1, "tcp;ofi_rxm", 2, true, bytes_of({4, 5, 6})});
  // Every truncation, and a trailing byte, is refused as corrupt.
  for (std::size_t n = 0; n < good.size(); ++n)
    expect_error([&] { decode_endpoint(std::span(good).first(n), 0, 1, mine); }, ErrorCode::kCorruptData);
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  expect_error([&] { decode_endpoint(longer, 0, 1, mine); }, ErrorCode::kCorruptData);
  // A memory key is not an endpoint record and vice versa.
  const std::vector<std::byte> key = encode_memory_key({1, 0x1000, 64, 7, {}, 0});
  expect_error([&] { decode_endpoint(key, 0, 1, mine); }, ErrorCode::kCorruptData);
  expect_error([&] { decode_memory_key(good, 0, 1); }, ErrorCode::kCorruptData);
}

TEST(LibfabricRecords, MemoryKeysRoundTripWithRawKeys) {
  const MemoryKey plain{2, 0x7f0000001000, 1 << 20, 0xabcdef, {}, 0};
  const MemoryKey decoded = decode_memory_key(encode_memory_key(plain), 0, 2);
  EXPECT_EQ(decoded.address, plain.address);
  EXPECT_EQ(decoded.bytes, plain.bytes);
  EXPECT_EQ(decoded.key, plain.key);
  EXPECT_TRUE(decoded.raw_key.empty());
  const MemoryKey raw{2, 0x1000, 4096, 0, bytes_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}), 0x55};
  const MemoryKey decoded_raw = decode_memory_key(encode_memory_key(raw), 0, 2);
  EXPECT_EQ(decoded_raw.raw_key, raw.raw_key);
  EXPECT_EQ(decoded_raw.raw_base, 0x55u);
  // Wrong peer, empty and wrapping regions.
  expect_error([&] { decode_memory_key(encode_memory_key(plain), 0, 3); }, ErrorCode::kInvalidArgument);
  expect_error([&] { decode_memory_key(encode_memory_key({2, 0x1000, 0, 1, {}, 0}), 0, 2); }, ErrorCode::kCorruptData);
  expect_error([&] { decode_memory_key(encode_memory_key({2, ~0ull - 10, 100, 1, {}, 0}), 0, 2); }, ErrorCode::kCorruptData);
}

TEST(LibfabricProviders, RankedByPreferenceAvoidingLoopbackAndIpv6) {
  const std::vector<Candidate> offered = {
      {"tcp;ofi_rxm", "lo", "127.0.0.1/32", false},  {"tcp;ofi_rxm", "eth0", "fe80::/64", true},
      {"tcp;ofi_rxm", "eth0", "10.0.0.0/24", false}, {"verbs;ofi_rxm", "mlx5_0", "IB-0xfe80", false},
      {"efa", "rdmap0-rdm", "efa", false},           {"udp;ofi_rxd", "eth0", "10.0.0.0/24", false},
  };
  // Automatic: EFA, then verbs, then TCP on a real interface over IPv4, then the rest.
  EXPECT_EQ(rank_candidates(offered, "", ""), (std::vector<std::size_t>{4, 3, 2, 1, 0, 5}));
  // A provider setting keeps only that provider; a domain setting only that domain.
  EXPECT_EQ(rank_candidates(offered, "tcp;ofi_rxm", ""), (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_EQ(rank_candidates(offered, "tcp;ofi_rxm", "lo"), (std::vector<std::size_t>{0}));
  EXPECT_TRUE(rank_candidates(offered, "cxi", "").empty());
  EXPECT_TRUE(is_loopback(offered[0]));
  EXPECT_FALSE(is_loopback(offered[2]));
  // Slingshot first of all.
  std::vector<Candidate> with_cxi = offered;
  with_cxi.push_back({"cxi", "cxi0", "cxi", false});
  EXPECT_EQ(rank_candidates(with_cxi, "", "").front(), 6u);
}

TEST(LibfabricBatches, CompletionModeFollowsTheProvidersOrdering) {
  EXPECT_EQ(choose_batch_completion("auto", true, true, "tcp;ofi_rxm"), BatchCompletion::kOrdered);
  EXPECT_EQ(choose_batch_completion("auto", false, true, "efa"), BatchCompletion::kTwoPhase);
  EXPECT_EQ(choose_batch_completion("auto", true, false, "x"), BatchCompletion::kTwoPhase);
  EXPECT_EQ(choose_batch_completion("two_phase", true, true, "tcp;ofi_rxm"), BatchCompletion::kTwoPhase);
  EXPECT_EQ(choose_batch_completion("ordered", true, true, "tcp;ofi_rxm"), BatchCompletion::kOrdered);
  const std::string text = expect_error([] { choose_batch_completion("ordered", false, true, "efa"); }, ErrorCode::kUnsupported);
  EXPECT_NE(text.find("FI_ORDER_WAW"), std::string::npos) << text;
  expect_error([] { choose_batch_completion("fenced", true, true, "x"); }, ErrorCode::kInvalidArgument);
}

TEST(LibfabricBatches, CqDataCarriesWriterAndImmediate) {
  for (int writer : {0, 1, 4095, 1 << 30})
    for (std::uint32_t immediate : {0u, 1u, 0xC0FFEEu, 0xFFFFFFFFu}) {
      const Arrival a = decode_cq_data(encode_cq_data(writer, immediate, true), true);
      EXPECT_EQ(a.writer, writer);
      EXPECT_EQ(a.immediate, immediate);
      // Four bytes of CQ data: the immediate alone, the writer from FI_SOURCE.
      const std::uint64_t short_data = encode_cq_data(writer, immediate, false);
      EXPECT_LE(short_data, 0xFFFFFFFFull);
      const Arrival b = decode_cq_data(short_data, false);
      EXPECT_EQ(b.writer, -1);
      EXPECT_EQ(b.immediate, immediate);
    }
}

// The provider parameters are the environment libfabric reads once, at a process's first provider query:
// set there from the settings, but a variable the user set is left as it is. (ctest runs each test in a
// process of its own: nothing queried a provider before.)
TEST(LibfabricProviders, ParametersAreSetBeforeTheFirstQueryUnlessTheUserSetThem) {
  if (std::getenv("WB_FI_RXM_BUFFER_BYTES") != nullptr) GTEST_SKIP() << "WB_FI_RXM_BUFFER_BYTES is set";
  ::unsetenv("FI_OFI_RXM_BUFFER_SIZE");
  ::setenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL", "777", 1);
  apply_provider_defaults();
  const char* buffer = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(std::string(buffer), find_setting("fi_rxm_buffer_bytes")->default_text());
  EXPECT_EQ(std::string(buffer), "1024");  // rxm's bounce buffers: this transport sends no messages
  EXPECT_EQ(std::string(std::getenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL")), "777");
}

}  // namespace
}  // namespace wb::fabric
#endif  // WB_HAVE_LIBFABRIC
