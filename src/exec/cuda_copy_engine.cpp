// Pack and assemble of CUDA parameters (copy_engine.hpp): one descriptor program per round and step,
// launched on the executor's own non-blocking stream between two events per pipeline slot; the progress
// loop polls the second event, never waits for it. Builds with CUDA only.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "exec/copy_engine.hpp"
#include "exec/device_copy_program.hpp"

namespace wb::exec {
namespace {

class DeviceCopyEngine final : public CopyEngine {
 public:
  DeviceCopyEngine(int rank, const ParameterMemory& parameters, const TransferBuffers& buffers,
                   const RoundSchedule& schedule)
      : rank_(rank),
        device_(parameters.device),
        parameters_(parameters.data),
        parameter_bytes_(parameters.bytes.begin(), parameters.bytes.end()),
        send_(buffers.send->for_copies()),
        receive_(buffers.receive->for_copies()),
        send_stride_(static_cast<std::size_t>(buffers.send_slot_stride)),
        receive_stride_(static_cast<std::size_t>(buffers.receive_slot_stride)),
        send_slot_bytes_(schedule.send_slot_bytes),
        receive_slot_bytes_(schedule.receive_slot_bytes) {
    DeviceGuard guard(device_);
    try {
      WB_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      const auto depth = static_cast<std::size_t>(std::max(1, schedule.pipeline_depth));
      pack_.resize(depth);
      assemble_.resize(depth);
      for (std::vector<Timing>* timings : {&pack_, &assemble_})
        for (Timing& t : *timings) {
          WB_CHECK_CUDA(cudaEventCreate(&t.started));
          WB_CHECK_CUDA(cudaEventCreate(&t.finished));
        }
      WB_CHECK_CUDA(cudaEventCreateWithFlags(&completion_, cudaEventDisableTiming));
      WB_CHECK_CUDA(cudaEventCreateWithFlags(&ordering_, cudaEventDisableTiming));
    } catch (...) {
      release();
      throw;
    }
  }
  ~DeviceCopyEngine() override {
    DeviceGuard guard;
    (void)guard.enter(device_);
    rounds_.clear();
    release();
  }

  void add_round(const RoundPlan& plan) override {
    // Compiled for slot 0; every other slot has its alignment (kDeviceSlotAlignment).
    DeviceCopyProgram pack(compile_copy_work(CopyDirection::kPack, plan.pack, parameters_, parameter_bytes_, send_,
                                             send_slot_bytes_),
                           device_, stream_);
    DeviceCopyProgram assemble(compile_copy_work(CopyDirection::kAssemble, plan.assemble, parameters_, parameter_bytes_,
                                                 receive_, receive_slot_bytes_),
                               device_, stream_);
    rounds_.push_back({std::move(pack), std::move(assemble)});
  }
  std::int64_t assembled_bytes(std::size_t round) const override { return rounds_[round].assemble.bytes(); }

  Status begin_update(const DeviceOrdering& after) override {
    if (lost_) return *lost_;
    DeviceGuard guard;
    WB_RETURN_IF_ERROR(guard.enter(device_));
    if (after.wait_event != nullptr) WB_TRY_CUDA(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(after.wait_event), 0));
    if (after.wait_stream != nullptr) {
      WB_TRY_CUDA(cudaEventRecord(ordering_, static_cast<cudaStream_t>(after.wait_stream)));
      WB_TRY_CUDA(cudaStreamWaitEvent(stream_, ordering_, 0));
    }
    return Status::ok();
  }

