// The probe on the emulated backends and on random loaders written only for this test: the probed source
// map equals the described one, reproduces load_weights bit for bit, stays compact, and a load_weights
// that is not a pure copy is reported with the parameter and position.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <algorithm>
#include <random>

#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/described_map.hpp"
#include "emu/frameworks/load_util.hpp"
#include "emu/models/presets.hpp"
#include "layout/probe.hpp"
#include "layout/probe_code.hpp"
#include "preset_params.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using ::testing::HasSubstr;

ProbeLoader loader_of(const EmulatedWorker& worker) {
  return [&worker](const CheckpointReader& checkpoint, const ParameterSet& params) {
    worker.load_weights(checkpoint, params);
  };
}

// Probes a worker whose parameters hold recognisable contents, and checks everything the issue names.
void check_probe(const EmulatedWorker& worker, const std::vector<TensorInfo>& tensors) {
  HostParameters params(worker.parameter_infos());
  // Contents the probe must give back untouched.
  for (const Parameter& p : params.parameters())
    for (std::size_t b = 0; b < p.view.nbytes(); ++b) static_cast<std::uint8_t*>(p.view.data)[b] = static_cast<std::uint8_t>(b * 7 + 3);
  HostParameters before(worker.parameter_infos());
  for (std::size_t i = 0; i < params.parameters().size(); ++i)
    std::memcpy(before.parameters()[i].view.data, params.parameters()[i].view.data, params.parameters()[i].view.nbytes());

  ProbeReport report;
  const SourceMap probed = probe_source_map(tensors, params.parameters(), loader_of(worker), {}, &report);
  for (std::size_t i = 0; i < params.parameters().size(); ++i)
    ASSERT_EQ(std::memcmp(before.parameters()[i].view.data, params.parameters()[i].view.data,
                          params.parameters()[i].view.nbytes()), 0)
        << worker.describe() << ": the probe did not restore " << params.parameters()[i].name;

  // Identical to the described map after normalization.
  const SourceMap described = described_source_map(worker, tensors);
  ASSERT_EQ(probed.copies.size(), described.copies.size()) << worker.describe();
  EXPECT_EQ(probed.copies, described.copies) << worker.describe();

  // Exact: applying it to a real checkpoint reproduces load_weights.
  SyntheticCheckpoint checkpoint(tensors, 2024);
  HostParameters loaded(worker.parameter_infos()), applied(worker.parameter_infos());
  worker.load_weights(checkpoint, loaded.parameters());
  apply_source_map(probed, checkpoint, applied.parameters());
  for (std::size_t i = 0; i < loaded.parameters().size(); ++i)
    ASSERT_EQ(std::memcmp(loaded.parameters()[i].view.data, applied.parameters()[i].view.data,
                          loaded.parameters()[i].view.nbytes()), 0)
        << worker.describe() << ": " << loaded.parameters()[i].name;
  // Bounded extra memory: the saved contents plus the sparse passes, far below a 64-bit index per element.
  EXPECT_EQ(report.scratch_bytes, report.parameter_bytes);
  EXPECT_LT(report.sparse_bytes, report.parameter_bytes + 4096 * params.parameters().size());
}

class ProbePreset : public ::testing::TestWithParam<std::string> {};

TEST_P(ProbePreset, ProbedMapsEqualDescribedMapsAndReproduceLoadWeights) {
  const PresetInstance instance = instantiate_preset(find_preset(GetParam()), ModelScale::kTiny);
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  const Deployment& d = instance.deployment;
  // Every trainer, and every worker of the first engine (the engines are replicas).
  for (int rank = 0; rank < d.trainer.world_size(); ++rank)
    check_probe(*make_trainer_worker(instance.model, d.trainer, rank), tensors);
  for (int rank = 0; rank < d.rollout.tp; ++rank)
    check_probe(*make_rollout_worker(instance.model, d.rollout, rank), tensors);
}

INSTANTIATE_TEST_SUITE_P(Presets, ProbePreset, testing_support::preset_names(), testing_support::preset_test_name);

