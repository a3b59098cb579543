// ibverbs transport, the update path: post_writes and poll. Never throws, never blocks, allocates nothing
// once warm (scratch vectors are sized at connect).
//
// A batch to a peer is planned over its rails first (plan_stripes), checked against the peer's batches in
// flight (WB_IB_BATCHES_IN_FLIGHT), the free send-queue slots of every rail and the completion-queue
// credits of every NIC (kRetryLater with nothing posted when one lacks room), then posted as one linked
// chain per rail with one ibv_post_send each: RDMA_WRITE for the pieces, the rail's immediate on the last
// one (RDMA_WRITE_WITH_IMM) or, with adaptive routing, as a zero-length RDMA_WRITE_WITH_IMM after them
// (RC ordering: the immediate completes after all the rail's bytes), only that one signalled, its wr_id
// the batch's sequence number.
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "transport/ibverbs/ibverbs_errors.hpp"
#include "transport/ibverbs/ibverbs_internal.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace wb::ibv {
namespace {

/// How often poll reads the devices' asynchronous events (a read() each): often enough that a waiting
/// receiver learns of a dead port at once, rarely enough to cost nothing.
constexpr std::chrono::milliseconds kEventInterval{1};

}  // namespace

Status IbverbsTransport::fail_peer(Peer& p, Status status) {
  if (!p.failure.is_ok()) return p.failure;
  p.failure = status;
  WB_LOG(kError) << "ibverbs: connection to rank " << p.rank << " failed: " << status.message();
  if (!p.connected) return status;
  // Every work request still on the peer's queue pairs completes, flushed, once a queue pair is in the
  // error state; a signalled marker posted after them comes back last, and then their completion queue
  // entries are free again (ibverbs_rails.hpp).
  for (std::size_t r = 0; r < p.rail.size(); ++r) {
    Rail& rail = p.rail[r];
    ibv_qp_attr error{};
    error.qp_state = IBV_QPS_ERR;
    const int moved = lib_.modify_qp(rail.qp, &error, IBV_QP_STATE);
    ibv_send_wr marker{};
    marker.wr_id = kDrainWrId;
    marker.opcode = IBV_WR_RDMA_WRITE;
    marker.num_sge = 0;
    marker.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    const int posted = moved == 0 ? ibv_post_send(rail.qp, &marker, &bad) : moved;
    if (posted != 0) {
      WB_LOG(kWarn) << "ibverbs: draining the queue pair of rank " << p.rank << " rail " << r << " on "
                    << nic_label(static_cast<std::size_t>(rail.nic)) << " failed (" << std::strerror(posted > 0 ? posted : errno)
                    << "): its " << rail.sq.outstanding() << " completion queue entries stay reserved";
    }
  }
  return status;
}

