// CUDA driver facts for the ibverbs transport (see ibverbs_cuda.hpp).
#include "transport/ibverbs/ibverbs_cuda.hpp"

#include <string>

#include "transport/ibverbs/ibverbs_topology.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#endif

namespace wb::ibv {

#ifdef WB_HAVE_CUDA
namespace {

/// A CUDA driver function, found through the runtime (no link dependency on libcuda).
template <class Fn>
Fn driver_function(const char* name, unsigned int version) {
  void* fn = nullptr;
#if CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  const cudaError_t rc = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found);
#else
  (void)version;
  const cudaError_t rc = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  const bool ok = rc == cudaSuccess && found == cudaDriverEntryPointSuccess;
#else
  (void)version;
  const bool ok = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault) == cudaSuccess;
#endif
  if (!ok || fn == nullptr) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

std::string cu_error_text(CUresult result) {
  static const auto get_name = driver_function<PFN_cuGetErrorName_v6000>("cuGetErrorName", 6000);
  const char* name = nullptr;
  if (get_name != nullptr && get_name(result, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return "CUresult " + std::to_string(static_cast<int>(result));
}

PFN_cuMemGetHandleForAddressRange_v11070 get_handle_function() {
  static const auto fn = driver_function<PFN_cuMemGetHandleForAddressRange_v11070>("cuMemGetHandleForAddressRange", 11070);
  return fn;
}

}  // namespace

std::string current_gpu_bus_id() {
  static const auto get_current = driver_function<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent", 4000);
  static const auto get_device = driver_function<PFN_cuCtxGetDevice_v2000>("cuCtxGetDevice", 2000);
  CUcontext context = nullptr;
  CUdevice device = 0;
  if (get_current == nullptr || get_device == nullptr || get_current(&context) != CUDA_SUCCESS || context == nullptr ||
      get_device(&device) != CUDA_SUCCESS)
    return "";
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, static_cast<int>(device)) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return normalize_pci_bus_id(bus_id);
}

bool cuda_driver_has_dmabuf() { return get_handle_function() != nullptr; }

int cuda_dmabuf_fd(unsigned long long begin, unsigned long long bytes, std::string& error) {
  const auto get_handle = get_handle_function();
  if (get_handle == nullptr) {
    error = "cuMemGetHandleForAddressRange is not in this CUDA driver";
    return -1;
  }
  int fd = -1;
  const CUresult rc = get_handle(&fd, static_cast<CUdeviceptr>(begin), bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (rc != CUDA_SUCCESS) {
    error = "cuMemGetHandleForAddressRange failed: " + cu_error_text(rc);
    return -1;
  }
  return fd;
}

#else

std::string current_gpu_bus_id() { return ""; }
bool cuda_driver_has_dmabuf() { return false; }
int cuda_dmabuf_fd(unsigned long long, unsigned long long, std::string& error) {
  error = "built without CUDA";
  return -1;
}

#endif

}  // namespace wb::ibv