// Parameters the probe cannot read in place (CUDA memory) are probed through host copies. Here the "device"
// is host memory reached only through the access functions, which count what they are asked to do: the
// map is the one a direct probe finds, load_weights always sees the real parameters, each of its calls
// comes after every parameter was zeroed, and the real parameters get their contents back.
TEST(Probe, ThroughAccessFunctionsAsForDeviceParameters) {
  const PresetInstance instance = instantiate_preset(find_preset("qwen3-30b-a3b"), ModelScale::kTiny);
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  const auto worker = make_rollout_worker(instance.model, instance.deployment.rollout, 1);
  HostParameters device(worker->parameter_infos()), before(worker->parameter_infos());
  for (std::size_t i = 0; i < device.parameters().size(); ++i) {
    const Parameter& p = device.parameters()[i];
    for (std::size_t b = 0; b < p.view.nbytes(); ++b) static_cast<std::uint8_t*>(p.view.data)[b] = static_cast<std::uint8_t>(b * 5 + i);
    std::memcpy(before.parameters()[i].view.data, p.view.data, p.view.nbytes());
  }
  std::size_t zeroed = 0, reads = 0, writes = 0, loads = 0;
  bool loaded_real = true, zeroed_first = true;
  ParameterAccess access;
  access.read = [&](const Parameter& p, void* host) {
    std::memcpy(host, p.view.data, p.view.nbytes());
    ++reads;
  };
  access.write = [&](const Parameter& p, const void* host) {
    std::memcpy(p.view.data, host, p.view.nbytes());
    ++writes;
  };
  access.zero = [&](const Parameter& p) {
    std::memset(p.view.data, 0, p.view.nbytes());
    ++zeroed;
  };
  const ProbeLoader load = [&](const CheckpointReader& c, const ParameterSet& s) {
    loaded_real = loaded_real && s[0].view.data == device.parameters()[0].view.data;
    // Zeroed before every digit pass; before the verification pass (the last) the marker is written instead.
    zeroed_first = zeroed_first && (zeroed == (loads + 1) * s.size() || (zeroed == loads * s.size() && writes == s.size()));
    ++loads;
    worker->load_weights(c, s);
  };
  ProbeReport report;
  const SourceMap through = probe_source_map_through(tensors, device.parameters(), load, access, {}, &report);
  HostParameters host(worker->parameter_infos());
  const SourceMap direct = probe_source_map(tensors, host.parameters(), loader_of(*worker));
  EXPECT_EQ(through.copies, direct.copies);
  EXPECT_TRUE(loaded_real) << "load_weights was given the host copies";
  EXPECT_TRUE(zeroed_first) << "load_weights ran on parameters that were not all zeroed (or marked)";
  EXPECT_EQ(static_cast<int>(loads), report.passes);
  const std::size_t n = device.parameters().size();
  EXPECT_EQ(zeroed, n * (loads - 1));
  EXPECT_EQ(reads, n * (loads + 1));  // after every load, and the contents once at the start
  EXPECT_EQ(writes, 2 * n);           // the marker, and the contents at the end
  ASSERT_EQ(report.accounts.size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const ParameterAccount& a = report.accounts[i];
    EXPECT_EQ(a.copied + a.constant + a.unwritten, device.parameters()[i].view.numel()) << device.parameters()[i].name;
  }
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(std::memcmp(before.parameters()[i].view.data, device.parameters()[i].view.data,
                          device.parameters()[i].view.nbytes()), 0)
        << "the probe did not restore " << device.parameters()[i].name;
  EXPECT_EQ(report.scratch_bytes, 2 * report.parameter_bytes);
}

// A load_weights that is not a copy is reported through the access functions as well, and the parameters
// still get their contents back.
TEST(Probe, ThroughAccessFunctionsReportsComputedValuesAndRestores) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kF32, {16, 8}}};
  HostParameters device({{"p", DType::kF32, {16, 8}}});
  auto* values = static_cast<float*>(device.parameters()[0].view.data);
  for (int i = 0; i < 128; ++i) values[i] = static_cast<float>(i) + 0.5f;
  ParameterAccess access;
  access.read = [](const Parameter& p, void* host) { std::memcpy(host, p.view.data, p.view.nbytes()); };
  access.write = [](const Parameter& p, const void* host) { std::memcpy(p.view.data, host, p.view.nbytes()); };
  access.zero = [](const Parameter& p) { std::memset(p.view.data, 0, p.view.nbytes()); };
  const ProbeLoader doubled = [](const CheckpointReader& c, const ParameterSet& s) {
    load_tensor(c, "w", s[0].view);
    auto* v = static_cast<float*>(s[0].view.data);
    for (int i = 0; i < 128; ++i) v[i] *= 2;
  };
  try {
    probe_source_map_through(tensors, device.parameters(), doubled, access);
    FAIL() << "not detected";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter p, element ["));
  }
  for (int i = 0; i < 128; ++i) ASSERT_EQ(values[i], static_cast<float>(i) + 0.5f) << "element " << i;
}

TEST(Probe, TransposedExpertsAndOddLayouts) {
  const ModelConfig model = scale_model(load_named_model_config("qwen3-30b-a3b"));
  const auto tensors = model_tensors(model);
  check_probe(*make_rollout_worker(model, RolloutSpec::parse("engines=1,tp=2,ep=2,transpose=experts"), 1), tensors);
  check_probe(*make_rollout_worker(model, RolloutSpec::parse("engines=1,tp=8,ep=4"), 5), tensors);
  check_probe(*make_trainer_worker(model, TrainerSpec::parse("tp=2,pp=2,cp=2,ep=4"), 6), tensors);
}

// --- random loaders written only for this test ---------------------------------------------------------

