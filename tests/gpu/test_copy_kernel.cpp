// The CUDA copy kernel (kernels/copy_work_kernel.cu through exec/device_copy_program.hpp) on a device: the
// descriptors of random and named copy lists (tests/support/copy_lists.hpp) run on device memory must give
// the element-by-element definition's bytes, bit for bit, in any pipeline slot, in one kernel launch.
// tests/unit/test_copy_work.cpp checks the same descriptors without a device. Tests that launch the kernel
// skip with the reason when no CUDA device is usable.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "weightbridge/status.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../support/copy_lists.hpp"
#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "exec/device_copy_program.hpp"
#endif

namespace wb {
namespace {

#ifdef WB_HAVE_CUDA

using namespace testing_support;

class CopyKernelDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }
  cudaStream_t stream_ = nullptr;
};

// Runs the list on the device (parameters and buffer in device memory, the buffer at `slot` of two) and
// compares every parameter and buffer byte with the definition.
void expect_device_exact(const CopyList& list, CopyDirection direction, cudaStream_t stream, int slot = 0) {
  SCOPED_TRACE(list.name + " " + name_of(direction) + " slot " + std::to_string(slot));
  Memory expected(list, direction, 99);
  const Memory initial = expected;
  reference(direction, list.copies, expected.parameters, expected.buffer);

  std::vector<DeviceBuffer> parameters;
  std::vector<std::byte*> bases;
  for (const Bytes& p : initial.parameters) {
    parameters.emplace_back(std::max<std::size_t>(p.size(), 1));
    cuda_copy(parameters.back().data(), p.data(), p.size());
    bases.push_back(static_cast<std::byte*>(parameters.back().data()));
  }
  const std::size_t stride = (initial.buffer.size() + 255) / 256 * 256;
  DeviceBuffer buffer(2 * stride + 1);
  auto* first = static_cast<std::byte*>(buffer.data());
  cuda_copy(first + slot * stride, initial.buffer.data(), initial.buffer.size());

  const exec::DeviceCopyProgram device_program(
      exec::compile_copy_work(direction, list.copies, bases, list.parameter_bytes, first, list.buffer_bytes), 0, stream);
  const Status status = device_program.execute(stream, first + slot * stride);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  Memory actual = initial;
  for (std::size_t p = 0; p < actual.parameters.size(); ++p)
    cuda_copy(actual.parameters[p].data(), bases[p], actual.parameters[p].size());
  cuda_copy(actual.buffer.data(), first + slot * stride, actual.buffer.size());
  EXPECT_TRUE(same_memory(expected, actual, "device vs the definition"));
}

TEST_F(CopyKernelDevice, RandomListsMatchTheDefinition) {
  for (const CopyList& list : random_lists(40, 77))
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      expect_device_exact(list, direction, stream_);
      if (HasFailure()) return;
    }
}

TEST_F(CopyKernelDevice, NamedListsMatchTheDefinition) {
  for (const CopyList& list : named_lists())
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      expect_device_exact(list, direction, stream_);
      if (HasFailure()) return;
    }
}

TEST_F(CopyKernelDevice, AnotherSlotOfTheBuffer) {
  for (const CopyList& list : named_lists())
    for (CopyDirection direction : {CopyDirection::kPack, CopyDirection::kAssemble}) {
      expect_device_exact(list, direction, stream_, 1);
      if (HasFailure()) return;
    }
}

