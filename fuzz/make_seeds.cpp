// wb_fuzz_seeds DIR: writes the starting corpus of every fuzz target into DIR/<target>/, from the
// library's own encoders and writers, so the seeds follow the formats when they change. scripts/fuzz.sh
// runs it before fuzzing; fuzz/corpus/ holds its output (plus files from other tools) as committed.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/status_message.hpp"
#include "coord/connect_records.hpp"
#include "exec/connect_record.hpp"
#include "plan/round_schedule.hpp"
#include "transport/ibverbs/ibverbs_wire.hpp"
#include "transport/shm/mailbox.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/source_map.hpp"
#if WB_HAVE_LIBFABRIC
#include "transport/libfabric/fabric_records.hpp"
#endif

namespace fs = std::filesystem;
using namespace wb;

namespace {

fs::path g_root;

void put(const std::string& target, const std::string& name, const std::vector<std::byte>& bytes) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::vector<std::byte> text_bytes(const std::string& text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::vector<std::byte> with_selector(std::uint8_t selector, const std::vector<std::byte>& body) {
  std::vector<std::byte> out{static_cast<std::byte>(selector)};
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

/// A checkpoint written by the library's writer, as bytes.
std::vector<std::byte> written(CheckpointFormat format, const std::vector<TensorInfo>& tensors) {
  const fs::path path = g_root / (format == CheckpointFormat::kHdf5 ? "seed.h5" : "seed.safetensors");
  auto writer = create_checkpoint(path.string(), format, tensors);
  std::uint8_t value = 1;
  for (const TensorInfo& info : tensors) {
    std::vector<std::byte> bytes(info.nbytes());
    for (std::byte& b : bytes) b = static_cast<std::byte>(value += 37);
    writer->write(info.name, bytes.data());
  }
  writer->finish();
  std::vector<std::byte> out = file_bytes(path);
  fs::remove(path);
  return out;
}

SliceCopy copy(std::uint32_t tensor, std::uint32_t parameter, Box box, std::int64_t offset, Shape strides) {
  return SliceCopy{tensor, parameter, std::move(box), offset, std::move(strides)};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  g_root = argv[1];
  fs::create_directories(g_root);

  // --- safetensors files -------------------------------------------------------------------------------
  const std::vector<TensorInfo> mixed = {{"model.embed_tokens.weight", DType::kBF16, {6, 4}},
                                         {"model.layers.0.mlp.gate.e_score_correction_bias", DType::kF32, {3}},
                                         {"model.layers.0.mlp.experts.0.up_proj.weight", DType::kF8E4M3, {2, 2, 3}},
                                         {"step", DType::kI64, {}},
                                         {"empty", DType::kF16, {0, 5}}};
  put("safetensors_header", "mixed.safetensors", written(CheckpointFormat::kSafetensors, mixed));
  put("safetensors_header", "one.safetensors", written(CheckpointFormat::kSafetensors, {{"w", DType::kU8, {4}}}));
  const std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<std::byte> raw(8);
  for (int b = 0; b < 8; ++b) raw[b] = static_cast<std::byte>((header.size() >> (8 * b)) & 0xFF);
  for (const std::byte b : text_bytes(header + std::string(8, '\x11'))) raw.push_back(b);
  put("safetensors_header", "hand.safetensors", raw);

  // --- safetensors index (the target provides the shards) -----------------------------------------------
  put("safetensors_index", "two_shards.json",
      text_bytes(R"({"metadata":{"total_size":164},"weight_map":{"model.embed_tokens.weight":"model-00001-of-00002.safetensors",)"
                 R"("model.norm.weight":"model-00001-of-00002.safetensors","lm_head.weight":"model-00002-of-00002.safetensors",)"
                 R"("model.layers.0.mlp.gate.e_score_correction_bias":"model-00002-of-00002.safetensors"}})"));
  put("safetensors_index", "sub.json", text_bytes(R"({"weight_map":{"extra.weight":"sub/extra.safetensors"}})"));
  put("safetensors_index", "outside.json", text_bytes(R"({"weight_map":{"escaped":"../outside.safetensors"}})"));

  // --- HDF5 files from our writer (h5py's are committed beside them) -------------------------------------
  put("hdf5", "mixed.h5", written(CheckpointFormat::kHdf5, mixed));
  put("hdf5", "one.h5", written(CheckpointFormat::kHdf5, {{"w", DType::kF32, {4}}}));

  // --- source maps -------------------------------------------------------------------------------------
  SourceMap empty;
  put("source_map", "empty.bin", serialize_source_map(empty));
  SourceMap map;
  map.parameters = {{"embedding", DType::kBF16, {50, 16}}, {"qkv", DType::kBF16, {16, 32}},
                    {"bias", DType::kF32, {8}}, {"experts", DType::kF8E4M3, {2, 16, 8}}};
  map.copies = {copy(0, 0, {{50, 0}, {50, 16}}, 0, {16, 1}),          // a row block
                copy(2, 1, {{0, 0}, {32, 16}}, 0, {1, 32}),           // transposed
                copy(1, 2, {{0}, {8}}, 0, {1}),                       // the f32 bias
                copy(3, 3, {{0, 0, 0}, {2, 16, 8}}, 0, {128, 8, 1})};  // three axes
  put("source_map", "layouts.bin", serialize_source_map(map));
  SourceMap many;
  many.parameters = {{"rows", DType::kBF16, {64, 16}}};
  for (std::int64_t r = 0; r < 64; r += 4) many.copies.push_back(copy(0, 0, {{r, 0}, {4, 16}}, r * 16, {16, 1}));
  put("source_map", "continuing.bin", serialize_source_map(many));

  // --- round schedules -----------------------------------------------------------------------------------
  RoundSchedule none;
  put("round_schedule", "empty.bin", serialize_round_schedule(none));
  RoundSchedule trainer;
  trainer.rank = 1;
  trainer.side = Side::kTrainer;
  trainer.peers = {4, 5};
  trainer.rounds.resize(2);
  std::int64_t at = 0;
  for (std::int64_t r = 0; r < 4; ++r) {
    BufferCopy b{copy(2, 1, {{r * 8, 0}, {8, 16}}, r * 128, {16, 1}), at, 2};
    trainer.rounds[0].pack.push_back(b);
    at += b.bytes();
  }
  trainer.rounds[0].writes = {{4, Stage::kReceive, 0, 0, at / 2}, {5, Stage::kReceive, at / 2, 64, at / 2}};
  trainer.rounds[1].pack.push_back(BufferCopy{copy(1, 2, {{0}, {8}}, 0, {1}), 0, 4});
  trainer.rounds[1].writes = {{5, Stage::kReceive, 0, 0, 32}};
  trainer.send_slot_bytes = at;
  trainer.receive_slot_bytes = 0;
  put("round_schedule", "trainer.bin", serialize_round_schedule(trainer));
  RoundSchedule rollout;
  rollout.rank = 4;
  rollout.side = Side::kRollout;
  rollout.peers = {1, 5};
  rollout.rounds.resize(1);
  rollout.rounds[0].arrivals = {{1, Stage::kReceive, 0, 256}, {5, Stage::kInternalExchange, 256, 256}};
  rollout.rounds[0].writes = {{5, Stage::kInternalExchange, 0, 0, 256}};
  rollout.rounds[0].assemble = {BufferCopy{copy(2, 0, {{0, 0}, {16, 16}}, 0, {1, 16}), 0, 2}};
  rollout.receive_slot_bytes = 512;
  put("round_schedule", "rollout.bin", serialize_round_schedule(rollout));

  // --- connect records ------------------------------------------------------------------------------------
  exec::ConnectRecord record{TransportKind::kCma, 4096, text_bytes("endpoint"), text_bytes("key"), {{0, 0, 3}, {2, 1, 2}}};
  put("connect_records", "executor.bin", with_selector(0, exec::encode_connect_record(record)));
  shm::ProcessAddress address;
  address.rank = 0;
  address.pid = 4242;
  address.pid_namespace = 4026531836;
  address.machine = "fuzz-host";
  address.mailbox = 0x7f0000001000;
  address.nonce = 0x1234567890abcdef;
  address.ring_slots = 8;
  address.mailbox_ranks = 16;
  std::vector<std::byte> endpoint = shm::encode_endpoint(TransportKind::kCma, 1, address);
  endpoint.resize(endpoint.size() - 8);  // the target appends the checksum
  put("connect_records", "cma_endpoint.bin", with_selector(1, endpoint));
  ibv::EndpointRecord ib;
  ib.rank = 2;
  ib.peer = 7;
  ibv::NicAddress nic;
  nic.device = "mlx5_0";
  nic.lid = 17;
  nic.mtu = 5;
  nic.max_message = 1u << 30;
  ib.nics = {nic, nic};
  ib.nics[1].device = "mlx5_1";
  ib.qps = {{0x1234, 0x55}, {0x1235, 0x66}};
  put("connect_records", "ibverbs_endpoint.bin", with_selector(2, ibv::serialize_endpoint(ib)));
  ibv::MemoryKey key;
  key.owner = 2;
  key.address = 0x7f0000000000;
  key.bytes = 1 << 20;
  key.rkeys = {0x100, 0x200};
  put("connect_records", "ibverbs_key.bin", with_selector(3, ibv::serialize_memory_key(key)));
#if WB_HAVE_LIBFABRIC
  fabric::EndpointRecord fabric_endpoint;
  fabric_endpoint.rank = 0;
  fabric_endpoint.provider = "tcp;ofi_rxm";
  fabric_endpoint.address_format = 2;
  fabric_endpoint.address = text_bytes("sockaddr_in bytes");
  put("connect_records", "fabric_endpoint.bin", with_selector(4, fabric::encode_endpoint(fabric_endpoint)));
  fabric::MemoryKey fabric_key;
  fabric_key.rank = 0;
  fabric_key.address = 0x7f0000000000;
  fabric_key.bytes = 1 << 20;
  fabric_key.key = 77;
  put("connect_records", "fabric_key.bin", with_selector(5, fabric::encode_memory_key(fabric_key)));
#endif
  coord::WorkerConfig config;
  config.trainer = true;
  config.node_key = 1LL << 33;
  config.buffer_bytes = 1LL << 30;
  config.pipeline_depth = 2;
  put("connect_records", "worker_config.bin", with_selector(6, coord::encode_worker_config(config)));
  TransferSummary summary;
  summary.workers = 2;
  summary.trainer_nodes = summary.rollout_nodes = 1;
  summary.rounds = 3;
  summary.model_bytes = summary.max_node_need_bytes = 4096;
  summary.t_min_seconds = 0.25;
  summary.node_of_worker = {0, 1};
  summary.node_ingress_bytes = {0, 4096};
  summary.node_egress_bytes = {4096, 0};
  summary.node_need_bytes = {0, 4096};
  put("connect_records", "summary.bin", with_selector(7, coord::encode_summary(summary)));
  put("connect_records", "status.bin",
      with_selector(8, comm::encode_status(Status(ErrorCode::kTimeout, "rank 3: the source maps did not complete"), 1, 2, {3})));
  return 0;
}