// One random parameter: rows concatenated from row slices of random checkpoint tensors, optionally
// interleaved (every k-th row), optionally stored transposed, in a random element type.
struct RandomLoader {
  struct Piece {
    std::string tensor;
    Box box;
    std::int64_t param_row;  // first parameter row it lands on
    std::int64_t row_step;   // 1, or k for interleaving
  };
  struct Param {
    TensorInfo info;
    bool transposed;
    std::vector<Piece> pieces;
  };
  std::vector<Param> params;
  std::size_t slice_copies = 0;

  void load(const CheckpointReader& checkpoint, const ParameterSet& set) const {
    for (std::size_t i = 0; i < params.size(); ++i) {
      TensorView view = set[i].view;
      if (params[i].transposed) view = view.transpose(0, 1);
      for (const Piece& piece : params[i].pieces) {
        TensorView rows = view.narrow(0, piece.param_row, (piece.box.extent[0] - 1) * piece.row_step + 1);
        rows.shape[0] = piece.box.extent[0];
        rows.strides[0] *= piece.row_step;
        load_box(checkpoint, piece.tensor, piece.box, rows);
      }
    }
  }
};

RandomLoader make_random_loader(std::mt19937_64& rng, const std::vector<TensorInfo>& tensors) {
  RandomLoader loader;
  auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  const int param_count = static_cast<int>(pick(1, 4));
  for (int p = 0; p < param_count; ++p) {
    const DType dtype = tensors[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(tensors.size()) - 1))].dtype;
    std::vector<const TensorInfo*> same;
    for (const TensorInfo& t : tensors)
      if (t.dtype == dtype && t.shape.size() == 2) same.push_back(&t);
    const std::int64_t cols = same[0]->shape[1];
    RandomLoader::Param param;
    param.transposed = pick(0, 2) == 0;
    const bool interleave = pick(0, 2) == 0;
    // Distinct source tensors per parameter: a parameter that holds the same checkpoint rows twice is
    // still decoded exactly, but normalization may then pair the duplicates up in more copies.
    std::shuffle(same.begin(), same.end(), rng);
    const int pieces = static_cast<int>(pick(1, static_cast<std::int64_t>(same.size())));
    std::int64_t rows = 0;
    if (interleave) {
      // k pieces of equal height interleaved row by row.
      const std::int64_t height = pick(1, 6);
      for (int k = 0; k < pieces; ++k) {
        const TensorInfo& t = *same[static_cast<std::size_t>(k)];
        const std::int64_t start = pick(0, t.shape[0] - height);
        param.pieces.push_back({t.name, Box{{start, 0}, {height, cols}}, k, pieces});
      }
      rows = height * pieces;
    } else {
      for (int k = 0; k < pieces; ++k) {
        const TensorInfo& t = *same[static_cast<std::size_t>(k)];
        const std::int64_t height = pick(1, t.shape[0]);
        const std::int64_t start = pick(0, t.shape[0] - height);
        param.pieces.push_back({t.name, Box{{start, 0}, {height, cols}}, rows, 1});
        rows += height;
      }
      rows += pick(0, 1) * 3;  // padding rows at the end now and then
    }
    loader.slice_copies += param.pieces.size();
    Shape shape = param.transposed ? Shape{cols, rows} : Shape{rows, cols};
    param.info = TensorInfo{"param" + std::to_string(p), dtype, shape};
    loader.params.push_back(std::move(param));
  }
  return loader;
}

TEST(Probe, RandomSliceTransposeConcatInterleaveLoaders) {
  // Tensors of every dtype, so that 1-byte codes (several digits per coordinate) are covered too.
  std::vector<TensorInfo> tensors;
  const DType dtypes[] = {DType::kBF16, DType::kF8E4M3, DType::kF32, DType::kI8, DType::kF16, DType::kF64};
  int n = 0;
  for (DType dtype : dtypes)
    for (int k = 0; k < 3; ++k) tensors.push_back({"t" + std::to_string(n++), dtype, {37 + 50 * k, 24}});
  tensors.push_back({"norm", DType::kBF16, {24}});
  std::mt19937_64 rng(7);
  SyntheticCheckpoint checkpoint(tensors, 11);
  for (int trial = 0; trial < 200; ++trial) {
    const RandomLoader loader = make_random_loader(rng, tensors);
    std::vector<TensorInfo> infos;
    for (const auto& p : loader.params) infos.push_back(p.info);
    HostParameters params(infos);
    const SourceMap map = probe_source_map(
        tensors, params.parameters(), [&](const CheckpointReader& c, const ParameterSet& s) { loader.load(c, s); });
    HostParameters loaded(infos), applied(infos);
    loader.load(checkpoint, loaded.parameters());
    apply_source_map(map, checkpoint, applied.parameters());
    for (std::size_t i = 0; i < infos.size(); ++i)
      ASSERT_EQ(std::memcmp(loaded.parameters()[i].view.data, applied.parameters()[i].view.data,
                            loaded.parameters()[i].view.nbytes()), 0)
          << "trial " << trial << " parameter " << i;
    // Compact: a small constant times the loader's slice copies, however large they are.
    EXPECT_LE(map.copies.size(), 2 * loader.slice_copies) << "trial " << trial;
  }
}

