// An emulated worker's parameters where a real framework keeps them: in host memory, or on a CUDA device
// (wb-replay --device cuda), several ranks possibly sharing one. The emulated backends load and compare in
// host memory; for device parameters this class moves the bytes across, as a framework's load_weights
// copies checkpoint tensors to the device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "emu/frameworks/backend.hpp"
#include "weightbridge/adapter.hpp"

namespace wb::emu {

enum class ParameterPlace { kHost, kCuda };
/// "host" | "cuda"; throws kInvalidArgument naming the flag otherwise.
ParameterPlace parse_parameter_place(const std::string& text);
const char* parameter_place_name(ParameterPlace place);
/// The GPU of this rank when it shares a machine with others: its local rank (Open MPI's, Slurm's or
/// MPICH's variable) modulo the visible devices; 0 when unknown or without devices.
int default_cuda_device();

class WorkerParameters {
 public:
  /// Device parameters go on `device` (one cudaMalloc per parameter). Throws kUnsupported without a device.
  WorkerParameters(const std::vector<TensorInfo>& infos, ParameterPlace place, int device = 0);

  ParameterPlace place() const { return place_; }
  /// What the adapters get: host views, or CUDA views of the device allocations.
  const ParameterSet& parameters() const { return place_ == ParameterPlace::kHost ? host_.parameters() : device_set_; }
  std::size_t total_bytes() const { return host_.total_bytes(); }

  /// The worker's load_weights on these parameters (the adapters' LoadWeightsFn, probe included): for device
  /// parameters, the current bytes come to the host, the worker loads into them there, and they go back, so
  /// that what load_weights does not write keeps its value on the device too.
  LoadWeightsFn loader(const EmulatedWorker& worker) const;
  /// loader(worker) applied to `checkpoint`.
  void load(const EmulatedWorker& worker, const CheckpointReader& checkpoint) const;
  /// The parameters' bytes, readable on the host: the parameters themselves, or a fresh copy of the device's.
  const ParameterSet& read() const;
  /// Every byte set to `value` (a trainer scribbling after send_weights returned).
  void fill(std::byte value) const;

 private:
  ParameterPlace place_;
  HostParameters host_;                 // the parameters (host), or the host copy of them (device)
  std::vector<DeviceBuffer> device_;    // device parameters
  ParameterSet device_set_;
};

}  // namespace wb::emu
