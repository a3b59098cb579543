// ibverbs transport, the update path: post_writes and poll. Never throws, never blocks, allocates nothing
// once warm (scratch vectors are sized at connect).
//
// A batch to a peer is planned over its rails first (plan_stripes), checked against the free send-queue
// slots and completion-queue credits of every rail (kRetryLater with nothing posted when one lacks room),
// then posted as one linked chain per rail with one ibv_post_send each: RDMA_WRITE for every piece but the
// rail's last, RDMA_WRITE_WITH_IMM for the last (RC ordering: the immediate arrives after all the rail's
// bytes), only that one signalled, its wr_id the batch token.
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "transport/ibverbs/ibverbs_internal.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace wb::ibv {

Status IbverbsTransport::fail_peer(Peer& p, Status status) {
  if (p.failure.is_ok()) {
    p.failure = status;
    WB_LOG(kError) << "ibverbs: connection to peer " << p.rank << " failed: " << status.message();
  }
  return status;
}

Status IbverbsTransport::post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                                     std::uint64_t token) {
  const auto found = peers_.find(peer);
  if (found == peers_.end() || !found->second->connected)
    return Status(ErrorCode::kInvalidArgument, "ibverbs post_writes: not connected to peer " + std::to_string(peer));
  Peer& p = *found->second;
  if (!p.failure.is_ok()) return p.failure;
  WB_RETURN_IF_ERROR(check_write_ranges(peer, writes, local_sizes_, p.region_sizes));

  StripeOptions options;
  options.rails = p.rails;
  options.first_rail = p.next_rail;
  options.max_message = p.max_message;
  options.min_stripe_bytes = config_.stripe_min_bytes;
  plan_stripes(writes, options, p.plan);

  // Room on every rail first: a batch is posted whole or not at all.
  for (int r = 0; r < p.rails; ++r) {
    const std::size_t needed = rail_work_requests(p.plan[static_cast<std::size_t>(r)]);
    const Rail& rail = p.rail[static_cast<std::size_t>(r)];
    if (needed > rail.sq.depth())
      return Status(ErrorCode::kInvalidArgument,
                    "ibverbs post_writes to peer " + std::to_string(peer) + ": the batch of " +
                        std::to_string(writes.size()) + " writes needs " + std::to_string(needed) +
                        " work requests on rail " + std::to_string(r) + ", more than its send queue holds (" +
                        std::to_string(rail.sq.depth()) + ", WB_IB_SQ_DEPTH; contiguous writes are merged, writes "
                        "longer than " + std::to_string(p.max_message) + " bytes split): post at most "
                        "capabilities().max_writes_per_batch writes at once");
    if (!rail.sq.fits(needed) || nics_[static_cast<std::size_t>(r)].send_credits == 0)
      return Status(ErrorCode::kRetryLater, "ibverbs send queue to peer " + std::to_string(peer) + " rail " +
                                                std::to_string(r) + " is full (" + std::to_string(needed) + " needed, " +
                                                std::to_string(rail.sq.free_slots()) + " free)");
  }
  if (p.rails > 1) p.next_rail = (p.next_rail + 1) % p.rails;

  for (int r = 0; r < p.rails; ++r) {
    const std::size_t needed = rail_work_requests(p.plan[static_cast<std::size_t>(r)]);
    WB_RETURN_IF_ERROR(post_rail(p, r, writes, immediate, token, needed));
  }
  p.batches.push(token);
  traffic_.add(peer, batch_bytes(writes));
  return Status::ok();
}

