// The round executor's connect record: it round-trips, and a truncated or malformed record from a peer
// is one error naming the peer, never a read past its end (a length near 2^64 used to wrap around the
// bounds check of the inline decoder this replaced, and the record's span then reached past it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "exec/connect_record.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> bytes_of(const char* text) {
  std::vector<std::byte> out(std::strlen(text));
  std::memcpy(out.data(), text, out.size());
  return out;
}

ConnectRecord sample() { return {1, 1 << 20, bytes_of("endpoint bytes"), bytes_of("key"), {0, 2, 3, 4, 0, 2}}; }

void expect_corrupt(const std::vector<std::byte>& bytes, const std::string& part) {
  try {
    decode_connect_record(bytes, 5);
    ADD_FAILURE() << "decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData);
    EXPECT_THAT(e.what(), HasSubstr("executor connect record from rank 5"));
    EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

void put_u64(std::vector<std::byte>& bytes, std::size_t at, std::uint64_t value) { std::memcpy(bytes.data() + at, &value, 8); }

TEST(ConnectRecord, RoundTrips) {
  EXPECT_EQ(decode_connect_record(encode_connect_record(sample()), 5), sample());
  EXPECT_EQ(decode_connect_record(encode_connect_record(ConnectRecord{}), 5), ConnectRecord{});
}

TEST(ConnectRecord, MalformedRecordsAreOneErrorNamingThePeer) {
  const std::vector<std::byte> good = encode_connect_record(sample());
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    SCOPED_TRACE(cut);
    expect_corrupt(std::vector<std::byte>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)), "");
  }
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  expect_corrupt(longer, "split batch values");

  // The endpoint's length is at byte 16: near 2^64, position + length wraps to a small number.
  std::vector<std::byte> wraps = good;
  put_u64(wraps, 16, ~std::uint64_t{0} - 7);
  expect_corrupt(wraps, "endpoint of 18446744073709551608 bytes");
  // Split values not in triples, or more than the record holds (8 * count wraps too).
  std::vector<std::byte> pairs = encode_connect_record({1, 64, {}, {}, {7, 8}});
  expect_corrupt(pairs, "2 split batch values");
  std::vector<std::byte> many = encode_connect_record({1, 64, {}, {}, {}});
  put_u64(many, many.size() - 8, std::uint64_t{3} << 61);
  expect_corrupt(many, "split batch values");
}

}  // namespace
}  // namespace wb::exec
