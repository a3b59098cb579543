#include "layout/probe.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iterator>
#include <optional>
#include <sstream>

#include "core/cuda_device.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "core/stream_copy.hpp"
#include "layout/parameter_copies.hpp"
#include "layout/probe_checkpoint.hpp"
#include "layout/probe_code.hpp"
#include "layout/probe_decoder.hpp"
#include "layout/probe_failure.hpp"
#include "layout/second_difference.hpp"
#include "layout/shared_parameters.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

using layout::ParameterCopies;
using layout::ProbeCheckpoint;
using layout::ProbePlan;
using layout::SavedParameters;
using layout::SparseField;
using layout::kComputed;
using layout::not_a_copy;

// What the parameters hold when load_weights is called: zeros in the digit passes (a region no copy reaches
// then decodes as unsourced), every byte kMarker in the keyed and the verification pass, so that an element still holding
// the marker afterwards was never written, and one holding 0 was written with a constant.
enum class Fill { kZero, kMarker };
// All-ones bytes are no digit code of any dtype (a NaN, or past the integer codes), so no value of the keyed
// pass equals the marker: an element load_weights leaves unwritten there is never taken for a copy.
constexpr unsigned char kMarker = 0xFF;

// With streaming stores: load_weights writes most elements again before anything reads them.
void fill_parameters(const ParameterSet& params, Fill fill) {
  for (const Parameter& p : params)
    set_streaming(static_cast<std::byte*>(p.view.data), fill == Fill::kZero ? 0 : kMarker, p.view.nbytes());
  fence_streaming_stores();
}

// One probe pass: prepare the parameters as `fill` says, then run load_weights on `probe`.
using PassLoader = std::function<void(const CheckpointReader& probe, Fill fill)>;

// The elements of a parameter after the verification pass, by what they hold.
struct MarkedElements {
  std::int64_t marker = 0;  // the marker: never written, or a copy set back to the marker
  std::int64_t zero = 0;    // 0: written with a constant
};

// Counts the elements [first, n) of the parameter that hold the marker and those that are 0; any other
// element is a value no decoded copy explains.
MarkedElements count_marked(const Parameter& param, std::int64_t first, std::int64_t n) {
  const auto* bytes = static_cast<const unsigned char*>(param.view.data);
  const std::size_t element = param.view.element_size();
  MarkedElements count;
  const auto one = [&](std::int64_t e) {
    const unsigned char* at = bytes + e * static_cast<std::int64_t>(element);
    bool marker = true, zero = true;
    for (std::size_t b = 0; b < element; ++b) {
      marker = marker && at[b] == kMarker;
      zero = zero && at[b] == 0;
    }
    if (marker) ++count.marker;
    else if (zero) ++count.zero;
    else not_a_copy(param, e, kComputed, "a value that no decoded copy explains");
  };
  std::int64_t e = first;
  if (8 % element == 0) {
    // Eight bytes at a time: long runs of one kind are the common case.
    constexpr std::uint64_t kMarkerWord = 0x0101010101010101ULL * kMarker;
    const auto per_word = static_cast<std::int64_t>(8 / element);
    for (; e + per_word <= n; e += per_word) {
      std::uint64_t word;
      std::memcpy(&word, bytes + e * static_cast<std::int64_t>(element), 8);
      if (word == kMarkerWord) count.marker += per_word;
      else if (word == 0) count.zero += per_word;
      else
        for (std::int64_t k = 0; k < per_word; ++k) one(e + k);
    }
  }
  for (; e < n; ++e) one(e);
  return count;
}

// Whether a box with `strides` in the parameter fills one contiguous run of it, in the box's row-major order.
bool dense_in_parameter(const Shape& extent, const Shape& strides) {
  std::int64_t run = 1;
  for (std::size_t a = extent.size(); a-- > 0;) {
    if (extent[a] > 1 && strides[a] != run) return false;
    run *= extent[a];
  }
  return true;
}

// Whether a box with `strides` in the parameter fills one contiguous run of it in some order of its axes:
// sorted by stride, each long axis' stride is the product of the extents inside it (then the run starts
// at the box's offset, every stride being positive).
bool fills_one_run(const Shape& extent, const Shape& strides) {
  std::array<std::pair<std::int64_t, std::int64_t>, 16> axes;  // (stride, extent) of the long axes
  std::size_t n = 0;
  for (std::size_t a = 0; a < extent.size(); ++a) {
    if (extent[a] < 2) continue;
    if (n == axes.size() || strides[a] <= 0) return false;
    axes[n++] = {strides[a], extent[a]};
  }
  std::sort(axes.begin(), axes.begin() + static_cast<std::ptrdiff_t>(n));
  std::int64_t run = 1;
  for (std::size_t k = 0; k < n; ++k) {
    if (axes[k].first != run) return false;
    run *= axes[k].second;
  }
  return true;
}