// Layouts where the probe's digits wrap and jump inside the parameters: a bf16 span holds 30,720 keys, so
// here stacked experts cross from one span to the next (the key's step along the expert axis changes
// there), a transposed copy of a tensor larger than a span walks its rows with a wrap every 1,280 elements
// (a jump over the hole every 640), a 1-D parameter holds rows of it back to back (the gap after each row
// is a cut), a parameter holds the same expert twice (repeated elements), and an f16 vector longer than a
// span is split across two parameters. The probed map reproduces load_weights bit for bit and stays one
// copy per loader copy.
TEST(Probe, LayoutsAcrossDigitSpans) {
  std::vector<TensorInfo> tensors = {{"pad", DType::kBF16, {10, 2000}}};  // 22,011 keys: span 0 nearly full
  for (int e = 0; e < 40; ++e) tensors.push_back({"expert" + std::to_string(e), DType::kBF16, {20, 30}});  // 651 keys
  tensors.push_back({"big", DType::kBF16, {3000, 40}});  // rows pitched 48: 144,048 keys
  tensors.push_back({"long", DType::kF16, {31000}});
  const std::vector<TensorInfo> infos = {{"experts", DType::kBF16, {40, 20, 30}},
                                         {"big_t", DType::kBF16, {40, 3000}},
                                         {"flat", DType::kBF16, {2900 * 40}},
                                         {"twice", DType::kBF16, {2, 20, 30}},
                                         {"long_a", DType::kF16, {20000}},
                                         {"long_b", DType::kF16, {11000}}};
  const auto load = [](const CheckpointReader& c, const ParameterSet& s) {
    for (int e = 0; e < 40; ++e) load_box(c, "expert" + std::to_string(e), Box{{0, 0}, {20, 30}}, s[0].view.select(0, e));
    load_box(c, "big", Box{{0, 0}, {3000, 40}}, s[1].view.transpose(0, 1));
    TensorView rows = s[2].view;  // rows 100 .. 2999 of big, back to back
    rows.shape = {2900, 40};
    rows.strides = {40, 1};
    load_box(c, "big", Box{{100, 0}, {2900, 40}}, rows);
    for (int k = 0; k < 2; ++k) load_box(c, "expert7", Box{{0, 0}, {20, 30}}, s[3].view.select(0, k));
    load_box(c, "long", Box{{0}, {20000}}, s[4].view);
    load_box(c, "long", Box{{20000}, {11000}}, s[5].view);
  };
  HostParameters params(infos);
  ProbeReport report;
  const SourceMap map = probe_source_map(tensors, params.parameters(), load, {}, &report);
  // Two digits of 61,440: the first, the keyed pass (the second), and, since the repeated expert leaves copies
  // of one element (normalization's corners) that the keyed pass cannot check, the second digit pass and the
  // verification after all.
  EXPECT_EQ(report.passes, 4);
  SyntheticCheckpoint checkpoint(tensors, 5);
  HostParameters loaded(infos), applied(infos);
  load(checkpoint, loaded.parameters());
  apply_source_map(map, checkpoint, applied.parameters());
  for (std::size_t i = 0; i < infos.size(); ++i)
    EXPECT_EQ(std::memcmp(loaded.parameters()[i].view.data, applied.parameters()[i].view.data,
                          loaded.parameters()[i].view.nbytes()), 0)
        << infos[i].name;
  // One copy per loader copy; the repeated expert in as many as normalization pairs its rows up (each
  // element once).
  std::vector<int> per_parameter(infos.size(), 0);
  std::int64_t twice = 0;
  for (const SliceCopy& copy : map.copies) {
    ++per_parameter[copy.parameter];
    if (copy.parameter == 3) twice += copy.box.numel();
  }
  EXPECT_EQ(twice, 2 * 20 * 30);
  per_parameter[3] = std::min(per_parameter[3], 2);
  EXPECT_EQ(per_parameter, (std::vector<int>{40, 1, 1, 2, 1, 1}));
  for (const SliceCopy& copy : map.copies) {
    if (copy.parameter == 2) {
      EXPECT_EQ(copy.box, (Box{{100, 0}, {2900, 40}}));
    }
  }
}

// An fp8 tensor of 9 M keys takes 4 passes (192^3 < 9e6); the f32 scales beside it need one, and their
// digits past the first are 0 at places past 2^64 (2^31 per digit): they decode all the same.
TEST(Probe, DtypesNeedingFewerPassesThanTheProbeRuns) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kF8E4M3, {3000, 3000}}, {"scale", DType::kF32, {24, 24}}};
  const std::vector<TensorInfo> infos = {{"w_part", DType::kF8E4M3, {8, 3000}}, {"scale", DType::kF32, {24, 24}}};
  const auto load = [](const CheckpointReader& c, const ParameterSet& s) {
    load_box(c, "w", Box{{2990, 0}, {8, 3000}}, s[0].view);
    load_box(c, "scale", Box{{0, 0}, {24, 24}}, s[1].view);
  };
  HostParameters params(infos);
  ProbeReport report;
  const SourceMap map = probe_source_map(tensors, params.parameters(), load, {}, &report);
  EXPECT_EQ(report.passes, 5);  // four digit passes and the verification (no keyed pass for fp8 codes)
  ASSERT_EQ(map.copies.size(), 2u);
  EXPECT_EQ(map.copies[0].box, (Box{{2990, 0}, {8, 3000}}));
  EXPECT_EQ(map.copies[1].box, (Box{{0, 0}, {24, 24}}));
}

