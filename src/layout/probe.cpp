#include "layout/probe.hpp"

#include <algorithm>
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

// One cell of the cut grid of a parameter, with the affine map of every field over it.
struct Cell {
  Shape corner;
  Shape extent;
  std::int64_t tensor = 0;
  Shape tensor_slope;                   // change of the tensor index per step along parameter axis a
  Shape base;                           // checkpoint coordinate at the corner, per checkpoint axis
  std::vector<Shape> slope;             // slope[c][a]: change of coordinate c per step along parameter axis a
};

// Decodes the passes of one parameter into slice copies (appended to `out`).
class ParameterDecoder {
 public:
  ParameterDecoder(const Parameter& param, std::uint32_t index, const ProbePlan& plan,
                   const std::vector<TensorInfo>& tensors, const std::vector<const SparseField*>& passes)
      : param_(param), index_(index), plan_(plan), tensors_(tensors), passes_(passes) {}

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
    while (true) {
      Cell c = make_cell(cell);
      if (c.tensor >= 0) emit(c, out);
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

  // Builds the cell's affine map from the digits at its corner and one step along each axis; tensor -1
  // marks padding.
  Cell make_cell(const std::vector<std::size_t>& cell_index) const {
    const Shape& shape = param_.view.shape;
    const std::size_t ndim = shape.size();
    Cell c;
    c.corner.resize(ndim);
    c.extent.resize(ndim);
    for (std::size_t a = 0; a < ndim; ++a) {
      const auto& cuts = cuts_[a];
      c.corner[a] = cuts[cell_index[a]];
      c.extent[a] = (cell_index[a] + 1 < cuts.size() ? cuts[cell_index[a] + 1] : shape[a]) - c.corner[a];
    }
    const layout::CodeSpace space = layout::code_space(param_.view.dtype);
    const auto sentinel = -static_cast<std::int64_t>(space.lo);
    const std::size_t corner = grid_index(c.corner);
    const std::size_t passes = passes_.size();
    // Scratch reused from cell to cell (a parameter may have many cells, a rank 100,000 parameters).
    std::vector<std::uint64_t>& digits = digits_;
    digits.assign(passes, 0);
    std::vector<std::vector<std::int64_t>>& steps = steps_;
    steps.resize(ndim);
    for (auto& step : steps) step.assign(passes, 0);
    // The grid point one step along each axis (the same in every pass); npos where the cell is one wide.
    constexpr std::size_t npos = static_cast<std::size_t>(-1);
    std::vector<std::size_t>& next_index = next_index_;
    next_index.assign(ndim, npos);
    Shape next = c.corner;
    for (std::size_t a = 0; a < ndim; ++a) {
      if (c.extent[a] < 2) continue;
      ++next[a];
      next_index[a] = grid_index(next);
      --next[a];
    }
    bool unsourced = false;
    for (std::size_t p = 0; p < passes; ++p) {
      const std::int64_t d = values_[p][corner];
      if (p == 0) unsourced = d == sentinel;
      if (unsourced != (d == sentinel) ||
          (!unsourced && (d < 0 || static_cast<std::uint64_t>(d) >= space.size)))
        not_a_copy(param_, flat_of(c.corner), kComputed, "bits that are no probe code in pass " + std::to_string(p));
      digits[p] = unsourced ? 0 : static_cast<std::uint64_t>(d);
      for (std::size_t a = 0; a < ndim; ++a)
        if (next_index[a] != npos) steps[a][p] = values_[p][next_index[a]] - d;
    }
    for (std::size_t a = 0; a < ndim; ++a)
      for (std::size_t p = 0; p < passes; ++p)
        if (unsourced && steps[a][p] != 0)
          not_a_copy(param_, flat_of(c.corner), kComputed, "a region no checkpoint element reaches is not uniform");
    if (unsourced) {
      c.tensor = -1;
      return c;
    }
    // Fields from digits; slopes from digit steps (the digit places are the same linear weights).
    std::vector<std::uint64_t>& fields = fields_;
    fields.assign(static_cast<std::size_t>(plan_.num_fields()), 0);
    plan_.combine_all(param_.view.dtype, digits, fields);
    const std::uint64_t base = space.size;
    auto field_slope = [&](int field, std::size_t axis) {
      std::int64_t slope = 0, place = 1;
      for (std::size_t p = 0; p < passes; ++p) {
        const layout::ProbePass& pass = plan_.pass(static_cast<int>(p));
        if (pass.field != field) continue;
        place = static_cast<std::int64_t>(layout::place_value(base, pass.digit));
        slope += steps[axis][p] * place;
      }
      return slope;
    };
    // The tensor index may itself step along an axis (experts e = 0, 1, ... stored one after another
    // come from tensors listed at a fixed distance): emit() splits such cells, one tensor per piece.
    c.tensor = static_cast<std::int64_t>(fields[0]);
    c.tensor_slope.resize(ndim);
    for (std::size_t a = 0; a < ndim; ++a) c.tensor_slope[a] = field_slope(layout::kTensorField, a);
    const std::size_t max_ndim = static_cast<std::size_t>(plan_.max_ndim());
    c.base.resize(max_ndim);
    c.slope.assign(max_ndim, Shape(ndim, 0));
    for (std::size_t axis = 0; axis < max_ndim; ++axis) {
      const int f = layout::axis_field(static_cast<int>(axis));
      c.base[axis] = static_cast<std::int64_t>(fields[static_cast<std::size_t>(f)]);
      for (std::size_t a = 0; a < ndim; ++a) c.slope[axis][a] = field_slope(f, a);
    }
    return c;
  }

  // A cell is one slice copy when every parameter axis it spans walks exactly one checkpoint axis with
  // step 1 and no checkpoint axis is walked by two parameter axes; otherwise it is split along its first
  // long axis (a parameter axis folded onto a checkpoint axis, e.g. [experts, rows] from rows) and the
  // pieces are merged again by normalization.
  void emit(const Cell& c, std::vector<SliceCopy>& out) {
    const std::size_t ndim = c.corner.size();
    std::size_t split = ndim;
    for (std::size_t a = 0; a < ndim && split == ndim; ++a)
      if (c.extent[a] > 1 && c.tensor_slope[a] != 0) split = a;
    if (split == ndim) {
      check_tensor(c);
      const std::size_t tensor_ndim = tensors_[static_cast<std::size_t>(c.tensor)].shape.size();
      std::vector<int> driver(tensor_ndim, -1);
      bool one_copy = true;
      for (std::size_t a = 0; a < ndim && one_copy; ++a) {
        if (c.extent[a] < 2) continue;
        int walked = -1;
        for (std::size_t t = 0; t < tensor_ndim; ++t) {
          if (c.slope[t][a] == 0) continue;
          if (walked >= 0 || c.slope[t][a] != 1 || driver[t] >= 0) one_copy = false;
          walked = static_cast<int>(t);
          if (one_copy) driver[t] = static_cast<int>(a);
        }
        if (walked < 0) one_copy = false;  // an axis that reads one element many times is no copy
      }
      if (one_copy) {
        emit_copy(c, driver, out);
        return;
      }
      for (std::size_t a = 0; a < ndim && split == ndim; ++a)
        if (c.extent[a] > 1) split = a;
    }
    if (++splits_ > std::max<std::int64_t>(4096, param_.view.numel() / 8))
      not_a_copy(param_, flat_of(c.corner), kComputed, "the values are not piecewise affine in the parameter's index");
    for (std::int64_t i = 0; i < c.extent[split]; ++i) {
      Cell piece = c;
      piece.corner[split] += i;
      piece.extent[split] = 1;
      piece.tensor += c.tensor_slope[split] * i;
      for (std::size_t t = 0; t < piece.base.size(); ++t) piece.base[t] += c.slope[t][split] * i;
      emit(piece, out);
    }
  }

  // The cell's tensor exists, has the parameter's dtype, and the coordinates of axes it lacks stay 0.
  void check_tensor(const Cell& c) const {
    if (c.tensor < 0 || static_cast<std::size_t>(c.tensor) >= tensors_.size())
      not_a_copy(param_, flat_of(c.corner), kComputed,
                 "decodes to tensor index " + std::to_string(c.tensor) + " of " + std::to_string(tensors_.size()));
    const TensorInfo& tensor = tensors_[static_cast<std::size_t>(c.tensor)];
    if (tensor.dtype != param_.view.dtype)
      not_a_copy(param_, flat_of(c.corner),
                 "it holds elements of " + tensor.name + " (" + std::string(dtype_name(tensor.dtype)) + ") in a " +
                     std::string(dtype_name(param_.view.dtype)) + " parameter: load_weights converts dtypes, which a "
                     "transfer of the checkpoint's bytes cannot reproduce",
                 "dtype mismatch");
    for (std::size_t axis = tensor.shape.size(); axis < c.base.size(); ++axis) {
      bool varies = c.base[axis] != 0;
      for (std::size_t a = 0; a < c.extent.size(); ++a) varies = varies || (c.extent[a] > 1 && c.slope[axis][a] != 0);
      if (varies) not_a_copy(param_, flat_of(c.corner), kComputed, "coordinate of an axis " + tensor.name + " lacks is not zero");
    }
  }

  void emit_copy(const Cell& c, const std::vector<int>& driver, std::vector<SliceCopy>& out) const {
    const std::size_t tensor_ndim = driver.size();
    const TensorInfo& tensor = tensors_[static_cast<std::size_t>(c.tensor)];
    SliceCopy copy;
    copy.tensor = static_cast<std::uint32_t>(c.tensor);
    copy.parameter = index_;
    copy.box.offset.assign(c.base.begin(), c.base.begin() + static_cast<std::ptrdiff_t>(tensor_ndim));
    copy.box.extent.assign(tensor_ndim, 1);
    copy.strides.assign(tensor_ndim, 0);
    for (std::size_t t = 0; t < tensor_ndim; ++t) {
      if (driver[t] < 0) continue;
      copy.box.extent[t] = c.extent[static_cast<std::size_t>(driver[t])];
      copy.strides[t] = strides_[static_cast<std::size_t>(driver[t])];
    }
    copy.offset = flat_of(c.corner);
    if (!copy.box.fits_in(tensor.shape))
      not_a_copy(param_, copy.offset, kComputed,
                 "decodes to " + tensor.name + copy.box.to_string() + ", outside its shape " + shape_to_string(tensor.shape));
    out.push_back(std::move(copy));
  }

  const Parameter& param_;
  std::uint32_t index_;
  const ProbePlan& plan_;
  const std::vector<TensorInfo>& tensors_;
  const std::vector<const SparseField*>& passes_;
  Shape strides_;
  std::vector<std::vector<std::int64_t>> cuts_;
  std::vector<std::vector<std::int64_t>> points_;
  std::vector<std::vector<std::int64_t>> values_;
  std::int64_t splits_ = 0;
  // make_cell's scratch.
  mutable std::vector<std::uint64_t> digits_, fields_;
  mutable std::vector<std::vector<std::int64_t>> steps_;
  mutable std::vector<std::size_t> next_index_;
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
      if (marks.size() < expected.size()) marks.assign(expected.size(), std::byte{kMarker});
      copy_tensor(target, TensorView::contiguous(marks.data(), tensor.dtype, part.extent));
    }
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

// The probe on host parameters; `run` prepares them and calls load_weights for each pass.
SourceMap probe_host(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params, const PassLoader& run,
                     const ProbeOptions& options, ProbeReport* report) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  ProbePlan plan(checkpoint_tensors);
  ProbeCheckpoint probe(checkpoint_tensors, plan);
  SavedParameters saved(params);
  double decode_seconds = 0, load_seconds = 0;

