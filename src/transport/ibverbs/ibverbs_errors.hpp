// Private: what the ibverbs transport says when something fails after set-up: a failed work completion,
// and an asynchronous event of the device (ibv_get_async_event), each turned into words a person can act
// on and into what fails with it (a peer, a NIC, the device). No ibverbs header: status, opcode and
// event values are the plain integers of <infiniband/verbs.h>.
#pragma once

#include <cstdint>
#include <string>

namespace wb::ibv {

/// A failed work completion.
struct CompletionError {
  int peer = -1;
  std::string nic;            // "mlx5_0:1"
  int rail = 0;
  bool receive = false;       // a receive (an arriving immediate) rather than our own write
  int status = 0;             // ibv_wc_status
  int opcode = 0;             // ibv_wc_opcode (meaningful only on success; providers vary)
  std::uint32_t vendor_err = 0;
  std::uint64_t token = 0;    // the batch's token, for a write
};
/// "RDMA write to rank 3 failed on mlx5_0:1 (rail 1): transport retry counter exceeded (status 12, ...):
/// <hint>".
std::string describe_completion_error(const CompletionError& error);
/// A hint for the most common failures (e.g. "the peer is dead or unreachable" for a retry-exceeded
/// status), or "" when there is none.
std::string completion_error_hint(int status);
/// The text of an ibv_wc_status value (as ibv_wc_status_str, without calling the library).
std::string wc_status_name(int status);
/// The name of an ibv_wc_opcode value ("RDMA_WRITE", "RECV_RDMA_WITH_IMM", ...).
std::string wc_opcode_name(int opcode);

/// What an asynchronous event concerns and what follows from it.
struct AsyncEventKind {
  enum class Scope : std::uint8_t { kNone, kQueuePair, kCompletionQueue, kSharedReceiveQueue, kPort, kDevice };
  enum class Effect : std::uint8_t {
    kIgnore,     // informational (connection established, a path migrated, ...)
    kWarn,       // worth a line in the log, nothing fails (receives running low, port back up)
    kFail,       // what it concerns is unusable: its peers fail
    kCheckGid,   // a GID of the port changed: fail if it is the one this rank advertised
  };
  const char* name = "";  // "QP_FATAL"
  Scope scope = Scope::kNone;
  Effect effect = Effect::kIgnore;
  const char* meaning = "";  // for the message
};
/// The kind of an ibv_event_type value (unknown values: device scope, kWarn).
AsyncEventKind async_event_kind(int event_type);

}  // namespace wb::ibv
