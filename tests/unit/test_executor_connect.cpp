// Device-free and MPI-free parts of the round executor's connect phase: the connect record in its byte
// codec form (exec/connect_handshake.hpp), and the check of CUDA parameter pointers through a seam for
// the runtime's pointer query (exec/parameter_check.hpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/byte_codec.hpp"
#include "exec/connect_handshake.hpp"
#include "exec/parameter_check.hpp"
#include "exec/round_executor.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using ::testing::HasSubstr;

exec::ConnectRecord sample_record() {
  exec::ConnectRecord record;
  record.transport = TransportKind::kCudaIpc;
  record.receive_slot_stride = (std::int64_t{3} << 30) + 256;
  record.endpoint = {std::byte{1}, std::byte{2}, std::byte{3}};
  record.receive_key = std::vector<std::byte>(300, std::byte{0x5A});
  record.splits = {{0, 0, 2}, {7, 2, 1u << 20}};
  return record;
}

std::string decode_error(const std::vector<std::byte>& bytes, int rounds) {
  try {
    exec::decode_connect_record(bytes, 3, rounds);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptData) << e.what();
    return e.status().message();
  }
  ADD_FAILURE() << "decoded";
  return {};
}

TEST(ExecutorConnect, RecordsRoundTripThroughTheByteCodec) {
  const exec::ConnectRecord record = sample_record();
  EXPECT_EQ(exec::decode_connect_record(exec::encode_connect_record(record), 3, 8), record);
  EXPECT_EQ(exec::decode_connect_record(exec::encode_connect_record(exec::ConnectRecord{}), 3, 0), exec::ConnectRecord{});
}

TEST(ExecutorConnect, MalformedRecordsNameThePeer) {
  std::vector<std::byte> bytes = exec::encode_connect_record(sample_record());
  // Truncated anywhere.
  for (std::size_t keep = 0; keep < bytes.size(); keep += 7)
    EXPECT_THAT(decode_error(std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)), 8),
                HasSubstr("from rank 3"));
  // Trailing bytes.
  std::vector<std::byte> longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THAT(decode_error(longer, 8), HasSubstr("trailing"));
  // Not a record.
  EXPECT_THAT(decode_error(std::vector<std::byte>(16, std::byte{0}), 8), HasSubstr("not an executor connect record"));
  // A split batch outside the rounds, or in one post.
  EXPECT_THAT(decode_error(bytes, 7), HasSubstr("rank 3 announced a split batch for round 7"));
  exec::ConnectRecord one_post = sample_record();
  one_post.splits = {{1, 1, 1}};
  EXPECT_THAT(decode_error(exec::encode_connect_record(one_post), 8), HasSubstr("in 1 posts"));
  // A length near 2^64 (position + length would wrap around): one error, no read past the end.
  codec::ByteWriter huge;
  huge.varint(0x57425843);  // the magic, version 1, cma, a stride of 64
  huge.varint(1);
  huge.varint(0);
  huge.varint(64);
  huge.varint(~std::uint64_t{0} - 7);
  EXPECT_THAT(decode_error(huge.take(), 8), HasSubstr("from rank 3"));
}

// A runtime that knows two allocations of cuda:1 (0x10000, 4 KiB, and 0x20000, 64 KiB), pinned host memory
// at 0x90000 and managed memory of cuda:0 at 0xA0000.
CudaPointerInfo fake_query(const void* address) {
  const auto a = reinterpret_cast<std::uint64_t>(address);
  CudaPointerInfo info;
  if (a >= 0x10000 && a < 0x11000) return {CudaPointerInfo::Kind::kDevice, 1, 0x10000, 0x1000};
  if (a >= 0x20000 && a < 0x30000) return {CudaPointerInfo::Kind::kDevice, 1, 0x20000, 0x10000};
  if (a >= 0x90000 && a < 0x91000) return {CudaPointerInfo::Kind::kHost, 0, 0, 0};
  if (a >= 0xA0000 && a < 0xA1000) return {CudaPointerInfo::Kind::kManaged, 0, 0, 0};
  return info;
}

std::string check_error(std::vector<std::uintptr_t> addresses, std::vector<std::size_t> bytes) {
  ParameterMemory memory;
  for (std::uintptr_t a : addresses) memory.data.push_back(reinterpret_cast<std::byte*>(a));
  memory.bytes = std::move(bytes);
  memory.memory = MemoryKind::kCuda;
  memory.device = 1;
  try {
    exec::check_device_parameters(5, memory, fake_query);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.status().message();
  }
  return {};
}

TEST(ExecutorConnect, CudaParametersMustBeDeviceMemoryOfTheirDeviceInsideOneAllocation) {
  // Whole allocations, pieces of one, and empty parameters anywhere are fine.
  EXPECT_EQ(check_error({0x10000, 0x20000, 0x20100, 0x1}, {0x1000, 0x100, 0xFF00, 0}), "");
  EXPECT_THAT(check_error({0x10000, 0x90000}, {16, 16}),
              HasSubstr("rank 5: parameter 1 (16 bytes at 0x90000) is pinned host memory, not device memory of cuda:1"));
  EXPECT_THAT(check_error({0xA0000}, {16}), HasSubstr("is managed memory"));
  EXPECT_THAT(check_error({0x50000}, {16}), HasSubstr("is unregistered host memory"));
  EXPECT_THAT(check_error({0x0}, {16}), HasSubstr("has no address"));
  EXPECT_THAT(check_error({0x10800}, {0x1000}),
              HasSubstr("parameter 0 (4096 bytes at 0x10800) runs past the end of its allocation (4096 bytes at 0x10000)"));
  ParameterMemory other_device;
  other_device.data = {reinterpret_cast<std::byte*>(0x10000)};
  other_device.bytes = {16};
  other_device.device = 0;
  try {
    exec::check_device_parameters(5, other_device, fake_query);
    ADD_FAILURE() << "accepted memory of cuda:1 as cuda:0";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("is device memory of cuda:1, not of cuda:0"));
  }
  EXPECT_THAT(check_error({0x10000, 0x20000}, {16}), HasSubstr("2 parameter addresses for 1 sizes"));
}