// The elements of a parameter that its copies fill, when each copy fills one run of it: then only the
// elements between the runs need the scan for the marker after the replay.
struct CopiedRuns {
  bool all_runs = true;
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // [first, end) of each copy
};

// Counts what lies between the runs (sorted here); runs that overlap are copies that claim an element twice.
MarkedElements count_between_runs(const Parameter& param, CopiedRuns& copied) {
  std::sort(copied.runs.begin(), copied.runs.end());
  MarkedElements total;
  std::int64_t at = 0;
  const auto add = [&](std::int64_t end) {
    const MarkedElements gap = count_marked(param, at, end);
    total.marker += gap.marker;
    total.zero += gap.zero;
  };
  for (const auto& [first, end] : copied.runs) {
    if (first < at)
      not_a_copy(param, first, kComputed, "two decoded copies cover this element");
    add(first);
    at = end;
  }
  add(param.view.numel());
  return total;
}

// Replays the decoded copies against the verification values load_weights just wrote (into parameters that
// held the marker): each copied element must match. In a parameter whose copies each fill one run of it,
// the elements between the runs must then hold the marker (never written) or 0 (a constant load_weights
// wrote); in any other parameter the copied elements are set back to the marker and the whole parameter is
// scanned so (1 GiB of bf16 shards: 0.08-0.1 s less than resetting and scanning every parameter). Returns the
// accounting of every parameter's elements.
std::vector<ParameterAccount> verify_against_load(const SourceMap& map, const ProbeCheckpoint& probe,
                                                  const ParameterSet& params) {
  constexpr std::int64_t kChunk = 1 << 20;
  std::vector<CopiedRuns> copied_runs(params.size());
  for (const SliceCopy& copy : map.copies) {
    CopiedRuns& runs = copied_runs[copy.parameter];
    runs.all_runs = runs.all_runs && fills_one_run(copy.box.extent, copy.strides);
    runs.runs.emplace_back(copy.offset, copy.offset + copy.box.numel());
  }
  std::vector<std::byte> expected;
  std::vector<std::byte> marks;  // kMarker bytes, grown once: a fresh buffer per chunk costs page faults
  Box part;                      // assigned in place: no allocation per copy (100,000 copies on a rank)
  for (const SliceCopy& copy : map.copies) {
    const Parameter& param = params[copy.parameter];
    const bool keep = copied_runs[copy.parameter].all_runs;  // copied elements keep their values
    const TensorInfo& tensor = probe.tensors()[copy.tensor];
    const std::size_t element = dtype_size(tensor.dtype);
    // Box rows in chunks so that the scratch stays small whatever the copy's size.
    const std::int64_t rows = copy.box.extent.empty() ? 1 : copy.box.extent[0];
    const std::int64_t per_row = copy.box.extent.empty() ? 1 : copy.box.numel() / std::max<std::int64_t>(rows, 1);
    const std::int64_t step = std::max<std::int64_t>(1, kChunk / std::max<std::int64_t>(per_row, 1));
    // A copy that fills one run of the parameter in another order (a transpose) goes back to the marker
    // as that run, in one memset once all its chunks compared, not by a strided walk per chunk.
    const bool one_run = fills_one_run(copy.box.extent, copy.strides);
    const auto set_back = [&] {
      std::memset(static_cast<std::byte*>(param.view.data) + copy.offset * static_cast<std::int64_t>(element), kMarker,
                  static_cast<std::size_t>(copy.box.numel()) * element);
    };
    // A transposed copy of the keyed pass: compared whole, in registers along the parameter's contiguous axis
    // (ProbeCheckpoint::strided_box_equals), not by writing its codes into a buffer and comparing that with a
    // transposed walk (bench_probe, a quarter of 1 GiB of bf16 transposed: verification 0.12-0.13 -> 0.075 CPU-s).
    // Safe: it tests the same thing, each element against the keyed code of its key, so only a copy that the
    // chunks below would pass is passed here; a mismatch, or a copy it does not apply to, takes the chunks,
    // which name the element.
    if (probe.keyed() && element == 2 && (keep || one_run) && !dense_in_parameter(copy.box.extent, copy.strides) &&
        probe.strided_box_equals(copy.tensor, copy.box,
                                 static_cast<std::byte*>(param.view.data) + copy.offset * static_cast<std::int64_t>(element),
                                 copy.strides)
            .value_or(false)) {
      if (!keep) set_back();
      continue;
    }
    for (std::int64_t row = 0; row < rows; row += step) {
      part.offset.assign(copy.box.offset.begin(), copy.box.offset.end());
      part.extent.assign(copy.box.extent.begin(), copy.box.extent.end());
      std::int64_t offset = copy.offset;
      if (!part.extent.empty()) {
        part.offset[0] += row;
        part.extent[0] = std::min(step, rows - row);
        offset += row * copy.strides[0];
      }
      // The common copy: one run of the parameter, compared in place, without views: the keyed pass's 2-byte
      // codes without writing the expected values anywhere (ProbeCheckpoint::box_equals), other values
      // against the box read. A mismatch takes the general path below, which names the element.
      const bool dense = dense_in_parameter(part.extent, copy.strides);
      std::byte* at = static_cast<std::byte*>(param.view.data) + offset * static_cast<std::int64_t>(element);
      const auto bytes = static_cast<std::size_t>(part.numel()) * element;
      const bool in_registers = dense && probe.keyed() && element == 2;
      if (in_registers && probe.box_equals(copy.tensor, part, at)) {  // by index: the map's order is not the list's
        if (!keep) std::memset(at, kMarker, bytes);
        continue;
      }
      expected.resize(bytes);
      probe.read_box(copy.tensor, part, expected.data());
      if (dense && !in_registers && std::memcmp(at, expected.data(), bytes) == 0) {
        if (!keep) std::memset(at, kMarker, bytes);
        continue;
      }
      TensorView target = param.view;
      target.data = static_cast<std::byte*>(param.view.data) + offset * static_cast<std::int64_t>(element);
      target.shape = part.extent;
      target.strides = copy.strides;
      const TensorView want = TensorView::contiguous(expected.data(), tensor.dtype, part.extent);
      if (!tensors_bitwise_equal(target, want)) {
        // Find the first differing element for the message.
        std::int64_t flat = 0;
        Shape index(part.extent.size(), 0);
        for (std::int64_t k = 0; k < part.numel(); ++k) {
          std::int64_t at = offset;
          for (std::size_t a = 0; a < index.size(); ++a) at += index[a] * copy.strides[a];
          if (std::memcmp(static_cast<std::byte*>(param.view.data) + at * static_cast<std::int64_t>(element),
                          expected.data() + k * static_cast<std::int64_t>(element), element) != 0) {
            flat = at;
            break;
          }
          for (std::size_t a = index.size(); a-- > 0;) {
            if (++index[a] < part.extent[a]) break;
            index[a] = 0;
          }
        }
        not_a_copy(param, flat,
                   "it equals a checkpoint element only for some values: load_weights computes it (from " + tensor.name +
                       part.to_string() + ")",
                   "the decoded copy does not reproduce load_weights when the values are not coordinates");
      }
      // Copied elements back to the marker: the final scan then finds anything load_weights wrote that no
      // copy explains.
      if (one_run) continue;
      if (marks.size() < expected.size()) marks.assign(expected.size(), std::byte{kMarker});
      copy_tensor(target, TensorView::contiguous(marks.data(), tensor.dtype, part.extent));
    }
    if (one_run && !keep) set_back();
  }
  std::vector<std::int64_t> copied(params.size(), 0);
  for (const SliceCopy& copy : map.copies) copied[copy.parameter] += copy.box.numel();
  std::vector<ParameterAccount> accounts;
  accounts.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (copied_runs[i].all_runs) {
      // The copied elements matched (and were not set back to the marker): the rest is never written or a constant.
      const MarkedElements rest = count_between_runs(params[i], copied_runs[i]);
      accounts.push_back({copied[i], rest.zero, rest.marker});
      continue;
    }
    const MarkedElements marked = count_marked(params[i], 0, params[i].view.numel());
    // Copies of one parameter never overlap (the map is normalized): their elements are among the marked.
    if (marked.marker < copied[i])
      not_a_copy(params[i], 0, kComputed,
                 "the decoded copies cover " + std::to_string(copied[i]) + " elements, more than the " +
                     std::to_string(marked.marker) + " that the verification pass found copied or unwritten");
    accounts.push_back({copied[i], marked.zero, marked.marker - copied[i]});
  }
  return accounts;
}

