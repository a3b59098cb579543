#include "layout/probe_code.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <utility>

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

namespace {

[[noreturn]] void too_large(const TensorInfo& t) {
  throw Error(ErrorCode::kInvalidArgument, "probe plan: tensor " + t.name + " " + shape_to_string(t.shape) +
                                               " takes the probe's keys of " + std::string(dtype_name(t.dtype)) +
                                               " past 2^64");
}

}  // namespace

namespace {

// The pitch of rows of `row` elements in digit space `ds`: the smallest divisor of u = ds.half above the row
// (u is a power of two or a smooth number below 2^15, whose divisors are few), or the row rounded up to a
// multiple of u.
std::uint64_t row_pitch(std::uint64_t row, const DigitSpace& ds, const TensorInfo& t) {
  const std::uint64_t u = ds.half, need = row + 1;
  if (need > u) {
    std::uint64_t pitch = 0;
    if (__builtin_mul_overflow((need + u - 1) / u, u, &pitch)) too_large(t);
    return pitch;
  }
  if ((u & (u - 1)) == 0) return std::bit_ceil(need);
  for (std::uint64_t d = need;; ++d)
    if (u % d == 0) return d;
}

}  // namespace

// Digit spans shorter than this (the 1-byte codes) lay out every axis on whole digits instead.
constexpr std::uint64_t kWholeDigitSpan = 4096;

ProbePlan::ProbePlan(const std::vector<TensorInfo>& tensors) {
  dtypes_.reserve(tensors.size());
  shapes_.reserve(tensors.size());
  bases_.reserve(tensors.size());
  place_start_.reserve(tensors.size());
  // Pitches by (dtype, row length): models repeat a few row lengths over many tensors.
  std::map<std::pair<DType, std::int64_t>, std::uint64_t> pitches;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    for (std::int64_t e : t.shape)
      if (e < 0)
        throw Error(ErrorCode::kInvalidArgument,
                    "probe plan: tensor " + t.name + " has a negative extent " + shape_to_string(t.shape));
    const DigitSpace ds = digit_space(t.dtype);
    dtypes_.push_back(t.dtype);
    shapes_.push_back(t.shape);
    place_start_.push_back(places_.size());
    places_.resize(places_.size() + t.shape.size());
    std::uint64_t* places = places_.data() + place_start_.back();
    // Places from the last axis out, each (extent + 1) times the one inside: compact first. A tensor whose
    // range fits in one span of u = ds.half keys is placed inside one span (no digit wraps or jumps inside
    // it at all); a larger one gets rows pitched to the spans and starts on a row boundary of them.
    const auto lay_out = [&](std::uint64_t pitch) {
      std::uint64_t place = 1;
      for (std::size_t a = t.shape.size(); a-- > 0;) {
        places[a] = place;
        const std::uint64_t step = a + 1 == t.shape.size() ? pitch : static_cast<std::uint64_t>(t.shape[a]) + 1;
        if (__builtin_mul_overflow(place, step, &place)) too_large(t);
      }
      return place;  // the range
    };
    const std::uint64_t u = ds.half;
    std::uint64_t& range = ranges_[static_cast<std::size_t>(t.dtype)];
    std::uint64_t size = lay_out(t.shape.empty() ? 1 : static_cast<std::uint64_t>(t.shape.back()) + 1);
    std::uint64_t align = 1;
    if (u < kWholeDigitSpan) {
      // 1-byte codes (spans of 96-240 keys): every axis but the outermost gets whole digits, its extent
      // and the gap, and the tensor starts on a digit of its outermost axis, so a digit wraps along an axis
      // only every D steps, as rows of a few dozen elements would otherwise make it every few.
      std::uint64_t place = 1;
      for (std::size_t a = t.shape.size(); a-- > 0;) {
        places[a] = place;
        if (a == 0) break;
        const std::uint64_t digits = place_value(ds.size, digits_needed(static_cast<std::uint64_t>(t.shape[a]), ds.size));
        if (digits == std::numeric_limits<std::uint64_t>::max() || __builtin_mul_overflow(place, digits, &place)) too_large(t);
      }
      if (!t.shape.empty() && __builtin_mul_overflow(place, static_cast<std::uint64_t>(t.shape[0]) + 1, &size)) too_large(t);
      if (t.shape.empty()) size = 1;
      align = place;
    } else if (size <= u) {
      if (range % u + size > u) align = u;  // would straddle the end of the span: start the next one
    } else {
      auto [it, fresh] = pitches.try_emplace({t.dtype, t.shape.back()}, 0);
      if (fresh) it->second = row_pitch(static_cast<std::uint64_t>(t.shape.back()), ds, t);
      size = lay_out(it->second);
      align = std::min(it->second, u);
    }
    std::uint64_t base = 0;
    if (__builtin_add_overflow(range, align - 1, &base)) too_large(t);
    base -= base % align;
    bases_.push_back(base);
    if (__builtin_add_overflow(base, size, &range)) too_large(t);
    by_dtype_[static_cast<std::size_t>(t.dtype)].push_back(i);
  }
  // At least one pass, so that a lone scalar still writes codes that tell sourced elements from padding.
  passes_ = 1;
  for (int d = 0; d < kNumDTypes; ++d)
    if (ranges_[static_cast<std::size_t>(d)] > 0)
      passes_ = std::max(passes_, digits_needed(ranges_[static_cast<std::size_t>(d)] - 1,
                                                digit_space(static_cast<DType>(d)).size));
}

