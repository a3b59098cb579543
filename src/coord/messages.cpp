#include "coord/messages.hpp"

#include <algorithm>
#include <cstring>

#include "comm/operation.hpp"
#include "comm/status_message.hpp"
#include "core/checks.hpp"
#include "core/byte_codec.hpp"

namespace wb::coord {

const char* request_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::kNone: return "none";
    case RequestKind::kConnect: return "connect";
    case RequestKind::kUpdate: return "update";
    case RequestKind::kShutdown: return "shutdown";
    case RequestKind::kAbort: return "abort";
    case RequestKind::kServeJoiner: return "serve a joiner";
    case RequestKind::kBeReplica: return "be the replica";
    case RequestKind::kMeetJoiner: return "meet the joiner";
    case RequestKind::kWiden: return "widen the fleet link";
    case RequestKind::kLeaveOut: return "leave the silent jobs out of the fleet link";
  }
  return "unknown";
}

Status send_request(MPI_Comm world, int leader, RequestKind kind, std::uint64_t v) {
  comm::OperationPtr op = comm::make_operation(2 * sizeof(std::int64_t));
  const std::int64_t message[2] = {static_cast<std::int64_t>(kind), static_cast<std::int64_t>(v)};
  std::memcpy(op->out.data(), message, sizeof message);
  WB_TRY_MPI(MPI_Isend(op->out.data(), 2, MPI_INT64_T, leader, kRequestTag, world, &op->request));
  comm::abandon(std::move(op));
  return Status::ok();
}

Status RequestInbox::take(MPI_Comm world, int trainer_leader, std::int64_t values[2]) {
  values[0] = values[1] = 0;
  int found = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  if (next_) {
    std::copy_n(next_->begin(), 2, values);
    next_.reset();
  } else {
    WB_TRY_MPI(MPI_Improbe(trainer_leader, kRequestTag, world, &found, &message, MPI_STATUS_IGNORE));
    if (!found) return Status::ok();
    WB_TRY_MPI(MPI_Mrecv(values, 2, MPI_INT64_T, &message, MPI_STATUS_IGNORE));
  }
  if (static_cast<RequestKind>(values[0]) != RequestKind::kUpdate) return Status::ok();
  WB_TRY_MPI(MPI_Improbe(trainer_leader, kRequestTag, world, &found, &message, MPI_STATUS_IGNORE));
  if (found) {
    std::array<std::int64_t, 2> following{};
    WB_TRY_MPI(MPI_Mrecv(following.data(), 2, MPI_INT64_T, &message, MPI_STATUS_IGNORE));
    const auto kind = static_cast<RequestKind>(following[0]);
    if (kind == RequestKind::kShutdown || kind == RequestKind::kAbort) {
      std::copy_n(following.begin(), 2, values);
      return Status::ok();
    }
    next_ = following;
  }
  comm::OperationPtr note = comm::make_operation(sizeof(std::int64_t));
  std::memcpy(note->out.data(), &values[1], sizeof(std::int64_t));
  WB_TRY_MPI(MPI_Isend(note->out.data(), 1, MPI_INT64_T, trainer_leader, kStartedTag, world, &note->request));
  comm::abandon(std::move(note));
  return Status::ok();
}

namespace {
constexpr std::uint8_t kAcknowledgementVersion = 1;
}

std::vector<std::byte> encode_acknowledgement(const Acknowledgement& ack) {
  codec::ByteWriter out;
  out.byte(kAcknowledgementVersion);
  out.varint(ack.version);
  const std::vector<std::byte> status = comm::encode_status(ack.status);
  out.varint(status.size());
  out.bytes(status);
  out.float64(ack.stalls.earliest_begin);
  out.float64(ack.stalls.latest_end);
  out.float64(ack.stalls.total_seconds);
  out.float64(ack.stalls.spans);
  return out.take();
}

Status decode_acknowledgement(std::span<const std::byte> bytes, Acknowledgement& ack) {
  try {
    codec::ByteReader in(bytes, "acknowledgement");
    if (const std::uint8_t got = in.byte(); got != kAcknowledgementVersion)
      in.fail("version " + std::to_string(got) + ", expected " + std::to_string(kAcknowledgementVersion));
    ack.version = in.varint();
    const auto status = in.bytes(static_cast<std::size_t>(in.bounded(in.remaining(), "status length")));
    ack.status = comm::decode_status(status);
    ack.stalls.earliest_begin = in.float64();
    ack.stalls.latest_end = in.float64();
    ack.stalls.total_seconds = in.float64();
    ack.stalls.spans = in.float64();
    in.expect_done();
  } catch (const Error& error) {
    return error.status();
  }
  return Status::ok();
}

}  // namespace wb::coord