// The calling thread's CPU time: what the probe costs on a machine shared with other work.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Wall and CPU time of one phase of the probe, summed over its intervals.
struct PhaseTime {
  double wall = 0, cpu = 0;
  std::chrono::steady_clock::time_point wall_start;
  double cpu_start = 0;
  bool running = false;
  void start() {
    wall_start = std::chrono::steady_clock::now();
    cpu_start = thread_cpu_seconds();
    running = true;
  }
  void stop() {  // also after an exception left the phase, or when it did not start
    if (!running) return;
    wall += seconds_since(wall_start);
    cpu += thread_cpu_seconds() - cpu_start;
    running = false;
  }
};

// Whether the keyed pass replaces the last digit pass: plans of two passes or more whose tensors are 2-byte
// codes but for a few (4 M keys at most of the other dtypes: f32 biases and scales), whose keyed values take
// 16-bit lanes (ProbeCheckpoint); the others compute a 64-bit hash per element, twice (load_weights and the
// replay).
bool keyed_pass_applies(const ProbePlan& plan) {
  constexpr std::uint64_t kOtherKeys = 1 << 22;
  if (plan.num_passes() < 2) return false;
  std::uint64_t other = 0;
  for (int d = 0; d < kNumDTypes; ++d)
    if (dtype_size(static_cast<DType>(d)) != 2) other += plan.key_range(static_cast<DType>(d));
  return other <= kOtherKeys;
}