Status IbverbsTransport::post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                                     std::uint64_t token) {
  const auto found = peers_.find(peer);
  if (found == peers_.end() || !found->second->connected)
    return Status(ErrorCode::kInvalidArgument, "ibverbs post_writes: not connected to rank " + std::to_string(peer));
  Peer& p = *found->second;
  if (!p.failure.is_ok()) return p.failure;
  WB_RETURN_IF_ERROR(regions_.check(peer, writes));
  if (p.batches.in_flight() >= config_.batches_in_flight)
    return Status(ErrorCode::kRetryLater, "ibverbs: " + std::to_string(p.batches.in_flight()) + " batches to rank " +
                                              std::to_string(peer) + " in flight (WB_IB_BATCHES_IN_FLIGHT)");

  StripeOptions options;
  options.rails = p.rails;
  options.first_rail = p.next_rail;
  options.max_message = p.max_message;
  options.min_stripe_bytes = config_.stripe_min_bytes;
  plan_stripes(writes, options, p.plan);

  // Room on every rail and NIC first: a batch is posted whole or not at all.
  std::fill(p.needed.begin(), p.needed.end(), 0u);
  for (int r = 0; r < p.rails; ++r) {
    const std::size_t needed = rail_work_requests(p.plan[static_cast<std::size_t>(r)], p.separate_immediate);
    const Rail& rail = p.rail[static_cast<std::size_t>(r)];
    if (needed > rail.sq.depth())
      return Status(ErrorCode::kInvalidArgument,
                    "ibverbs post_writes to rank " + std::to_string(peer) + ": the batch of " +
                        std::to_string(writes.size()) + " writes needs " + std::to_string(needed) +
                        " work requests on rail " + std::to_string(r) + ", more than its send queue holds (" +
                        std::to_string(rail.sq.depth()) + ", WB_IB_SQ_DEPTH; contiguous writes are merged, writes "
                        "longer than " + std::to_string(p.max_message) + " bytes split): post at most "
                        "capabilities().max_writes_per_batch writes at once");
    if (!rail.sq.fits(needed))
      return Status(ErrorCode::kRetryLater, "ibverbs send queue to rank " + std::to_string(peer) + " rail " +
                                                std::to_string(r) + " is full (" + std::to_string(needed) + " needed, " +
                                                std::to_string(rail.sq.free_slots()) + " free)");
    p.needed[static_cast<std::size_t>(rail.nic)] += static_cast<std::uint32_t>(needed);
  }
  for (std::size_t n = 0; n < p.needed.size(); ++n)
    if (p.needed[n] > nics_[n].credits.available())
      return Status(ErrorCode::kRetryLater, "ibverbs completion queue of " + nic_label(n) + " is full (" +
                                                std::to_string(p.needed[n]) + " entries needed, " +
                                                std::to_string(nics_[n].credits.available()) + " free)");
  if (p.rails > 1) p.next_rail = (p.next_rail + 1) % p.rails;

  const std::uint64_t sequence = p.next_sequence++ & kMaxBatchSequence;
  for (int r = 0; r < p.rails; ++r) {
    const std::size_t needed = rail_work_requests(p.plan[static_cast<std::size_t>(r)], p.separate_immediate);
    WB_RETURN_IF_ERROR(post_rail(p, r, writes, immediate, sequence, needed));
  }
  p.batches.push(sequence, token);
  traffic_.add(peer, batch_bytes(writes));
  return Status::ok();
}

Status IbverbsTransport::post_rail(Peer& p, int r, std::span<const WriteRequest> writes, std::uint32_t immediate,
                                   std::uint64_t sequence, std::size_t work_requests) {
  const auto ri = static_cast<std::size_t>(r);
  Rail& rail = p.rail[ri];
  const auto ni = static_cast<std::size_t>(rail.nic);
  const std::vector<Piece>& pieces = p.plan[ri];
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    const WriteRequest& w = writes[piece.write];
    const LocalRegion& local = local_[w.local_memory];
    const RemoteRegion& remote = remote_[w.remote_memory];
    ibv_sge& sge = rail.sges[i];
    sge.addr = local.address + w.local_offset + piece.offset;
    sge.length = static_cast<std::uint32_t>(piece.bytes);
    sge.lkey = local.lkeys[ni];
    ibv_send_wr& wr = rail.wrs[i];
    wr = ibv_send_wr{};
    wr.wr_id = sequence;
    wr.next = rail.wrs.data() + i + 1;  // the last one is cut below
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = remote.address + w.remote_offset + piece.offset;
    wr.wr.rdma.rkey = remote.rkeys[ni];
  }
  if (work_requests > pieces.size()) {
    // The immediate on its own: a zero-length write (no memory is accessed; the address is one the peer owns).
    ibv_send_wr& wr = rail.wrs[pieces.size()];
    wr = ibv_send_wr{};
    wr.wr_id = sequence;
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    if (p.zero_length_target != SIZE_MAX) {
      const RemoteRegion& target = remote_[p.zero_length_target];
      wr.wr.rdma.remote_addr = target.address;
      wr.wr.rdma.rkey = target.rkeys.size() > ni ? target.rkeys[ni] : 0;
    }
  }
  ibv_send_wr& last = rail.wrs[work_requests - 1];
  last.next = nullptr;
  last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  last.imm_data = immediate_to_wire(immediate);
  last.send_flags = IBV_SEND_SIGNALED;

  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(rail.qp, rail.wrs.data(), &bad);
  if (rc != 0) {
    const int error = rc > 0 ? rc : errno;
    const std::size_t posted = bad == nullptr ? 0 : static_cast<std::size_t>(bad - rail.wrs.data());
    // What was taken is accounted for, so that the drain gives its entries back.
    if (posted > 0) {
      rail.sq.push(sequence, static_cast<std::uint32_t>(posted));
      (void)nics_[ni].credits.take(static_cast<std::uint32_t>(posted));
    }
    return fail_peer(p, make_call_error(ErrorCode::kIbverbs, "ibv_post_send",
                                        std::string(std::strerror(error)) + " (rank " + std::to_string(p.rank) +
                                            ", rail " + std::to_string(r) + " on " + nic_label(ni) + ": " +
                                            std::to_string(posted) + " of " + std::to_string(work_requests) +
                                            " work requests were posted; the connection is unusable)",
                                        __FILE__, __LINE__));
  }
  rail.sq.push(sequence, static_cast<std::uint32_t>(work_requests));
  (void)nics_[ni].credits.take(static_cast<std::uint32_t>(work_requests));
  return Status::ok();
}

