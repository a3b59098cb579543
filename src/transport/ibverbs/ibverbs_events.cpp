// ibverbs transport, asynchronous events: poll reads every device's events (ibv_get_async_event on a
// non-blocking descriptor) and turns those that break something into a failed peer (queue pair events),
// a failed NIC (completion queue, shared receive queue, port, a changed GID or LID) or a failed device,
// each with a message naming the event, the NIC and the peers that fail with it. Without this a receiver
// waiting for arrivals from behind a dead port would learn of it only from its own timeout.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "transport/ibverbs/ibverbs_errors.hpp"
#include "transport/ibverbs/ibverbs_internal.hpp"

namespace wb::ibv {

Status IbverbsTransport::fail_nic(std::size_t n, const Status& status) {
  Nic& nic = nics_[n];
  if (!nic.failure.is_ok()) return Status::ok();  // reported once
  nic.failure = status;
  WB_LOG(kError) << "ibverbs: " << nic.address.label() << " failed: " << status.message();
  // Every peer with a queue pair on the NIC fails with it (its other rails could not carry its batches:
  // every batch has a part on every rail).
  Status first;
  for (auto& [rank, peer] : peers_) {
    bool uses = false;
    for (const auto& [qpn, owner] : nic.owners) uses = uses || owner.peer == peer.get();
    if (!uses) continue;
    const Status s = fail_peer(*peer, Status(status.code(), "rank " + std::to_string(rank) + " is unreachable: " +
                                                                status.message()));
    if (first.is_ok()) first = s;
  }
  return first.is_ok() ? status : first;
}

Status IbverbsTransport::handle_async_event(std::size_t d, const ibv_async_event& event) {
  using Scope = AsyncEventKind::Scope;
  using Effect = AsyncEventKind::Effect;
  const AsyncEventKind kind = async_event_kind(static_cast<int>(event.event_type));
  const std::string head = std::string("asynchronous event ") + kind.name + " on ";
  switch (kind.scope) {
    case Scope::kQueuePair: {
      const std::uint32_t qpn = event.element.qp != nullptr ? event.element.qp->qp_num : 0;
      for (std::size_t n = 0; n < nics_.size(); ++n) {
        if (nics_[n].device != d) continue;
        const auto owner = nics_[n].owners.find(qpn);
        if (owner == nics_[n].owners.end()) continue;
        Peer& p = *owner->second.peer;
        const int rail = owner->second.position < static_cast<int>(p.rail_of.size())
                             ? p.rail_of[static_cast<std::size_t>(owner->second.position)]
                             : -1;
        const std::string text = head + nic_label(n) + " (queue pair " + std::to_string(qpn) + " of the connection to rank " +
                                 std::to_string(p.rank) + ", rail " + std::to_string(rail) + "): " + kind.meaning;
        if (kind.effect == Effect::kFail) return fail_peer(p, Status(ErrorCode::kIbverbs, text));
        WB_LOG(kDebug) << "ibverbs: " << text;
        return Status::ok();
      }
      WB_LOG(kDebug) << "ibverbs: " << head << devices_[d].name << " for queue pair " << qpn << " of no connection";
      return Status::ok();
    }
    case Scope::kCompletionQueue:
    case Scope::kSharedReceiveQueue: {
      for (std::size_t n = 0; n < nics_.size(); ++n) {
        const bool match = kind.scope == Scope::kCompletionQueue ? event.element.cq == nics_[n].cq.get()
                                                                 : event.element.srq == nics_[n].srq.get();
        if (!match) continue;
        const std::string text = head + nic_label(n) + ": " + kind.meaning;
        if (kind.effect == Effect::kFail) return fail_nic(n, Status(ErrorCode::kIbverbs, text));
        WB_LOG(kWarn) << "ibverbs: " << text;
        return Status::ok();
      }
      return Status::ok();
    }
    case Scope::kPort: {
      for (std::size_t n = 0; n < nics_.size(); ++n) {
        if (nics_[n].device != d || nics_[n].address.port != event.element.port_num) continue;
        const NicAddress& a = nics_[n].address;
        if (kind.effect == Effect::kCheckGid) {
          // Only the GID this rank advertised matters: its peers address it.
          ibv_gid now{};
          const int rc = lib_.query_gid(devices_[d].context.get(), a.port, static_cast<int>(a.gid_index), &now);
          Gid current{};
          std::memcpy(current.data(), now.raw, current.size());
          if (rc == 0 && current == a.gid) {
            WB_LOG(kDebug) << "ibverbs: " << head << a.label() << ": GID[" << a.gid_index << "] unchanged";
            return Status::ok();
          }
          const std::string now_text =
              rc == 0 ? format_gid(current) : std::string("unreadable (") + std::strerror(rc > 0 ? rc : errno) + ")";
          return fail_nic(n, Status(ErrorCode::kIbverbs, head + a.label() + ": GID[" + std::to_string(a.gid_index) +
                                                             "], which this rank advertised as " + format_gid(a.gid) +
                                                             ", is now " + now_text + ": peers address a GID that is gone (" +
                                                             kind.meaning + ")"));
        }
        const std::string text = head + a.label() + ": " + kind.meaning;
        if (kind.effect == Effect::kFail) return fail_nic(n, Status(ErrorCode::kIbverbs, text));
        if (kind.effect == Effect::kWarn) {
          WB_LOG(kWarn) << "ibverbs: " << text;
        }
        return Status::ok();
      }
      return Status::ok();
    }
    case Scope::kDevice: {
      const std::string text = head + devices_[d].name + ": " + kind.meaning;
      if (kind.effect != Effect::kFail) {
        WB_LOG(kWarn) << "ibverbs: " << text << " (event type " << static_cast<int>(event.event_type) << ")";
        return Status::ok();
      }
      Status first;
      for (std::size_t n = 0; n < nics_.size(); ++n) {
        if (nics_[n].device != d) continue;
        const Status s = fail_nic(n, Status(ErrorCode::kIbverbs, text));
        if (first.is_ok()) first = s;
      }
      return first;
    }
    case Scope::kNone: return Status::ok();
  }
  return Status::ok();
}

Status IbverbsTransport::read_async_events() {
  Status first;
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    for (;;) {
      ibv_async_event event{};
      if (lib_.get_async_event(devices_[d].context.get(), &event) != 0) break;  // EAGAIN: none left
      const Status s = handle_async_event(d, event);
      lib_.ack_async_event(&event);
      if (!s.is_ok() && first.is_ok()) first = s;
    }
  }
  return first;
}

}  // namespace wb::ibv
