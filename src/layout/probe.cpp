#include "layout/probe.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iterator>
#include <sstream>

#include "core/cuda_device.hpp"
#include "core/device.hpp"
#include "core/log.hpp"
#include "layout/parameter_copies.hpp"
#include "layout/probe_checkpoint.hpp"
#include "layout/probe_code.hpp"
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

std::string index_text(const Shape& shape, std::int64_t flat) {
  Shape index(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    index[a] = shape[a] == 0 ? 0 : flat % shape[a];
    flat = shape[a] == 0 ? 0 : flat / shape[a];
  }
  return shape_to_string(index);
}

// What the user reads: which element, and that load_weights computed its value instead of copying it; the
// probe's own finding follows in parentheses, for whoever debugs the loader.
constexpr const char* kComputed =
    "the value load_weights wrote there is not a checkpoint value: it was computed (scaled, converted, combined "
    "or made up), not copied";

[[noreturn]] void not_a_copy(const Parameter& param, std::int64_t flat, const std::string& what, const std::string& detail) {
  throw Error(ErrorCode::kInvalidArgument, "load_weights is not a pure copy: parameter " + param.name + ", element " +
                                               index_text(param.view.shape, flat) + ": " + what + " (probe: " + detail + ")");
}

// What the parameters hold when load_weights is called: zeros in the digit passes (a region no copy reaches
// then decodes as unsourced), every byte kMarker in the verification pass, so that an element still holding
// the marker afterwards was never written, and one holding 0 was written with a constant.
enum class Fill { kZero, kMarker };
constexpr unsigned char kMarker = 0xA5;

void fill_parameters(const ParameterSet& params, Fill fill) {
  for (const Parameter& p : params) std::memset(p.view.data, fill == Fill::kZero ? 0 : kMarker, p.view.nbytes());
}

// One probe pass: prepare the parameters as `fill` says, then run load_weights on `probe`.
using PassLoader = std::function<void(const CheckpointReader& probe, Fill fill)>;

// One cell of the cut grid of a parameter: the key at its corner and the key's step along each axis (the
// key is affine inside a cell; modulo 2^64, as the second differences work).
struct Cell {
  Shape corner;
  Shape extent;
  std::uint64_t key = 0;
  std::vector<std::uint64_t> step;  // step[a]: change of the key per step along parameter axis a
};

// Decodes the passes of one parameter into slice copies (appended to `out`).
class ParameterDecoder {
 public:
  ParameterDecoder(const Parameter& param, std::uint32_t index, const ProbePlan& plan,
                   const std::vector<TensorInfo>& tensors, const std::vector<const SparseField*>& passes)
      : param_(param), index_(index), plan_(plan), tensors_(tensors), passes_(passes),
        space_(layout::digit_space(param.view.dtype)) {}

