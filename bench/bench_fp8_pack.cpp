// The trainers' FP8 pack (exec/quantized_pack.hpp) against the plain pack of the same parameters, on one
// core: what quantizing costs a trainer per update. Prints one line of JSON.
//
//   bench_fp8_pack [--rows R] [--cols C] [--tensors N] [--reps K] [--rule RULE]
//
// N BF16 weights [R, C] (default 4 of [1536, 4000]: edge blocks of 128 x 128 in every row of blocks), each a
// trainer parameter holding the whole tensor. plain: the CopyProgram packing the BF16 parameters into the
// buffer (2 bytes an element). fp8: QuantizedPack::quantize (amaxes, scales, codes) then the CopyProgram
// packing the FP8 form (codes and scales, about 1 byte an element). Both are checked first: the fp8 buffer
// holds open_fp8_form of the parameters bit for bit. The two are interleaved, K times each, and the medians
// compared: fp8_over_plain is the goal's ratio (issue 32: at most 1.5).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "exec/pack.hpp"
#include "exec/quantized_pack.hpp"
#include "layout/fp8_form.hpp"
#include "weightbridge/status.hpp"

namespace {

using namespace wb;
using i64 = std::int64_t;
using Clock = std::chrono::steady_clock;

// The parameters read as a checkpoint (each parameter the whole tensor of the same index).
class ParameterCheckpoint final : public CheckpointReader {
 public:
  ParameterCheckpoint(const std::vector<TensorInfo>& tensors, const std::vector<std::byte*>& memory)
      : tensors_(tensors), memory_(memory) {}
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      if (tensors_[t].name != name) continue;
      const i64 cols = tensors_[t].shape[1], element = 2;
      auto* out = static_cast<std::byte*>(destination);
      for (i64 r = 0; r < box.extent[0]; ++r)
        std::memcpy(out + r * box.extent[1] * element,
                    memory_[t] + ((box.offset[0] + r) * cols + box.offset[1]) * element,
                    static_cast<std::size_t>(box.extent[1] * element));
      return;
    }
    throw Error(ErrorCode::kNotFound, std::string(name));
  }
  std::string source() const override { return "the benchmark's parameters"; }

 private:
  const std::vector<TensorInfo>& tensors_;
  const std::vector<std::byte*>& memory_;
};

std::vector<BufferCopy> buffer_copies(const SourceMap& map, i64& buffer_bytes) {
  std::vector<BufferCopy> out;
  buffer_bytes = 0;
  for (const SliceCopy& copy : map.copies) {
    const auto element = static_cast<std::uint8_t>(dtype_size(map.parameters[copy.parameter].dtype));
    out.push_back({copy, buffer_bytes, element});
    buffer_bytes += out.back().bytes();
  }
  return out;
}

