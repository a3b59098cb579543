// Pack and assemble of host parameters (copy_engine.hpp): the CPU copy programs, run at once on the
// executor's thread; when verifying, the verifier's programs, which digest as they copy (exec/verify.hpp).
// A trainer packing for FP8 engines casts the codes of its pieces of the converted tensors into the buffer
// first (exec/fp8_cast_program.hpp), then copies the rest.
#include <chrono>
#include <span>
#include <vector>

#include "exec/copy_engine.hpp"
#include "exec/fp8_cast_program.hpp"
#include "exec/pack.hpp"
#include "exec/verify.hpp"

namespace wb::exec {
namespace {

class HostCopyEngine final : public CopyEngine {
 public:
  HostCopyEngine(const ParameterMemory& parameters, const TransferBuffers& buffers, const RoundSchedule& schedule,
                 Verifier* verifier)
      : verifier_(verifier),
        fp8_casts_(parameters.fp8_casts),
        parameters_(parameters.data),
        parameter_bytes_(parameters.bytes.begin(), parameters.bytes.end()),
        send_(buffers.send->for_copies()),
        receive_(buffers.receive->for_copies()),
        send_stride_(static_cast<std::size_t>(buffers.send_slot_stride)),
        receive_stride_(static_cast<std::size_t>(buffers.receive_slot_stride)),
        send_slot_bytes_(schedule.send_slot_bytes),
        receive_slot_bytes_(schedule.receive_slot_bytes) {
    // The verifier digests what its own programs pack, from the shadows (QuantizedPack::cast_in_pack).
    if (fp8_casts_ != nullptr && verifier_ != nullptr)
      throw Error(ErrorCode::kInternal, "FP8 casts in the pack and a verifier: a verified pack reads the shadows");
  }

  void add_round(const RoundPlan& plan) override {
    Fp8CastProgram casts;
    std::vector<BufferCopy> rest;
    if (fp8_casts_ != nullptr) casts = Fp8CastProgram(plan.pack, *fp8_casts_, send_slot_bytes_, rest);
    const std::span<const BufferCopy> pack = fp8_casts_ != nullptr ? std::span<const BufferCopy>(rest) : plan.pack;
    rounds_.push_back({CopyProgram(CopyDirection::kPack, pack, parameter_bytes_, send_slot_bytes_),
                       CopyProgram(CopyDirection::kAssemble, plan.assemble, parameter_bytes_, receive_slot_bytes_),
                       std::move(casts)});
  }
  std::int64_t assembled_bytes(std::size_t round) const override { return rounds_[round].assemble.bytes(); }

  Status begin_update(const DeviceOrdering& after) override {
    if (after.wait_event != nullptr || after.wait_stream != nullptr)
      return Status(ErrorCode::kInvalidArgument, "an update of host parameters cannot wait on a CUDA event or stream");
    return Status::ok();
  }

  Status advance(CopyStep step, std::size_t round, std::size_t slot, bool& started, bool& done, double& seconds) override {
    const auto t0 = std::chrono::steady_clock::now();
    std::byte* const send_slot = send_ + slot * send_stride_;
    std::byte* const receive_slot = receive_ + slot * receive_stride_;
    if (verifier_ != nullptr && step == CopyStep::kPack)
      verifier_->pack(static_cast<int>(round), parameters_, send_slot);  // packs and digests
    else if (verifier_ != nullptr)
      verifier_->assemble(static_cast<int>(round), parameters_, receive_slot);  // digests and assembles
    else if (step == CopyStep::kPack) {
      rounds_[round].casts.execute(parameters_, send_slot);  // first: the scale copies read what it takes
      rounds_[round].pack.execute(parameters_, send_slot);
    } else
      rounds_[round].assemble.execute(parameters_, receive_slot);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    started = done = true;
    return Status::ok();
  }

  Status end_update() override { return Status::ok(); }
  Status explain(Status status) override { return status; }
  void* completion_event() const override { return nullptr; }
  void synchronize() noexcept override {}
  // The programs take the parameters' addresses at every run.
  void rebind(std::size_t parameter, std::byte* data, const RoundSchedule&) override { parameters_.at(parameter) = data; }

 private:
  struct Round {
    CopyProgram pack, assemble;
    Fp8CastProgram casts;
  };
  Verifier* verifier_;
  QuantizedPack* fp8_casts_;
  std::vector<std::byte*> parameters_;
  std::vector<std::int64_t> parameter_bytes_;
  std::byte* send_;
  std::byte* receive_;
  std::size_t send_stride_, receive_stride_;
  std::int64_t send_slot_bytes_, receive_slot_bytes_;
  std::vector<Round> rounds_;
};

}  // namespace

std::unique_ptr<CopyEngine> make_host_copy_engine(const ParameterMemory& parameters, const TransferBuffers& buffers,
                                                  const RoundSchedule& schedule, Verifier* verifier) {
  return std::make_unique<HostCopyEngine>(parameters, buffers, schedule, verifier);
}

std::unique_ptr<CopyEngine> make_copy_engine(int rank, const ParameterMemory& parameters, const TransferBuffers& buffers,
                                             const RoundSchedule& schedule, Verifier* verifier) {
  if (parameters.memory == MemoryKind::kCuda) return make_device_copy_engine(rank, parameters, buffers, schedule);
  return make_host_copy_engine(parameters, buffers, schedule, verifier);
}

}  // namespace wb::exec
