// ibverbs transport, memory: registering this rank's memory with every device (host memory with ibv_reg_mr,
// or ibv_reg_mr_iova2 with relaxed ordering; CUDA memory through a dma-buf of the allocation and
// ibv_reg_dmabuf_mr, or ibv_reg_mr on the device pointer for nvidia-peermem systems, as WB_IB_DMABUF
// says), and importing the memory keys of peers into one id space for the whole transport.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "core/log.hpp"
#include "transport/ibverbs/ibverbs_cuda.hpp"
#include "transport/ibverbs/ibverbs_gpu_policy.hpp"
#include "transport/ibverbs/ibverbs_internal.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace wb::ibv {
namespace {

#ifdef WB_HAVE_CUDA
// ibverbs_gpu_policy.cpp states these values without CUDA's headers.
static_assert(cudaGPUDirectRDMAWritesOrderingOwner == 100);
static_assert(cudaFlushGPUDirectRDMAWritesOptionHost == 1);
#endif

std::string range_text(const void* address, std::size_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "[%p, +%zu)", address, bytes);
  return text;
}

/// The errno text of a failed registration, with the usual cause of ENOMEM.
std::string registration_error(int error) {
  std::string text = std::strerror(error);
  if (error == ENOMEM) text += " (is the locked-memory limit, ulimit -l, too low?)";
  return text;
}

#ifdef WB_HAVE_CUDA

struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

#endif  // WB_HAVE_CUDA

}  // namespace

ibv_mr* IbverbsTransport::register_range(const Device& device, void* address, std::size_t bytes, int access) const {
  if (relaxed_ordering_)
    return lib_.reg_mr_iova2(device.pd.get(), address, bytes, reinterpret_cast<std::uintptr_t>(address),
                             static_cast<unsigned int>(access | IBV_ACCESS_RELAXED_ORDERING));
  return lib_.reg_mr(device.pd.get(), address, bytes, access);
}

void IbverbsTransport::register_host(LocalRegion& region, int access) {
  void* address = reinterpret_cast<void*>(region.address);
  for (const Device& device : devices_) {
    ibv_mr* mr = register_range(device, address, region.bytes, access);
    if (mr == nullptr) {
      const int error = errno;
      throw Error(make_call_error(ErrorCode::kIbverbs,
                                  std::string(relaxed_ordering_ ? "ibv_reg_mr_iova2" : "ibv_reg_mr") + "(" + device.name +
                                      ", host memory " + range_text(address, region.bytes) + ")",
                                  registration_error(error), __FILE__, __LINE__));
    }
    region.mrs.emplace_back(mr, MrDeregisterer{&lib_});
  }
}

