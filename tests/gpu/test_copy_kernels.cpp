// The CUDA copy kernels (kernels/copy_kernels.hpp) against the host copy wb::copy_tensor, the
// reference. Tests that launch kernels skip with the reason when no CUDA device is usable; argument
// checking, planning and the device query need no device and run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/device.hpp"
#include "weightbridge/dtype.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/copy_kernels.hpp"
#endif

namespace wb {
namespace {

TEST(CudaDevice, UnavailableReasonExplainsZeroCount) {
  const int count = cuda_device_count();
  const std::string& reason = cuda_unavailable_reason();
  ASSERT_GE(count, 0);
  if (count > 0) {
    EXPECT_TRUE(reason.empty()) << reason;
    return;
  }
  EXPECT_FALSE(reason.empty());
#ifdef WB_HAVE_CUDA
  // "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is detected"
  EXPECT_EQ(reason.rfind("cudaGetDeviceCount: cuda", 0), 0u) << reason;
#else
  EXPECT_EQ(reason, "built without CUDA");
#endif
  EXPECT_EQ(cuda_device_count(), count) << "queried once, answered the same";
}

TEST(CudaDevice, BufferWithoutDeviceThrows) {
  DeviceBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is available";
  try {
    DeviceBuffer buffer(64);
    FAIL() << "allocated device memory without a device";
  } catch (const Error& e) {
#ifdef WB_HAVE_CUDA
    EXPECT_EQ(e.code(), ErrorCode::kCuda) << e.what();
#else
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
#endif
  }
}

#ifdef WB_HAVE_CUDA

using kernels::CopyPlan;

// Views are built on a fake, well-aligned base address and rebased onto real buffers: the view
// arithmetic of TensorView (box, permute, transpose) never dereferences.
constexpr std::uintptr_t kFakeBase = std::uintptr_t{1} << 20;

struct ViewSpec {
  TensorView view;  // relative to kFakeBase
  std::int64_t extra_bytes = 0;  // added to the data pointer: misaligns the view on purpose

