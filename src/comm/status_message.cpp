#include "comm/status_message.hpp"

#include <cstring>

namespace wb::comm {

std::vector<std::byte> encode_status(const Status& status, std::int64_t a, std::int64_t b, const std::vector<int>& ranks) {
  const std::int64_t head[4] = {static_cast<std::int64_t>(status.code()), a, b, static_cast<std::int64_t>(ranks.size())};
  std::vector<std::byte> bytes(sizeof head + ranks.size() * sizeof(int) + status.message().size());
  std::memcpy(bytes.data(), head, sizeof head);
  if (!ranks.empty()) std::memcpy(bytes.data() + sizeof head, ranks.data(), ranks.size() * sizeof(int));
  std::memcpy(bytes.data() + sizeof head + ranks.size() * sizeof(int), status.message().data(), status.message().size());
  return bytes;
}

Status decode_status(std::span<const std::byte> bytes, std::int64_t* a, std::int64_t* b, std::vector<int>* ranks) {
  std::int64_t head[4] = {static_cast<std::int64_t>(ErrorCode::kInternal), 0, 0, 0};
  if (bytes.size() < sizeof head) return Status(ErrorCode::kCorruptData, "a control message of " + std::to_string(bytes.size()) + " bytes");
  std::memcpy(head, bytes.data(), sizeof head);
  if (head[3] < 0 || static_cast<std::size_t>(head[3]) > (bytes.size() - sizeof head) / sizeof(int))
    return Status(ErrorCode::kCorruptData, "a control message with " + std::to_string(head[3]) + " ranks in " +
                                               std::to_string(bytes.size()) + " bytes");
  if (a != nullptr) *a = head[1];
  if (b != nullptr) *b = head[2];
  const std::size_t listed = static_cast<std::size_t>(head[3]) * sizeof(int);
  if (ranks != nullptr) {
    ranks->resize(static_cast<std::size_t>(head[3]));
    if (listed > 0) std::memcpy(ranks->data(), bytes.data() + sizeof head, listed);
  }
  std::string message(reinterpret_cast<const char*>(bytes.data()) + sizeof head + listed, bytes.size() - sizeof head - listed);
  if (head[0] < 0 || head[0] > static_cast<std::int64_t>(ErrorCode::kInternal))
    return Status(ErrorCode::kCorruptData, "a control message with error code " + std::to_string(head[0]));
  if (head[0] == 0) return Status(ErrorCode::kOk, std::move(message));
  return Status(static_cast<ErrorCode>(head[0]), std::move(message));
}

}  // namespace wb::comm
