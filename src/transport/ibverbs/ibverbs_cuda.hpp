// Private: the few CUDA driver facts the ibverbs transport needs, looked up through the runtime
// (cudaGetDriverEntryPoint*), so that the library links only CUDA::cudart and loads without a driver.
// Without CUDA (WB_HAVE_CUDA unset) every answer is "not there".
#pragma once

#include <string>

namespace wb::ibv {

/// The PCI bus id (sysfs form, "0000:3b:00.0") of the GPU whose CUDA context is current on this thread;
/// "" when none is (host parameters, no CUDA), so that NIC locality then uses every NIC.
std::string current_gpu_bus_id();

/// Whether the CUDA driver can export a dma-buf of device memory (cuMemGetHandleForAddressRange).
bool cuda_driver_has_dmabuf();

/// A dma-buf file descriptor for [begin, begin + bytes) of device memory, or -1 with the reason in `error`.
int cuda_dmabuf_fd(unsigned long long begin, unsigned long long bytes, std::string& error);

}  // namespace wb::ibv
