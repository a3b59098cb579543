// Builds without CUDA: the executor's CUDA parts refuse, naming why (the executor itself refuses CUDA
// parameters before it gets here; these keep the library whole).
#include "exec/copy_engine.hpp"
#include "exec/device_quantizer.hpp"
#include "exec/transfer_memory.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(ErrorCode::kUnsupported, std::string(what) + ": built without CUDA");
}
}  // namespace

std::unique_ptr<BufferMemory> allocate_pinned_buffer(std::size_t, int) { no_cuda("pinned transfer buffers"); }
std::unique_ptr<BufferMemory> allocate_device_buffer(std::size_t, int) { no_cuda("device transfer buffers"); }
std::unique_ptr<CopyEngine> make_device_copy_engine(int, const ParameterMemory&, const TransferBuffers&,
                                                    const RoundSchedule&) {
  no_cuda("pack and assemble of CUDA parameters");
}

std::unique_ptr<DeviceQuantizer> make_device_quantizer(const DeviceQuantizePlan&, int) {
  no_cuda("the FP8 quantizing pack of CUDA parameters");
}

}  // namespace wb::exec
