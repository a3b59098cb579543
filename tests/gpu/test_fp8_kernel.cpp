// The FP8 quantize kernels (exec/fp8_kernel_launch.hpp) against the host's reference (layout::quantize_band):
// a bf16 tensor of several 128 x 128 blocks with edge blocks, random values of every magnitude, an all-zero
// block, subnormal, huge and NaN blocks, held in two device parameters (rows cut at 200, inside a block, and
// the second stored transposed), the three scale rules: every code and scale bit for bit. Skipped without a
// usable CUDA device (built and compiled everywhere CUDA is).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/device.hpp"
#include "layout/fp8_form.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "exec/fp8_kernel_launch.hpp"
#endif

namespace wb {
namespace fp8 {
// What gtest prints of a rule (and ctest's discovered names carry): its name.
inline void PrintTo(ScaleRule rule, std::ostream* out) { *out << scale_rule_name(rule); }
}  // namespace fp8
namespace {

#ifdef WB_HAVE_CUDA

constexpr std::int64_t kRows = 300, kCols = 520, kCut = 200;

std::uint16_t bf16_bits(float x) { return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(x) >> 16); }

std::vector<std::uint16_t> make_values() {
  std::mt19937 random(32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 12);
  std::vector<std::uint16_t> v(static_cast<std::size_t>(kRows * kCols));
  for (std::uint16_t& x : v) x = bf16_bits(std::ldexp(normal(random), exponent(random) / 4));
  const auto fill = [&](std::int64_t r0, std::int64_t c0, const auto& value) {
    for (std::int64_t r = r0; r < std::min(r0 + 128, kRows); ++r)
      for (std::int64_t c = c0; c < std::min(c0 + 128, kCols); ++c) v[static_cast<std::size_t>(r * kCols + c)] = value(r, c);
  };
  fill(128, 128, [](std::int64_t, std::int64_t) { return std::uint16_t{0}; });                        // all zero
  fill(0, 256, [](std::int64_t r, std::int64_t c) { return static_cast<std::uint16_t>((r * 7 + c) % 128); });  // subnormal
  fill(256, 384, [](std::int64_t r, std::int64_t) { return bf16_bits(r % 2 ? 3.0e38f : -1.0e30f); });  // huge, edge block
  v[150 * kCols + 3] = 0x7FC0;  // NaN in block (1, 0), which the cut at 200 splits
  return v;
}

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
  layout::QuantizationConfig config;
  config.rule = GetParam();
  const std::vector<std::uint16_t> values = make_values();
  const Shape scales_shape = layout::scale_shape({kRows, kCols}, config);
  const std::int64_t blocks = scales_shape[0] * scales_shape[1];
  // The reference: the form of the whole tensor, band by band.
  std::vector<std::uint8_t> want_codes(values.size());
  std::vector<float> want_scales(static_cast<std::size_t>(blocks));
  for (std::int64_t r = 0; r < kRows; r += 128)
    layout::quantize_band(config, DType::kBF16, values.data() + r * kCols, std::min<std::int64_t>(128, kRows - r), kCols,
                          want_codes.data() + r * kCols, want_scales.data() + r / 128 * scales_shape[1]);
  // Two device parameters: rows [0, 200) as they are, rows [200, 300) transposed ([cols, 100]).
  std::vector<std::uint16_t> top(values.begin(), values.begin() + kCut * kCols), bottom_t(static_cast<std::size_t>((kRows - kCut) * kCols));
  for (std::int64_t r = kCut; r < kRows; ++r)
    for (std::int64_t c = 0; c < kCols; ++c)
      bottom_t[static_cast<std::size_t>(c * (kRows - kCut) + (r - kCut))] = values[static_cast<std::size_t>(r * kCols + c)];
  DeviceMemory top_d(top.size() * 2), bottom_d(bottom_t.size() * 2), top_codes(top.size()), bottom_codes(bottom_t.size());
  DeviceMemory amax(static_cast<std::size_t>(blocks) * 4), scales(static_cast<std::size_t>(blocks) * 4),
      factors(static_cast<std::size_t>(blocks) * 4);
  to_device(top_d.as<void>(), top);
  to_device(bottom_d.as<void>(), bottom_t);
  ASSERT_EQ(cudaMemset(amax.as<void>(), 0, static_cast<std::size_t>(blocks) * 4), cudaSuccess);
  std::vector<exec::Fp8CopyItem> items(2);
  for (exec::Fp8CopyItem& item : items) {
    item.amax_bits = amax.as<std::uint32_t>();
    item.factors = factors.as<float>();
    item.cols = kCols;
    item.scale_cols = scales_shape[1];
  }
  items[0].source = top_d.as<std::uint16_t>();
  items[0].codes = top_codes.as<std::uint8_t>();
  items[0].rows = kCut;
  items[0].stride0 = kCols;
  items[1].source = bottom_d.as<std::uint16_t>();
  items[1].codes = bottom_codes.as<std::uint8_t>();
  items[1].row0 = kCut;
  items[1].rows = kRows - kCut;
  items[1].stride0 = 1;
  items[1].stride1 = kRows - kCut;
  DeviceMemory items_d(items.size() * sizeof(exec::Fp8CopyItem));
  to_device(items_d.as<void>(), items);
  const auto* device_items = items_d.as<const exec::Fp8CopyItem>();
  ASSERT_TRUE(exec::launch_fp8_amax(device_items, 2, nullptr).is_ok());
  ASSERT_TRUE(exec::launch_fp8_scales(amax.as<std::uint32_t>(), scales.as<float>(), factors.as<float>(), blocks, config.rule, nullptr).is_ok());
  ASSERT_TRUE(exec::launch_fp8_cast(device_items, 2, config.rule, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got_scales = from_device<float>(scales.as<void>(), want_scales.size());
  for (std::int64_t b = 0; b < blocks; ++b)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got_scales[static_cast<std::size_t>(b)]),
              std::bit_cast<std::uint32_t>(want_scales[static_cast<std::size_t>(b)]))
        << "scale of block " << b << ": " << got_scales[static_cast<std::size_t>(b)] << " vs " << want_scales[static_cast<std::size_t>(b)];
  const std::vector<std::uint8_t> got_top = from_device<std::uint8_t>(top_codes.as<void>(), top.size());
  const std::vector<std::uint8_t> got_bottom = from_device<std::uint8_t>(bottom_codes.as<void>(), bottom_t.size());
  for (std::int64_t r = 0; r < kRows; ++r)
    for (std::int64_t c = 0; c < kCols; ++c) {
      const std::uint8_t got = r < kCut ? got_top[static_cast<std::size_t>(r * kCols + c)]
                                        : got_bottom[static_cast<std::size_t>(c * (kRows - kCut) + (r - kCut))];
      ASSERT_EQ(got, want_codes[static_cast<std::size_t>(r * kCols + c)]) << "code of element (" << r << ", " << c << ")";
    }
}

INSTANTIATE_TEST_SUITE_P(Rules, Fp8KernelDevice,
                         ::testing::Values(fp8::ScaleRule::kPlain, fp8::ScaleRule::kPerBlockCast, fp8::ScaleRule::kUe8m0),
                         [](const ::testing::TestParamInfo<fp8::ScaleRule>& info) {
                           std::string name(fp8::scale_rule_name(info.param));
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

#endif  // WB_HAVE_CUDA

}  // namespace
}  // namespace wb
