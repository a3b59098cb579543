// Private: how the ibverbs transport treats CUDA memory, decided without a GPU so that tests check it:
// which registration path (dma-buf or nvidia-peermem) and whether arrivals need a GPU flush. Plain
// integers stand for the CUDA attribute values, so that this compiles and is tested without CUDA.
#pragma once

#include <string>

#include "transport/ibverbs/ibverbs_config.hpp"

namespace wb::ibv {

/// Which registrations to try for CUDA memory, in order.
struct GpuRegistrationPlan {
  bool dmabuf = false;   // ibv_reg_dmabuf_mr of a dma-buf of the allocation
  bool peermem = false;  // ibv_reg_mr of the device pointer (nvidia-peermem)
  std::string why_not_dmabuf;  // when dmabuf is false: why ("" otherwise)
};
/// From WB_IB_DMABUF and what is there: the library's ibv_reg_dmabuf_mr (rdma-core >= 34) and the CUDA
/// driver's cuMemGetHandleForAddressRange. Throws kUnsupported when WB_IB_DMABUF=on and either is missing.
GpuRegistrationPlan plan_gpu_registration(Switch dmabuf, bool library_has_dmabuf, bool driver_has_dmabuf);

/// The GPU-flush decision for CUDA memory that RDMA writes land in, from the device's attributes:
/// cudaDevAttrGPUDirectRDMAWritesOrdering (`ordering`: 0 none, 100 owner, 200 all devices) and
/// cudaDevAttrGPUDirectRDMAFlushWritesOptions (`flush_options`: bit 0 host-initiated flush).
struct GpuFlushDecision {
  bool flush = false;  // poll calls cudaDeviceFlushGPUDirectRDMAWrites before it reports an arrival
  bool risky = false;  // neither ordered nor flushable: a kernel may read an arrival before its bytes
  std::string text;    // the decision and why, for the log
};
GpuFlushDecision gpu_flush_decision(int device, int ordering, int flush_options);

}  // namespace wb::ibv