Status IbverbsTransport::post_rail(Peer& p, int r, std::span<const WriteRequest> writes, std::uint32_t immediate,
                                   std::uint64_t token, std::size_t work_requests) {
  const auto ri = static_cast<std::size_t>(r);
  Rail& rail = p.rail[ri];
  const std::vector<Piece>& pieces = p.plan[ri];
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    const WriteRequest& w = writes[piece.write];
    const LocalRegion& local = local_[w.local_memory];
    const RemoteRegion& remote = p.regions[w.remote_memory];
    ibv_sge& sge = rail.sges[i];
    sge.addr = local.address + w.local_offset + piece.offset;
    sge.length = static_cast<std::uint32_t>(piece.bytes);
    sge.lkey = local.lkeys[ri];
    ibv_send_wr& wr = rail.wrs[i];
    wr = ibv_send_wr{};
    wr.wr_id = token;
    wr.next = rail.wrs.data() + i + 1;  // the last one is cut below
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = remote.address + w.remote_offset + piece.offset;
    wr.wr.rdma.rkey = remote.rkeys[ri];
  }
  if (pieces.empty()) {
    // No bytes on this rail: a zero-length write carries the immediate (no memory is accessed).
    ibv_send_wr& wr = rail.wrs[0];
    wr = ibv_send_wr{};
    wr.wr_id = token;
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    if (!p.regions.empty() && !p.regions.front().rkeys.empty()) {
      wr.wr.rdma.remote_addr = p.regions.front().address;
      wr.wr.rdma.rkey = p.regions.front().rkeys[ri];
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
    const int peer = p.rank;
    return fail_peer(p, make_call_error(ErrorCode::kIbverbs, "ibv_post_send",
                                           std::string(std::strerror(error)) + " (peer " + std::to_string(peer) +
                                               ", rail " + std::to_string(r) + " on " + nic_label(ri) + ": " +
                                               std::to_string(posted) + " of " + std::to_string(work_requests) +
                                               " work requests were posted; the connection is unusable)",
                                           __FILE__, __LINE__));
  }
  rail.sq.push(token, static_cast<std::uint32_t>(work_requests));
  --nics_[ri].send_credits;
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
  const int rail = owner->second.rail;
  // The opcode is only valid on success; a failed receive is recognised by its wr_id.
  const bool receive = wc.status == IBV_WC_SUCCESS ? (wc.opcode & IBV_WC_RECV) != 0 : wc.wr_id == kReceiveWrId;
  if (receive) ++nic.to_repost;

  if (wc.status != IBV_WC_SUCCESS) {
    if (!p.failure.is_ok()) return Status::ok();  // flushed after the error already reported
    CompletionError e;
    e.peer = peer;
    e.nic = nic.address.label();
    e.rail = rail;
    e.receive = receive;
    e.status_text = ibv_wc_status_str(wc.status);
    e.status = static_cast<int>(wc.status);
    e.opcode = wc_opcode_name(static_cast<int>(wc.opcode));
    e.vendor_err = wc.vendor_err;
    e.wr_id = wc.wr_id;
    return fail_peer(p, Status(ErrorCode::kIbverbs, describe_completion_error(e)));
  }
  if (!p.failure.is_ok()) return Status::ok();
  const std::string where = "ibverbs peer " + std::to_string(peer) + " rail " + std::to_string(rail) + ": ";

  if (receive) {
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0)
      return fail_peer(p, Status(ErrorCode::kInternal, where + "unexpected receive completion " +
                                                              wc_opcode_name(static_cast<int>(wc.opcode)) +
                                                              " (only RDMA_WRITE_WITH_IMM is expected)"));
    bool complete = false;
    std::uint32_t immediate = 0;
    const Status s = p.arrivals.arrive(rail, immediate_from_wire(wc.imm_data), complete, immediate);
    if (!s.is_ok()) return fail_peer(p, Status(s.code(), where + s.message()));
    if (complete) {
      Completion c;
      c.kind = Completion::Kind::kArrival;
      c.peer = peer;
      c.immediate = immediate;
      completions.push_back(c);
      arrived = true;
    }
    return Status::ok();
  }

  if (wc.opcode != IBV_WC_RDMA_WRITE)
    return fail_peer(p, Status(ErrorCode::kInternal, where + "unexpected send completion " +
                                                            wc_opcode_name(static_cast<int>(wc.opcode))));
  if (rail >= p.rails)
    return fail_peer(p, Status(ErrorCode::kInternal, where + "completion on a rail this connection does not use"));
  std::uint32_t freed = 0;
  Status s = p.rail[static_cast<std::size_t>(rail)].sq.complete(wc.wr_id, freed);
  if (!s.is_ok()) return fail_peer(p, Status(s.code(), where + s.message()));
  ++nic.send_credits;
  s = p.batches.rail_done(rail, wc.wr_id);
  if (!s.is_ok()) return fail_peer(p, Status(s.code(), where + s.message()));
  std::uint64_t token = 0;
  while (p.batches.pop_complete(token)) {
    Completion c;
    c.kind = Completion::Kind::kWritesDone;
    c.peer = peer;
    c.token = token;
    completions.push_back(c);
  }
  return Status::ok();
}

Status IbverbsTransport::repost_receives(Nic& nic) {
  const std::uint32_t count = std::min(nic.to_repost, nic.srq_depth);
  if (count == 0) return Status::ok();
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
                               std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc) + " (device " +
                                   std::to_string(device) + ")",
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
  bool arrived = false;
  for (Nic& nic : nics_) {
    for (;;) {
      const int n = ibv_poll_cq(nic.cq.get(), kPollBatch, wcs_.data());
      if (n < 0) {
        if (first.is_ok())
          first = make_call_error(ErrorCode::kIbverbs, "ibv_poll_cq",
                                  "returned " + std::to_string(n) + " on " + nic.address.label(), __FILE__, __LINE__);
        break;
      }
      for (int i = 0; i < n; ++i) {
        // Every polled completion is handled (its accounting kept) even after an error; the first error is returned.
        const Status s = handle_completion(nic, wcs_[static_cast<std::size_t>(i)], completions, arrived);
        if (!s.is_ok() && first.is_ok()) first = s;
      }
      if (n < kPollBatch) break;
    }
    const Status s = repost_receives(nic);
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  if (arrived) {
    const Status s = flush_gpu_writes();
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  return first;
}

}  // namespace wb::ibv