  std::int64_t offset_bytes() const {
    return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(view.data) - kFakeBase) + extra_bytes;
  }
  // Bytes of a buffer that holds every element of the view.
  std::size_t footprint() const {
    std::int64_t last = 0;
    for (std::size_t a = 0; a < view.shape.size(); ++a) last += (view.shape[a] - 1) * view.strides[a];
    return static_cast<std::size_t>(offset_bytes() + (last + 1) * static_cast<std::int64_t>(view.element_size()));
  }
  TensorView on(void* base, MemoryKind memory) const {
    TensorView rebased = view;
    rebased.data = static_cast<std::byte*>(base) + offset_bytes();
    rebased.memory = memory;
    rebased.device = 0;
    return rebased;
  }
};

ViewSpec contiguous(DType dtype, Shape shape, std::int64_t extra_bytes = 0) {
  return {TensorView::contiguous(reinterpret_cast<void*>(kFakeBase), dtype, std::move(shape)), extra_bytes};
}

ViewSpec strided(DType dtype, Shape shape, Shape strides, std::int64_t offset_elements = 0) {
  TensorView view;
  view.data = reinterpret_cast<void*>(kFakeBase + static_cast<std::uintptr_t>(offset_elements) * dtype_size(dtype));
  view.dtype = dtype;
  view.shape = std::move(shape);
  view.strides = std::move(strides);
  return {view, 0};
}

ViewSpec box_of(DType dtype, Shape parent, Box box) { return {contiguous(dtype, std::move(parent)).view.box(box), 0}; }

ViewSpec permuted(ViewSpec spec, std::vector<int> order) {
  spec.view = spec.view.permute(order);
  return spec;
}

struct Layout {
  const char* name;
  std::function<std::pair<ViewSpec, ViewSpec>(DType)> make;  // (dst, src)
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"contiguous_odd", [](DType t) { return std::pair{contiguous(t, {37, 129}), contiguous(t, {37, 129})}; }},
      {"contiguous_large",
       [](DType t) { return std::pair{contiguous(t, {3, (1 << 20) + 7}), contiguous(t, {3, (1 << 20) + 7})}; }},
      {"single_element", [](DType t) { return std::pair{contiguous(t, {1, 1}), contiguous(t, {1, 1})}; }},
      {"row_box",
       [](DType t) { return std::pair{contiguous(t, {37, 129}), box_of(t, {50, 129}, Box{{5, 0}, {37, 129}})}; }},
      {"column_box",
       [](DType t) { return std::pair{contiguous(t, {37, 129}), box_of(t, {37, 200}, Box{{0, 13}, {37, 129}})}; }},
      {"column_box_both",
       [](DType t) {
         return std::pair{box_of(t, {41, 160}, Box{{2, 3}, {37, 129}}), box_of(t, {37, 200}, Box{{0, 13}, {37, 129}})};
       }},
      {"column_box_aligned",
       [](DType t) {
         return std::pair{box_of(t, {40, 256}, Box{{1, 64}, {37, 128}}), box_of(t, {37, 512}, Box{{0, 128}, {37, 128}})};
       }},
      {"many_short_rows",
       [](DType t) {
         return std::pair{contiguous(t, {20011, 3}), box_of(t, {20011, 10}, Box{{0, 5}, {20011, 3}})};
       }},
      {"transposed_src",
       [](DType t) { return std::pair{contiguous(t, {37, 129}), permuted(contiguous(t, {129, 37}), {1, 0})}; }},
      {"transposed_dst",
       [](DType t) { return std::pair{permuted(contiguous(t, {129, 37}), {1, 0}), contiguous(t, {37, 129})}; }},
      {"transposed_both",
       [](DType t) {
         return std::pair{permuted(contiguous(t, {129, 37}), {1, 0}), permuted(contiguous(t, {129, 37}), {1, 0})};
       }},
      {"transposed_large",
       [](DType t) { return std::pair{contiguous(t, {1031, 1029}), permuted(contiguous(t, {1029, 1031}), {1, 0})}; }},
      {"permuted_3d",
       [](DType t) { return std::pair{contiguous(t, {11, 5, 7}), permuted(contiguous(t, {5, 7, 11}), {2, 0, 1})}; }},
      {"permuted_3d_boxes",
       [](DType t) {
         ViewSpec src = box_of(t, {6, 9, 13}, Box{{1, 2, 3}, {5, 7, 9}});
         return std::pair{box_of(t, {8, 11, 6}, Box{{1, 2, 0}, {7, 9, 5}}), permuted(src, {1, 2, 0})};
       }},
      {"strided_inner",
       [](DType t) { return std::pair{contiguous(t, {37, 129}), strided(t, {37, 129}, {259, 2}, 1)}; }},
      {"broadcast_src", [](DType t) { return std::pair{contiguous(t, {37, 129}), strided(t, {37, 129}, {0, 1})}; }},
      {"misaligned_elements",
       [](DType t) {
         return std::pair{strided(t, {37, 129}, {129, 1}, 1), strided(t, {37, 129}, {129, 1}, 3)};
       }},
      {"misaligned_bytes",
       [](DType t) { return std::pair{contiguous(t, {37, 129}, 3), contiguous(t, {37, 129}, 1)}; }},
      {"misaligned_bytes_transposed",
       [](DType t) {
         ViewSpec src = permuted(contiguous(t, {129, 37}), {1, 0});
         src.extra_bytes = 1;
         return std::pair{contiguous(t, {37, 129}, 2), src};
       }},
      {"eight_dims",
       [](DType t) {
         Shape parent{3, 4, 3, 4, 3, 4, 3, 5}, extent{2, 3, 2, 3, 2, 3, 2, 3};
         return std::pair{contiguous(t, extent), box_of(t, parent, Box{{1, 0, 1, 1, 0, 1, 1, 2}, extent})};
       }},
      {"eight_dims_reversed",
       [](DType t) {
         Shape parent{3, 4, 3, 4, 3, 4, 3, 5}, extent{2, 3, 2, 3, 2, 3, 2, 3};
         ViewSpec src = permuted(box_of(t, parent, Box{{1, 0, 1, 1, 0, 1, 1, 2}, extent}), {7, 6, 5, 4, 3, 2, 1, 0});
         return std::pair{contiguous(t, {3, 2, 3, 2, 3, 2, 3, 2}), src};
       }},
  };
  return all;
}

constexpr std::array<DType, 4> kDTypes = {DType::kU8, DType::kBF16, DType::kF32, DType::kF64};

class CopyKernels : public ::testing::TestWithParam<std::size_t> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  }
  void TearDown() override { kernels::testing::force_wide_index(false); }
};