// The probe on host parameters; `run` prepares them and calls load_weights for each pass.
SourceMap probe_host(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params, const PassLoader& run,
                     const ProbeOptions& options, ProbeReport* report) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  ProbePlan plan(checkpoint_tensors);
  ProbeCheckpoint probe(checkpoint_tensors, plan);
  PhaseTime decode, load, verify, save;
  save.start();
  // Destroyed (the contents written back, the copies unmapped) before the report is made, so that its
  // times cover that too; when the probe throws, on the way out.
  std::optional<SavedParameters> saved(std::in_place, params);
  const std::size_t saved_bytes = saved->bytes();
  save.stop();

  // passes[p][i]: the nonzeros of pass p in parameter i.
  std::vector<std::vector<SparseField>> passes;
  std::size_t sparse_bytes = 0;
  const auto digit_pass = [&](int p) {
    probe.set_pass(p);
    load.start();
    run(probe, Fill::kZero);
    load.stop();
    decode.start();
    auto& fields = passes.emplace_back();
    fields.reserve(params.size());
    for (const Parameter& param : params) {
      const layout::CodeSpace space = layout::code_space(param.view.dtype);
      fields.push_back(layout::second_differences(param.view.data, static_cast<int>(param.view.element_size()),
                                                  param.view.shape, space.lo));
      if (!fields.back().complete)
        not_a_copy(param, fields.back().covered, kComputed, "the values are not piecewise affine (too many breaks to be copies)");
      sparse_bytes += fields.back().flat_positions.size() * 16;
    }
    decode.stop();
  };
  // The map from the digit passes so far (and, keyed, the keyed pass the parameters hold).
  const auto decode_map = [&](bool keyed) {
    decode.start();
    SourceMap map;
    for (const Parameter& param : params) map.parameters.push_back(TensorInfo{param.name, param.view.dtype, param.view.shape});
    // Normalized parameter by parameter: copies of different parameters never merge and the normal order
    // starts with the parameter, so this is the map's normal form, in small sorts (100,000 tensors: one
    // sort of the whole map per axis and sweep took 14% of the probe).
    SourceMap one;
    std::vector<const SparseField*> fields;
    for (std::size_t i = 0; i < params.size(); ++i) {
      fields.clear();
      for (const auto& pass : passes) fields.push_back(&pass[i]);
      one.copies.clear();
      std::optional<layout::KeyedDigit> digit;
      if (keyed) digit.emplace(options.verification_seed, params[i].view.dtype, plan);
      layout::decode_parameter(params[i], static_cast<std::uint32_t>(i), plan, checkpoint_tensors, fields, one.copies,
                               keyed ? &*digit : nullptr);
      one = normalize_source_map(std::move(one));
      if (keyed && !layout::keyed_copies_checked(one.copies))
        not_a_copy(params[i], 0, kComputed, "a copy too small for the keyed pass to check");
      std::move(one.copies.begin(), one.copies.end(), std::back_inserter(map.copies));
    }
    validate_source_map(map, checkpoint_tensors);
    decode.stop();
    return map;
  };
  const auto load_and_verify = [&](const SourceMap& map) {
    load.start();
    run(probe, Fill::kMarker);
    load.stop();
    verify.start();
    std::vector<ParameterAccount> accounts = verify_against_load(map, probe, params);
    verify.stop();
    return accounts;
  };

  // Two passes or more (keyed_pass_applies): the digit passes but the last, then the keyed pass, which both
  // decides the top digit and verifies (one load_weights pass fewer). Where it cannot (a copy too small to check; a mismatch: a top
  // digit that changes inside a cell of the lower digits, or a loader that computes), the plain last digit pass
  // and the verification pass follow, and decide as before.
  const int digit_passes = plan.num_passes();
  SourceMap map;
  std::vector<ParameterAccount> accounts;
  int load_passes = digit_passes + 1;
  bool decided = false;
  if (keyed_pass_applies(plan)) {
    for (int p = 0; p + 1 < digit_passes; ++p) digit_pass(p);
    probe.set_keyed(options.verification_seed);
    load.start();
    run(probe, Fill::kMarker);
    load.stop();
    try {
      map = decode_map(true);
      verify.start();
      accounts = verify_against_load(map, probe, params);
      verify.stop();
      load_passes = digit_passes;
      decided = true;
    } catch (const Error& e) {
      decode.stop();
      verify.stop();
      WB_LOG(kDebug) << "probe: the keyed pass does not decide the map (" << e.what() << "); the last digit pass and the verification pass follow";
      load_passes = digit_passes + 2;
    }
  }
  if (!decided) {
    for (int p = static_cast<int>(passes.size()); p < digit_passes; ++p) digit_pass(p);
    map = decode_map(false);
    passes.clear();
    probe.set_verification(options.verification_seed);
    accounts = load_and_verify(map);
  }
  passes.clear();
  save.start();
  saved.reset();
  save.stop();

  if (report != nullptr) {
    report->passes = load_passes;
    report->decode_seconds = decode.wall;
    report->load_seconds = load.wall;
    report->verify_seconds = verify.wall;
    report->decode_cpu_seconds = decode.cpu;
    report->load_cpu_seconds = load.cpu;
    report->verify_cpu_seconds = verify.cpu;
    report->save_seconds = save.wall;
    report->save_cpu_seconds = save.cpu;
    report->parameter_bytes = params.total_bytes();
    report->scratch_bytes = saved_bytes;
    report->sparse_bytes = sparse_bytes;
    report->copies = map.copies.size();
    report->serialized_bytes = serialize_source_map(map).size();
    report->seconds = seconds_since(start);
    report->cpu_seconds = thread_cpu_seconds() - cpu_start;
    report->accounts = std::move(accounts);
  }
  WB_LOG(kDebug) << "probe: " << params.size() << " parameters, " << map.copies.size() << " copies, "
                 << load_passes << " load_weights passes, " << seconds_since(start) << " s, CPU "
                 << thread_cpu_seconds() - cpu_start << " s (load " << load.wall << " s, decode " << decode.wall
                 << " s, verify " << verify.wall << " s, save and restore " << save.wall << " s; CPU load " << load.cpu
                 << " s, decode " << decode.cpu << " s, verify " << verify.cpu << " s, save and restore " << save.cpu << " s)";
  return map;
}


