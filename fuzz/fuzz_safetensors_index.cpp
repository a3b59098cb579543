// libFuzzer target: a model.safetensors.index.json. Beside it sit two valid shards (and a subdirectory
// with a third); one directory up sits a shard holding the tensor "escaped", which no index may reach.
// Opening either succeeds, listing only tensors of the shards in the directory, or throws wb::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "fuzz_util.hpp"
#include "weightbridge/checkpoint.hpp"

namespace {

namespace fs = std::filesystem;

void write_shard(const fs::path& path, const std::vector<wb::TensorInfo>& tensors) {
  auto writer = wb::create_checkpoint(path.string(), wb::CheckpointFormat::kSafetensors, tensors);
  for (const wb::TensorInfo& info : tensors) {
    std::vector<std::byte> bytes(info.nbytes(), std::byte{0x3C});
    writer->write(info.name, bytes.data());
  }
  writer->finish();
}

const fs::path& index_path() {
  static const fs::path path = [] {
    const fs::path root = wb::fuzz::scratch_directory("wb-fuzz-index");
    const fs::path ckpt = root / "ckpt";
    fs::create_directories(ckpt / "sub");
    write_shard(ckpt / "model-00001-of-00002.safetensors",
                {{"model.embed_tokens.weight", wb::DType::kBF16, {8, 4}}, {"model.norm.weight", wb::DType::kF32, {4}}});
    write_shard(ckpt / "model-00002-of-00002.safetensors",
                {{"lm_head.weight", wb::DType::kBF16, {8, 4}}, {"model.layers.0.mlp.gate.e_score_correction_bias", wb::DType::kF32, {2}}});
    write_shard(ckpt / "sub" / "extra.safetensors", {{"extra.weight", wb::DType::kU8, {3}}});
    write_shard(root / "outside.safetensors", {{"escaped", wb::DType::kU8, {1}}});
    return ckpt / "model.safetensors.index.json";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path& path = index_path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const auto reader = wb::open_safetensors_checkpoint(path.string());
    for (const wb::TensorInfo& info : reader->tensors()) {
      if (info.name == "escaped") std::abort();  // a shard outside the index's directory was opened
      std::vector<std::byte> out(info.nbytes());
      reader->read(info.name, out.data());
    }
  } catch (const wb::Error&) {
  }
  return 0;
}