// Copies src into dst on the device and on the host (the reference) into buffers that start out with
// the same filler, and compares the whole destination buffers: every element and every gap.
void expect_matches_host(const ViewSpec& dst, const ViewSpec& src, void* stream = nullptr) {
  const std::size_t dst_bytes = dst.footprint(), src_bytes = src.footprint();
  std::vector<unsigned char> host_src(src_bytes), expected(dst_bytes, 0xCD), actual(dst_bytes, 0);
  std::mt19937_64 random(dst_bytes * 31 + src_bytes);
  for (auto& byte : host_src) byte = static_cast<unsigned char>(random());

  DeviceBuffer device_src(src_bytes), device_dst(dst_bytes);
  cuda_copy(device_src.data(), host_src.data(), src_bytes);
  cuda_copy(device_dst.data(), expected.data(), dst_bytes);

  copy_tensor(dst.on(expected.data(), MemoryKind::kHost), src.on(host_src.data(), MemoryKind::kHost));
  const TensorView dst_view = dst.on(device_dst.data(), MemoryKind::kCuda);
  const TensorView src_view = src.on(device_src.data(), MemoryKind::kCuda);
  if (stream == nullptr) {
    const Status status = kernels::copy_tensor(dst_view, src_view);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
  } else {
    const Status status = kernels::copy_tensor_async(dst_view, src_view, stream);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
  }
  cuda_copy(actual.data(), device_dst.data(), dst_bytes);

  const auto mismatch = std::mismatch(expected.begin(), expected.end(), actual.begin());
  if (mismatch.first != expected.end()) {
    const auto at = mismatch.first - expected.begin();
    ADD_FAILURE() << "destination byte " << at << " of " << dst_bytes << " (element " << (at - dst.offset_bytes()) /
                     static_cast<std::int64_t>(dst.view.element_size()) << " from the view start): expected "
                  << int(*mismatch.first) << ", got " << int(*mismatch.second) << " (0xCD is untouched filler)";
  }
}

