// The one interface through which the round executor's progress loop packs and assembles, whatever
// memory the parameters are in: host parameters by the CPU copy programs (exec/pack.hpp, at once), CUDA
// parameters by the copy kernel on a stream of the executor's (exec/device_copy_program.hpp, started and
// then polled, never waited for). The loop treats both alike: a step is started, then done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "exec/round_executor.hpp"
#include "exec/transfer_memory.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

enum class CopyStep : std::uint8_t { kPack, kAssemble };

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  /// Set-up: compiles round `round`'s pack and assemble (throws wb::Error naming the copy). Rounds are
  /// added in order, 0 first.
  virtual void add_round(const RoundPlan& plan) = 0;
  /// Payload bytes of round `round`'s assemble.
  virtual std::int64_t assembled_bytes(std::size_t round) const = 0;

  /// Orders the update after the caller's work (DeviceOrdering); kInvalidArgument when the parameters'
  /// memory has nothing to order.
  virtual Status begin_update(const DeviceOrdering& after) = 0;
  /// Moves round `round`'s `step` on pipeline slot `slot` forward: starts it when `started` is false (and
  /// sets it), else looks whether it finished. `done` once it has; its duration is then added to
  /// `seconds`. An empty step is done at once.
  virtual Status advance(CopyStep step, std::size_t round, std::size_t slot, bool& started, bool& done,
                         double& seconds) = 0;
  /// After the update's last step: the completion event is recorded.
  virtual Status end_update() = 0;
  /// Turns a failure of the update path (a transport's or the engine's own) into the one error of a lost
  /// CUDA context when that is what happened; otherwise returns it unchanged.
  virtual Status explain(Status status) = 0;
  /// RoundExecutor::completion_event.
  virtual void* completion_event() const = 0;
  /// Teardown: waits for the engine's own work to end (best effort, never throws).
  virtual void synchronize() noexcept = 0;
  /// RoundExecutor::rebind_parameter: parameter `parameter` is at `data` from the next update on. Programs
  /// that hold addresses are compiled again from `schedule` (the rounds add_round was given). Throws
  /// wb::Error when that fails.
  virtual void rebind(std::size_t parameter, std::byte* data, const RoundSchedule& schedule) = 0;
};

class Verifier;

/// The engine for `parameters`' memory over `buffers`. Set-up: throws wb::Error (kUnsupported for CUDA
/// parameters in a build without CUDA). `verifier` (host parameters only; may be null): packs and
/// assembles instead of the round's programs, digesting as it goes (exec/verify.hpp).
std::unique_ptr<CopyEngine> make_copy_engine(int rank, const ParameterMemory& parameters, const TransferBuffers& buffers,
                                             const RoundSchedule& schedule, Verifier* verifier = nullptr);

/// The CPU engine (exec/host_copy_engine.cpp) and the CUDA one (exec/cuda_copy_engine.cpp, or a refusal in
/// builds without CUDA: exec/no_cuda.cpp).
std::unique_ptr<CopyEngine> make_host_copy_engine(const ParameterMemory& parameters, const TransferBuffers& buffers,
                                                  const RoundSchedule& schedule, Verifier* verifier = nullptr);
std::unique_ptr<CopyEngine> make_device_copy_engine(int rank, const ParameterMemory& parameters,
                                                    const TransferBuffers& buffers, const RoundSchedule& schedule);

}  // namespace wb::exec
