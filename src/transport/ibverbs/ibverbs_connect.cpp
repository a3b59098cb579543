// ibverbs transport, connecting: endpoint(peer) creates one RC queue pair per NIC for that peer and
// describes them in a versioned record; connect(peer) validates the peer's record and moves each queue
// pair RESET -> INIT -> RTR -> RTS towards the peer's queue pair on the same rail.
//
// A peer may write once both sides have returned from connect (the caller synchronizes, e.g. with a
// barrier); a write that arrives earlier is retransmitted by RC until the receiving side is ready (up to
// WB_IB_RETRY_COUNT timeouts of WB_IB_TIMEOUT).
#include <infiniband/verbs.h>

#include <algorithm>
#include <random>
#include <string>

#include "transport/ibverbs/ibverbs_internal.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"

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
  for (std::size_t n = 0; n < nics_.size(); ++n) {
    Nic& nic = nics_[n];
    const Device& device = devices_[nic.device];
    const auto max_wr = static_cast<std::uint32_t>(std::max(device.attr.max_qp_wr, 1));
    if (config_.sq_depth > max_wr)
      throw Error(ErrorCode::kInvalidArgument, "WB_IB_SQ_DEPTH=" + std::to_string(config_.sq_depth) + " exceeds the " +
                                                   std::to_string(max_wr) + " work requests a queue pair of " +
                                                   nic.address.label() + " holds");
    ibv_qp_init_attr attr{};
    attr.send_cq = nic.cq.get();
    attr.recv_cq = nic.cq.get();
    attr.srq = nic.srq.get();  // receives come from the NIC's shared receive queue
    attr.cap.max_send_wr = config_.sq_depth;
    attr.cap.max_send_sge = 1;
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;  // selective signalling: only the last work request of a batch
    try {
      QpPtr qp(WB_CHECK_IBV_PTR(ibv_create_qp(device.pd.get(), &attr)));
      nic.owners[qp->qp_num] = QpOwner{&peer, static_cast<int>(n)};
      record->nics.push_back(nic.address);
      record->qps.push_back(QueuePairAddress{qp->qp_num, random_psn()});
      peer.qps.push_back(std::move(qp));
    } catch (const Error& e) {
      rethrow_in(e, "ibverbs endpoint(" + std::to_string(peer.rank) + "): creating the queue pair on " + nic.address.label());
    }
  }
  peer.record = std::move(record);
}

std::vector<std::byte> IbverbsTransport::endpoint(int peer) {
  Peer& p = peer_entry(peer);
  // Once per peer: a second call describes the same queue pairs again.
  if (p.record == nullptr) create_queue_pairs(p);
  return serialize_endpoint(*p.record);
}

void IbverbsTransport::bring_up(Peer& peer, int rail, const NicAddress& remote, const QueuePairAddress& remote_qp) {
  const auto ri = static_cast<std::size_t>(rail);
  const NicAddress& local = nics_[ri].address;
  ibv_qp* qp = peer.qps[ri].get();
  const std::string where = "ibverbs connect to peer " + std::to_string(peer.rank) + ", rail " + std::to_string(rail) +
                            " (local " + local.label() + " QP " + std::to_string(qp->qp_num) + " -> peer's " +
                            remote.label() + " QP " + std::to_string(remote_qp.qpn) + ")";
  const char* step = "RESET -> INIT";
  try {
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = local.port;
    init.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    WB_CHECK_IBV(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));

    step = "INIT -> RTR";
    ibv_qp_attr rtr{};
    rtr.qp_state = IBV_QPS_RTR;
    rtr.path_mtu = static_cast<ibv_mtu>(std::min(local.mtu, remote.mtu));
    rtr.dest_qp_num = remote_qp.qpn;
    rtr.rq_psn = remote_qp.psn;
    rtr.max_dest_rd_atomic = 1;
    rtr.min_rnr_timer = 12;  // 0.64 ms before a sender retries a WRITE_WITH_IMM that found no receive
    rtr.ah_attr.dlid = remote.lid;
    rtr.ah_attr.sl = config_.service_level;
    rtr.ah_attr.src_path_bits = 0;
    rtr.ah_attr.port_num = local.port;
    // RoCE always routes by GID; InfiniBand needs a GRH only between subnets (different GID prefixes)
    // or when WB_IB_GID_INDEX asks for one.
    const bool other_subnet = !gid_is_zero(remote.gid) && !gid_is_zero(local.gid) &&
                              !std::equal(local.gid.begin(), local.gid.begin() + 8, remote.gid.begin());
    if (local.link_layer == LinkLayer::kEthernet || other_subnet || config_.gid_index >= 0) {
      rtr.ah_attr.is_global = 1;
      std::copy(remote.gid.begin(), remote.gid.end(), rtr.ah_attr.grh.dgid.raw);
      rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(local.gid_index);
      rtr.ah_attr.grh.hop_limit = 255;
      rtr.ah_attr.grh.traffic_class = config_.traffic_class;
      rtr.ah_attr.grh.flow_label = 0;
    }
    WB_CHECK_IBV(ibv_modify_qp(qp, &rtr,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));

    step = "RTR -> RTS";
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = config_.timeout;
    rts.retry_cnt = config_.retry_count;
    rts.rnr_retry = 7;  // retry without limit while the receiver replenishes its receives
    rts.sq_psn = peer.record->qps[ri].psn;
    rts.max_rd_atomic = 1;
    WB_CHECK_IBV(ibv_modify_qp(qp, &rts,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                   IBV_QP_MAX_QP_RD_ATOMIC));
  } catch (const Error& e) {
    // Back to RESET so that a later connect can start over.
    for (const QpPtr& q : peer.qps) {
      ibv_qp_attr reset{};
      reset.qp_state = IBV_QPS_RESET;
      (void)ibv_modify_qp(q.get(), &reset, IBV_QP_STATE);
    }
    rethrow_in(e, where + ", " + step);
  }
}

