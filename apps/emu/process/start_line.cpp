#include "emu/process/start_line.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>

#include "comm/backoff.hpp"
#include "core/checks.hpp"
#include "emu/process/bounded_exit.hpp"

namespace wb::emu {
namespace {

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

}  // namespace

std::string StartLine::wait(std::uint64_t version, const std::string& what, const std::function<bool()>& idle,
                            std::string* note) {
  if (rank_ != 0) {
    send(0, version, kReady, "");
    comm::OperationPtr answer = comm::make_operation(0, kMaxBytes);
    WB_CHECK_MPI(MPI_Irecv(answer->in.data(), static_cast<int>(kMaxBytes), MPI_BYTE, 0, kStartTag, MPI_COMM_WORLD,
                           &answer->request));
    // Rank 0 answers within the timeout of its own arrival, which is later than this one's by no more
    // than the last update's acknowledgements: one timeout more is ample.
    bool interrupted = false;
    const auto waiting = [&] {
      if (idle && !idle()) interrupted = true;
      return !interrupted;
    };
    if (!wait_within(answer, 2 * seconds_, waiting))
      return interrupted ? "" : name_(0) + " did not start " + what + " within " + seconds_text(2 * seconds_) + " s";
    const auto [kind, text] = decode(answer->in);
    if (kind == kGo) {
      if (note != nullptr) *note = text;
      return "";
    }
    left_ = true;
    return text;
  }
  // Rank 0: every other rank's note, or a failure, or the deadline.
  std::vector<bool> arrived(static_cast<std::size_t>(world_), false);
  arrived[0] = true;
  int missing = world_ - 1;
  const double start = wall_seconds();
  comm::Backoff backoff;
  while (missing > 0 && failed_.empty()) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status probe;
    WB_CHECK_MPI(MPI_Improbe(MPI_ANY_SOURCE, kStartTag, MPI_COMM_WORLD, &found, &message, &probe));
    if (found) {
      int count = 0;
      WB_CHECK_MPI(MPI_Get_count(&probe, MPI_BYTE, &count));
      std::vector<std::byte> bytes(static_cast<std::size_t>(count));
      WB_CHECK_MPI(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
      const auto [kind, text] = decode(bytes);
      if (kind == kFailed) {
        failed_ = what + " not started: " + name_(probe.MPI_SOURCE) + " failed: " + text;
      } else if (!arrived[static_cast<std::size_t>(probe.MPI_SOURCE)] && version_of(bytes) == version) {
        arrived[static_cast<std::size_t>(probe.MPI_SOURCE)] = true;
        --missing;
      }
      backoff.progressed();
      continue;
    }
    if (wall_seconds() - start > seconds_) {
      std::string absent;
      for (int r = 0; r < world_; ++r)
        if (!arrived[static_cast<std::size_t>(r)]) absent += (absent.empty() ? "" : ", ") + name_(r);
      failed_ = what + " not started: " + absent + " did not come to it within " +
                seconds_text(seconds_) + " s (stopped, dead, or busy outside WeightBridge)";
      break;
    }
    if (idle && !idle()) return "";
    backoff.pause();
  }
  for (int r = 1; r < world_; ++r)
    send(r, version, failed_.empty() ? kGo : kStop, failed_.empty() && note != nullptr ? *note : failed_);
  if (!failed_.empty()) left_ = true;
  return failed_;
}

void StartLine::leave(std::uint64_t version, const std::string& why) {
  if (left_) return;
  left_ = true;
  if (rank_ != 0) {
    send(0, version, kFailed, why);
    return;
  }
  for (int r = 1; r < world_; ++r) send(r, version, kStop, "version " + std::to_string(version) + ": " + name_(0) + " failed: " + why);
}

void StartLine::send(int peer, std::uint64_t version, Kind kind, const std::string& text) {
  comm::OperationPtr op = comm::make_operation();
  const std::int64_t head[2] = {static_cast<std::int64_t>(version), kind};
  const std::size_t bytes = std::min(text.size(), kMaxBytes - sizeof head);
  op->out.resize(sizeof head + bytes);
  std::memcpy(op->out.data(), head, sizeof head);
  std::memcpy(op->out.data() + sizeof head, text.data(), bytes);
  WB_CHECK_MPI(MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, peer, kStartTag, MPI_COMM_WORLD, &op->request));
  comm::abandon(std::move(op));  // not waited for: kept until MPI completes it
}

std::uint64_t StartLine::version_of(const std::vector<std::byte>& bytes) {
  std::int64_t head[2] = {0, 0};
  std::memcpy(head, bytes.data(), std::min(bytes.size(), sizeof head));
  return static_cast<std::uint64_t>(head[0]);
}

std::pair<std::int64_t, std::string> StartLine::decode(const std::vector<std::byte>& bytes) {
  std::int64_t head[2] = {0, kStop};
  std::memcpy(head, bytes.data(), std::min(bytes.size(), sizeof head));
  std::string text;
  for (std::size_t i = sizeof head; i < bytes.size() && bytes[i] != std::byte{0}; ++i) text.push_back(static_cast<char>(bytes[i]));
  return {head[1], text};
}

}  // namespace wb::emu