  // passes[p][i]: the nonzeros of pass p in parameter i.
  std::vector<std::vector<SparseField>> passes(static_cast<std::size_t>(plan.num_passes()));
  std::size_t sparse_bytes = 0;
  for (int p = 0; p < plan.num_passes(); ++p) {
    probe.set_pass(p);
    const auto load_start = std::chrono::steady_clock::now();
    run(probe, Fill::kZero);
    load_seconds += seconds_since(load_start);
    const auto decode_start = std::chrono::steady_clock::now();
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
    decode_seconds += seconds_since(decode_start);
  }

  const auto decode_start = std::chrono::steady_clock::now();
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
  decode_seconds += seconds_since(decode_start);

  probe.set_verification(options.verification_seed);
  const auto load_start = std::chrono::steady_clock::now();
  run(probe, Fill::kMarker);
  load_seconds += seconds_since(load_start);
  const auto verify_start = std::chrono::steady_clock::now();
  std::vector<ParameterAccount> accounts = verify_against_load(map, probe, params);
  const double verify_seconds = seconds_since(verify_start);

  if (report != nullptr) {
    report->passes = plan.num_passes() + 1;
    report->decode_seconds = decode_seconds;
    report->load_seconds = load_seconds;
    report->verify_seconds = verify_seconds;
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
                 << thread_cpu_seconds() - cpu_start << " s (load " << load_seconds << " s, decode " << decode_seconds
                 << " s, verify " << verify_seconds << " s)";
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