TEST(Probe, AShardOfALargeMatrixIsOneCopy) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {4096, 4096}}};
  HostParameters params({{"shard", DType::kBF16, {1024, 4096}}});
  ProbeReport report;
  const SourceMap map = probe_source_map(
      tensors, params.parameters(),
      [](const CheckpointReader& c, const ParameterSet& s) { load_box(c, "w", Box{{2048, 0}, {1024, 4096}}, s[0].view); },
      {}, &report);
  ASSERT_EQ(map.copies.size(), 1u);
  EXPECT_EQ(map.copies[0].box, (Box{{2048, 0}, {1024, 4096}}));
  EXPECT_EQ(report.passes, 2);  // the first digit and the keyed pass, which decides the second and verifies
  EXPECT_LE(report.serialized_bytes, 64u + 64u);
  std::printf("probe of a [1024, 4096] bf16 shard: %d passes, %.3f s (decode %.3f s), %zu sparse bytes\n",
              report.passes, report.seconds, report.decode_seconds, report.sparse_bytes);
}

// Every element is accounted for: copied, written with 0 by load_weights (padding a loader zeroes), or never
// written; the parameters' contents come back, and the counts are the same through the access functions.
TEST(Probe, EveryElementIsCopiedConstantOrUnwritten) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {16, 8}}, {"n", DType::kF32, {5}}};
  const std::vector<TensorInfo> infos = {{"padded", DType::kBF16, {20, 8}},  // rows 0-15 copied, 16-19 zeroed
                                         {"partly", DType::kF32, {7}},       // 0-4 copied, 5-6 left as they are
                                         {"cache", DType::kF32, {3}},        // never written
                                         {"zeros", DType::kBF16, {4}}};      // written with 0 only
  HostParameters params(infos);
  const ProbeLoader load = [](const CheckpointReader& c, const ParameterSet& s) {
    load_tensor(c, "w", s[0].view.box(Box{{0, 0}, {16, 8}}));
    std::memset(static_cast<std::byte*>(s[0].view.data) + 16 * 8 * 2, 0, 4 * 8 * 2);
    load_tensor(c, "n", s[1].view.box(Box{{0}, {5}}));
    std::memset(s[3].view.data, 0, s[3].view.nbytes());
  };
  for (std::size_t i = 0; i < params.parameters().size(); ++i)
    std::memset(params.parameters()[i].view.data, 0x11 + static_cast<int>(i), params.parameters()[i].view.nbytes());
  HostParameters before(infos);
  for (std::size_t i = 0; i < params.parameters().size(); ++i)
    std::memcpy(before.parameters()[i].view.data, params.parameters()[i].view.data, params.parameters()[i].view.nbytes());
  ProbeReport report;
  (void)probe_source_map(tensors, params.parameters(), load, {}, &report);
  ASSERT_EQ(report.accounts.size(), 4u);
  const auto expect = [&](std::size_t i, std::int64_t copied, std::int64_t constant, std::int64_t unwritten) {
    EXPECT_EQ(report.accounts[i].copied, copied) << params.parameters()[i].name;
    EXPECT_EQ(report.accounts[i].constant, constant) << params.parameters()[i].name;
    EXPECT_EQ(report.accounts[i].unwritten, unwritten) << params.parameters()[i].name;
  };
  expect(0, 128, 32, 0);
  expect(1, 5, 0, 2);
  expect(2, 0, 0, 3);
  expect(3, 0, 4, 0);
  for (std::size_t i = 0; i < params.parameters().size(); ++i)
    EXPECT_EQ(std::memcmp(before.parameters()[i].view.data, params.parameters()[i].view.data,
                          params.parameters()[i].view.nbytes()), 0)
        << "not restored: " << params.parameters()[i].name;

  ParameterAccess access;
  access.read = [](const Parameter& p, void* host) { std::memcpy(host, p.view.data, p.view.nbytes()); };
  access.write = [](const Parameter& p, const void* host) { std::memcpy(p.view.data, host, p.view.nbytes()); };
  access.zero = [](const Parameter& p) { std::memset(p.view.data, 0, p.view.nbytes()); };
  ProbeReport through;
  (void)probe_source_map_through(tensors, params.parameters(), load, access, {}, &through);
  ASSERT_EQ(through.accounts.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(through.accounts[i].copied, report.accounts[i].copied);
    EXPECT_EQ(through.accounts[i].constant, report.accounts[i].constant);
    EXPECT_EQ(through.accounts[i].unwritten, report.accounts[i].unwritten);
  }
}

