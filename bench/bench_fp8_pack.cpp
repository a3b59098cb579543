// The trainers' FP8 pack (exec/quantized_pack.hpp, exec/fp8_cast_program.hpp) against the plain pack of the
// same parameters, on one core: what quantizing costs a trainer per update (issue 32's goal: at most 1.5 x).
//
//   bench_fp8_pack [--rows R] [--cols C] [--tensors N] [--piece-rows P] [--rule RULE] [--changed F]
//                  [--benchmark_* flags]
//
// N BF16 weights [R, C] (default 4 of [1536, 4000]: edge blocks of 128 x 128 in every row of blocks), each a
// trainer parameter holding the whole tensor, packed as one round whose pieces are P rows of a tensor (0,
// the default: the whole tensor; a P off a multiple of 128 cuts blocks, whose amaxes quantize then takes
// before the round). Every iteration times, on this thread's CPU clock, one after the other:
//   plain   the CopyProgram packing the BF16 parameters (2 bytes an element);
//   casts   how a trainer packs for FP8 engines (no staging): QuantizedPack::quantize (the amaxes the casts
//           cannot take themselves, the scales), then the round's Fp8CastProgram (codes straight into the
//           buffer, amaxes of whole blocks from the same read) and the CopyProgram of the scales;
//   shadows the staged or verified path: quantize writes the codes into shadow parameters, the round's
//           CopyProgram copies them and the scales.
// Between iterations (not timed) the parameters change as a training step changes them: each element moves
// by one bf16 ulp with probability F (default 0.02: with fp32 master weights, an element of magnitude 0.02
// changes its bf16 value when its Adam steps of ~lr cross half an ulp, 6e-5: about 1 % of them per step at
// lr 1e-6; 1: every element, so every scale, changes). The casts take their scales speculatively from the
// last update (Fp8CastProgram::cast_speculatively); recast_share is the share of blocks cast again.
// Counters (per repetition; run with --benchmark_repetitions=5 for medians): plain_ms, casts_ms (of it
// casts_quantize_ms in quantize), shadows_ms, casts_over_plain (the goal's ratio), shadows_over_plain,
// own_amax_blocks (blocks whose amax the casts take as they read them), plain_ns_per_element and
// casts_ns_per_element. Both FP8 buffers are checked against open_fp8_form of the parameters, bit for bit,
// before timing and after the last update: the benchmark exits non-zero otherwise.
#include <benchmark/benchmark.h>
#include <time.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "exec/fp8_cast_program.hpp"
#include "exec/pack.hpp"
#include "exec/quantized_pack.hpp"
#include "layout/fp8_form.hpp"
#include "weightbridge/status.hpp"