SourceMap probe_device_parameters(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params,
                                  const ProbeLoader& load_weights, const ProbeOptions& options, ProbeReport* report) {
  const Parameter& first = params[0];
  for (const Parameter& p : params)
    if (p.view.memory != MemoryKind::kCuda || p.view.device != first.view.device)
      throw Error(ErrorCode::kInvalidArgument,
                  "probe: parameter " + p.name + " is in " +
                      (p.view.memory == MemoryKind::kCuda ? "the memory of CUDA device " + std::to_string(p.view.device)
                                                          : std::string("host memory")) +
                      ", parameter " + first.name + " in that of CUDA device " + std::to_string(first.view.device) +
                      ": a worker's parameters are all in host memory or all on one device");
  DeviceCopyStream stream(first.view.device);
  ParameterAccess access;
  // Host <-> device copies wait at once (the host copy is read next); zeroes are waited for by the next read.
  access.read = [&stream](const Parameter& p, void* host) {
    throw_if_error(stream.copy(host, p.view.data, p.view.nbytes()));
    throw_if_error(stream.wait());
  };
  access.write = [&stream](const Parameter& p, const void* host) {
    throw_if_error(stream.copy(p.view.data, host, p.view.nbytes()));
  };
  access.zero = [&stream](const Parameter& p) { throw_if_error(stream.zero(p.view.data, p.view.nbytes())); };
  // load_weights fills the parameters on streams of its own (or the legacy one): the probe's copies start
  // after them and the zeroes finish before load_weights runs.
  const int device = first.view.device;
  access.done = [&stream, device] {
    throw_if_error(stream.wait());
    DeviceGuard current(device);
    cuda_synchronize();
  };
  return probe_source_map_through(checkpoint_tensors, params, load_weights, access, options, report);
}

}  // namespace