TEST_P(CopyKernels, MatchesHostCopy) {
  const Layout& layout = layouts()[GetParam()];
  for (bool wide : {false, true}) {
    kernels::testing::force_wide_index(wide);
    for (DType dtype : kDTypes) {
      SCOPED_TRACE(std::string(layout.name) + " " + std::string(dtype_name(dtype)) + (wide ? " wide index" : ""));
      const auto [dst, src] = layout.make(dtype);
      expect_matches_host(dst, src);
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CopyKernels, ::testing::Range<std::size_t>(0, layouts().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           return std::string(layouts()[info.param].name);
                         });

TEST(CopyKernelsDevice, AsyncOnUserStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_matches_host(contiguous(dtype, {512, 1000}), box_of(dtype, {600, 1100}, Box{{7, 9}, {512, 1000}}), stream);
    expect_matches_host(contiguous(dtype, {512, 1000}), permuted(contiguous(dtype, {1000, 512}), {1, 0}), stream);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CopyKernelsDevice, EmptyCopyLaunchesNothing) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  DeviceBuffer buffer(64);
  const TensorView view = TensorView::contiguous(buffer.data(), DType::kF32, {0, 16}, MemoryKind::kCuda);
  EXPECT_TRUE(kernels::copy_tensor(view, view).is_ok());
}

// --- argument checking and planning: host only, no device needed ---------------------------------------

TensorView fake_cuda(DType dtype, Shape shape) {
  return TensorView::contiguous(reinterpret_cast<void*>(kFakeBase), dtype, std::move(shape), MemoryKind::kCuda);
}

TensorView as_cuda(const ViewSpec& spec) { return spec.on(reinterpret_cast<void*>(kFakeBase), MemoryKind::kCuda); }

// Every entry point reports the same error, before touching a device.
void expect_rejected(const TensorView& dst, const TensorView& src, ErrorCode code, const std::string& mentions) {
  CopyPlan plan;
  const Status planned = kernels::plan_copy(dst, src, &plan);
  EXPECT_EQ(planned.code(), code) << planned.to_string();
  EXPECT_NE(planned.message().find(mentions), std::string::npos) << planned.message();
  EXPECT_EQ(kernels::copy_tensor_async(dst, src, nullptr).code(), code);
  EXPECT_EQ(kernels::copy_tensor(dst, src).code(), code);
}

TEST(CopyKernelsArguments, MismatchesAreInvalid) {
  expect_rejected(fake_cuda(DType::kF32, {4, 8}), fake_cuda(DType::kBF16, {4, 8}), ErrorCode::kInvalidArgument, "dtype");
  expect_rejected(fake_cuda(DType::kF32, {4, 8}), fake_cuda(DType::kF32, {8, 4}), ErrorCode::kInvalidArgument, "shape");
  TensorView bad_strides = fake_cuda(DType::kF32, {4, 8});
  bad_strides.strides = {8};
  expect_rejected(bad_strides, fake_cuda(DType::kF32, {4, 8}), ErrorCode::kInvalidArgument, "strides");
  TensorView null_data = fake_cuda(DType::kF32, {4, 8});
  null_data.data = nullptr;
  expect_rejected(fake_cuda(DType::kF32, {4, 8}), null_data, ErrorCode::kInvalidArgument, "null");
  TensorView overlapping = fake_cuda(DType::kF32, {4, 8});
  overlapping.strides = {0, 1};
  expect_rejected(overlapping, fake_cuda(DType::kF32, {4, 8}), ErrorCode::kInvalidArgument, "more than once");
}

TEST(CopyKernelsArguments, HostMemoryAndOtherDevicesAreUnsupported) {
  TensorView host = fake_cuda(DType::kF32, {4, 8});
  host.memory = MemoryKind::kHost;
  expect_rejected(fake_cuda(DType::kF32, {4, 8}), host, ErrorCode::kUnsupported, "CUDA memory only");
  expect_rejected(host, fake_cuda(DType::kF32, {4, 8}), ErrorCode::kUnsupported, "CUDA memory only");
  TensorView other = fake_cuda(DType::kF32, {4, 8});
  other.device = 1;
  expect_rejected(fake_cuda(DType::kF32, {4, 8}), other, ErrorCode::kUnsupported, "cuda:1");
}

TEST(CopyKernelsArguments, MoreThanEightAxesAfterCoalescingAreUnsupported) {
  const Shape parent(9, 3), extent(9, 2);
  const TensorView src = as_cuda(box_of(DType::kU8, parent, Box{Shape(9, 0), extent}));
  expect_rejected(fake_cuda(DType::kU8, extent), src, ErrorCode::kUnsupported, "9 axes");
  // The same number of axes that coalesce is fine.
  CopyPlan plan;
  ASSERT_TRUE(kernels::plan_copy(fake_cuda(DType::kU8, Shape(12, 2)), fake_cuda(DType::kU8, Shape(12, 2)), &plan).is_ok());
  EXPECT_EQ(plan.ndim, 1);
}

TEST(CopyKernelsArguments, HostCopyPointsToTheKernels) {
  std::vector<float> host(32);
  const TensorView dst = TensorView::contiguous(host.data(), DType::kF32, {4, 8});
  try {
    copy_tensor(dst, fake_cuda(DType::kF32, {4, 8}));
    FAIL() << "the host copy accepted CUDA memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("wb::kernels::copy_tensor"), std::string::npos) << e.what();
  }
}

CopyPlan plan_of(const ViewSpec& dst, const ViewSpec& src) {
  CopyPlan plan;
  const Status status = kernels::plan_copy(as_cuda(dst), as_cuda(src), &plan);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return plan;
}

TEST(CopyKernelsPlan, EmptyCopyNeedsNothing) {
  CopyPlan plan;
  ASSERT_TRUE(kernels::plan_copy(fake_cuda(DType::kF32, {0, 8}), fake_cuda(DType::kF32, {0, 8}), &plan).is_ok());
  EXPECT_EQ(plan.path, CopyPlan::Path::kNone);
  EXPECT_TRUE(kernels::copy_tensor_async(fake_cuda(DType::kF32, {0, 8}), fake_cuda(DType::kF32, {0, 8}), nullptr).is_ok());
}

TEST(CopyKernelsPlan, ContiguousIsOneRowOfWideVectors) {
  const CopyPlan plan = plan_of(contiguous(DType::kF32, {1, 37, 1, 129}), contiguous(DType::kF32, {1, 37, 1, 129}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kRows);
  EXPECT_EQ(plan.ndim, 1);
  EXPECT_EQ(plan.shape, Shape{37 * 129});
  EXPECT_EQ(plan.vector_bytes, 16);  // the odd length goes to the tail, not to narrower vectors
  EXPECT_FALSE(plan.wide_index);
}

TEST(CopyKernelsPlan, BoxesUseTheWidestAlignedVector) {
  // Rows of 129 f32 starting 13 elements in, every 200 elements: 4-byte alignment only.
  CopyPlan plan = plan_of(contiguous(DType::kF32, {37, 129}), box_of(DType::kF32, {37, 200}, Box{{0, 13}, {37, 129}}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kRows);
  EXPECT_EQ(plan.ndim, 2);
  EXPECT_EQ(plan.vector_bytes, 4);
  // bf16 rows starting 8 elements in, every 256 elements: 16-byte aligned.
  plan = plan_of(contiguous(DType::kBF16, {37, 128}), box_of(DType::kBF16, {37, 256}, Box{{0, 8}, {37, 128}}));
  EXPECT_EQ(plan.vector_bytes, 16);
  // Rows of 3 bytes: vectors no wider than a row.
  plan = plan_of(box_of(DType::kU8, {100, 8}, Box{{0, 0}, {100, 3}}), box_of(DType::kU8, {100, 16}, Box{{0, 0}, {100, 3}}));
  EXPECT_EQ(plan.vector_bytes, 2);
  // A base address off by one byte.
  plan = plan_of(contiguous(DType::kF64, {37, 129}, 1), contiguous(DType::kF64, {37, 129}));
  EXPECT_EQ(plan.vector_bytes, 1);
}

TEST(CopyKernelsPlan, TransposesCopyElementsWithStoresInDestinationOrder) {
  CopyPlan plan = plan_of(contiguous(DType::kF32, {37, 129}), permuted(contiguous(DType::kF32, {129, 37}), {1, 0}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kElements);
  EXPECT_EQ(plan.ndim, 2);
  EXPECT_EQ(plan.word_bytes, 4);
  EXPECT_EQ(plan.dst_strides, (Shape{129, 1}));
  EXPECT_EQ(plan.src_strides, (Shape{1, 37}));
  // A transposed destination is walked in its own memory order.
  plan = plan_of(permuted(contiguous(DType::kF32, {129, 37}), {1, 0}), contiguous(DType::kF32, {37, 129}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kElements);
  EXPECT_EQ(plan.dst_strides, (Shape{37, 1}));
  EXPECT_EQ(plan.src_strides, (Shape{1, 129}));
  // Both transposed the same way: one contiguous run.
  plan = plan_of(permuted(contiguous(DType::kF32, {129, 37}), {1, 0}), permuted(contiguous(DType::kF32, {129, 37}), {1, 0}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kRows);
  EXPECT_EQ(plan.ndim, 1);
  // Elements that are not element-aligned are moved in narrower words.
  ViewSpec src = permuted(contiguous(DType::kF64, {129, 37}), {1, 0});
  src.extra_bytes = 2;
  plan = plan_of(contiguous(DType::kF64, {37, 129}), src);
  EXPECT_EQ(plan.word_bytes, 2);
}

TEST(CopyKernelsPlan, IndexWidthFollowsTheCounts) {
  // 65537^2 > 2^32 elements, transposed: 64-bit index math.
  CopyPlan plan = plan_of(contiguous(DType::kU8, {65537, 65537}), permuted(contiguous(DType::kU8, {65537, 65537}), {1, 0}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kElements);
  EXPECT_TRUE(plan.wide_index);
  // 2^31 + 5 contiguous bytes are 2^27 16-byte vectors: 32 bits suffice.
  plan = plan_of(contiguous(DType::kU8, {(std::int64_t{1} << 31) + 5}), contiguous(DType::kU8, {(std::int64_t{1} << 31) + 5}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kRows);
  EXPECT_FALSE(plan.wide_index);
  // 2^31 rows of 2 bytes: 64 bits.
  plan = plan_of(contiguous(DType::kU8, {std::int64_t{1} << 31, 2}), strided(DType::kU8, {std::int64_t{1} << 31, 2}, {4, 1}));
  EXPECT_EQ(plan.path, CopyPlan::Path::kRows);
  EXPECT_TRUE(plan.wide_index);
  // 2^31 - 1 of them: 32 bits.
  plan = plan_of(contiguous(DType::kU8, {(std::int64_t{1} << 31) - 1, 2}),
                 strided(DType::kU8, {(std::int64_t{1} << 31) - 1, 2}, {4, 1}));
  EXPECT_FALSE(plan.wide_index);
  kernels::testing::force_wide_index(true);
  plan = plan_of(contiguous(DType::kF32, {4, 4}), contiguous(DType::kF32, {4, 4}));
  kernels::testing::force_wide_index(false);
  EXPECT_TRUE(plan.wide_index);
}

#else  // !WB_HAVE_CUDA

TEST(CopyKernels, NeedCuda) { GTEST_SKIP() << cuda_unavailable_reason(); }

#endif

}  // namespace
}  // namespace wb