namespace {

using namespace wb;
using i64 = std::int64_t;

struct Flags {
  i64 rows = 1536, cols = 4000, tensors = 4, piece_rows = 0;
  std::string rule = "per-block-cast";
  double changed = 0.02;
};
Flags flags;

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

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
        std::memcpy(out + r * box.extent[1] * element, memory_[t] + ((box.offset[0] + r) * cols + box.offset[1]) * element,
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

// One round packing every copy of `map`, cut into pieces of `piece_rows` rows (0: whole).
std::vector<BufferCopy> round_copies(const SourceMap& map, i64 piece_rows, i64& buffer_bytes) {
  std::vector<BufferCopy> out;
  buffer_bytes = 0;
  for (const SliceCopy& copy : map.copies) {
    const auto element = static_cast<std::uint8_t>(dtype_size(map.parameters[copy.parameter].dtype));
    const i64 rows = copy.box.extent[0];
    const i64 step = piece_rows > 0 && copy.box.ndim() == 2 && copy.box.extent[1] > 1 ? piece_rows : rows;
    for (i64 r = 0; r < rows; r += step) {
      SliceCopy piece = copy;
      piece.box.offset[0] += r;
      piece.box.extent[0] = std::min(step, rows - r);
      piece.offset += r * copy.strides[0];
      out.push_back({piece, buffer_bytes, element});
      buffer_bytes += out.back().bytes();
    }
  }
  return out;
}

std::vector<i64> parameter_bytes(const SourceMap& map) {
  std::vector<i64> out;
  for (const TensorInfo& p : map.parameters) out.push_back(static_cast<i64>(p.nbytes()));
  return out;
}

// The parameters, the FP8 form, and the three packs, built and checked once.
struct Setup {
  std::vector<TensorInfo> infos;
  SourceMap map;
  std::vector<std::vector<std::uint16_t>> storage;
  std::vector<std::byte*> memory;
  layout::Fp8Form form;
  std::unique_ptr<exec::QuantizedPack> casting, shadowing;
  std::vector<std::byte*> casting_memory, shadowing_memory;
  exec::CopyProgram plain, cast_rest, shadows;
  exec::Fp8CastProgram casts;
  std::vector<std::byte> plain_buffer, cast_buffer, shadow_buffer;
  i64 plain_bytes = 0, fp8_bytes = 0, own_amax_blocks = 0;
  exec::AmaxExchange none = [](std::span<std::uint32_t>) { return Status::ok(); };

  Setup() {
    std::mt19937 generator(7);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (i64 t = 0; t < flags.tensors; ++t) {
      const std::string name = "layers." + std::to_string(t) + ".weight";
      infos.push_back({name, DType::kBF16, {flags.rows, flags.cols}});
      map.parameters.push_back({name, DType::kBF16, {flags.rows, flags.cols}});
      map.copies.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(t), Box::whole(infos.back().shape), 0,
                            {flags.cols, 1}});
      storage.emplace_back(static_cast<std::size_t>(flags.rows * flags.cols));
      for (std::uint16_t& v : storage.back()) v = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(normal(generator)) >> 16);
      memory.push_back(reinterpret_cast<std::byte*>(storage.back().data()));
    }
    layout::QuantizationConfig config;
    config.rule = layout::parse_scale_rule_or_throw(flags.rule, "--rule");
    form = layout::derive_fp8_form(infos, config);
    casting = std::make_unique<exec::QuantizedPack>(map, form);
    shadowing = std::make_unique<exec::QuantizedPack>(map, form);
    casting->cast_in_pack();
    casting_memory = casting->form_memory(memory);
    shadowing_memory = shadowing->form_memory(memory);

    const std::vector<BufferCopy> plain_copies = round_copies(map, flags.piece_rows, plain_bytes);
    plain = exec::CopyProgram(exec::CopyDirection::kPack, plain_copies, parameter_bytes(map), plain_bytes);
    const std::vector<BufferCopy> fp8_copies = round_copies(casting->form_map(), flags.piece_rows, fp8_bytes);
    std::vector<BufferCopy> rest;
    casts = exec::Fp8CastProgram(fp8_copies, *casting, fp8_bytes, rest);
    own_amax_blocks = casts.own_amax_blocks();
    const std::vector<i64> fp8_parameter_bytes = parameter_bytes(casting->form_map());
    cast_rest = exec::CopyProgram(exec::CopyDirection::kPack, rest, fp8_parameter_bytes, fp8_bytes);
    shadows = exec::CopyProgram(exec::CopyDirection::kPack, fp8_copies, fp8_parameter_bytes, fp8_bytes);
    plain_buffer.resize(static_cast<std::size_t>(plain_bytes));
    cast_buffer.resize(static_cast<std::size_t>(fp8_bytes));
    shadow_buffer.resize(static_cast<std::size_t>(fp8_bytes));

    // Checked before timing: every code and scale in both buffers equals the FP8 form of the parameters.
    pack_casts();
    pack_shadows();
    check();
  }

  // Both buffers against the FP8 form of the parameters as they are now, bit for bit.
  void check() const {
    i64 buffer_bytes = 0;
    const std::vector<BufferCopy> fp8_copies = round_copies(casting->form_map(), flags.piece_rows, buffer_bytes);
    const ParameterCheckpoint bf16(infos, memory);
    const auto reference = layout::open_fp8_form(bf16, form);
    for (const BufferCopy& c : fp8_copies) {
      std::vector<std::byte> expected(static_cast<std::size_t>(c.bytes()));
      reference->read_box(form.tensors[c.copy.tensor].name, c.copy.box, expected.data());
      for (const std::vector<std::byte>* buffer : {&cast_buffer, &shadow_buffer})
        if (std::memcmp(expected.data(), buffer->data() + c.buffer_offset, expected.size()) != 0)
          throw Error(ErrorCode::kInternal, "the FP8 pack (" + std::string(buffer == &cast_buffer ? "casts" : "shadows") +
                                                ") of " + form.tensors[c.copy.tensor].name + " differs from its FP8 form");
    }
  }

  // An update's change: the last mantissa bit of each element flipped with probability flags.changed (a
  // step of one ulp, up or down), as training moves bf16 weights between two updates.
  std::mt19937_64 changes{11};
  void train_step() {
    if (flags.changed <= 0) return;
    for (std::vector<std::uint16_t>& values : storage) {
      if (flags.changed >= 1) {
        for (std::uint16_t& v : values) v ^= 1;
        continue;
      }
      // Gaps between changed elements drawn geometrically: a share `changed` of them, anywhere.
      std::geometric_distribution<i64> gap(flags.changed);
      for (i64 k = gap(changes); k < static_cast<i64>(values.size()); k += 1 + gap(changes)) values[static_cast<std::size_t>(k)] ^= 1;
    }
  }

  double cast_quantize_seconds = 0;  // of pack_casts, in quantize (the amaxes the casts do not take)
  void pack_casts() {
    const double t0 = thread_seconds();
    if (const Status status = casting->quantize(memory, none); !status) throw Error(status);
    cast_quantize_seconds += thread_seconds() - t0;
    casts.execute(casting_memory, cast_buffer.data());
    cast_rest.execute(casting_memory, cast_buffer.data());
  }
  void pack_shadows() {
    if (const Status status = shadowing->quantize(memory, none); !status) throw Error(status);
    shadows.execute(shadowing_memory, shadow_buffer.data());
  }
};