void IbverbsTransport::connect(int peer, std::span<const std::byte> peer_endpoint) {
  Peer& p = peer_entry(peer);
  if (p.record == nullptr)
    throw Error(ErrorCode::kInvalidArgument, "ibverbs connect to peer " + std::to_string(peer) + " before endpoint(" +
                                                 std::to_string(peer) + "): that record (sent to the peer) names the "
                                                 "queue pairs the peer connects to");
  if (p.connected) throw Error(ErrorCode::kInvalidArgument, "ibverbs: already connected to peer " + std::to_string(peer));

  const EndpointRecord remote = parse_endpoint(peer_endpoint, peer);
  const int rails = check_connectable(*p.record, remote, peer);
  for (const RemoteRegion& region : p.regions)
    if (region.bytes != 0 && region.rkeys.size() != remote.nics.size())
      throw Error(ErrorCode::kInvalidArgument, "ibverbs connect to peer " + std::to_string(peer) + ": a memory key imported "
                                                   "from it has rkeys for " + std::to_string(region.rkeys.size()) +
                                                   " NIC(s), its endpoint record lists " + std::to_string(remote.nics.size()));

  std::uint64_t max_message = kMaxPiece;
  for (int r = 0; r < rails; ++r) {
    const auto i = static_cast<std::size_t>(r);
    bring_up(p, r, remote.nics[i], remote.qps[i]);
    max_message = std::min({max_message, nics_[i].address.max_message, remote.nics[i].max_message});
  }

  p.rails = rails;
  p.remote_nics = remote.nics.size();
  p.max_message = max_message;
  p.next_rail = peer % rails;  // spreads unstriped batches of different peers over the NICs
  p.rail.assign(static_cast<std::size_t>(rails), Rail{});
  for (int r = 0; r < rails; ++r) {
    Rail& rail = p.rail[static_cast<std::size_t>(r)];
    rail.qp = p.qps[static_cast<std::size_t>(r)].get();
    rail.sq.reset(config_.sq_depth);
    rail.wrs.assign(config_.sq_depth, ibv_send_wr{});
    rail.sges.assign(config_.sq_depth, ibv_sge{});
  }
  p.batches.reset(rails, config_.sq_depth);
  p.arrivals.reset(rails);
  p.plan.assign(static_cast<std::size_t>(rails), {});
  for (auto& pieces : p.plan) pieces.reserve(config_.sq_depth);
  p.connected = true;
  WB_LOG(kDebug) << "ibverbs: connected to peer " << peer << " over " << rails << " rail(s), path MTU "
                 << mtu_bytes(std::min(nics_[0].address.mtu, remote.nics[0].mtu)) << ", max message " << max_message;
}

}  // namespace wb::ibv