TEST_F(CopyKernelDevice, OneKernelPerExecution) {
  // Captured into a graph, one execution of a program with runs and tiles is one kernel node.
  const CopyList list = from_tensors("capture", {tensor({300, 77}, {1, 0}, 2), tensor({50000}, {0}, 1)}, 4, 1.0, 3, 8);
  std::vector<DeviceBuffer> parameters;
  std::vector<std::byte*> bases;
  for (std::int64_t b : list.parameter_bytes) {
    parameters.emplace_back(static_cast<std::size_t>(b));
    bases.push_back(static_cast<std::byte*>(parameters.back().data()));
  }
  DeviceBuffer buffer(static_cast<std::size_t>(list.buffer_bytes));
  const exec::DeviceCopyProgram program(
      exec::compile_copy_work(CopyDirection::kPack, list.copies, bases, list.parameter_bytes,
                              static_cast<std::byte*>(buffer.data()), list.buffer_bytes),
      0, stream_);
  ASSERT_TRUE(program.work().has_transposes);
  ASSERT_GT(program.stats().run_items, 0);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status status = program.execute(stream_);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  std::size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 1u);
  if (nodes == 1) {
    cudaGraphNode_t node = nullptr;
    ASSERT_EQ(cudaGraphGetNodes(graph, &node, &nodes), cudaSuccess);
    cudaGraphNodeType type{};
    ASSERT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    EXPECT_EQ(type, cudaGraphNodeTypeKernel);
  }
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_F(CopyKernelDevice, ALaunchErrorIsTheLaunchsOwn) {
  // A stale error of an unrelated call (a failed allocation) must not be reported as the launch's, nor be
  // swallowed for whoever checks next.
  void* memory = nullptr;
  ASSERT_NE(cudaMalloc(&memory, std::size_t{1} << 62), cudaSuccess);
  const CopyList list = from_tensors("stale", {tensor({5000}, {0}, 1)}, 2, 1.0, 0, 9);
  DeviceBuffer parameter(static_cast<std::size_t>(list.parameter_bytes[0])), buffer(static_cast<std::size_t>(list.buffer_bytes));
  std::vector<std::byte*> bases{static_cast<std::byte*>(parameter.data())};
  const exec::DeviceCopyProgram program(exec::compile_copy_work(CopyDirection::kPack, list.copies, bases, list.parameter_bytes,
                                                                static_cast<std::byte*>(buffer.data()), list.buffer_bytes),
                                        0, stream_);
  const Status status = program.execute(stream_);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);  // still there for its owner
}

TEST(CopyKernelNoDevice, LoadingNeedsADevice) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is available";
  const CopyList list = from_tensors("no device", {tensor({1000}, {0}, 1)}, 1, 1.0, 0, 1);
  Memory memory(list, CopyDirection::kPack, 1);
  std::vector<std::byte*> parameters = addresses(memory.parameters);
  const exec::CopyWork work = exec::compile_copy_work(CopyDirection::kPack, list.copies, parameters, list.parameter_bytes,
                                                      memory.buffer.data(), list.buffer_bytes);
  try {
    exec::DeviceCopyProgram program(work, 0);
    FAIL() << "loaded a program without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find(cuda_unavailable_reason()), std::string::npos) << e.what();
  }
  // An empty program needs no device and launches nothing.
  exec::DeviceCopyProgram empty(exec::CopyWork{}, 0);
  EXPECT_TRUE(empty.empty());
  EXPECT_TRUE(empty.execute(nullptr).is_ok());
}

TEST(CudaErrors, AFaultingKernelLosesTheContextOtherErrorsDoNot) {
  for (const cudaError_t sticky : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
                                   cudaErrorIllegalInstruction, cudaErrorHardwareStackError, cudaErrorAssert})
    EXPECT_TRUE(cuda_error_is_sticky(sticky)) << cudaGetErrorName(sticky);
  for (const cudaError_t ordinary : {cudaSuccess, cudaErrorNotReady, cudaErrorMemoryAllocation, cudaErrorInvalidValue,
                                     cudaErrorNoDevice, cudaErrorInvalidDevice, cudaErrorLaunchOutOfResources})
    EXPECT_FALSE(cuda_error_is_sticky(ordinary)) << cudaGetErrorName(ordinary);
}

TEST(CudaErrors, OneTextForEveryCheck) {
  EXPECT_EQ(detail::cuda_error_string(cudaErrorNoDevice),
            std::string("cudaErrorNoDevice: ") + cudaGetErrorString(cudaErrorNoDevice));
}

#else  // !WB_HAVE_CUDA

TEST(CopyKernel, NeedsCuda) { GTEST_SKIP() << cuda_unavailable_reason(); }

#endif

}  // namespace
}  // namespace wb