Setup& setup() {
  static Setup instance;
  return instance;
}

// Interleaved on one thread's CPU clock: plain, casts, shadows in every iteration.
void BM_Fp8Pack(benchmark::State& state) {
  Setup& s = setup();
  double plain = 0, casts = 0, shadows = 0;
  s.cast_quantize_seconds = 0;
  const std::int64_t recast_before = s.casts.recast_blocks();
  for (auto _ : state) {
    s.train_step();  // not timed
    double t0 = thread_seconds();
    s.plain.execute(s.memory, s.plain_buffer.data());
    double t1 = thread_seconds();
    plain += t1 - t0;
    s.pack_casts();
    t0 = thread_seconds();
    casts += t0 - t1;
    s.pack_shadows();
    shadows += thread_seconds() - t0;
    benchmark::ClobberMemory();
  }
  try {
    s.check();  // the codes of the last update, after the parameters changed between updates
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["recast_share"] =
      static_cast<double>(s.casts.recast_blocks() - recast_before) / std::max(1.0, static_cast<double>(s.own_amax_blocks) * n);
  state.counters["plain_ms"] = plain / n * 1e3;
  state.counters["casts_ms"] = casts / n * 1e3;
  state.counters["shadows_ms"] = shadows / n * 1e3;
  state.counters["casts_quantize_ms"] = s.cast_quantize_seconds / n * 1e3;
  state.counters["casts_over_plain"] = casts / plain;
  state.counters["shadows_over_plain"] = shadows / plain;
  state.counters["plain_MiB"] = static_cast<double>(s.plain_bytes) / (1 << 20);
  state.counters["fp8_MiB"] = static_cast<double>(s.fp8_bytes) / (1 << 20);
  state.counters["own_amax_blocks"] = static_cast<double>(s.own_amax_blocks);
  const double elements = static_cast<double>(flags.tensors * flags.rows * flags.cols) * n;
  state.counters["plain_ns_per_element"] = plain / elements * 1e9;
  state.counters["casts_ns_per_element"] = casts / elements * 1e9;
}
BENCHMARK(BM_Fp8Pack)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  try {
    for (int i = 1; i < argc; i += 2) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) throw Error(ErrorCode::kInvalidArgument, flag + " needs a value");
      const std::string value = argv[i + 1];
      if (flag == "--rows") flags.rows = std::stoll(value);
      else if (flag == "--cols") flags.cols = std::stoll(value);
      else if (flag == "--tensors") flags.tensors = std::stoll(value);
      else if (flag == "--piece-rows") flags.piece_rows = std::stoll(value);
      else if (flag == "--rule") flags.rule = value;
      else if (flag == "--changed") flags.changed = std::stod(value);
      else throw Error(ErrorCode::kInvalidArgument, "unknown flag " + flag);
    }
    if (flags.rows <= 0 || flags.cols <= 0 || flags.tensors <= 0 || flags.piece_rows < 0)
      throw Error(ErrorCode::kInvalidArgument, "--rows, --cols and --tensors must be positive, --piece-rows not negative");
    if (!(flags.changed >= 0 && flags.changed <= 1)) throw Error(ErrorCode::kInvalidArgument, "--changed must be in [0, 1]");
    (void)setup();  // builds and checks: a wrong pack fails here, before any timing
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fp8_pack: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
