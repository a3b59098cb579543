// The device quantizer (exec/device_quantizer.hpp): buffers in device memory, three kernel launches per
// update on the caller's stream, the shared blocks' amaxes copied out for the exchange and back. Builds
// with CUDA only.
#include <cuda_runtime_api.h>

#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "exec/device_quantizer.hpp"
#include "exec/fp8_kernel_launch.hpp"
#include "exec/transfer_memory.hpp"

namespace wb::exec {
namespace {

class CudaDeviceQuantizer final : public DeviceQuantizer {
 public:
  CudaDeviceQuantizer(const DeviceQuantizePlan& plan, int device) : plan_(plan), device_(device) {
    for (std::int64_t bytes : plan.shadow_bytes) shadows_.push_back(allocate_device_buffer(static_cast<std::size_t>(bytes), device));
    const auto blocks = static_cast<std::size_t>(plan.blocks);
    scales_ = allocate_device_buffer(blocks * sizeof(float), device);
    factors_ = allocate_device_buffer(blocks * sizeof(float), device);
    amax_ = allocate_device_buffer(blocks * sizeof(std::uint32_t), device);
    items_ = allocate_device_buffer(plan.copies.size() * sizeof(Fp8CopyItem), device);
    shared_bits_.assign(plan.shared.size(), 0);
  }

  std::vector<std::byte*> buffers() const override {
    std::vector<std::byte*> out;
    for (const auto& shadow : shadows_) out.push_back(shadow->for_copies());
    for (const DeviceQuantizePlan::Tensor& t : plan_.tensors)
      out.push_back(scales_->for_copies() + t.first_block * static_cast<std::int64_t>(sizeof(float)));
    return out;
  }

  Status quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange, void* stream) override {
    DeviceGuard guard(device_);
    const auto cuda_stream = static_cast<cudaStream_t>(stream);
    // The items name the parameters' addresses of this update (the caller's may move between updates).
    std::vector<Fp8CopyItem> items(plan_.copies.size());
    auto* amax = reinterpret_cast<std::uint32_t*>(amax_->for_copies());
    auto* factors = reinterpret_cast<float*>(factors_->for_copies());
    for (std::size_t k = 0; k < items.size(); ++k) {
      const DeviceQuantizePlan::Copy& c = plan_.copies[k];
      const DeviceQuantizePlan::Tensor& t = plan_.tensors[c.tensor];
      Fp8CopyItem& item = items[k];
      item.source = reinterpret_cast<const std::uint16_t*>(parameters[c.parameter]);
      item.codes = reinterpret_cast<std::uint8_t*>(shadows_[c.shadow]->for_copies());
      item.amax_bits = amax + t.first_block;
      item.factors = factors + t.first_block;
      item.offset = c.offset;
      item.stride0 = c.stride0;
      item.stride1 = c.stride1;
      item.row0 = c.row0;
      item.col0 = c.col0;
      item.rows = c.rows;
      item.cols = c.cols;
      item.block_rows = plan_.block_rows;
      item.block_cols = plan_.block_cols;
      item.scale_cols = t.scale_cols;
    }
    const auto count = static_cast<std::uint32_t>(items.size());
    WB_TRY_CUDA(cudaMemcpyAsync(items_->for_copies(), items.data(), items.size() * sizeof(Fp8CopyItem),
                                cudaMemcpyHostToDevice, cuda_stream));
    WB_TRY_CUDA(cudaMemsetAsync(amax, 0, static_cast<std::size_t>(plan_.blocks) * sizeof(std::uint32_t), cuda_stream));
    const auto* device_items = reinterpret_cast<const Fp8CopyItem*>(items_->for_copies());
    WB_RETURN_IF_ERROR(launch_fp8_amax(device_items, count, stream));
    if (!plan_.shared.empty()) {  // a few bytes a block: one copy each way per shared block
      for (std::size_t i = 0; i < plan_.shared.size(); ++i)
        if (plan_.shared[i] >= 0)
          WB_TRY_CUDA(cudaMemcpyAsync(&shared_bits_[i], amax + plan_.shared[i], sizeof(std::uint32_t), cudaMemcpyDeviceToHost,
                                      cuda_stream));
      WB_TRY_CUDA(cudaStreamSynchronize(cuda_stream));
      WB_RETURN_IF_ERROR(exchange(shared_bits_));
      for (std::size_t i = 0; i < plan_.shared.size(); ++i)
        if (plan_.shared[i] >= 0)
          WB_TRY_CUDA(cudaMemcpyAsync(amax + plan_.shared[i], &shared_bits_[i], sizeof(std::uint32_t), cudaMemcpyHostToDevice,
                                      cuda_stream));
    }
    WB_RETURN_IF_ERROR(launch_fp8_scales(amax, reinterpret_cast<float*>(scales_->for_copies()), factors, plan_.blocks,
                                         plan_.rule, stream));
    WB_RETURN_IF_ERROR(launch_fp8_cast(device_items, count, plan_.rule, stream));
    WB_TRY_CUDA(cudaStreamSynchronize(cuda_stream));  // `items` and the shared bits are host memory of this call
    return Status::ok();
  }

 private:
  DeviceQuantizePlan plan_;
  int device_ = 0;
  std::vector<std::unique_ptr<BufferMemory>> shadows_;
  std::unique_ptr<BufferMemory> scales_, factors_, amax_, items_;
  std::vector<std::uint32_t> shared_bits_;
};

}  // namespace

std::unique_ptr<DeviceQuantizer> make_device_quantizer(const DeviceQuantizePlan& plan, int device) {
  return std::make_unique<CudaDeviceQuantizer>(plan, device);
}

}  // namespace wb::exec
