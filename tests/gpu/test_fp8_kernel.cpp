// The FP8 quantize kernels (exec/fp8_kernel_launch.hpp) on the device against the host's reference
// (tests/support/fp8_kernel_case.hpp; the kernels' per-thread source runs on the host in
// tests/unit/test_fp8_kernel_body.cpp), the three scale rules: every code and scale bit for bit. Skipped
// without a usable CUDA device (built and compiled everywhere CUDA is).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "../support/fp8_kernel_case.hpp"
#include "core/device.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "exec/fp8_kernel_launch.hpp"
#endif

namespace wb {
namespace {

#ifdef WB_HAVE_CUDA

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&data_, std::max<std::size_t>(bytes, 1)), cudaSuccess); }
  ~DeviceMemory() { cudaFree(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
};

template <typename T>
void to_device(void* device, const std::vector<T>& host) {
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

template <typename T>
std::vector<T> from_device(const void* device, std::size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

class Fp8KernelDevice : public ::testing::TestWithParam<fp8::ScaleRule> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  }
};

TEST_P(Fp8KernelDevice, EveryCodeAndScaleEqualsTheHostReference) {
  const testing_support::Fp8KernelCase c(GetParam());
  const auto blocks = static_cast<std::size_t>(c.blocks);
  DeviceMemory top_d(c.top.size() * 2), bottom_d(c.bottom_t.size() * 2), top_codes(c.top.size()), bottom_codes(c.bottom_t.size());
  DeviceMemory amax(blocks * 4), scales(blocks * 4), factors(blocks * 4);
  to_device(top_d.as<void>(), c.top);
  to_device(bottom_d.as<void>(), c.bottom_t);
  ASSERT_EQ(cudaMemset(amax.as<void>(), 0, blocks * 4), cudaSuccess);
  const std::vector<exec::Fp8CopyItem> items = c.items(top_d.as<std::uint16_t>(), top_codes.as<std::uint8_t>(), bottom_d.as<std::uint16_t>(),
                                                       bottom_codes.as<std::uint8_t>(), amax.as<std::uint32_t>(), factors.as<float>());
  DeviceMemory items_d(items.size() * sizeof(exec::Fp8CopyItem));
  to_device(items_d.as<void>(), items);
  const auto* device_items = items_d.as<const exec::Fp8CopyItem>();
  ASSERT_TRUE(exec::launch_fp8_amax(device_items, 2, nullptr).is_ok());
  ASSERT_TRUE(exec::launch_fp8_scales(amax.as<std::uint32_t>(), scales.as<float>(), factors.as<float>(), c.blocks, c.config.rule, nullptr).is_ok());
  ASSERT_TRUE(exec::launch_fp8_cast(device_items, 2, c.config.rule, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got_scales = from_device<float>(scales.as<void>(), blocks);
  for (std::size_t b = 0; b < blocks; ++b)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got_scales[b]), std::bit_cast<std::uint32_t>(c.want_scales[b]))
        << "scale of block " << b << ": " << got_scales[b] << " vs " << c.want_scales[b];
  const std::vector<std::uint8_t> got_top = from_device<std::uint8_t>(top_codes.as<void>(), c.top.size());
  const std::vector<std::uint8_t> got_bottom = from_device<std::uint8_t>(bottom_codes.as<void>(), c.bottom_t.size());
  for (std::int64_t r = 0; r < c.kRows; ++r)
    for (std::int64_t col = 0; col < c.kCols; ++col)
      ASSERT_EQ(c.code_at(got_top, got_bottom, r, col), c.want_codes[c.index(r, col)]) << "code of element (" << r << ", " << col << ")";
}

INSTANTIATE_TEST_SUITE_P(Rules, Fp8KernelDevice,
                         ::testing::Values(fp8::ScaleRule::kPlain, fp8::ScaleRule::kPerBlockCast, fp8::ScaleRule::kUe8m0),
                         [](const ::testing::TestParamInfo<fp8::ScaleRule>& info) { return testing_support::scale_rule_test_name(info.param); });

#endif  // WB_HAVE_CUDA

}  // namespace
}  // namespace wb
