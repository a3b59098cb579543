// ibverbs transport, connecting: endpoint(peer) creates WB_IB_QPS_PER_CONNECTION RC queue pairs per NIC for
// that peer and describes them in a versioned record; connect(peer) validates the peer's record and moves
// each rail's queue pair RESET -> INIT -> RTR -> RTS towards the peer's queue pair on the same rail, with
// the route (GRH, DLID) the two ports' attributes call for.
//
// A peer may write once both sides have returned from connect (the caller synchronizes, e.g. with a
// barrier); a write that arrives earlier is retransmitted by RC until the receiving side is ready (up to
// WB_IB_RETRY_COUNT timeouts of WB_IB_TIMEOUT).
#include <infiniband/verbs.h>

#include <algorithm>
#include <random>
#include <string>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "transport/ibverbs/ibverbs_internal.hpp"

namespace wb::ibv {
namespace {

/// A port's message limit, bounded by what one scatter-gather entry can carry.
constexpr std::uint64_t kMaxPiece = std::uint64_t{1} << 31;

/// Adds what was being done to a verbs error, keeping its code (and the call, errno text, file:line).
[[noreturn]] void rethrow_in(const Error& error, const std::string& context) {
  throw Error(error.code(), context + ": " + error.status().message());
}

std::uint32_t random_psn() {
  static std::mt19937 engine{std::random_device{}()};
  return engine() & 0xffffff;
}

}  // namespace

Peer& IbverbsTransport::peer_entry(int peer) {
  if (peer < 0) throw Error(ErrorCode::kInvalidArgument, "ibverbs: peer rank " + std::to_string(peer));
  auto& slot = peers_[peer];
  if (slot == nullptr) {
    slot = std::make_unique<Peer>();
    slot->rank = peer;
  }
  return *slot;
}

void IbverbsTransport::create_queue_pairs(Peer& peer) {
  auto record = std::make_unique<EndpointRecord>();
  record->rank = rank_;
  record->peer = peer.rank;
  record->qps_per_nic = config_.qps_per_connection;
  record->batches_in_flight = config_.batches_in_flight;
  // On failure nothing stays behind: a later endpoint(peer) starts over.
  auto undo = [&] {
    for (const QpPtr& qp : peer.qps)
      for (Nic& nic : nics_)
        if (nic.owners.erase(qp->qp_num) != 0) nic.credits.give(1);
    peer.qps.clear();
  };
  try {
  for (std::size_t n = 0; n < nics_.size(); ++n) {
    Nic& nic = nics_[n];
    const Device& device = devices_[nic.device];
    const std::string where = "ibverbs endpoint(" + std::to_string(peer.rank) + "): " + nic.address.label();
    if (!nic.failure.is_ok()) throw Error(nic.failure.code(), where + " failed earlier: " + nic.failure.message());
    const auto max_wr = static_cast<std::uint32_t>(std::max(device.attr.max_qp_wr, 1));
    if (config_.sq_depth + 1 > max_wr)
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_SQ_DEPTH=" + std::to_string(config_.sq_depth) + " and a drain marker exceed the " +
                                                   std::to_string(max_wr) + " work requests a queue pair of " +
                                                   nic.address.label() + " holds");
    record->nics.push_back(nic.address);
    for (int j = 0; j < config_.qps_per_connection; ++j) {
      // Each queue pair keeps one completion queue entry for the drain marker it gets if it fails.
      if (!nic.credits.take(1))
        throw Error(ErrorCode::kInvalidArgument, where + ": its completion queue has no entry left for another queue pair (" +
                                                     std::to_string(nics_[n].owners.size()) + " exist); raise WB_IB_CQ_DEPTH");
      ibv_qp_init_attr attr{};
      attr.send_cq = nic.cq.get();
      attr.recv_cq = nic.cq.get();
      attr.srq = nic.srq.get();  // receives come from the NIC's shared receive queue
      attr.cap.max_send_wr = config_.sq_depth + 1;  // + the drain marker
      attr.cap.max_send_sge = 1;
      attr.qp_type = IBV_QPT_RC;
      attr.sq_sig_all = 0;  // selective signalling: only the last work request of a batch
      try {
        QpPtr qp(WB_IBV_CHECK_PTR("ibv_create_qp", lib_.create_qp(device.pd.get(), &attr)), QpDestroyer{&lib_});
        nic.owners[qp->qp_num] = QpOwner{&peer, static_cast<int>(peer.qps.size())};
        record->qps.push_back(QueuePairAddress{qp->qp_num, random_psn()});
        peer.qps.push_back(std::move(qp));
      } catch (const Error& e) {
        nic.credits.give(1);
        rethrow_in(e, where + ": creating queue pair " + std::to_string(j));
      }
    }
  }
  } catch (...) {
    undo();
    throw;
  }
  peer.record = std::move(record);
}