// Tied weights: one memory under two names (a state_dict lists both). Both names get the copies of the
// tensor load_weights wrote there, with the same accounting; a view into another parameter is refused naming
// both (an update of one would write into the other).
TEST(Probe, ParametersSharingMemoryGetTheSameCopies) {
  const std::vector<TensorInfo> tensors = {{"embed", DType::kBF16, {16, 8}}, {"norm", DType::kF32, {8}}};
  HostParameters params({{"embed", DType::kBF16, {16, 8}}, {"norm", DType::kF32, {8}}});
  ParameterSet tied;
  tied.add("embed", params.parameters()[0].view);
  tied.add("norm", params.parameters()[1].view);
  tied.add("head", params.parameters()[0].view);  // the same memory, listed after another parameter
  const ProbeLoader load = [](const CheckpointReader& c, const ParameterSet& s) {
    load_tensor(c, "embed", s.at("embed").view);
    load_tensor(c, "norm", s.at("norm").view);
  };
  for (int through = 0; through < 2; ++through) {
    SCOPED_TRACE(through ? "through access functions" : "host");
    ProbeReport report;
    const SourceMap map = through ? probe_source_map_through(tensors, tied, load, ParameterAccess{
                                        [](const Parameter& p, void* host) { std::memcpy(host, p.view.data, p.view.nbytes()); },
                                        [](const Parameter& p, const void* host) { std::memcpy(p.view.data, host, p.view.nbytes()); },
                                        [](const Parameter& p) { std::memset(p.view.data, 0, p.view.nbytes()); }, {}}, {}, &report)
                                  : probe_source_map(tensors, tied, load, {}, &report);
    ASSERT_EQ(map.parameters.size(), 3u);
    EXPECT_EQ(map.parameters[2].name, "head");
    ASSERT_EQ(map.copies.size(), 3u);
    for (const std::uint32_t param : {0u, 2u}) {
      const auto copy = std::find_if(map.copies.begin(), map.copies.end(), [&](const SliceCopy& c) { return c.parameter == param; });
      ASSERT_NE(copy, map.copies.end()) << "no copy into parameter " << param;
      EXPECT_EQ(copy->tensor, 0u);
      EXPECT_EQ(copy->box, (Box{{0, 0}, {16, 8}}));
    }
    ASSERT_EQ(report.accounts.size(), 3u);
    EXPECT_EQ(report.accounts[2].copied, 128);
    EXPECT_EQ(report.accounts[0].copied, 128);
  }

  ParameterSet overlapping;
  overlapping.add("embed", params.parameters()[0].view);
  overlapping.add("rows", params.parameters()[0].view.box(Box{{4, 0}, {4, 8}}));
  try {
    probe_source_map(tensors, overlapping, load);
    FAIL() << "a parameter inside another was taken";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameters embed (bf16 [16, 8]) and rows (bf16 [4, 8]) overlap in memory without "
                                    "being the same tensor"));
  }
}

// --- load_weights that are not pure copies ----------------------------------------------------------

void expect_not_a_copy(const ProbeLoader& load, const std::string& param_name) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {16, 8}}, {"v", DType::kBF16, {16, 8}}};
  HostParameters params({{"p", DType::kBF16, {16, 8}}, {"q", DType::kF32, {16, 8}}});
  try {
    probe_source_map(tensors, params.parameters(), load);
    FAIL() << "not detected";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a pure copy"));
    EXPECT_THAT(e.what(), HasSubstr("parameter " + param_name + ", element ["));
    // In the user's words: the value was computed, not copied (or a dtype converted).
    EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("not a checkpoint value"), HasSubstr("computes it"),
                                           HasSubstr("converts dtypes")));
  }
}

void copy_w(const CheckpointReader& c, const ParameterSet& s) { load_tensor(c, "w", s[0].view); }

TEST(Probe, ArithmeticScalingAndConversionAreReported) {
  // Doubling a bf16 value: +1 in the exponent, which maps codes onto other valid codes.
  expect_not_a_copy([](const CheckpointReader& c, const ParameterSet& s) {
    copy_w(c, s);
    auto* bits = static_cast<std::uint16_t*>(s[0].view.data);
    for (std::int64_t i = 0; i < s[0].view.numel(); ++i) bits[i] = static_cast<std::uint16_t>(bits[i] + 0x80);
  }, "p");
  // Adding one element to another (arithmetic on a single element).
  expect_not_a_copy([](const CheckpointReader& c, const ParameterSet& s) {
    copy_w(c, s);
    auto* bits = static_cast<std::uint16_t*>(s[0].view.data);
    bits[37] = static_cast<std::uint16_t>(bits[37] + bits[5] - 0x80);
  }, "p");
  // A dtype conversion bf16 -> f32 into the second parameter.
  expect_not_a_copy([](const CheckpointReader& c, const ParameterSet& s) {
    std::vector<std::uint16_t> rows(16 * 8);
    c.read("v", rows.data());
    auto* out = static_cast<std::uint32_t*>(s[1].view.data);
    for (std::size_t i = 0; i < rows.size(); ++i) out[i] = static_cast<std::uint32_t>(rows[i]) << 16;
  }, "q");
  // A constant written where no checkpoint element goes.
  expect_not_a_copy([](const CheckpointReader& c, const ParameterSet& s) {
    c.read_box("w", Box{{0, 0}, {8, 8}}, s[0].view.data);
    static_cast<std::uint16_t*>(s[0].view.data)[100] = 0x3f80;
  }, "p");
}

