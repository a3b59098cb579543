// The round executor with parameters in CUDA memory, under MPI on one machine (the ranks share the
// machine's GPUs): every rank probes its emulated worker on host memory, rank 0 plans and scatters the
// round schedules, and then the parameters live on the device. Each update moves a new checkpoint
// version from the trainers' device parameters into every rollout's, which must equal the rollout's own
// load_weights of that version bit for bit. Twice: with the transport chosen automatically (cuda_ipc,
// buffers in device memory) and with cma (buffers in pinned host memory that the kernels reach mapped).
//
// Without a device the transfers skip on every rank with the reason; the choice of buffer memory and the
// refusal of CUDA parameters without a device run everywhere.
#include <gtest/gtest.h>
#include <mpi.h>

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../support/executor_rank.hpp"
#include "../support/setting_scope.hpp"
#include "core/device.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "exec/round_executor.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/plan.hpp"

namespace wb::emu {
namespace {

TransportCapabilities capabilities(bool host, bool cuda) {
  TransportCapabilities c;
  c.host_memory = host;
  c.cuda_memory = cuda;
  c.max_writes_per_batch = 1;
  return c;
}

TEST(ExecutorBuffers, DeviceMemoryWhenEveryTransportRegistersIt) {
  using Entry = std::pair<TransportKind, TransportCapabilities>;
  const Entry cuda_ipc{TransportKind::kCudaIpc, capabilities(false, true)};
  const Entry ibverbs{TransportKind::kIbverbs, capabilities(true, true)};
  const Entry cma{TransportKind::kCma, capabilities(true, false)};
  EXPECT_EQ(choose_buffer_memory(MemoryKind::kCuda, std::vector<Entry>{cuda_ipc, ibverbs}), MemoryKind::kCuda);
  EXPECT_EQ(choose_buffer_memory(MemoryKind::kCuda, std::vector<Entry>{}), MemoryKind::kCuda);
  // One transport that registers host memory only: pinned host buffers, mapped into the device.
  EXPECT_EQ(choose_buffer_memory(MemoryKind::kCuda, std::vector<Entry>{ibverbs, cma}), MemoryKind::kHost);
  // Host parameters keep host buffers, whatever the transports.
  EXPECT_EQ(choose_buffer_memory(MemoryKind::kHost, std::vector<Entry>{cuda_ipc, ibverbs}), MemoryKind::kHost);
  // Nothing both can register.
  try {
    choose_buffer_memory(MemoryKind::kCuda, std::vector<Entry>{cuda_ipc, cma});
    FAIL() << "chose a memory neither transport registers";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("cuda_ipc (registers CUDA memory), cma (registers host memory)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ExecutorBuffers, CudaParametersWithoutADeviceAreRefused) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a device is available";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  RoundSchedule schedule;
  schedule.rank = rank;
  ParameterMemory memory;
  memory.memory = MemoryKind::kCuda;
  try {
    RoundExecutor executor(schedule, memory, MPI_COMM_WORLD);
    FAIL() << "constructed an executor for CUDA parameters without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find(cuda_unavailable_reason()), std::string::npos) << e.what();
  }
}

TEST(ExecutorBuffers, HostParametersHaveNoDeviceWorkToOrder) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  RoundSchedule schedule;
  schedule.rank = rank;
  RoundExecutor executor(schedule, ParameterMemory{}, MPI_COMM_WORLD);
  EXPECT_EQ(executor.completion_event(), nullptr);
  int event = 0;  // any address: refused before it is used
  const Status status = executor.run_update(DeviceOrdering{&event, nullptr});
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument) << status.to_string();
  EXPECT_TRUE(executor.run_update().is_ok());
}

struct Case {
  std::string name, model, trainer, rollout;
  int gpus_per_node;
  std::int64_t buffer_bytes;
  std::string transport;       // the WB_TRANSPORT setting
  MemoryKind buffers;          // where the transfer buffers must end up
};

class ExecutorOnGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ExecutorOnGpu, EveryUpdateIsBitExact) {
  if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Case& c = GetParam();
  wb::testing::SettingScope settings;
  settings.set("transport", c.transport);
  // connect: probe on host memory, all-gather, plan on rank 0, scatter.
  testing_support::ExecutorRank r =
      testing_support::executor_rank({c.model, 2, c.trainer, c.rollout, c.gpus_per_node}, c.buffer_bytes, MPI_COMM_WORLD);

