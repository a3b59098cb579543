#include "layout/probe_decoder.hpp"

#include <algorithm>

#include "layout/probe_failure.hpp"

namespace wb::layout {
namespace {

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
                   const std::vector<TensorInfo>& tensors, const std::vector<const SparseField*>& passes,
                   const KeyedDigit* keyed)
      : param_(param), index_(index), plan_(plan), tensors_(tensors), passes_(passes),
        space_(digit_space(param.view.dtype)), keyed_(keyed) {}

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
        const auto coords = nonzero_coordinates(*field, a);
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
    for (const SparseField* field : passes_) values_.push_back(evaluate_grid(*field, points_));

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
      // Past 2^64 only through a nonzero digit: the passes a larger dtype needs carry digit 0 here.
      if (*digit != 0)
        overflow = overflow || place == 0 || __builtin_mul_overflow(*digit, place, &term) ||
                   __builtin_add_overflow(key, term, &key);
      if (place != 0 && __builtin_mul_overflow(place, space_.size, &place)) place = 0;  // 0: past 2^64
    }
    if (keyed_ != nullptr && !unsourced) {
      // The top digit from the keyed pass's code, which the parameter holds, and the lower digits.
      const std::uint64_t bits = load_bits(param_.view.dtype, param_.view.data, static_cast<std::size_t>(flat_of(at)));
      const auto written = space_.digit(bits - space_.lo);
      if (!written) not_a_copy(param_, flat_of(at), kComputed, "bits that are no probe code in the keyed pass");
      const std::uint64_t top = keyed_->top(key, *written);
      if (top != 0)
        overflow = overflow || place == 0 || __builtin_mul_overflow(top, place, &term) ||
                   __builtin_add_overflow(key, term, &key);
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
  const DigitSpace space_;
  const KeyedDigit* keyed_;
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

}  // namespace

bool keyed_copies_checked(const std::vector<SliceCopy>& copies) {
  for (const SliceCopy& copy : copies) {
    std::int64_t decided = 1;
    for (const std::int64_t e : copy.box.extent) decided += e > 1 ? 1 : 0;
    if (copy.box.numel() <= decided) return false;
  }
  return true;
}

void decode_parameter(const Parameter& param, std::uint32_t index, const ProbePlan& plan,
                      const std::vector<TensorInfo>& tensors, const std::vector<const SparseField*>& passes,
                      std::vector<SliceCopy>& out, const KeyedDigit* keyed) {
  ParameterDecoder(param, index, plan, tensors, passes, keyed).decode(out);
}

}  // namespace wb::layout