// Rows pitched 61,440 keys (rows of 32,768) step the key by one whole digit D: the first digit does not see
// where a parameter's rows pass from one tensor to another, only the top digit does. Rows 0-2 of a and rows
// 0-1 of b (seven rows of a apart in the keys) in one parameter: rows 1-4 are one cell of the first digit
// (row 0 is cut off by the differences' start), whose corner and step in the keyed pass give tops 1, 2 and
// predict 3, 4 (rows 3-4 of a, which exist), where b's rows carry 7, 8. Only the keyed values at every
// element tell them apart; the probe must then run the plain passes and map b's rows to b.
TEST(Probe, KeyedPassRefusesAKeyLineThatTheFirstDigitCannotSee) {
  const std::vector<TensorInfo> tensors = {{"a", DType::kBF16, {6, 32768}}, {"b", DType::kBF16, {2, 32768}}};
  const std::vector<TensorInfo> infos = {{"ab", DType::kBF16, {5, 32768}}};
  const auto load = [](const CheckpointReader& c, const ParameterSet& s) {
    load_box(c, "a", Box{{0, 0}, {3, 32768}}, s[0].view.narrow(0, 0, 3));
    load_box(c, "b", Box{{0, 0}, {2, 32768}}, s[0].view.narrow(0, 3, 2));
  };
  ASSERT_EQ(wb::layout::ProbePlan(tensors).num_passes(), 2);
  HostParameters params(infos);
  ProbeReport report;
  const SourceMap map = probe_source_map(tensors, params.parameters(), load, {}, &report);
  EXPECT_EQ(report.passes, 4);  // the keyed pass did not decide: the second digit and the verification
  SyntheticCheckpoint checkpoint(tensors, 3);
  HostParameters loaded(infos), applied(infos);
  load(checkpoint, loaded.parameters());
  apply_source_map(map, checkpoint, applied.parameters());
  EXPECT_EQ(std::memcmp(loaded.parameters()[0].view.data, applied.parameters()[0].view.data,
                        loaded.parameters()[0].view.nbytes()), 0);
  ASSERT_EQ(map.copies.size(), 2u);
  EXPECT_EQ(map.copies[1].tensor, 1u);
}

// Three digits (a tensor of 5.1e9 keys): the keyed pass is the third, over cells of the two lower digits,
// here rows across the wrap of those (row 737,280 starts at key 61,440^2).
TEST(Probe, KeyedPassDecidesTheThirdDigit) {
  const std::vector<TensorInfo> tensors = {{"big", DType::kBF16, {1000000, 4000}}, {"e", DType::kBF16, {20, 30}}};
  const std::vector<TensorInfo> infos = {{"across", DType::kBF16, {64, 4000}}, {"start", DType::kBF16, {8, 4000}},
                                         {"e_t", DType::kBF16, {30, 20}}};
  const auto load = [](const CheckpointReader& c, const ParameterSet& s) {
    load_box(c, "big", Box{{737250, 0}, {64, 4000}}, s[0].view);
    load_box(c, "big", Box{{10, 0}, {8, 4000}}, s[1].view);
    load_box(c, "e", Box{{0, 0}, {20, 30}}, s[2].view.transpose(0, 1));
  };
  ASSERT_EQ(wb::layout::ProbePlan(tensors).num_passes(), 3);
  HostParameters params(infos);
  ProbeReport report;
  const SourceMap map = probe_source_map(tensors, params.parameters(), load, {}, &report);
  EXPECT_EQ(report.passes, 3);  // two digit passes and the keyed pass
  ASSERT_EQ(map.copies.size(), 3u);
  EXPECT_EQ(map.copies[0].box, (Box{{737250, 0}, {64, 4000}}));
  EXPECT_EQ(map.copies[1].box, (Box{{10, 0}, {8, 4000}}));
  EXPECT_EQ(map.copies[2].box, (Box{{0, 0}, {20, 30}}));
  EXPECT_EQ(map.copies[2].strides, (Shape{1, 20}));
}