std::string ProbePlan::describe_pass(int p) const {
  if (p < 0 || p >= passes_)
    throw Error(ErrorCode::kInvalidArgument,
                "probe plan: pass " + std::to_string(p) + " out of range (" + std::to_string(passes_) + " passes)");
  return "key digit " + std::to_string(p);
}

std::span<const std::uint64_t> ProbePlan::places(std::size_t tensor) const {
  return {places_.data() + place_start_.at(tensor), shapes_[tensor].size()};
}

std::uint64_t ProbePlan::key(std::size_t tensor, std::span<const std::int64_t> index) const {
  const std::span<const std::uint64_t> place = places(tensor);
  std::uint64_t k = bases_[tensor];
  for (std::size_t a = 0; a < place.size() && a < index.size(); ++a) k += static_cast<std::uint64_t>(index[a]) * place[a];
  return k;
}

std::uint64_t ProbePlan::digit(int p, std::size_t tensor, std::span<const std::int64_t> index) const {
  describe_pass(p);  // range check
  return digit_of(key(tensor, index), digit_space(dtypes_.at(tensor)).size, p);
}

std::uint64_t ProbePlan::combine(DType dtype, std::span<const std::uint64_t> pass_digits) const {
  if (pass_digits.size() != static_cast<std::size_t>(passes_))
    throw Error(ErrorCode::kInvalidArgument, "probe plan: combine got " + std::to_string(pass_digits.size()) +
                                                 " digits for " + std::to_string(passes_) + " passes");
  return combine_digits(pass_digits, digit_space(dtype).size);
}

bool ProbePlan::element(DType dtype, std::uint64_t key, std::size_t& tensor, Shape& index) const {
  const std::vector<std::size_t>& list = by_dtype_[static_cast<std::size_t>(dtype)];
  if (key >= ranges_[static_cast<std::size_t>(dtype)]) return false;
  // The last tensor whose base is <= key (bases increase along the list; a zero-range tensor has none).
  const auto it = std::upper_bound(list.begin(), list.end(), key,
                                   [this](std::uint64_t k, std::size_t t) { return k < bases_[t]; });
  if (it == list.begin()) return false;
  tensor = *(it - 1);
  const Shape& shape = shapes_[tensor];
  const std::span<const std::uint64_t> place = places(tensor);
  std::uint64_t rest = key - bases_[tensor];
  index.resize(shape.size());
  for (std::size_t a = 0; a < shape.size(); ++a) {
    const std::uint64_t c = rest / place[a];
    if (c >= static_cast<std::uint64_t>(shape[a])) return false;  // in a gap
    index[a] = static_cast<std::int64_t>(c);
    rest -= c * place[a];
  }
  return rest == 0;  // a scalar's range is 1
}

}  // namespace wb::layout