SourceMap probe_source_map_through(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params,
                                   const ProbeLoader& load_weights, const ParameterAccess& access,
                                   const ProbeOptions& options, ProbeReport* report) {
  if (const layout::SharedParameters shared = layout::find_shared_parameters(params); shared.any()) {
    const ProbeLoader whole = [&](const CheckpointReader& probe, const ParameterSet&) { load_weights(probe, params); };
    const SourceMap map = probe_source_map_through(checkpoint_tensors, shared.distinct, whole, access, options, report);
    return layout::expand_shared_parameters(map, params, shared, checkpoint_tensors, report);
  }
  const auto done = [&access] {
    if (access.done) access.done();
  };
  const ParameterCopies host(params);
  const ParameterSet& copies = host.views();
  for (std::size_t i = 0; i < params.size(); ++i) access.read(params[i], copies[i].view.data);
  done();
  const PassLoader through = [&](const CheckpointReader& probe, Fill fill) {
    if (fill == Fill::kZero) {
      for (const Parameter& p : params) access.zero(p);
    } else {
      fill_parameters(copies, fill);  // the host copies are read back after load_weights anyway
      for (std::size_t i = 0; i < params.size(); ++i) access.write(params[i], copies[i].view.data);
    }
    done();
    load_weights(probe, params);
    done();
    for (std::size_t i = 0; i < params.size(); ++i) access.read(params[i], copies[i].view.data);
    done();
  };
  const auto restore = [&] {
    for (std::size_t i = 0; i < params.size(); ++i) access.write(params[i], copies[i].view.data);
    done();
  };
  SourceMap map;
  try {
    // The host probe restores the copies' contents when it ends, failed or not; they go back to the parameters.
    map = probe_host(checkpoint_tensors, copies, through, options, report);
  } catch (...) {
    try {
      restore();
    } catch (const Error& e) {
      WB_LOG(kWarn) << "probe: the parameters' contents could not be restored after a failed probe: " << e.what();
    }
    throw;
  }
  restore();
  if (report != nullptr) report->scratch_bytes += params.total_bytes();
  return map;
}

SourceMap probe_source_map(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params,
                           const ProbeLoader& load_weights, const ProbeOptions& options, ProbeReport* report) {
  bool any_cuda = false;
  for (const Parameter& p : params) {
    if (!p.view.is_contiguous()) throw Error(ErrorCode::kInvalidArgument, "probe: parameter " + p.name + " is not contiguous");
    any_cuda = any_cuda || p.view.memory == MemoryKind::kCuda;
  }
  if (const layout::SharedParameters shared = layout::find_shared_parameters(params); shared.any()) {
    // load_weights still gets every name: it may write the shared memory under either.
    const ProbeLoader whole = [&](const CheckpointReader& probe, const ParameterSet&) { load_weights(probe, params); };
    const SourceMap map = probe_source_map(checkpoint_tensors, shared.distinct, whole, options, report);
    return layout::expand_shared_parameters(map, params, shared, checkpoint_tensors, report);
  }
  if (any_cuda) return probe_device_parameters(checkpoint_tensors, params, load_weights, options, report);
  return probe_host(checkpoint_tensors, params,
                    [&](const CheckpointReader& probe, Fill fill) {
                      fill_parameters(params, fill);
                      load_weights(probe, params);
                    },
                    options, report);
}

}  // namespace wb
