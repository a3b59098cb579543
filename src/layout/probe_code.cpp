#include "layout/probe_code.hpp"

#include <algorithm>
#include <limits>

#include "weightbridge/status.hpp"

namespace wb::layout {

std::uint64_t encode_digit(DType dtype, std::uint64_t digit) {
  const CodeSpace cs = code_space(dtype);
  if (digit >= cs.size)
    throw Error(ErrorCode::kInvalidArgument, "probe code: digit " + std::to_string(digit) + " is outside the " +
                                                 std::string(dtype_name(dtype)) + " code space of " +
                                                 std::to_string(cs.size) + " digits");
  return cs.lo + digit;
}

std::uint64_t place_value(std::uint64_t base, int k) {
  std::uint64_t p = 1;
  for (int i = 0; i < k; ++i)
    if (__builtin_mul_overflow(p, base, &p)) return std::numeric_limits<std::uint64_t>::max();
  return p;
}

int digits_needed(std::uint64_t max_value, std::uint64_t base) {
  int k = 0;
  for (std::uint64_t rest = max_value; rest > 0; rest /= base) ++k;
  return k;
}

std::uint64_t combine_digits(std::span<const std::uint64_t> digits, std::uint64_t base) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t value = 0;
  for (std::size_t k = digits.size(); k-- > 0;) {  // Horner, highest digit first
    if (__builtin_mul_overflow(value, base, &value) || __builtin_add_overflow(value, digits[k], &value))
      return kMax;
  }
  return value;
}

// --- ProbePlan --------------------------------------------------------------------------------------

ProbePlan::ProbePlan(const std::vector<TensorInfo>& tensors) {
  dtypes_.reserve(tensors.size());
  shapes_.reserve(tensors.size());
  std::size_t max_ndim = 0;
  for (const TensorInfo& t : tensors) {
    for (std::int64_t e : t.shape)
      if (e < 0)
        throw Error(ErrorCode::kInvalidArgument,
                    "probe plan: tensor " + t.name + " has a negative extent " + shape_to_string(t.shape));
    dtypes_.push_back(t.dtype);
    shapes_.push_back(t.shape);
    max_ndim = std::max(max_ndim, t.shape.size());
  }

  // Digits per field: the most any tensor needs in its own base. An empty axis (extent 0) needs none.
  field_digits_.assign(1 + max_ndim, 0);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::uint64_t base = code_space(dtypes_[t]).size;
    int& id_digits = field_digits_[kTensorField];
    id_digits = std::max(id_digits, digits_needed(t, base));
    const Shape& shape = shapes_[t];
    for (std::size_t a = 0; a < shape.size(); ++a) {
      if (shape[a] <= 1) continue;
      int& d = field_digits_[static_cast<std::size_t>(axis_field(static_cast<int>(a)))];
      d = std::max(d, digits_needed(static_cast<std::uint64_t>(shape[a] - 1), base));
    }
  }
  // At least one pass, so that a lone tensor (or a single-tensor checkpoint) still writes codes that
  // tell sourced elements from padding.
  field_digits_[kTensorField] = std::max(field_digits_[kTensorField], 1);

  // Field by field, lowest digit first: the order does not matter for decoding, this one reads well.
  passes_.clear();
  for (std::size_t f = 0; f < field_digits_.size(); ++f)
    for (int k = 0; k < field_digits_[f]; ++k) passes_.push_back({static_cast<int>(f), k});
}

const ProbePass& ProbePlan::pass(int p) const {
  if (p < 0 || p >= num_passes())
    throw Error(ErrorCode::kInvalidArgument,
                "probe plan: pass " + std::to_string(p) + " out of range (" + std::to_string(num_passes()) + " passes)");
  return passes_[static_cast<std::size_t>(p)];
}

std::string ProbePlan::field_name(int field) {
  return field == kTensorField ? std::string("tensor index") : "axis " + std::to_string(field - 1);
}

std::string ProbePlan::describe_pass(int p) const {
  const ProbePass& ps = pass(p);
  return field_name(ps.field) + ", digit " + std::to_string(ps.digit);
}

std::uint64_t ProbePlan::field_value(int field, std::size_t tensor, std::span<const std::int64_t> index) {
  if (field == kTensorField) return tensor;
  const auto axis = static_cast<std::size_t>(field - 1);
  return axis < index.size() ? static_cast<std::uint64_t>(index[axis]) : 0;
}

std::uint64_t ProbePlan::digit(int p, std::size_t tensor, std::span<const std::int64_t> index) const {
  const ProbePass& ps = pass(p);
  return digit_of(field_value(ps.field, tensor, index), code_space(dtypes_.at(tensor)).size, ps.digit);
}

std::uint64_t ProbePlan::combine(DType dtype, int field, std::span<const std::uint64_t> pass_digits) const {
  if (pass_digits.size() != passes_.size())
    throw Error(ErrorCode::kInvalidArgument, "probe plan: combine got " + std::to_string(pass_digits.size()) +
                                                 " digits for " + std::to_string(passes_.size()) + " passes");
  if (field < 0 || field >= num_fields())
    throw Error(ErrorCode::kInvalidArgument, "probe plan: no field " + std::to_string(field) + " (the plan has " +
                                                 std::to_string(num_fields()) + ")");
  const std::uint64_t base = code_space(dtype).size;
  std::uint64_t digits[64] = {};  // every base is >= 119, so a 64-bit field has at most 10 digits
  const int n = field_digits(field);
  for (std::size_t p = 0; p < passes_.size(); ++p)
    if (passes_[p].field == field) digits[passes_[p].digit] = pass_digits[p];
  return combine_digits(std::span<const std::uint64_t>(digits, static_cast<std::size_t>(n)), base);
}

void ProbePlan::combine_all(DType dtype, std::span<const std::uint64_t> pass_digits,
                            std::span<std::uint64_t> fields) const {
  if (fields.size() != field_digits_.size())
    throw Error(ErrorCode::kInvalidArgument, "probe plan: combine_all got room for " + std::to_string(fields.size()) +
                                                 " fields, the plan has " + std::to_string(field_digits_.size()));
  for (std::size_t f = 0; f < fields.size(); ++f) fields[f] = combine(dtype, static_cast<int>(f), pass_digits);
}

}  // namespace wb::layout