  // The parameters on the device; rollouts start from a fill pattern that only padding keeps.
  const int device = rank % cuda_device_count();
  std::vector<DeviceBuffer> on_device;
  ParameterMemory memory;
  memory.memory = MemoryKind::kCuda;
  memory.device = device;
  for (const Parameter& p : r.host.parameters()) {
    std::memset(p.view.data, 0xEE, p.view.nbytes());
    on_device.emplace_back(std::max<std::size_t>(p.view.nbytes(), 1), device);
    cuda_copy(on_device.back().data(), p.view.data, p.view.nbytes());
    memory.data.push_back(static_cast<std::byte*>(on_device.back().data()));
    memory.bytes.push_back(p.view.nbytes());
  }
  ExecutorOptions options;
  options.timeout_seconds = 60;
  RoundExecutor executor(std::move(r.schedule), memory, MPI_COMM_WORLD, options);
  EXPECT_EQ(executor.stats().buffer_memory, c.buffers);
  const std::int64_t registrations = executor.stats().registrations;

#ifdef WB_HAVE_CUDA
  // The trainer's own work on its parameters, on a stream of its own: the update waits for it on the
  // device (an event on odd versions, the stream itself on even ones), and the caller waits for the
  // update's completion event, without synchronizing the device.
  cudaStream_t user = nullptr;
  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  ASSERT_NE(executor.completion_event(), nullptr);
#endif
  for (std::uint64_t version = 1; version <= 3; ++version) {
    SyntheticCheckpoint checkpoint(r.setup.tensors, 2000 + version);
    DeviceOrdering after;
    if (r.trainer) {
      r.setup.worker->load_weights(checkpoint, r.host.parameters());
#ifdef WB_HAVE_CUDA
      for (std::size_t i = 0; i < r.host.parameters().size(); ++i)
        ASSERT_EQ(cudaMemcpyAsync(memory.data[i], r.host.parameters()[i].view.data, memory.bytes[i], cudaMemcpyDefault, user),
                  cudaSuccess);
      ASSERT_EQ(cudaEventRecord(written, user), cudaSuccess);
      after = version % 2 ? DeviceOrdering{written, nullptr} : DeviceOrdering{nullptr, user};
#endif
    }
    const Status status = executor.run_update(after);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
#ifdef WB_HAVE_CUDA
    ASSERT_EQ(cudaStreamWaitEvent(user, static_cast<cudaEvent_t>(executor.completion_event()), 0), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(user), cudaSuccess);
#endif
    if (r.trainer) continue;
    HostParameters expected(r.setup.worker->parameter_infos());
    for (const Parameter& p : expected.parameters()) std::memset(p.view.data, 0xEE, p.view.nbytes());
    r.setup.worker->load_weights(checkpoint, expected.parameters());
    for (std::size_t i = 0; i < expected.parameters().size(); ++i) {
      const TensorView& want = expected.parameters()[i].view;
      std::vector<unsigned char> got(want.nbytes());
      cuda_copy(got.data(), memory.data[i], got.size());
      if (std::memcmp(got.data(), want.data, got.size()) == 0) continue;
      std::size_t at = 0, wrong = 0;
      const auto* w = static_cast<const unsigned char*>(want.data);
      for (std::size_t b = 0; b < got.size(); ++b)
        if (got[b] != w[b]) at = wrong++ == 0 ? b : at;
      FAIL() << "rank " << rank << " version " << version << ": " << expected.parameters()[i].name << " differs in "
             << wrong << " of " << got.size() << " bytes, first at byte " << at;
    }
  }
#ifdef WB_HAVE_CUDA
  EXPECT_EQ(cudaEventDestroy(written), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(user), cudaSuccess);
#endif
  EXPECT_EQ(executor.stats().registrations, registrations) << "an update registered memory";
  EXPECT_EQ(executor.stats().updates, 3);
  if (r.trainer) {
    EXPECT_GT(executor.stats().bytes_written, 0);
    EXPECT_GT(executor.stats().pack_seconds, 0) << "no pack kernel ran";
  } else {
    EXPECT_GT(executor.stats().bytes_assembled, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExecutorOnGpu,
    ::testing::Values(
        // MoE with GQA over two rollout nodes (external exchange), buffers in device memory (cuda_ipc).
        Case{"qwen3_moe_device_buffers", "qwen3-30b-a3b", "tp=2", "engines=2,tp=2", 2, 96 << 10, "auto", MemoryKind::kCuda},
        // MLA with transposed experts on the rollouts: tiles in the assemble.
        Case{"mla_device_buffers", "moonlight-16b-a3b", "tp=2", "engines=2,tp=2,ep=2,transpose=experts", 2, 128 << 10,
             "auto", MemoryKind::kCuda},
        // The same over cma: pinned host buffers the kernels read and write through the mapping.
        Case{"qwen3_moe_pinned_buffers", "qwen3-30b-a3b", "tp=2", "engines=2,tp=2", 2, 96 << 10, "cma", MemoryKind::kHost},
        Case{"mla_pinned_buffers", "moonlight-16b-a3b", "tp=2", "engines=2,tp=2,ep=2,transpose=experts", 2, 128 << 10,
             "cma", MemoryKind::kHost}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace wb::emu
