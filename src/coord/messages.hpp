// The coordinator's control messages: the tags on the adapters' own duplicate of the world communicator,
// and the requests trainer rank 0 sends to every engine's rank 0. Small MPI messages only: never the
// training or inference engine's own control plane, never weight bytes.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/span_summary.hpp"
#include "weightbridge/status.hpp"

namespace wb::coord {

/// The words of a joined engine's notice that it left between updates (ReceiverAdapter::leave), and
/// whether a failure is that notice: the trainers, meeting it as the cause of a link's failure, let go of
/// that link instead of abandoning it, and send that job nothing more.
inline constexpr const char* kLeftBetweenUpdates = "left between updates";
inline bool is_leave(const Status& status) {
  return !status && status.message().find(kLeftBetweenUpdates) != std::string::npos;
}

inline constexpr int kRequestTag = 0x5701;  // trainer rank 0 -> engine rank 0
inline constexpr int kAckTag = 0x5702;      // engine rank 0 -> trainer rank 0
inline constexpr int kClockTag = 0x5703;    // clock offset ping-pong at construction
inline constexpr int kStartedTag = 0x5704;  // engine rank 0 -> trainer rank 0: "took update v" (diagnostics)
inline constexpr int kNoticeTag = 0x5705;   // "I gave up", to a rank's neighbours
inline constexpr int kQueryTag = 0x5706;    // "where are you?" from a rank whose step timed out
inline constexpr int kAnswerTag = 0x5707;   // its answer
inline constexpr int kReplicaTag = 0x5708;  // a joiner's rank 0 -> trainer rank 0: whether it connected to a joined replica
inline constexpr int kMetTag = 0x5709;      // a joined engine's rank 0 -> trainer rank 0: whether it met a joiner's port
inline constexpr int kAliveTag = 0x570a;    // the fleet link after a loss: an engine's rank 0 -> trainer rank 0, the version it holds
inline constexpr int kVerdictTag = 0x570b;  // ... and back (and on to the engine's ranks): the survivors the link is rebuilt from
inline constexpr int kEnterTag = 0x570c;    // ... every engine rank in it -> trainer rank 0: it has the verdict and enters the rebuild
inline constexpr int kGoTag = 0x570d;       // ... and back: the survivors that all said so, who make the link

// kAbort: the trainers shut down after a failure (the engines fail too, with the reason their notices carry).
// kServeJoiner: to the replica only (engine 0 of the trainers' job, or a joined job appointed by
// kBeReplica): an engine job is being taken; once the version named is installed, its workers make a link
// with the joiner and write it that version (coord/catch_up.hpp). kBeReplica: to a joined engine job with
// two workers or more, when the trainers have no replica: it opens a port later joiners connect to first.
// On the fleet link (coord/fleet_link.hpp): kMeetJoiner, a joined engine's leader connects to the joiner's
// port; kWiden, every worker of a joined engine takes part in widening the fleet link with the joiner and
// re-links onto the widened one (kept source map, version, history and stalls); kLeaveOut, every engine
// of the fleet link rejoins it as after a loss, the jobs silent at a joiner's port left out (W3).
enum class RequestKind : std::int64_t {
  kNone = 0, kConnect = 1, kUpdate = 2, kShutdown = 3, kAbort = 4, kServeJoiner = 5, kBeReplica = 6, kMeetJoiner = 7,
  kWiden = 8, kLeaveOut = 9
};
const char* request_name(RequestKind kind);
/// Trainer rank 0: one request to an engine's rank 0 (`leader`, a rank of `world`). Not waited for: an
/// engine that does not take it fails the update by its deadline, and one that is gone must not hold this one.
Status send_request(MPI_Comm world, int leader, RequestKind kind, std::uint64_t v);

/// Engine rank 0: the requests trainer rank 0 sends, in order. An update followed by a shutdown or an
/// abort was given up by the trainers (they shut down only after every install, or after a failure): it is
/// skipped, for taking it would write into peers that may be gone. Any other request right after an update
/// is kept for the next take: on the fleet link an asynchronous resend after a loss is followed at once by
/// kBeReplica, which, taken in the update's place, left the resend's writes to the new replica unreceived
/// until the trainers' deadline.
class RequestInbox {
 public:
  /// The next request, {kNone, 0} when none came. A taken update is noted to trainer rank 0 (kStartedTag),
  /// which names silent engines when an update fails.
  Status take(MPI_Comm world, int trainer_leader, std::int64_t values[2]);

 private:
  std::optional<std::array<std::int64_t, 2>> next_;
};

/// What engine rank 0 tells trainer rank 0 about an update (kAckTag): installed on the whole engine, or
/// why not, and the engine's stalls for it (every rank's, summed over the engine), from which the trainers
/// compute the update's EWTT and AGST without gathering reports.
struct Acknowledgement {
  std::uint64_t version = 0;
  Status status;
  comm::SpanSummary stalls;  // empty when the update failed
};

std::vector<std::byte> encode_acknowledgement(const Acknowledgement& ack);
/// kCorruptData when the bytes are not one (update path: never throws).
Status decode_acknowledgement(std::span<const std::byte> bytes, Acknowledgement& ack);

}  // namespace wb::coord
