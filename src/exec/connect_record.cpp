#include "exec/connect_record.hpp"

#include <cstring>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

void append_u64(std::vector<std::byte>& out, std::uint64_t value) {
  const auto* p = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), p, p + sizeof value);
}

/// Reads the fields in order, every length checked against what is left (never by adding it to the
/// position: a length near 2^64 would wrap around).
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, int peer) : bytes_(bytes), peer_(peer) {}

  std::uint64_t u64(const char* field) {
    if (left() < 8) fail(std::string(field) + " truncated");
    std::uint64_t value = 0;
    std::memcpy(&value, bytes_.data() + at_, 8);
    at_ += 8;
    return value;
  }
  std::vector<std::byte> bytes(const char* field) {
    const std::uint64_t size = u64(field);
    if (size > left())
      fail(std::string(field) + " of " + std::to_string(size) + " bytes, " + std::to_string(left()) + " left");
    std::vector<std::byte> out(bytes_.begin() + static_cast<std::ptrdiff_t>(at_),
                               bytes_.begin() + static_cast<std::ptrdiff_t>(at_ + size));
    at_ += static_cast<std::size_t>(size);
    return out;
  }
  std::size_t left() const { return bytes_.size() - at_; }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::kCorruptData, "executor connect record from rank " + std::to_string(peer_) + ": " + why +
                                             " at byte " + std::to_string(at_));
  }

 private:
  std::span<const std::byte> bytes_;
  int peer_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<std::byte> encode_connect_record(const ConnectRecord& record) {
  std::vector<std::byte> out;
  append_u64(out, record.transport);
  append_u64(out, record.receive_slot_stride);
  append_u64(out, record.endpoint.size());
  out.insert(out.end(), record.endpoint.begin(), record.endpoint.end());
  append_u64(out, record.memory_key.size());
  out.insert(out.end(), record.memory_key.begin(), record.memory_key.end());
  append_u64(out, record.split_batches.size());
  for (const std::uint64_t value : record.split_batches) append_u64(out, value);
  return out;
}

ConnectRecord decode_connect_record(std::span<const std::byte> bytes, int peer) {
  Reader in(bytes, peer);
  ConnectRecord record;
  record.transport = in.u64("transport");
  record.receive_slot_stride = in.u64("receive slot stride");
  record.endpoint = in.bytes("endpoint");
  record.memory_key = in.bytes("memory key");
  const std::uint64_t values = in.u64("split batch count");
  if (values % 3 != 0 || values != in.left() / 8 || in.left() % 8 != 0)
    in.fail(std::to_string(values) + " split batch values (triples expected, filling the rest of the record)");
  record.split_batches.reserve(static_cast<std::size_t>(values));
  for (std::uint64_t i = 0; i < values; ++i) record.split_batches.push_back(in.u64("split batch"));
  return record;
}

}  // namespace wb::exec