// One element of a large shard that load_weights computes (doubled: a code onto another code) in every pass is
// refused, naming it; one that it writes differently in the keyed pass only is not taken from the keyed pass
// (the plain passes decide, and load_weights copies there).
TEST(Probe, KeyedPassChecksEveryElementOfALargeShard) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {4096, 4096}}};
  const std::vector<TensorInfo> infos = {{"shard", DType::kBF16, {1024, 4096}}};
  const auto copy_shard = [](const CheckpointReader& c, const ParameterSet& s) {
    load_box(c, "w", Box{{2048, 0}, {1024, 4096}}, s[0].view);
  };
  for (const std::int64_t flat : {std::int64_t{0}, std::int64_t{1}, std::int64_t{4096}, std::int64_t{500 * 4096 + 1000},
                                  std::int64_t{1024 * 4096 - 1}}) {
    HostParameters params(infos);
    const std::string element = shape_to_string(Shape{flat / 4096, flat % 4096});
    try {
      (void)probe_source_map(tensors, params.parameters(), [&](const CheckpointReader& c, const ParameterSet& s) {
        copy_shard(c, s);
        auto* bits = static_cast<std::uint16_t*>(s[0].view.data);
        bits[flat] = static_cast<std::uint16_t>(bits[flat] + 0x80);
      });
      ADD_FAILURE() << "a doubled element " << element << " was taken for a copy";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("not a pure copy")) << element;
      EXPECT_THAT(e.what(), HasSubstr("element " + element)) << e.what();
    }
    ProbeReport report;
    const SourceMap map = probe_source_map(tensors, params.parameters(), [&](const CheckpointReader& c, const ParameterSet& s) {
      copy_shard(c, s);
      if (c.source().find("keyed") != std::string::npos) {
        auto* bits = static_cast<std::uint16_t*>(s[0].view.data);
        bits[flat] = static_cast<std::uint16_t>(bits[flat] ^ 0x0100);  // another code of the keyed pass
      }
    }, {}, &report);
    EXPECT_EQ(report.passes, 4) << element;
    ASSERT_EQ(map.copies.size(), 1u) << element;
    EXPECT_EQ(map.copies[0].box, (Box{{2048, 0}, {1024, 4096}})) << element;
  }
}

// The same for a shard that load_weights stores transposed (its keyed pass compared along the parameter's rows,
// ProbeCheckpoint::strided_box_equals): an element it computes anywhere (at either end, inside a 32-element
// vector step, in the middle), is refused, naming that element; one it changes in the keyed pass only sends
// the probe to the plain passes; copied exactly, the shard is one copy decided in two passes.
TEST(Probe, KeyedPassChecksEveryElementOfATransposedShard) {
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {4096, 4096}}};
  const std::vector<TensorInfo> infos = {{"shard_t", DType::kBF16, {2048, 4096}}};
  const auto copy_shard = [](const CheckpointReader& c, const ParameterSet& s) {
    const Box box{{0, 2048}, {4096, 2048}};  // column shard 1 of 2, stored [in, out]
    std::vector<std::uint16_t> scratch(static_cast<std::size_t>(box.numel()));
    c.read_box("w", box, scratch.data());
    copy_tensor(s[0].view.transpose(0, 1), TensorView::contiguous(scratch.data(), DType::kBF16, box.extent));
  };
  for (const std::int64_t flat : {std::int64_t{0}, std::int64_t{33}, std::int64_t{700 * 4096 + 1001}, std::int64_t{2048 * 4096 - 1}}) {
    HostParameters params(infos);
    const std::string element = shape_to_string(Shape{flat / 4096, flat % 4096});
    try {
      (void)probe_source_map(tensors, params.parameters(), [&](const CheckpointReader& c, const ParameterSet& s) {
        copy_shard(c, s);
        auto* bits = static_cast<std::uint16_t*>(s[0].view.data);
        bits[flat] = static_cast<std::uint16_t>(bits[flat] + 0x80);
      });
      ADD_FAILURE() << "a doubled element " << element << " was taken for a copy";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("not a pure copy")) << element;
      EXPECT_THAT(e.what(), HasSubstr("element " + element)) << e.what();
    }
    // Changed in the keyed pass only: not taken from it (the comparison along the rows sees it), so the plain
    // passes decide.
    ProbeReport report;
    const SourceMap map = probe_source_map(tensors, params.parameters(), [&](const CheckpointReader& c, const ParameterSet& s) {
      copy_shard(c, s);
      if (c.source().find("keyed") != std::string::npos) {
        auto* bits = static_cast<std::uint16_t*>(s[0].view.data);
        bits[flat] = static_cast<std::uint16_t>(bits[flat] ^ 0x0100);
      }
    }, {}, &report);
    EXPECT_EQ(report.passes, 4) << element;
    ASSERT_EQ(map.copies.size(), 1u) << element;
    EXPECT_EQ(map.copies[0].box, (Box{{0, 2048}, {4096, 2048}})) << element;
  }
  HostParameters params(infos);
  ProbeReport report;
  const SourceMap map = probe_source_map(tensors, params.parameters(), copy_shard, {}, &report);
  EXPECT_EQ(report.passes, 2);
  ASSERT_EQ(map.copies.size(), 1u);
  EXPECT_EQ(map.copies[0].box, (Box{{0, 2048}, {4096, 2048}}));
  EXPECT_EQ(map.copies[0].strides, (Shape{1, 4096}));
}

}  // namespace
}  // namespace wb::emu