std::vector<std::byte> IbverbsTransport::endpoint(int peer) {
  Peer& p = peer_entry(peer);
  // Once per peer: a second call describes the same queue pairs again.
  if (p.record == nullptr) create_queue_pairs(p);
  return serialize_endpoint(*p.record);
}

void IbverbsTransport::bring_up(Peer& peer, int rail, const EndpointRecord& remote_record) {
  const Rail& r = peer.rail[static_cast<std::size_t>(rail)];
  const auto ni = static_cast<std::size_t>(r.nic);
  const Nic& nic = nics_[ni];
  const NicAddress& local = nic.address;
  const NicAddress& remote = remote_record.nics[ni];
  const QueuePairAddress& remote_qp = remote_record.qps[static_cast<std::size_t>(r.position)];
  ibv_qp* qp = r.qp;
  const std::string where = "ibverbs connect to rank " + std::to_string(peer.rank) + ", rail " + std::to_string(rail) +
                            " (local " + local.label() + " QP " + std::to_string(qp->qp_num) + " -> the peer's " +
                            remote.label() + " QP " + std::to_string(remote_qp.qpn) + ")";
  const char* step = "route";
  try {
    const Route route = choose_route(RoutePort{local.link_layer, local.lid, local.gid, nic.grh_required},
                                     RoutePort{remote.link_layer, remote.lid, remote.gid, false},
                                     config_.gid.requested >= 0, rank_text(peer.rank));
    step = "RESET -> INIT";
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = nic.pkey_index;
    init.port_num = local.port;
    init.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    WB_IBV_CHECK("ibv_modify_qp", lib_.modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));

    step = "INIT -> RTR";
    ibv_qp_attr rtr{};
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = static_cast<ibv_mtu>(std::min(local.mtu, remote.mtu));
    rtr.dest_qp_num = remote_qp.qpn;
    rtr.rq_psn = remote_qp.psn;
    rtr.max_dest_rd_atomic = 1;
    rtr.min_rnr_timer = 12;  // 0.64 ms before a sender retries a WRITE_WITH_IMM that found no receive
    rtr.ah_attr.dlid = route.dlid;
    rtr.ah_attr.sl = config_.service_level;
    rtr.ah_attr.src_path_bits = 0;
    rtr.ah_attr.port_num = local.port;
    if (route.global) {
      rtr.ah_attr.is_global = 1;
      std::copy(remote.gid.begin(), remote.gid.end(), rtr.ah_attr.grh.dgid.raw);
      rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(local.gid_index);
      rtr.ah_attr.grh.hop_limit = 255;
      rtr.ah_attr.grh.traffic_class = config_.traffic_class;
      rtr.ah_attr.grh.flow_label = 0;
    }
    WB_IBV_CHECK("ibv_modify_qp", lib_.modify_qp(qp, &rtr,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));

    step = "RTR -> RTS";
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = config_.timeout;
    rts.retry_cnt = config_.retry_count;
    rts.rnr_retry = 7;  // retry without limit while the receiver replenishes its receives
    rts.sq_psn = peer.record->qps[static_cast<std::size_t>(r.position)].psn;
    rts.max_rd_atomic = 1;
    WB_IBV_CHECK("ibv_modify_qp", lib_.modify_qp(qp, &rts,
                                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC));
    WB_LOG(kDebug) << where << ": " << route.reason;
  } catch (const Error& e) {
    // Back to RESET so that a later connect can start over.
    for (const QpPtr& q : peer.qps) {
      ibv_qp_attr reset{};
      reset.qp_state = IBV_QPS_RESET;
      (void)lib_.modify_qp(q.get(), &reset, IBV_QP_STATE);
    }
    rethrow_in(e, where + ", " + step);
  }
}