std::vector<i64> parameter_bytes(const SourceMap& map) {
  std::vector<i64> out;
  for (const TensorInfo& p : map.parameters) out.push_back(static_cast<i64>(p.nbytes()));
  return out;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int run(int argc, char** argv) {
  i64 rows = 1536, cols = 4000, tensors = 4;
  int reps = 9;
  std::string rule = "per-block-cast";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rows") rows = std::stoll(value);
    else if (flag == "--cols") cols = std::stoll(value);
    else if (flag == "--tensors") tensors = std::stoll(value);
    else if (flag == "--reps") reps = std::stoi(value);
    else if (flag == "--rule") rule = value;
    else throw Error(ErrorCode::kInvalidArgument, "unknown flag " + flag);
  }
  if (rows <= 0 || cols <= 0 || tensors <= 0 || reps <= 0)
    throw Error(ErrorCode::kInvalidArgument, "--rows, --cols, --tensors and --reps must be positive");
  std::vector<TensorInfo> infos;
  SourceMap map;
  std::vector<std::vector<std::uint16_t>> storage;
  std::vector<std::byte*> memory;
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (i64 t = 0; t < tensors; ++t) {
    const std::string name = "layers." + std::to_string(t) + ".weight";
    infos.push_back({name, DType::kBF16, {rows, cols}});
    map.parameters.push_back({name, DType::kBF16, {rows, cols}});
    map.copies.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(t), Box::whole(infos.back().shape), 0, {cols, 1}});
    storage.emplace_back(static_cast<std::size_t>(rows * cols));
    for (std::uint16_t& v : storage.back()) v = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(normal(generator)) >> 16);
    memory.push_back(reinterpret_cast<std::byte*>(storage.back().data()));
  }
  layout::QuantizationConfig config;
  config.rule = layout::parse_scale_rule_or_throw(rule, "--rule");
  const layout::Fp8Form form = layout::derive_fp8_form(infos, config);
  exec::QuantizedPack quantized(map, form);
  const SourceMap& fp8_map = quantized.form_map();
  const std::vector<std::byte*> fp8_memory = quantized.form_memory(memory);

  i64 plain_bytes = 0, fp8_bytes = 0;
  const std::vector<BufferCopy> plain_copies = buffer_copies(map, plain_bytes);
  const std::vector<BufferCopy> fp8_copies = buffer_copies(fp8_map, fp8_bytes);
  const exec::CopyProgram plain(exec::CopyDirection::kPack, plain_copies, parameter_bytes(map), plain_bytes);
  const exec::CopyProgram fp8(exec::CopyDirection::kPack, fp8_copies, parameter_bytes(fp8_map), fp8_bytes);
  std::vector<std::byte> plain_buffer(static_cast<std::size_t>(plain_bytes)), fp8_buffer(static_cast<std::size_t>(fp8_bytes));
  const exec::AmaxExchange none = [](std::span<std::uint32_t>) { return Status::ok(); };

  // Checked before timing: every code and scale in the buffer equals the FP8 form of the parameters.
  {
    const Status status = quantized.quantize(memory, none);
    if (!status) throw Error(status);
    fp8.execute(fp8_memory, fp8_buffer.data());
    const ParameterCheckpoint bf16(infos, memory);
    const auto reference = layout::open_fp8_form(bf16, form);
    for (const BufferCopy& c : fp8_copies) {
      std::vector<std::byte> expected(static_cast<std::size_t>(c.bytes()));
      reference->read_box(form.tensors[c.copy.tensor].name, c.copy.box, expected.data());
      if (std::memcmp(expected.data(), fp8_buffer.data() + c.buffer_offset, expected.size()) != 0)
        throw Error(ErrorCode::kInternal, "the FP8 pack of " + form.tensors[c.copy.tensor].name + " differs from its FP8 form");
    }
  }
  std::vector<double> plain_s, fp8_s, quantize_s;
  for (int k = 0; k < reps; ++k) {
    auto start = Clock::now();
    plain.execute(memory, plain_buffer.data());
    plain_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    start = Clock::now();
    const Status status = quantized.quantize(memory, none);
    const auto quantized_at = Clock::now();
    fp8.execute(fp8_memory, fp8_buffer.data());
    fp8_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    quantize_s.push_back(std::chrono::duration<double>(quantized_at - start).count());
    if (!status) throw Error(status);
  }
  const double p = median(plain_s), f = median(fp8_s), q = median(quantize_s);
  std::printf("{\"benchmark\":\"fp8_pack\",\"rule\":\"%s\",\"tensors\":%lld,\"shape\":[%lld,%lld],\"reps\":%d,"
              "\"plain_bytes\":%lld,\"fp8_bytes\":%lld,\"plain_s\":%.6f,\"fp8_s\":%.6f,\"quantize_s\":%.6f,"
              "\"plain_GBps\":%.3f,\"fp8_source_GBps\":%.3f,\"fp8_over_plain\":%.3f,\"goal\":1.5,\"verified\":true}\n",
              rule.c_str(), static_cast<long long>(tensors), static_cast<long long>(rows), static_cast<long long>(cols), reps,
              static_cast<long long>(plain_bytes), static_cast<long long>(fp8_bytes), p, f, q, plain_bytes / p / 1e9,
              plain_bytes / f / 1e9, f / p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fp8_pack: %s\n", e.what());
    return 1;
  }
}