Status IbverbsTransport::handle_completion(Nic& nic, const ibv_wc& wc, std::vector<Completion>& completions,
                                           bool& arrived) {
  const auto owner = nic.owners.find(wc.qp_num);
  if (owner == nic.owners.end())
    return Status(ErrorCode::kInternal, "ibverbs: completion on " + nic.address.label() + " for unknown queue pair " +
                                            std::to_string(wc.qp_num));
  Peer& p = *owner->second.peer;
  const int peer = p.rank;
  const int rail = owner->second.position < static_cast<int>(p.rail_of.size())
                       ? p.rail_of[static_cast<std::size_t>(owner->second.position)]
                       : -1;
  const std::string where = "ibverbs rank " + std::to_string(peer) + " rail " + std::to_string(rail) + ": ";

  // Receives and drain markers carry wr_ids no batch has; the opcode of a failed completion is undefined.
  if (wc.wr_id == kReceiveWrId) {
    ++nic.to_repost;
    if (!p.failure.is_ok()) return Status::ok();  // a flush after the error already reported
    if (wc.status != IBV_WC_SUCCESS) {
      CompletionError e{peer, nic.address.label(), rail, true, static_cast<int>(wc.status), static_cast<int>(wc.opcode),
                        wc.vendor_err, 0};
      return fail_peer(p, Status(ErrorCode::kIbverbs, describe_completion_error(e)));
    }
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0 || rail < 0)
      return fail_peer(p, Status(ErrorCode::kInternal, where + "unexpected receive completion " +
                                                           wc_opcode_name(static_cast<int>(wc.opcode)) +
                                                           " (only RDMA_WRITE_WITH_IMM is expected)"));
    bool complete = false;
    std::uint32_t immediate = 0;
    const Status s = p.arrivals.arrive(rail, immediate_from_wire(wc.imm_data), complete, immediate);
    if (!s.is_ok()) return fail_peer(p, Status(s.code(), where + s.message()));
    if (complete) {
      completions.push_back(Completion{Completion::Kind::kArrival, peer, 0, immediate});
      arrived = true;
    }
    return Status::ok();
  }
  if (rail < 0) return Status(ErrorCode::kInternal, where + "send completion on a queue pair no rail uses");
  Rail& r = p.rail[static_cast<std::size_t>(rail)];
  if (wc.wr_id == kDrainWrId) {
    // Everything posted before the marker has completed (in order) and been polled: its entries are free.
    nic.credits.give(r.sq.drain() + 1);
    r.drained = true;
    return Status::ok();
  }
  if (!p.failure.is_ok()) return Status::ok();  // the drain marker gives the entries back
  if (wc.status != IBV_WC_SUCCESS) {
    std::uint64_t token = 0;
    (void)p.batches.token_of(wc.wr_id, token);
    CompletionError e{peer, nic.address.label(), rail, false, static_cast<int>(wc.status), static_cast<int>(wc.opcode),
                      wc.vendor_err, token};
    return fail_peer(p, Status(ErrorCode::kIbverbs, describe_completion_error(e)));
  }
  if (wc.opcode != IBV_WC_RDMA_WRITE)
    return fail_peer(p, Status(ErrorCode::kInternal, where + "unexpected send completion " +
                                                         wc_opcode_name(static_cast<int>(wc.opcode))));
  std::uint32_t freed = 0;
  Status s = r.sq.complete(wc.wr_id, freed);
  if (!s.is_ok()) return fail_peer(p, Status(s.code(), where + s.message()));
  nic.credits.give(freed);
  s = p.batches.rail_done(rail, wc.wr_id);
  if (!s.is_ok()) return fail_peer(p, Status(s.code(), where + s.message()));
  std::uint64_t token = 0;
  while (p.batches.pop_complete(token)) completions.push_back(Completion{Completion::Kind::kWritesDone, peer, token, 0});
  return Status::ok();
}