void IbverbsTransport::register_cuda(LocalRegion& region, int access) {
#ifdef WB_HAVE_CUDA
  void* address = reinterpret_cast<void*>(region.address);
  const std::string what = "CUDA memory " + range_text(address, region.bytes) + " of device " + std::to_string(region.device);
  DeviceGuard current(region.device);
  cudaPointerAttributes attributes{};
  WB_CHECK_CUDA(cudaPointerGetAttributes(&attributes, address));
  if (attributes.type != cudaMemoryTypeDevice)
    throw Error(ErrorCode::kInvalidArgument, "register_memory: " + what + " is not device memory (cudaMemoryType " +
                                                 std::to_string(static_cast<int>(attributes.type)) +
                                                 "); register host or managed memory as host memory");
  if (attributes.device != region.device)
    throw Error(ErrorCode::kInvalidArgument, "register_memory: " + what + " belongs to device " +
                                                 std::to_string(attributes.device));

  const GpuRegistrationPlan plan = plan_gpu_registration(config_.dmabuf, lib_.reg_dmabuf_mr != nullptr, cuda_driver_has_dmabuf());
  // dma-buf of the page-aligned range around the memory; the region starts `offset` bytes into it and is
  // addressed by its own virtual address (iova), which is what the memory key hands to peers.
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t begin = region.address / page * page;
  const std::uint64_t end = (region.address + region.bytes + page - 1) / page * page;
  FdCloser dmabuf;
  std::string dmabuf_error = plan.why_not_dmabuf;
  if (plan.dmabuf) dmabuf.fd = cuda_dmabuf_fd(begin, end - begin, dmabuf_error);
  if (dmabuf.fd < 0 && !plan.peermem)
    throw Error(ErrorCode::kUnsupported, "register_memory(" + what + "): WB_IB_DMABUF=on, but " + dmabuf_error);
  for (const Device& device : devices_) {
    ibv_mr* mr = nullptr;
    if (dmabuf.fd >= 0) {
      mr = lib_.reg_dmabuf_mr(device.pd.get(), region.address - begin, region.bytes, region.address, dmabuf.fd,
                              relaxed_ordering_ ? access | IBV_ACCESS_RELAXED_ORDERING : access);
      if (mr == nullptr) {
        dmabuf_error = std::string("ibv_reg_dmabuf_mr failed: ") + registration_error(errno);
        if (!plan.peermem)
          throw Error(make_call_error(ErrorCode::kIbverbs, "ibv_reg_dmabuf_mr(" + device.name + ", " + what + ")",
                                      registration_error(errno), __FILE__, __LINE__));
      }
    }
    if (mr == nullptr) {
      // Legacy GPUDirect RDMA (nvidia-peermem) registers the device pointer like host memory.
      mr = register_range(device, address, region.bytes, access);
      if (mr == nullptr) {
        const int error = errno;
        throw Error(make_call_error(ErrorCode::kIbverbs, "register_memory(" + what + ") on " + device.name,
                                    "dma-buf: " + dmabuf_error + "; ibv_reg_mr on the device pointer (nvidia-peermem): " +
                                        registration_error(error),
                                    __FILE__, __LINE__));
      }
      WB_LOG(kDebug) << "ibverbs: " << what << " registered on " << device.name << " through nvidia-peermem ("
                     << dmabuf_error << ")";
    }
    region.mrs.emplace_back(mr, MrDeregisterer{&lib_});
  }

  // Where the GPU does not order incoming RDMA writes before its own later reads, poll flushes them
  // (cudaDeviceFlushGPUDirectRDMAWrites) before it reports an arrival. The decision is logged once per device.
  int ordering = 0, flush_options = 0;
  if (cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, region.device) != cudaSuccess ||
      cudaDeviceGetAttribute(&flush_options, cudaDevAttrGPUDirectRDMAFlushWritesOptions, region.device) != cudaSuccess) {
    (void)cudaGetLastError();
    ordering = 0;
    flush_options = 0;
  }
  const GpuFlushDecision decision = gpu_flush_decision(region.device, ordering, flush_options);
  if (decision.flush && std::find(gpu_flush_devices_.begin(), gpu_flush_devices_.end(), region.device) == gpu_flush_devices_.end())
    gpu_flush_devices_.push_back(region.device);
  if (std::find(gpu_devices_logged_.begin(), gpu_devices_logged_.end(), region.device) == gpu_devices_logged_.end()) {
    gpu_devices_logged_.push_back(region.device);
    if (decision.risky) {
      WB_LOG(kWarn) << "ibverbs: " << decision.text;
    } else {
      WB_LOG(kInfo) << "ibverbs: " << decision.text;
    }
  }
#else
  (void)access;
  throw Error(ErrorCode::kUnsupported, "ibverbs register_memory: CUDA memory of device " + std::to_string(region.device) +
                                           " needs a build with CUDA (WB_HAVE_CUDA)");
#endif
}

MemoryRegistration IbverbsTransport::register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) {
  if (address == nullptr && bytes != 0)
    throw Error(ErrorCode::kInvalidArgument, "ibverbs register_memory: null address for " + std::to_string(bytes) + " bytes");
  LocalRegion region;
  region.address = reinterpret_cast<std::uintptr_t>(address);
  region.bytes = bytes;
  region.memory = memory;
  region.device = device;
  if (bytes != 0) {
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (memory == MemoryKind::kCuda) register_cuda(region, access);
    else register_host(region, access);
    for (const Nic& nic : nics_) {
      region.lkeys.push_back(region.mrs[nic.device]->lkey);
      region.rkeys.push_back(region.mrs[nic.device]->rkey);
    }
  }
  MemoryKey key;
  key.owner = rank_;
  key.address = region.address;
  key.bytes = region.bytes;
  key.rkeys = region.rkeys;

  MemoryRegistration registration;
  registration.id = regions_.add_local(region.bytes);  // the same numbering as local_
  registration.remote_key = serialize_memory_key(key);
  local_.push_back(std::move(region));
  return registration;
}

std::uint32_t IbverbsTransport::import_memory(int peer, std::span<const std::byte> remote_key) {
  MemoryKey key = parse_memory_key(remote_key, peer);
  Peer& p = peer_entry(peer);
  if (p.connected && key.bytes != 0 && key.rkeys.size() != p.remote_nics)
    throw Error(ErrorCode::kInvalidArgument, "ibverbs import_memory: the memory key from rank " + std::to_string(peer) +
                                                 " has rkeys for " + std::to_string(key.rkeys.size()) +
                                                 " NIC(s), its endpoint record lists " + std::to_string(p.remote_nics));
  const auto id = static_cast<std::uint32_t>(remote_.size());
  RemoteRegion region;
  region.owner = peer;
  region.address = key.address;
  region.bytes = key.bytes;
  region.rkeys = std::move(key.rkeys);
  if (p.zero_length_target == SIZE_MAX && !region.rkeys.empty()) p.zero_length_target = id;
  remote_.push_back(std::move(region));
  (void)regions_.add_remote(peer, key.bytes);  // the same numbering as remote_
  return id;
}

}  // namespace wb::ibv