void IbverbsTransport::connect(int peer, std::span<const std::byte> peer_endpoint) {
  Peer& p = peer_entry(peer);
  const std::string who = rank_text(peer);
  if (p.record == nullptr)
    throw Error(ErrorCode::kInvalidArgument, "ibverbs connect to " + who + " before endpoint(" + std::to_string(peer) +
                                                 "): that record (sent to the peer) names the queue pairs the peer connects to");
  if (p.connected) throw Error(ErrorCode::kInvalidArgument, "ibverbs: already connected to " + who);
  if (!p.failure.is_ok()) throw Error(p.failure.code(), "ibverbs connect to " + who + ": " + p.failure.message());

  const EndpointRecord remote = parse_endpoint(peer_endpoint, peer);
  const Connection connection = check_connectable(*p.record, remote, peer);
  for (std::size_t id = 0; id < remote_.size(); ++id)
    if (remote_[id].owner == peer && remote_[id].bytes != 0 && remote_[id].rkeys.size() != remote.nics.size())
      throw Error(ErrorCode::kInvalidArgument, "ibverbs connect to " + who + ": memory key " + std::to_string(id) +
                                                   " imported from it has rkeys for " + std::to_string(remote_[id].rkeys.size()) +
                                                   " NIC(s), its endpoint record lists " + std::to_string(remote.nics.size()));
  for (int n = 0; n < connection.nic_pairs; ++n)
    if (!nics_[static_cast<std::size_t>(n)].failure.is_ok())
      throw Error(ErrorCode::kIbverbs, "ibverbs connect to " + who + ": " + nic_label(static_cast<std::size_t>(n)) +
                                           " failed earlier: " + nics_[static_cast<std::size_t>(n)].failure.message());

  const int rails = connection.rails();
  const int k = connection.qps_per_nic;
  p.rail.assign(static_cast<std::size_t>(rails), Rail{});
  p.rail_of.assign(p.qps.size(), -1);
  for (int r = 0; r < rails; ++r) {
    Rail& rail = p.rail[static_cast<std::size_t>(r)];
    rail.nic = rail_nic(r, connection.nic_pairs);
    rail.position = rail.nic * k + rail_qp_on_nic(r, connection.nic_pairs);
    rail.qp = p.qps[static_cast<std::size_t>(rail.position)].get();
    p.rail_of[static_cast<std::size_t>(rail.position)] = r;
  }
  std::uint64_t max_message = kMaxPiece;
  for (int r = 0; r < rails; ++r) {
    bring_up(p, r, remote);
    const auto ni = static_cast<std::size_t>(p.rail[static_cast<std::size_t>(r)].nic);
    max_message = std::min({max_message, nics_[ni].address.max_message, remote.nics[ni].max_message});
  }

  p.connection = connection;
  p.rails = rails;
  p.remote_nics = remote.nics.size();
  p.max_message = max_message;
  // Adaptive routing where any of the connection's NICs wants it: the separate immediate is harmless elsewhere.
  p.separate_immediate = std::any_of(p.rail.begin(), p.rail.end(),
                                     [&](const Rail& rail) { return nics_[static_cast<std::size_t>(rail.nic)].adaptive_routing; });
  p.next_rail = peer % rails;  // spreads unstriped batches of different peers over the NICs
  for (Rail& rail : p.rail) {
    rail.sq.reset(config_.sq_depth);
    rail.wrs.assign(config_.sq_depth + 1, ibv_send_wr{});
    rail.sges.assign(config_.sq_depth + 1, ibv_sge{});
  }
  p.batches.reset(rails, config_.batches_in_flight);
  p.arrivals.reset(rails);
  p.plan.assign(static_cast<std::size_t>(rails), {});
  for (auto& pieces : p.plan) pieces.reserve(config_.sq_depth);
  p.needed.assign(nics_.size(), 0);
  p.connected = true;

  // The receives this NIC must hold now that the peer may write here.
  for (int n = 0; n < connection.nic_pairs; ++n) {
    Nic& nic = nics_[static_cast<std::size_t>(n)];
    if (!nic.receives.add_writer(remote.batches_in_flight, k) && !nic.warned_receives) {
      nic.warned_receives = true;
      WB_LOG(kWarn) << "ibverbs: " << nic.receives.shortfall(nic.address.label());
    }
  }
  WB_LOG(kDebug) << "ibverbs: connected to " << who << " over " << rails << " rail(s) (" << connection.nic_pairs
                 << " NIC pair(s) x " << k << "), path MTU " << mtu_bytes(std::min(nics_[0].address.mtu, remote.nics[0].mtu))
                 << ", max message " << max_message << (p.separate_immediate ? ", adaptive routing" : "");
}

}  // namespace wb::ibv