Status IbverbsTransport::repost_receives(Nic& nic) {
  const std::uint32_t count = std::min(nic.to_repost, nic.srq_depth);
  if (count == 0 || !nic.failure.is_ok()) return Status::ok();
  for (std::uint32_t i = 0; i < count; ++i) {
    ibv_recv_wr& wr = nic.recv_wrs[i];
    wr = ibv_recv_wr{};
    wr.wr_id = kReceiveWrId;
    wr.next = i + 1 < count ? &nic.recv_wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  const int rc = ibv_post_srq_recv(nic.srq.get(), nic.recv_wrs.data(), &bad);
  if (rc != 0) {
    const int error = rc > 0 ? rc : errno;
    return make_call_error(ErrorCode::kIbverbs, "ibv_post_srq_recv",
                           std::string(std::strerror(error)) + " (replenishing " + std::to_string(count) +
                               " receives on " + nic.address.label() + ")",
                           __FILE__, __LINE__);
  }
  nic.to_repost -= count;
  return Status::ok();
}

Status IbverbsTransport::flush_gpu_writes() {
#ifdef WB_HAVE_CUDA
  if (gpu_flush_devices_.empty()) return Status::ok();
  int previous = 0;
  WB_TRY_CUDA(cudaGetDevice(&previous));
  Status status;
  for (const int device : gpu_flush_devices_) {
    const cudaError_t rc = cudaSetDevice(device) == cudaSuccess
                               ? cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                                                    cudaFlushGPUDirectRDMAWritesToOwner)
                               : cudaGetLastError();
    if (rc != cudaSuccess && status.is_ok())
      status = make_call_error(ErrorCode::kCuda, "cudaDeviceFlushGPUDirectRDMAWrites",
                               detail::cuda_error_string(rc) + " (device " + std::to_string(device) + ")",
                               __FILE__, __LINE__);
  }
  WB_TRY_CUDA(cudaSetDevice(previous));
  return status;
#else
  return Status::ok();
#endif
}

Status IbverbsTransport::poll(std::vector<Completion>& completions) {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first.is_ok()) first = s;
  };
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_event_check_) {
    next_event_check_ = now + kEventInterval;
    keep(read_async_events());
  }
  bool arrived = false;
  for (std::size_t n = 0; n < nics_.size(); ++n) {
    Nic& nic = nics_[n];
    for (;;) {
      const int count = ibv_poll_cq(nic.cq.get(), kPollBatch, wcs_.data());
      if (count < 0) {
        keep(fail_nic(n, make_call_error(ErrorCode::kIbverbs, "ibv_poll_cq",
                                         "returned " + std::to_string(count) + " on " + nic.address.label(), __FILE__, __LINE__)));
        break;
      }
      // Every polled completion is handled (its accounting kept) even after an error; the first error is returned.
      for (int i = 0; i < count; ++i) keep(handle_completion(nic, wcs_[static_cast<std::size_t>(i)], completions, arrived));
      if (count < kPollBatch) break;
    }
    keep(repost_receives(nic));
  }
  if (arrived) keep(flush_gpu_writes());
  return first;
}

}  // namespace wb::ibv
