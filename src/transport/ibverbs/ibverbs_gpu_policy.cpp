// How the ibverbs transport treats CUDA memory (see ibverbs_gpu_policy.hpp).
#include "transport/ibverbs/ibverbs_gpu_policy.hpp"

#include <string>

#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

// The CUDA values (cudaGPUDirectRDMAWritesOrdering*, cudaFlushGPUDirectRDMAWritesOption*), stated here so
// that the decision compiles and is tested without CUDA; ibverbs_memory.cpp checks them against CUDA's.
constexpr int kOrderingOwner = 100;
constexpr int kFlushOptionHost = 1 << 0;

}  // namespace

GpuRegistrationPlan plan_gpu_registration(Switch dmabuf, bool library_has_dmabuf, bool driver_has_dmabuf) {
  GpuRegistrationPlan plan;
  std::string missing;
  if (!library_has_dmabuf) missing = "libibverbs has no ibv_reg_dmabuf_mr (rdma-core < 34)";
  else if (!driver_has_dmabuf) missing = "the CUDA driver has no cuMemGetHandleForAddressRange (< 11.7)";
  switch (dmabuf) {
    case Switch::kOff:
      plan.peermem = true;
      plan.why_not_dmabuf = "WB_IB_DMABUF=off";
      break;
    case Switch::kOn:
      if (!missing.empty())
        throw Error(ErrorCode::kUnsupported, "WB_IB_DMABUF=on, but " + missing + "; set it to auto or off to use nvidia-peermem");
      plan.dmabuf = true;
      break;
    case Switch::kAuto:
      plan.dmabuf = missing.empty();
      plan.peermem = true;  // where the dma-buf registration itself fails (an older kernel)
      plan.why_not_dmabuf = missing;
      break;
  }
  return plan;
}

GpuFlushDecision gpu_flush_decision(int device, int ordering, int flush_options) {
  GpuFlushDecision d;
  const std::string head = "CUDA device " + std::to_string(device) + ": ";
  if (ordering >= kOrderingOwner) {
    d.text = head + "the GPU orders incoming RDMA writes before its own later accesses (GPUDirectRDMAWritesOrdering " +
             std::to_string(ordering) + "): no flush before reporting an arrival";
  } else if ((flush_options & kFlushOptionHost) != 0) {
    d.flush = true;
    d.text = head + "incoming RDMA writes are not ordered before the GPU's own accesses (GPUDirectRDMAWritesOrdering " +
             std::to_string(ordering) + "): poll flushes them (cudaDeviceFlushGPUDirectRDMAWrites) before it reports an arrival";
  } else {
    d.risky = true;
    d.text = head + "incoming RDMA writes are neither ordered before the GPU's own accesses (GPUDirectRDMAWritesOrdering " +
             std::to_string(ordering) + ") nor flushable from the host (flush options " + std::to_string(flush_options) +
             "): a kernel may read an arrival's memory before all its bytes are visible";
  }
  return d;
}

}  // namespace wb::ibv
