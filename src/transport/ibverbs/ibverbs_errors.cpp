// Failed completions and asynchronous events in words (see ibverbs_errors.hpp).
#include "transport/ibverbs/ibverbs_errors.hpp"

#include <infiniband/verbs.h>  // enum values only; no library call here

#include <cstdio>
#include <string>

#include "core/hex.hpp"
#include "transport/ibverbs/ibverbs_wire.hpp"

namespace wb::ibv {
std::string wc_status_name(int status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    default: return "unknown status " + std::to_string(status);
  }
}

std::string wc_opcode_name(int opcode) {
  switch (opcode) {
    case IBV_WC_SEND: return "SEND";
    case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";
    case IBV_WC_COMP_SWAP: return "COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "FETCH_ADD";
    case IBV_WC_BIND_MW: return "BIND_MW";
    case IBV_WC_LOCAL_INV: return "LOCAL_INV";
    case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "opcode " + std::to_string(opcode);
  }
}

std::string completion_error_hint(int status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      return "the peer did not acknowledge: it is dead, unreachable, or its queue pair was not connected in time";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "the peer had no receive posted for the immediate (it stopped polling?)";
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer refused the write: remote address or rkey outside what it registered (stale memory key?)";
    case IBV_WC_LOC_PROT_ERR: return "a local address or lkey is outside the registered memory";
    case IBV_WC_WR_FLUSH_ERR: return "flushed after an earlier error on the same connection";
    default: return "";
  }
}

std::string describe_completion_error(const CompletionError& e) {
  std::string text = "RDMA ";
  text += e.receive ? "receive of an immediate from " : "write to ";
  text += rank_text(e.peer);
  text += " failed on " + e.nic + " (rail " + std::to_string(e.rail) + "): " + wc_status_name(e.status);
  text += " (status " + std::to_string(e.status) + ", opcode " + wc_opcode_name(e.opcode) + ", vendor_err " + hex(e.vendor_err);
  if (!e.receive) text += ", batch token " + std::to_string(e.token);
  text += ")";
  const std::string hint = completion_error_hint(e.status);
  if (!hint.empty()) text += ": " + hint;
  return text;
}

AsyncEventKind async_event_kind(int event_type) {
  using Scope = AsyncEventKind::Scope;
  using Effect = AsyncEventKind::Effect;
  switch (event_type) {
    case IBV_EVENT_CQ_ERR:
      return {"CQ_ERR", Scope::kCompletionQueue, Effect::kFail,
              "the completion queue overran or failed; completions of every connection on the NIC are lost"};
    case IBV_EVENT_QP_FATAL:
      return {"QP_FATAL", Scope::kQueuePair, Effect::kFail, "the queue pair hit an error the NIC cannot report per work request"};
    case IBV_EVENT_QP_REQ_ERR:
      return {"QP_REQ_ERR", Scope::kQueuePair, Effect::kFail, "the peer's NIC saw a malformed request from this queue pair"};
    case IBV_EVENT_QP_ACCESS_ERR:
      return {"QP_ACCESS_ERR", Scope::kQueuePair, Effect::kFail,
              "a request arriving on this queue pair violated its access rights (a write outside registered memory?)"};
    case IBV_EVENT_COMM_EST: return {"COMM_EST", Scope::kQueuePair, Effect::kIgnore, "communication established"};
    case IBV_EVENT_SQ_DRAINED: return {"SQ_DRAINED", Scope::kQueuePair, Effect::kIgnore, "send queue drained"};
    case IBV_EVENT_PATH_MIG: return {"PATH_MIG", Scope::kQueuePair, Effect::kIgnore, "path migrated"};
    case IBV_EVENT_PATH_MIG_ERR:
      return {"PATH_MIG_ERR", Scope::kQueuePair, Effect::kFail, "the queue pair's path could not be migrated"};
    case IBV_EVENT_DEVICE_FATAL:
      return {"DEVICE_FATAL", Scope::kDevice, Effect::kFail, "the device failed (it needs a reset; firmware or PCIe error?)"};
    case IBV_EVENT_PORT_ACTIVE: return {"PORT_ACTIVE", Scope::kPort, Effect::kWarn, "the port became active"};
    case IBV_EVENT_PORT_ERR:
      return {"PORT_ERR", Scope::kPort, Effect::kFail, "the port went down (cable, switch port or subnet manager?)"};
    case IBV_EVENT_LID_CHANGE:
      return {"LID_CHANGE", Scope::kPort, Effect::kFail,
              "the port's LID changed: peers still address the LID this rank advertised"};
    case IBV_EVENT_PKEY_CHANGE: return {"PKEY_CHANGE", Scope::kPort, Effect::kWarn, "the port's P_Key table changed"};
    case IBV_EVENT_SM_CHANGE: return {"SM_CHANGE", Scope::kPort, Effect::kWarn, "the subnet manager changed"};
    case IBV_EVENT_SRQ_ERR:
      return {"SRQ_ERR", Scope::kSharedReceiveQueue, Effect::kFail,
              "the shared receive queue failed; no immediate can arrive on the NIC"};
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return {"SRQ_LIMIT_REACHED", Scope::kSharedReceiveQueue, Effect::kWarn,
              "the shared receive queue ran low on receives (writers will be paced by RNR retries)"};
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return {"QP_LAST_WQE_REACHED", Scope::kQueuePair, Effect::kIgnore, "a failed queue pair left the shared receive queue"};
    case IBV_EVENT_CLIENT_REREGISTER:
      return {"CLIENT_REREGISTER", Scope::kPort, Effect::kWarn, "the subnet manager asked clients to register again"};
    case IBV_EVENT_GID_CHANGE:
      return {"GID_CHANGE", Scope::kPort, Effect::kCheckGid, "the port's GID table changed (an IP address moved?)"};
    case IBV_EVENT_WQ_FATAL: return {"WQ_FATAL", Scope::kNone, Effect::kIgnore, "a work queue failed (not used here)"};
    default: return {"UNKNOWN", Scope::kDevice, Effect::kWarn, "an event this build does not know"};
  }
}

}  // namespace wb::ibv
