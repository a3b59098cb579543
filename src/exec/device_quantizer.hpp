// The trainers' FP8 pack for parameters in CUDA memory (exec/quantized_pack.hpp, use_device): the shadow
// and scale buffers on the device, the quantize kernels (exec/fp8_kernel_launch.hpp) on the caller's stream,
// the shared blocks' amaxes through the host for the exchange. Builds with CUDA only (exec/no_cuda.cpp
// refuses otherwise).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "exec/quantized_pack.hpp"

namespace wb::exec {

class DeviceQuantizer {
 public:
  virtual ~DeviceQuantizer() = default;
  /// The shadow buffers then the scale buffers, device memory (the pack's own parameters, in order).
  virtual std::vector<std::byte*> buffers() const = 0;
  /// One update: amaxes, their exchange, scales, codes; complete on the device when it returns.
  virtual Status quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange, void* stream) = 0;
};

/// Set-up: throws kCuda, or kUnsupported without CUDA.
std::unique_ptr<DeviceQuantizer> make_device_quantizer(const DeviceQuantizePlan& plan, int device);

}  // namespace wb::exec
