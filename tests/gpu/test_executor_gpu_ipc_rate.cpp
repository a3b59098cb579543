// Not a check of speed, a measurement with a check of bytes: cuda_ipc's write rate for one 256 MiB batch of
// 4 MiB writes between two ranks sharing the machine's GPUs, next to a device-to-device cudaMemcpy of the
// same bytes in the same run (rank 0 prints both; scripts/gpu-check.sh reads the line). The bytes that
// landed are compared with what was sent. Skips with the reason without a device.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

constexpr std::size_t kTotal = std::size_t{256} << 20, kWrite = std::size_t{4} << 20;
constexpr int kRepeats = 3;

std::vector<std::byte> swap_with(int peer, const std::vector<std::byte>& mine) {
  std::uint64_t n = mine.size(), theirs = 0;
  MPI_Sendrecv(&n, 1, MPI_UINT64_T, peer, 1, &theirs, 1, MPI_UINT64_T, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  std::vector<std::byte> out(theirs);
  MPI_Sendrecv(mine.data(), static_cast<int>(n), MPI_BYTE, peer, 2, out.data(), static_cast<int>(theirs), MPI_BYTE, peer, 2,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return out;
}

// Polls until `count` completions of `kind` arrived; false after 60 s.
bool wait_for(Transport& transport, Completion::Kind kind, int count) {
  std::vector<Completion> seen;
  int got = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < count && std::chrono::steady_clock::now() < until) {
    seen.clear();
    if (!transport.poll(seen).is_ok()) return false;
    got += static_cast<int>(std::count_if(seen.begin(), seen.end(), [&](const Completion& c) { return c.kind == kind; }));
  }
  return got >= count;
}

TEST(CudaIpcRate, OneBatchOf256MiBNextToDeviceCopy) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) GTEST_SKIP() << "runs on 2 ranks";
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  const int device = rank % cuda_device_count(), peer = 1 - rank;
  std::unique_ptr<Transport> transport = make_transport(TransportKind::kCudaIpc, rank);
  DeviceBuffer memory(kTotal, device);
  std::vector<std::uint8_t> host(kTotal);
  for (std::size_t i = 0; i < kTotal; ++i) host[i] = static_cast<std::uint8_t>(rank == 0 ? (i * 131 + 7) >> 3 : 0);
  cuda_copy(memory.data(), host.data(), kTotal);
  const MemoryRegistration registration = transport->register_memory(memory.data(), kTotal, MemoryKind::kCuda, device);
  const std::vector<std::byte> endpoint = swap_with(peer, transport->endpoint(peer));
  transport->connect(peer, endpoint);
  const std::vector<std::byte> key = swap_with(peer, registration.remote_key);
  const std::uint32_t remote = transport->import_memory(peer, key);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::vector<WriteRequest> writes;
    for (std::size_t at = 0; at < kTotal; at += kWrite) writes.push_back({registration.id, at, remote, at, kWrite});
    double best = 1e30;
    for (int repeat = 0; repeat <= kRepeats; ++repeat) {  // the first one warms up
      const auto start = std::chrono::steady_clock::now();
      Status status;
      do status = transport->post_writes(peer, writes, static_cast<std::uint32_t>(repeat), static_cast<std::uint64_t>(repeat));
      while (status.code() == ErrorCode::kRetryLater);
      ASSERT_TRUE(status.is_ok()) << status.to_string();
      ASSERT_TRUE(wait_for(*transport, Completion::Kind::kWritesDone, 1)) << "writes of batch " << repeat;
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (repeat > 0) best = std::min(best, seconds);
    }
    DeviceBuffer copy(kTotal, device);
    double best_copy = 1e30;
    for (int repeat = 0; repeat <= kRepeats; ++repeat) {
      const auto start = std::chrono::steady_clock::now();
      cuda_copy(copy.data(), memory.data(), kTotal);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (repeat > 0) best_copy = std::min(best_copy, seconds);
    }
    std::printf("[cuda_ipc throughput] 256 MiB as 64 writes of 4 MiB, rank 0 -> rank 1: %.2f GB/s (%.2f ms, best of %d); "
                "device-to-device cudaMemcpy, same bytes: %.2f GB/s (%.2f ms)\n",
                double(kTotal) / best / 1e9, best * 1e3, kRepeats, double(kTotal) / best_copy / 1e9, best_copy * 1e3);
    std::fflush(stdout);
  } else {
    ASSERT_TRUE(wait_for(*transport, Completion::Kind::kArrival, kRepeats + 1)) << "the measured batches";
    cuda_copy(host.data(), memory.data(), kTotal);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kTotal; ++i) wrong += host[i] != static_cast<std::uint8_t>((i * 131 + 7) >> 3);
    EXPECT_EQ(wrong, 0u) << "bytes of the measured batches that did not land";
  }
  MPI_Barrier(MPI_COMM_WORLD);  // no import outlives the peer's memory
  transport.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace wb