  Status advance(CopyStep step, std::size_t round, std::size_t slot, bool& started, bool& done, double& seconds) override {
    const bool pack = step == CopyStep::kPack;
    const DeviceCopyProgram& program = pack ? rounds_[round].pack : rounds_[round].assemble;
    if (program.empty()) {
      started = done = true;
      return Status::ok();
    }
    Timing& timing = (pack ? pack_ : assemble_)[slot];
    if (!started) {
      std::byte* buffer = pack ? send_ + slot * send_stride_ : receive_ + slot * receive_stride_;
      DeviceGuard guard;
      WB_RETURN_IF_ERROR(guard.enter(device_));
      WB_TRY_CUDA(cudaEventRecord(timing.started, stream_));
      WB_RETURN_IF_ERROR(program.execute(stream_, buffer));
      WB_TRY_CUDA(cudaEventRecord(timing.finished, stream_));
      started = true;
      return Status::ok();
    }
    const cudaError_t rc = cudaEventQuery(timing.finished);
    if (rc == cudaErrorNotReady) return Status::ok();
    if (rc != cudaSuccess)
      return make_call_error(ErrorCode::kCuda, "cudaEventQuery (the end of a kernel)", detail::cuda_error_string(rc),
                             __FILE__, __LINE__);
    done = true;
    float milliseconds = 0;
    if (cudaEventElapsedTime(&milliseconds, timing.started, timing.finished) == cudaSuccess) seconds += milliseconds / 1e3;
    return Status::ok();
  }

  Status end_update() override {
    DeviceGuard guard;
    WB_RETURN_IF_ERROR(guard.enter(device_));
    WB_TRY_CUDA(cudaEventRecord(completion_, stream_));
    return Status::ok();
  }

  // A kernel that faults loses the whole context: every later call, a transport's included, returns the
  // same sticky error. Say so once, and the same way from then on.
  Status explain(Status status) override {
    if (status) return status;
    if (lost_) return *lost_;
    if (status.code() != ErrorCode::kCuda) return status;
    const cudaError_t rc = cudaStreamQuery(stream_);
    if (!cuda_error_is_sticky(rc)) return status;
    lost_ = Status(ErrorCode::kCuda, "rank " + std::to_string(rank_) + " (cuda:" + std::to_string(device_) +
                                         "): CUDA context lost (a pack/assemble kernel faulted): " +
                                         detail::cuda_error_string(rc) +
                                         "; no CUDA call of this process can succeed any more, restart it");
    return *lost_;
  }

  void* completion_event() const override { return completion_; }

  // The descriptors on the device hold the addresses: every round is compiled again (rare: a framework
  // that moved a parameter between updates).
  void rebind(std::size_t parameter, std::byte* data, const RoundSchedule& schedule) override {
    DeviceGuard guard(device_);
    WB_CHECK_CUDA(cudaStreamSynchronize(stream_));
    parameters_.at(parameter) = data;
    rounds_.clear();
    for (const RoundPlan& plan : schedule.rounds) add_round(plan);
  }

  void synchronize() noexcept override {
    DeviceGuard guard;
    if (guard.enter(device_)) (void)cudaStreamSynchronize(stream_);
  }

 private:
  struct Timing {
    cudaEvent_t started = nullptr, finished = nullptr;
  };
  struct Round {
    DeviceCopyProgram pack, assemble;
  };

  void release() noexcept {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (std::vector<Timing>* timings : {&pack_, &assemble_})
      for (Timing& t : *timings) {
        if (t.started != nullptr) (void)cudaEventDestroy(t.started);
        if (t.finished != nullptr) (void)cudaEventDestroy(t.finished);
        t = Timing{};
      }
    for (cudaEvent_t* event : {&completion_, &ordering_})
      if (*event != nullptr) (void)cudaEventDestroy(*event), *event = nullptr;
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  int rank_;
  int device_;
  std::vector<std::byte*> parameters_;
  std::vector<std::int64_t> parameter_bytes_;
  std::byte* send_;
  std::byte* receive_;
  std::size_t send_stride_, receive_stride_;
  std::int64_t send_slot_bytes_, receive_slot_bytes_;
  cudaStream_t stream_ = nullptr;
  std::vector<Timing> pack_, assemble_;  // per pipeline slot
  cudaEvent_t completion_ = nullptr;     // after each update's last kernel
  cudaEvent_t ordering_ = nullptr;       // DeviceOrdering::wait_stream, recorded there
  std::vector<Round> rounds_;
  std::optional<Status> lost_;
};

}  // namespace

std::unique_ptr<CopyEngine> make_device_copy_engine(int rank, const ParameterMemory& parameters,
                                                    const TransferBuffers& buffers, const RoundSchedule& schedule) {
  return std::make_unique<DeviceCopyEngine>(rank, parameters, buffers, schedule);
}

}  // namespace wb::exec