// --- which memory and transport each pair uses (mixed worlds) ----------------------------------------------

// As the executor gathers them: a rank keeps device buffers when its parameters are on the device and the
// NIC of its pairs to other machines (if any) registers device memory.
exec::RankPlaces places_of(std::vector<std::string> machines, std::vector<bool> cuda, bool nic_registers_cuda = true) {
  exec::RankPlaces places;
  places.machines = std::move(machines);
  places.cuda = std::move(cuda);
  for (std::size_t r = 0; r < places.cuda.size(); ++r) {
    places.any_cuda = places.any_cuda || places.cuda[r];
    bool remote = false;
    for (const std::string& m : places.machines) remote = remote || m != places.machines[r];
    places.device_buffers.push_back(places.cuda[r] && (!remote || nic_registers_cuda));
  }
  return places;
}

TransportCapabilities capabilities_of(TransportKind kind, bool nic_registers_cuda) {
  TransportCapabilities c;
  c.host_memory = kind != TransportKind::kCudaIpc;
  c.cuda_memory = kind == TransportKind::kCudaIpc || (kind != TransportKind::kCma && nic_registers_cuda);
  c.between_machines = kind == TransportKind::kIbverbs || kind == TransportKind::kLibfabric;
  return c;
}

// Every rank of `places` talking to every other (the widest schedule): both ends of each pair choose the
// same transport, and every rank finds buffer memory all of its transports register, for every mix of host
// and CUDA parameters on up to two machines and both kinds of NIC.
void expect_consistent(const exec::RankPlaces& places, bool nic_registers_cuda, const std::string& what) {
  const int n = static_cast<int>(places.machines.size());
  for (int rank = 0; rank < n; ++rank) {
    std::vector<std::pair<TransportKind, TransportCapabilities>> used;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      const bool same = places.machines[rank] == places.machines[peer];
      const TransportKind mine = choose_transport(same, exec::pair_memory(places, rank, peer), "auto");
      if (same) {
        const TransportKind theirs = choose_transport(same, exec::pair_memory(places, peer, rank), "auto");
        EXPECT_EQ(mine, theirs) << what << ": ranks " << rank << " and " << peer;
      }
      used.emplace_back(mine, capabilities_of(mine, nic_registers_cuda));
    }
    const MemoryKind parameters = places.cuda[rank] ? MemoryKind::kCuda : MemoryKind::kHost;
    MemoryKind buffers = MemoryKind::kHost;
    EXPECT_NO_THROW(buffers = choose_buffer_memory(parameters, used)) << what << ": rank " << rank;
    if (!places.cuda[rank]) {
      EXPECT_EQ(buffers, MemoryKind::kHost) << what << ": rank " << rank;
    }
  }
}

TEST(ExecutorConnect, PairsAgreeAndEveryRankFindsBufferMemoryInMixedWorlds) {
  // Four ranks: two per machine or all on one; every assignment of host and CUDA parameters.
  for (int machines = 1; machines <= 2; ++machines)
    for (int mask = 0; mask < 16; ++mask)
      for (bool nic_registers_cuda : {false, true}) {
        std::vector<std::string> where;
        std::vector<bool> cuda;
        for (int r = 0; r < 4; ++r) {
          where.push_back(machines == 1 || r < 2 ? "a" : "b");
          cuda.push_back(((mask >> r) & 1) != 0);
        }
        expect_consistent(places_of(where, cuda, nic_registers_cuda), nic_registers_cuda,
                          std::to_string(machines) + " machine(s), CUDA mask " + std::to_string(mask) +
                              (nic_registers_cuda ? ", NIC registers CUDA" : ", host-only NIC"));
      }
}

TEST(ExecutorConnect, CudaIpcOnlyWhereEveryRankOfTheMachineHasCudaParameters) {
  // All on the GPU: device to device.
  EXPECT_EQ(exec::pair_memory(places_of({"a", "a", "a"}, {true, true, true}), 0, 2), MemoryKind::kCuda);
  // Trainers on the GPU, rollouts on the host (and the reverse): every pair of the machine goes through host
  // memory, the GPU ranks' buffers pinned host memory.
  const exec::RankPlaces mixed = places_of({"a", "a", "a"}, {true, true, false});
  for (int r = 0; r < 3; ++r)
    for (int p = 0; p < 3; ++p)
      if (r != p) {
        EXPECT_EQ(exec::pair_memory(mixed, r, p), MemoryKind::kHost) << r << " -> " << p;
      }
  // Between machines each side registers its own memory; a host machine does not change the GPU machine.
  const exec::RankPlaces two = places_of({"a", "a", "b"}, {true, true, false});
  EXPECT_EQ(exec::pair_memory(two, 0, 1), MemoryKind::kCuda);
  EXPECT_EQ(exec::pair_memory(two, 0, 2), MemoryKind::kCuda);
  EXPECT_EQ(exec::pair_memory(two, 2, 0), MemoryKind::kHost);
  // A NIC that registers host memory only: the GPU machine's own pairs go through host memory too, so that
  // its ranks need one kind of buffer.
  const exec::RankPlaces host_nic = places_of({"a", "a", "b"}, {true, true, true}, false);
  EXPECT_EQ(exec::pair_memory(host_nic, 0, 1), MemoryKind::kHost);
}

}  // namespace
}  // namespace wb