  void decode(std::vector<SliceCopy>& out) {
    const Shape& shape = param_.view.shape;
    const int ndim = static_cast<int>(shape.size());
    if (param_.view.numel() == 0) return;
    strides_ = contiguous_strides(shape);
    // Cut lines: every coordinate where some pass has a nonzero, plus the start of each axis.
    cuts_.assign(static_cast<std::size_t>(ndim), {});
    std::vector<std::vector<std::int64_t>> points(static_cast<std::size_t>(ndim));
    for (int a = 0; a < ndim; ++a) {
      std::vector<std::int64_t>& cuts = cuts_[static_cast<std::size_t>(a)];
      cuts.push_back(0);
      for (const SparseField* field : passes_) {
        const auto coords = layout::nonzero_coordinates(*field, a);
        cuts.insert(cuts.end(), coords.begin(), coords.end());
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      // Values at each corner and one step further along the axis give the slopes.
      std::vector<std::int64_t>& p = points[static_cast<std::size_t>(a)];
      for (std::int64_t c : cuts) {
        p.push_back(c);
        if (c + 1 < shape[static_cast<std::size_t>(a)]) p.push_back(c + 1);
      }
      std::sort(p.begin(), p.end());
      p.erase(std::unique(p.begin(), p.end()), p.end());
    }
    points_ = points;
    values_.clear();
    for (const SparseField* field : passes_) values_.push_back(layout::evaluate_grid(*field, points_));

    // Walk every cell of the cut grid.
    std::vector<std::size_t> cell(static_cast<std::size_t>(ndim), 0);
    pieces_.resize(static_cast<std::size_t>(ndim) + 1);  // emit's pieces, one per depth of splitting
    Cell& c = pieces_[0];
    while (true) {
      if (make_cell(cell, c)) emit(0, out);
      int a = ndim - 1;
      for (; a >= 0; --a) {
        if (++cell[static_cast<std::size_t>(a)] < cuts_[static_cast<std::size_t>(a)].size()) break;
        cell[static_cast<std::size_t>(a)] = 0;
      }
      if (a < 0) break;
    }
  }

 private:
  // Flat index into values_[p] of a grid point given per-axis coordinates.
  std::size_t grid_index(const Shape& at) const {
    std::size_t flat = 0;
    for (std::size_t a = 0; a < at.size(); ++a) {
      const auto& p = points_[a];
      const auto pos = static_cast<std::size_t>(std::lower_bound(p.begin(), p.end(), at[a]) - p.begin());
      flat = flat * p.size() + pos;
    }
    return flat;
  }

  std::int64_t flat_of(const Shape& at) const {
    std::int64_t flat = 0;
    for (std::size_t a = 0; a < at.size(); ++a) flat += at[a] * strides_[a];
    return flat;
  }

  // The key at grid point `point` from its digit in every pass; false when every pass left the sentinel
  // there (no checkpoint element reached it). Throws on bits that are no code, or a sentinel in some passes only.
  bool key_at(std::size_t point, const Shape& at, std::uint64_t& key) const {
    const auto sentinel = -static_cast<std::int64_t>(space_.lo);
    const bool unsourced = values_[0][point] == sentinel;
    std::uint64_t place = 1, term = 0;
    bool overflow = false;
    key = 0;
    for (std::size_t p = 0; p < passes_.size(); ++p) {
      const std::int64_t v = values_[p][point];
      const auto digit = space_.digit(static_cast<std::uint64_t>(v));
      if ((v == sentinel) != unsourced || (!unsourced && !digit))
        not_a_copy(param_, flat_of(at), kComputed, "bits that are no probe code in pass " + std::to_string(p));
      if (unsourced) continue;
      overflow = overflow || __builtin_mul_overflow(*digit, place, &term) || __builtin_add_overflow(key, term, &key);
      if (p + 1 < passes_.size()) overflow = overflow || __builtin_mul_overflow(place, space_.size, &place);
    }
    if (overflow) not_a_copy(param_, flat_of(at), kComputed, "the codes decode to a key past 2^64");
    return !unsourced;
  }

  // The cell's corner key and steps; false for padding (no source), which must be uniform.
  bool make_cell(const std::vector<std::size_t>& cell_index, Cell& c) const {
    const Shape& shape = param_.view.shape;
    const std::size_t ndim = shape.size();
    c.corner.resize(ndim);
    c.extent.resize(ndim);
    for (std::size_t a = 0; a < ndim; ++a) {
      const auto& cuts = cuts_[a];
      c.corner[a] = cuts[cell_index[a]];
      c.extent[a] = (cell_index[a] + 1 < cuts.size() ? cuts[cell_index[a] + 1] : shape[a]) - c.corner[a];
    }
    const bool sourced = key_at(grid_index(c.corner), c.corner, c.key);
    c.step.assign(ndim, 0);
    Shape& next = next_;
    next = c.corner;
    for (std::size_t a = 0; a < ndim; ++a) {
      if (c.extent[a] < 2) continue;
      ++next[a];
      std::uint64_t key = 0;
      if (key_at(grid_index(next), next, key) != sourced)
        not_a_copy(param_, flat_of(c.corner), kComputed, "a region no checkpoint element reaches is not uniform");
      c.step[a] = key - c.key;
      if (!sourced) {
        // Padding: every pass must hold the sentinel all along (its second differences are 0 only then).
        for (std::size_t p = 0; p < passes_.size(); ++p)
          if (values_[p][grid_index(next)] != values_[p][grid_index(c.corner)])
            not_a_copy(param_, flat_of(c.corner), kComputed, "a region no checkpoint element reaches is not uniform");
      }
      --next[a];
    }
    return sourced;
  }

  // The checkpoint element a key names, of the parameter's dtype (a dtype the loader converted decodes to
  // no element, or to one the verification pass then refutes).
  std::size_t element_of(std::uint64_t key, const Cell& c, Shape& index) const {
    std::size_t tensor = 0;
    if (!plan_.element(param_.view.dtype, key, tensor, index))
      not_a_copy(param_, flat_of(c.corner), kComputed,
                 "the codes decode to no element of a " + std::string(dtype_name(param_.view.dtype)) + " tensor");
    return tensor;
  }

  // A cell is one slice copy when its corner and one step along every long axis decode to elements of one
  // tensor, every coordinate stays inside the tensor over the whole cell (then, the key being affine in the
  // tensor's coordinates, every element of the cell is the one the copy says), every parameter axis it spans
  // walks exactly one checkpoint axis with step 1 and no checkpoint axis is walked by two parameter axes.
  // Otherwise it is split along the axis that leaves the tensor (experts e = 0, 1, ... stored one after
  // another) or its first long axis (a parameter axis folded onto a checkpoint axis, e.g. [experts, rows]
  // from rows), each piece keyed from the affine key, and the pieces are merged again by normalization.
  void emit(std::size_t depth, std::vector<SliceCopy>& out) {
    const Cell& c = pieces_[depth];
    const std::size_t ndim = c.corner.size();
    Shape& at = at_;  // scratch: a split no longer needs them
    Shape& next = stepped_;
    const std::size_t tensor = element_of(c.key, c, at);
    const Shape& tshape = tensors_[tensor].shape;
    const std::size_t tensor_ndim = tshape.size();
    std::vector<std::int64_t>& slope = slope_;  // slope[t * ndim + a]: coordinate t per step along axis a
    slope.assign(tensor_ndim * ndim, 0);
    std::size_t split = ndim;
    for (std::size_t a = 0; a < ndim && split == ndim; ++a) {
      if (c.extent[a] < 2) continue;
      if (element_of(c.key + c.step[a], c, next) != tensor) {
        split = a;
        break;
      }
      for (std::size_t t = 0; t < tensor_ndim; ++t) slope[t * ndim + a] = next[t] - at[t];
    }
    if (split == ndim) {
      bool one_copy = true;
      for (std::size_t t = 0; t < tensor_ndim && one_copy; ++t) {
        std::int64_t lo = at[t], hi = at[t];
        for (std::size_t a = 0; a < ndim && one_copy; ++a) {
          const std::int64_t k = slope[t * ndim + a];
          std::int64_t move = 0;
          one_copy = !__builtin_mul_overflow(k, c.extent[a] - 1, &move) &&
                     !__builtin_add_overflow(k < 0 ? lo : hi, move, k < 0 ? &lo : &hi);
        }
        one_copy = one_copy && lo >= 0 && hi < tshape[t];
      }
      std::vector<int>& driver = driver_;
      driver.assign(tensor_ndim, -1);
      for (std::size_t a = 0; a < ndim && one_copy; ++a) {
        if (c.extent[a] < 2) continue;
        int walked = -1;
        for (std::size_t t = 0; t < tensor_ndim; ++t) {
          const std::int64_t k = slope[t * ndim + a];
          if (k == 0) continue;
          if (walked >= 0 || k != 1 || driver[t] >= 0) one_copy = false;
          walked = static_cast<int>(t);
          if (one_copy) driver[t] = static_cast<int>(a);
        }
        if (walked < 0) one_copy = false;  // an axis that reads one element many times is no copy
      }
      if (one_copy) {
        emit_copy(c, tensor, at, driver, out);
        return;
      }
      for (std::size_t a = 0; a < ndim && split == ndim; ++a)
        if (c.extent[a] > 1) split = a;
    }
    if (++splits_ > std::max<std::int64_t>(4096, param_.view.numel() / 8))
      not_a_copy(param_, flat_of(c.corner), kComputed, "the values are not piecewise affine in the parameter's index");
    // Pieces of extent 1 along `split`: each splits further along other axes only, so depth stays <= ndim.
    if (pieces_.size() < depth + 2) pieces_.resize(depth + 2);
    for (std::int64_t i = 0; i < pieces_[depth].extent[split]; ++i) {
      const Cell& whole = pieces_[depth];
      Cell& piece = pieces_[depth + 1];
      piece.corner.assign(whole.corner.begin(), whole.corner.end());
      piece.extent.assign(whole.extent.begin(), whole.extent.end());
      piece.step.assign(whole.step.begin(), whole.step.end());
      piece.corner[split] += i;
      piece.extent[split] = 1;
      piece.key = whole.key + whole.step[split] * static_cast<std::uint64_t>(i);
      emit(depth + 1, out);
    }
  }

  void emit_copy(const Cell& c, std::size_t tensor, const Shape& at, const std::vector<int>& driver,
                 std::vector<SliceCopy>& out) const {
    const std::size_t tensor_ndim = driver.size();
    SliceCopy copy;
    copy.tensor = static_cast<std::uint32_t>(tensor);
    copy.parameter = index_;
    copy.box.offset = at;
    copy.box.extent.assign(tensor_ndim, 1);
    copy.strides.assign(tensor_ndim, 0);
    for (std::size_t t = 0; t < tensor_ndim; ++t) {
      if (driver[t] < 0) continue;
      copy.box.extent[t] = c.extent[static_cast<std::size_t>(driver[t])];
      copy.strides[t] = strides_[static_cast<std::size_t>(driver[t])];
    }
    copy.offset = flat_of(c.corner);
    out.push_back(std::move(copy));
  }

  const Parameter& param_;
  std::uint32_t index_;
  const ProbePlan& plan_;
  const std::vector<TensorInfo>& tensors_;
  const std::vector<const SparseField*>& passes_;
  const layout::DigitSpace space_;
  Shape strides_;
  std::vector<std::vector<std::int64_t>> cuts_;
  std::vector<std::vector<std::int64_t>> points_;
  std::vector<std::vector<std::int64_t>> values_;
  std::int64_t splits_ = 0;
  std::vector<Cell> pieces_;  // the cell being emitted and its pieces, by depth of splitting
  // Scratch of make_cell and emit.
  mutable Shape next_;
  Shape at_, stepped_;
  std::vector<std::int64_t> slope_;
  std::vector<int> driver_;
};

// The elements of a parameter after the verification pass, by what they hold.
struct MarkedElements {
  std::int64_t marker = 0;  // the marker: never written, or a copy set back to the marker
  std::int64_t zero = 0;    // 0: written with a constant
};

// Counts the parameter's elements that hold the marker and those that are 0; any other element is a value
// no decoded copy explains.
MarkedElements count_marked(const Parameter& param) {
  const auto* bytes = static_cast<const unsigned char*>(param.view.data);
  const std::size_t element = param.view.element_size();
  const std::int64_t n = param.view.numel();
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
  std::int64_t e = 0;
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

// Replays the decoded copies against the verification values load_weights just wrote (into parameters that
// held the marker): each copied element must match and is then set back to the marker, so that afterwards
// every element holds the marker (never written) or 0 (a constant load_weights wrote). Returns the accounting
// of every parameter's elements.
std::vector<ParameterAccount> verify_against_load(const SourceMap& map, const ProbeCheckpoint& probe,
                                                  const ParameterSet& params) {
  constexpr std::int64_t kChunk = 1 << 20;
  std::vector<std::byte> expected;
  std::vector<std::byte> marks;  // kMarker bytes, grown once: a fresh buffer per chunk costs page faults
  Box part;                      // assigned in place: no allocation per copy (100,000 copies on a rank)
  for (const SliceCopy& copy : map.copies) {
    const Parameter& param = params[copy.parameter];
    const TensorInfo& tensor = probe.tensors()[copy.tensor];
    const std::size_t element = dtype_size(tensor.dtype);
    // Box rows in chunks so that the scratch stays small whatever the copy's size.
    const std::int64_t rows = copy.box.extent.empty() ? 1 : copy.box.extent[0];
    const std::int64_t per_row = copy.box.extent.empty() ? 1 : copy.box.numel() / std::max<std::int64_t>(rows, 1);
    const std::int64_t step = std::max<std::int64_t>(1, kChunk / std::max<std::int64_t>(per_row, 1));
    // A copy that fills one run of the parameter in another order (a transpose) goes back to the marker
    // as that run, in one memset once all its chunks compared, not by a strided walk per chunk.
    const bool one_run = fills_one_run(copy.box.extent, copy.strides);
    for (std::int64_t row = 0; row < rows; row += step) {
      part.offset.assign(copy.box.offset.begin(), copy.box.offset.end());
      part.extent.assign(copy.box.extent.begin(), copy.box.extent.end());
      std::int64_t offset = copy.offset;
      if (!part.extent.empty()) {
        part.offset[0] += row;
        part.extent[0] = std::min(step, rows - row);
        offset += row * copy.strides[0];
      }
      expected.resize(static_cast<std::size_t>(part.numel()) * element);
      probe.read_box(copy.tensor, part, expected.data());  // by index: the map's order is not the list's
      if (dense_in_parameter(part.extent, copy.strides)) {
        // The common copy: one run of the parameter. Compared and marked in place, without views; a
        // mismatch takes the general path below, which names the element.
        std::byte* at = static_cast<std::byte*>(param.view.data) + offset * static_cast<std::int64_t>(element);
        if (std::memcmp(at, expected.data(), expected.size()) == 0) {
          std::memset(at, kMarker, expected.size());
          continue;
        }
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
    if (one_run)
      std::memset(static_cast<std::byte*>(param.view.data) + copy.offset * static_cast<std::int64_t>(element), kMarker,
                  static_cast<std::size_t>(copy.box.numel()) * element);
  }
  std::vector<std::int64_t> copied(params.size(), 0);
  for (const SliceCopy& copy : map.copies) copied[copy.parameter] += copy.box.numel();
  std::vector<ParameterAccount> accounts;
  accounts.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const MarkedElements marked = count_marked(params[i]);
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
  void start() {
    wall_start = std::chrono::steady_clock::now();
    cpu_start = thread_cpu_seconds();
  }
  void stop() {
    wall += seconds_since(wall_start);
    cpu += thread_cpu_seconds() - cpu_start;
  }
};

// The probe on host parameters; `run` prepares them and calls load_weights for each pass.
SourceMap probe_host(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params, const PassLoader& run,
                     const ProbeOptions& options, ProbeReport* report) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  ProbePlan plan(checkpoint_tensors);
  ProbeCheckpoint probe(checkpoint_tensors, plan);
  SavedParameters saved(params);
  PhaseTime decode, load, verify;

  // passes[p][i]: the nonzeros of pass p in parameter i.
  std::vector<std::vector<SparseField>> passes(static_cast<std::size_t>(plan.num_passes()));
  std::size_t sparse_bytes = 0;
  for (int p = 0; p < plan.num_passes(); ++p) {
    probe.set_pass(p);
    load.start();
    run(probe, Fill::kZero);
    load.stop();
    decode.start();
    auto& fields = passes[static_cast<std::size_t>(p)];
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
  }

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
    ParameterDecoder decoder(params[i], static_cast<std::uint32_t>(i), plan, checkpoint_tensors, fields);
    one.copies.clear();
    decoder.decode(one.copies);
    one = normalize_source_map(std::move(one));
    std::move(one.copies.begin(), one.copies.end(), std::back_inserter(map.copies));
  }
  passes.clear();
  validate_source_map(map, checkpoint_tensors);
  decode.stop();

  probe.set_verification(options.verification_seed);
  load.start();
  run(probe, Fill::kMarker);
  load.stop();
  verify.start();
  std::vector<ParameterAccount> accounts = verify_against_load(map, probe, params);
  verify.stop();

  if (report != nullptr) {
    report->passes = plan.num_passes() + 1;
    report->decode_seconds = decode.wall;
    report->load_seconds = load.wall;
    report->verify_seconds = verify.wall;
    report->decode_cpu_seconds = decode.cpu;
    report->load_cpu_seconds = load.cpu;
    report->verify_cpu_seconds = verify.cpu;
    report->parameter_bytes = params.total_bytes();
    report->scratch_bytes = saved.bytes();
    report->sparse_bytes = sparse_bytes;
    report->copies = map.copies.size();
    report->serialized_bytes = serialize_source_map(map).size();
    report->seconds = seconds_since(start);
    report->cpu_seconds = thread_cpu_seconds() - cpu_start;
    report->accounts = std::move(accounts);
  }
  WB_LOG(kDebug) << "probe: " << params.size() << " parameters, " << map.copies.size() << " copies, "
                 << plan.num_passes() + 1 << " load_weights passes, " << seconds_since(start) << " s, CPU "
                 << thread_cpu_seconds() - cpu_start << " s (load " << load.wall << " s, decode " << decode.wall
                 << " s, verify " << verify.wall << " s; CPU load " << load.cpu << " s, decode " << decode.cpu
                 << " s, verify " << verify.cpu << " s)";
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
