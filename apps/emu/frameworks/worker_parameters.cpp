#include "emu/frameworks/worker_parameters.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "weightbridge/status.hpp"

namespace wb::emu {

ParameterPlace parse_parameter_place(const std::string& text) {
  if (text == "host") return ParameterPlace::kHost;
  if (text == "cuda") return ParameterPlace::kCuda;
  throw Error(ErrorCode::kInvalidArgument, "--device " + text + ": expected host or cuda");
}

const char* parameter_place_name(ParameterPlace place) { return place == ParameterPlace::kHost ? "host" : "cuda"; }

int default_cuda_device() {
  const int devices = cuda_device_count();
  if (devices <= 0) return 0;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return std::atoi(value) % devices;
  return 0;
}

WorkerParameters::WorkerParameters(const std::vector<TensorInfo>& infos, ParameterPlace place, int device)
    : place_(place), host_(infos) {
  if (place_ == ParameterPlace::kHost) return;
  if (cuda_device_count() == 0)
    throw Error(ErrorCode::kUnsupported, "--device cuda: no CUDA device (" + cuda_unavailable_reason() + ")");
  device_.reserve(infos.size());
  for (const TensorInfo& info : infos) {
    device_.emplace_back(std::max<std::size_t>(1, info.nbytes()), device);
    device_set_.add(info.name, TensorView::contiguous(device_.back().data(), info.dtype, info.shape, MemoryKind::kCuda, device));
  }
  fill(std::byte{0});
}

LoadWeightsFn WorkerParameters::loader(const EmulatedWorker& worker) const {
  if (place_ == ParameterPlace::kHost)
    return [&worker](const CheckpointReader& c, const ParameterSet& p) { worker.load_weights(c, p); };
  return [this, &worker](const CheckpointReader& c, const ParameterSet& p) {
    const ParameterSet& host = host_.parameters();
    if (p.size() != host.size()) throw Error(ErrorCode::kInternal, "WorkerParameters::loader: another parameter set");
    for (std::size_t i = 0; i < p.size(); ++i) cuda_copy(host[i].view.data, p[i].view.data, p[i].view.nbytes());
    worker.load_weights(c, host);
    for (std::size_t i = 0; i < p.size(); ++i) cuda_copy(p[i].view.data, host[i].view.data, p[i].view.nbytes());
  };
}

void WorkerParameters::load(const EmulatedWorker& worker, const CheckpointReader& checkpoint) const {
  loader(worker)(checkpoint, parameters());
}

const ParameterSet& WorkerParameters::read() const {
  const ParameterSet& host = host_.parameters();
  if (place_ == ParameterPlace::kCuda)
    for (std::size_t i = 0; i < host.size(); ++i) cuda_copy(host[i].view.data, device_set_[i].view.data, host[i].view.nbytes());
  return host;
}

void WorkerParameters::fill(std::byte value) const {
  if (place_ == ParameterPlace::kHost) {
    for (const Parameter& p : host_.parameters()) std::memset(p.view.data, static_cast<int>(value), p.view.nbytes());
    return;
  }
  // One host pattern per parameter, copied over (set-up and test code: simplicity over speed).
  for (std::size_t i = 0; i < device_set_.size(); ++i) {
    const Parameter& h = host_.parameters()[i];
    std::memset(h.view.data, static_cast<int>(value), h.view.nbytes());
    cuda_copy(device_set_[i].view.data, h.view.data, h.view.nbytes());
  }
}

}  // namespace wb::emu
