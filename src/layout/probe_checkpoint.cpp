#include "layout/probe_checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "layout/keyed_lanes.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

__extension__ typedef unsigned __int128 Uint128;  // __extension__: quiet under -Wpedantic

constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // splitmix64 increment

inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// out[0, n) = value, eight bytes per store: the plain element loop is not vectorized at -O2 and
// writes 1- and 2-byte elements at a fraction of the memory bandwidth.
template <typename T>
void fill_constant(T* out, std::int64_t n, T value) {
  constexpr std::int64_t kPerWord = 8 / sizeof(T);
  std::uint64_t word = value;
  if constexpr (sizeof(T) < 8)
    for (std::int64_t i = 1; i < kPerWord; ++i) word = (word << (8 * sizeof(T))) | value;
  std::int64_t i = 0;
  for (; i + kPerWord <= n; i += kPerWord) std::memcpy(out + i, &word, 8);
  for (; i < n; ++i) out[i] = value;
}

// The digits of consecutive field values v0, v0 + 1, ... without a division per value: the quotient by
// the place value advances once every `place` values and the digit wraps at `base`.
class DigitCounter {
 public:
  DigitCounter(std::uint64_t v0, std::uint64_t base, std::uint64_t place)
      : base_(base), place_(place), rest_(v0 % place), digit_((v0 / place) % base) {}
  std::uint64_t digit() const { return digit_; }
  /// Values left before the digit changes.
  std::uint64_t run() const { return place_ - rest_; }
  /// Skips `n` <= run() values.
  void skip(std::uint64_t n) {
    rest_ += n;
    if (rest_ == place_) {
      rest_ = 0;
      digit_ = digit_ + 1 == base_ ? 0 : digit_ + 1;
    }
  }

 private:
  std::uint64_t base_, place_, rest_, digit_;
};

// out[0, n) = first, first + 1, ...: 16 bytes per store (GCC's vector extension; the scalar loop is not
// vectorized at -O2 and stores 2-byte codes at a fraction of the memory bandwidth).
template <typename T>
void fill_consecutive(T* out, std::int64_t n, T first) {
  constexpr int kLanes = 16 / sizeof(T);
  typedef T Lanes __attribute__((vector_size(16)));
  Lanes v{}, step{};
  for (int i = 0; i < kLanes; ++i) {
    v[i] = static_cast<T>(first + static_cast<T>(i));
    step[i] = static_cast<T>(kLanes);
  }
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes, v += step) std::memcpy(out + i, &v, sizeof(v));
  for (; i < n; ++i) out[i] = static_cast<T>(first + static_cast<T>(i));
}

// out[j] = the code of digit k of key k0 + j, for j < n (place = D^k): with place 1 runs of consecutive
// codes up to the next wrap of the digit or the hole of the digit space, otherwise runs of one code.
template <typename T>
void fill_key_run(T* out, std::int64_t n, std::uint64_t k0, const DigitSpace& ds, std::uint64_t place) {
  if (place == 1) {
    std::uint64_t digit = k0 % ds.size;
    for (std::int64_t j = 0; j < n;) {
      const std::uint64_t end = digit < ds.half ? ds.half : ds.size;
      const auto len = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(n - j), end - digit));
      fill_consecutive(out + j, len, static_cast<T>(ds.bits(digit)));
      j += len;
      digit += static_cast<std::uint64_t>(len);
      if (digit == ds.size) digit = 0;
    }
    return;
  }
  DigitCounter counter(k0, ds.size, place);
  for (std::int64_t j = 0; j < n;) {
    const auto len = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(n - j), counter.run()));
    fill_constant(out + j, len, static_cast<T>(ds.bits(counter.digit())));
    counter.skip(static_cast<std::uint64_t>(len));
    j += len;
  }
}

// Calls fn(row length, key of the row's first element) for each row (the last axis) of `box` in row-major
// order, the box's first element having key `first` (ndim >= 1).
template <class Fn>
void each_row_key(std::span<const std::uint64_t> places, const Box& box, std::uint64_t first, Fn&& fn) {
  const auto ndim = static_cast<std::size_t>(box.ndim());
  const std::int64_t row = box.extent[ndim - 1];
  Shape index(ndim - 1, 0);  // odometer over the axes before the last
  for (std::int64_t r = 0, rows = box.numel() / row; r < rows; ++r) {
    std::uint64_t k = first;
    for (std::size_t a = 0; a + 1 < ndim; ++a) k += static_cast<std::uint64_t>(index[a]) * places[a];
    fn(row, k);
    for (std::size_t a = ndim - 1; a-- > 0;) {
      if (++index[a] < box.extent[a]) break;
      index[a] = 0;
    }
  }
}

// Codes of pass p for `box` of tensor `tensor`, row by row (the key runs on along a row). The key grows in
// the box's row-major order (each axis' place exceeds everything the axes inside it add), so when the first
// and the last element share their run of the digit, the whole box is one code: in the passes of high digits
// almost every box.
template <typename T>
void fill_pass(const ProbePlan& plan, std::size_t tensor, int pass, const Box& box, T* out) {
  const DigitSpace ds = digit_space(plan.dtype(tensor));
  const std::uint64_t place = place_value(ds.size, pass);
  const std::int64_t numel = box.numel();
  if (numel == 0) return;
  const auto ndim = static_cast<std::size_t>(box.ndim());
  const std::span<const std::uint64_t> places = plan.places(tensor);
  std::uint64_t first = plan.base(tensor), last = first;
  for (std::size_t a = 0; a < ndim; ++a) {
    first += static_cast<std::uint64_t>(box.offset[a]) * places[a];
    last += static_cast<std::uint64_t>(box.offset[a] + box.extent[a] - 1) * places[a];
  }
  if (first / place == last / place) {
    fill_constant(out, numel, static_cast<T>(ds.bits((first / place) % ds.size)));
    return;
  }
  each_row_key(places, box, first, [&](std::int64_t row, std::uint64_t k) {
    fill_key_run(out, row, k, ds, place);
    out += row;
  });
}

// Verification values. 1- and 2-byte codes: element f of a tensor gets hash16(f mod 2^16 xor k), k a
// 16-bit key from (seed, tensor, f / 2^16) and hash16 a bijection of 16-bit words (xorshift-multiply
// rounds), scaled into [0, D) by multiply-high: one value per element, eight per SSE2 vector of 16-bit lanes
// (a native multiply there), and no two elements of one 2^16-element block share a hash. 4- and 8-byte codes:
// word w = f / kSlices of a splitmix64 stream (mix64(key + (w + 1)·gamma)), slice f % kSlices of it (two
// 32-bit slices or one). A value depends on (seed, tensor, f) only, so any box agrees with the whole.
// The 16-bit keys of one tensor's blocks of 2^16 elements.
class BlockKeys {
 public:
  explicit BlockKeys(std::uint64_t key) : key_(key) {}
  std::uint16_t operator()(std::uint64_t block) {
    if (block != block_ || !have_) {
      block_ = block;
      have_ = true;
      value_ = static_cast<std::uint16_t>(mix64(key_ ^ mix64(block + kGamma)) >> 48);
    }
    return value_;
  }

 private:
  std::uint64_t key_, block_ = 0;
  bool have_ = false;
  std::uint16_t value_ = 0;
};

// out[0, n) = the values of elements first, first + 1, ... (1- and 2-byte codes).
template <typename T>
void fill_small_verification(BlockKeys& keys, const CodeSpace& cs, std::uint64_t first, std::int64_t n, T* out) {
  typedef std::uint16_t Lanes __attribute__((vector_size(16)));
  // D < 2^16: the scaling is a 16-bit multiply-high (SSE2 pmulhuw once vectorized).
  const auto lo = static_cast<std::uint16_t>(cs.lo), size = static_cast<std::uint16_t>(cs.size);
  const auto scale = [&](std::uint16_t h) {
    return static_cast<T>(lo + static_cast<std::uint16_t>((static_cast<std::uint32_t>(h) * size) >> 16));
  };
  for (std::int64_t i = 0; i < n;) {
    const std::uint64_t f = first + static_cast<std::uint64_t>(i);
    const auto in_block = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(n - i), 65536 - (f & 0xffff)));
    const std::uint16_t k = keys(f >> 16);
    auto low = static_cast<std::uint16_t>(f);
    T* o = out + i;
    std::int64_t j = 0;
    constexpr std::int64_t kChunk = 256;
    std::uint16_t hashes[kChunk];
    for (; j + kChunk <= in_block; j += kChunk, low = static_cast<std::uint16_t>(low + kChunk)) {
      Lanes x = {low, static_cast<std::uint16_t>(low + 1), static_cast<std::uint16_t>(low + 2),
                 static_cast<std::uint16_t>(low + 3), static_cast<std::uint16_t>(low + 4),
                 static_cast<std::uint16_t>(low + 5), static_cast<std::uint16_t>(low + 6),
                 static_cast<std::uint16_t>(low + 7)};
      const Lanes eight = {8, 8, 8, 8, 8, 8, 8, 8};
      for (std::int64_t v = 0; v < kChunk; v += 8, x += eight) {
        const Lanes h = hash16(x ^ k);
        std::memcpy(hashes + v, &h, sizeof(h));
      }
      for (std::int64_t v = 0; v < kChunk; ++v) o[j + v] = scale(hashes[v]);  // vectorized: a multiply-high
    }
    for (; j < in_block; ++j, ++low) o[j] = scale(hash16(static_cast<std::uint16_t>(low ^ k)));
    i += in_block;
  }
}

template <typename T>
struct VerificationSlices {
  static constexpr int kSlices = sizeof(T) == 4 ? 2 : 1;
  static constexpr int kBits = 64 / kSlices;

  static std::uint64_t code(std::uint64_t h, int slice, const CodeSpace& cs) {
    if constexpr (kSlices == 1) {
      (void)slice;
      return cs.lo + static_cast<std::uint64_t>((static_cast<Uint128>(h) * cs.size) >> 64);
    } else {
      const std::uint64_t x = (h >> (slice * kBits)) & ((1ULL << kBits) - 1);
      return cs.lo + ((x * cs.size) >> kBits);
    }
  }
};

// Wide codes: out[0, n) = the values of elements first, first + 1, ...
template <typename T>
void fill_wide_verification(std::uint64_t key, const CodeSpace& cs, std::uint64_t first, std::int64_t n, T* out) {
  using Slices = VerificationSlices<T>;
  constexpr auto kSlices = static_cast<std::uint64_t>(Slices::kSlices);
  const std::uint64_t last = first + static_cast<std::uint64_t>(n);
  std::uint64_t f = first;  // out[f - first] is the element of flat index f
  auto partial = [&](std::uint64_t end) {
    const std::uint64_t h = mix64(key + (f / kSlices + 1) * kGamma);
    for (; f < end; ++f) out[f - first] = static_cast<T>(Slices::code(h, static_cast<int>(f % kSlices), cs));
  };
  if (f % kSlices != 0) partial(std::min(last, (f / kSlices + 1) * kSlices));
  std::uint64_t state = key + (f / kSlices + 1) * kGamma;
  for (; f + kSlices <= last; f += kSlices, state += kGamma) {
    const std::uint64_t h = mix64(state);
    T* o = out + (f - first);
#pragma GCC unroll 2
    for (int s = 0; s < Slices::kSlices; ++s) o[s] = static_cast<T>(Slices::code(h, s, cs));
  }
  if (f < last) partial(last);
}

template <typename T>
void fill_verification(const TensorInfo& info, std::size_t tensor, std::uint64_t seed, const Box& box, T* out) {
  const CodeSpace cs = code_space(info.dtype);
  const std::uint64_t key = mix64(mix64(seed + kGamma) ^ mix64(static_cast<std::uint64_t>(tensor) + 0x5851f42d4c957f2dULL));
  BlockKeys keys(key);
  const std::int64_t numel = box.numel();
  if (numel == 0) return;
  const int ndim = box.ndim();
  // Row by row: the flat index is contiguous along the last axis, and across the axes before it as long as
  // the box spans them whole (a scalar is one row of one element). Axis `inner` is where rows start.
  const Shape strides = contiguous_strides(info.shape);
  int inner = std::max(ndim - 1, 0);
  while (inner > 0 && box.offset[inner] == 0 && box.extent[inner] == info.shape[static_cast<std::size_t>(inner)]) --inner;
  std::int64_t row = 1;
  for (int a = inner; a < ndim; ++a) row *= box.extent[a];
  const std::int64_t rows = numel / row;
  Shape index(static_cast<std::size_t>(std::max(ndim, 1)), 0);  // odometer over the axes before `inner`
  for (std::int64_t r = 0; r < rows; ++r, out += row) {
    std::int64_t flat = ndim == 0 ? 0 : box.offset[inner] * strides[inner];
    for (int d = 0; d < inner; ++d) flat += (box.offset[d] + index[d]) * strides[d];
    if constexpr (sizeof(T) <= 2)
      fill_small_verification(keys, cs, static_cast<std::uint64_t>(flat), row, out);
    else
      fill_wide_verification(key, cs, static_cast<std::uint64_t>(flat), row, out);
    for (int d = inner - 1; d >= 0; --d) {
      if (++index[d] < box.extent[d]) break;
      index[d] = 0;
    }
  }
}

// Calls fn(j, len, first, top) for the pieces of keys k0 .. k0 + n - 1 that share their top digit and their
// block of 2^16 lows (key k0 + j has low first and that top), in order, until fn returns false; false if it
// did.
template <class Fn>
bool each_keyed_piece(std::int64_t n, std::uint64_t k0, const KeyedDigit& keyed, Fn&& fn) {
  const std::uint64_t place = keyed.place(), base = keyed.base();
  std::uint64_t low = k0 % place, top = k0 / place % base;
  for (std::int64_t j = 0; j < n;) {
    const auto len = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(n - j), place - low));
    for (std::int64_t i = 0; i < len;) {
      const std::uint64_t first = low + static_cast<std::uint64_t>(i);
      const auto piece = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(len - i),
                                                                           65536 - (first & 0xffff)));
      if (!fn(j + i, piece, first, top)) return false;
      i += piece;
    }
    j += len;
    low = 0;
    top = top + 1 == base ? 0 : top + 1;
  }
  return true;
}

KeyedRun16 keyed_run16(std::uint64_t top, const DigitSpace& ds, const KeyedDigit& keyed) {
  return {static_cast<std::uint16_t>(top), static_cast<std::uint16_t>(keyed.base()), static_cast<std::uint16_t>(ds.lo),
          static_cast<std::uint16_t>(ds.half), static_cast<std::uint16_t>(ds.hole)};
}

// out[j] = the keyed pass's code of key k0 + j, for j < n. 2-byte codes go in 16-bit lanes (keyed_lanes.hpp).
template <typename T>
void fill_keyed_run(T* out, std::int64_t n, std::uint64_t k0, const DigitSpace& ds, const KeyedDigit& keyed) {
  each_keyed_piece(n, k0, keyed, [&](std::int64_t j, std::int64_t len, std::uint64_t first, std::uint64_t top) {
    T* o = out + j;
    if constexpr (sizeof(T) == 2) {
      keyed_codes16(o, len, static_cast<std::uint16_t>(first), keyed.block_key(first >> 16), keyed_run16(top, ds, keyed));
    } else {
      for (std::int64_t k = 0; k < len; ++k)
        o[k] = static_cast<T>(ds.bits((top + keyed.offset(first + static_cast<std::uint64_t>(k))) % keyed.base()));
    }
    return true;
  });
}

// The keyed pass's codes for `box`, row by row (the key runs on along a row).
template <typename T>
void fill_keyed(const ProbePlan& plan, std::size_t tensor, std::uint64_t seed, const Box& box, T* out) {
  const DigitSpace ds = digit_space(plan.dtype(tensor));
  const KeyedDigit keyed(seed, plan.dtype(tensor), plan);
  const std::int64_t numel = box.numel();
  if (numel == 0) return;
  const auto ndim = static_cast<std::size_t>(box.ndim());
  const std::span<const std::uint64_t> places = plan.places(tensor);
  std::uint64_t first = plan.base(tensor);
  for (std::size_t a = 0; a < ndim; ++a) first += static_cast<std::uint64_t>(box.offset[a]) * places[a];
  if (ndim == 0) return fill_keyed_run(out, 1, first, ds, keyed);
  each_row_key(places, box, first, [&](std::int64_t row, std::uint64_t k) {
    fill_keyed_run(out, row, k, ds, keyed);
    out += row;
  });
}

template <typename T>
void fill(const ProbePlan& plan, const TensorInfo& info, std::size_t tensor, bool verification, bool keyed,
          std::uint64_t seed, int pass, const Box& box, void* destination) {
  T* out = static_cast<T*>(destination);
  if (verification)
    fill_verification(info, tensor, seed, box, out);
  else if (keyed)
    fill_keyed(plan, tensor, seed, box, out);
  else
    fill_pass(plan, tensor, pass, box, out);
}

}  // namespace

ProbeCheckpoint::ProbeCheckpoint(std::vector<TensorInfo> tensors, ProbePlan plan)
    : tensors_(std::move(tensors)), plan_(std::move(plan)) {
  if (plan_.num_tensors() != tensors_.size())
    throw Error(ErrorCode::kInvalidArgument, "probe checkpoint: the probe plan covers " +
                                                 std::to_string(plan_.num_tensors()) + " tensors, the checkpoint has " +
                                                 std::to_string(tensors_.size()));
  by_name_.reserve(tensors_.size());
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const TensorInfo& info = tensors_[t];
    if (plan_.dtype(t) != info.dtype || plan_.shape(t) != info.shape)
      throw Error(ErrorCode::kInvalidArgument, "probe checkpoint: tensor " + info.name +
                                                   ": the probe plan was built for another dtype or shape");
    if (!by_name_.emplace(info.name, t).second)
      throw Error(ErrorCode::kInvalidArgument, "probe checkpoint: tensor " + info.name + " listed twice");
  }
}

void ProbeCheckpoint::set_pass(int p) {
  plan_.describe_pass(p);  // range check
  pass_ = p;
  verification_ = false;
  keyed_ = false;
}

void ProbeCheckpoint::set_verification(std::uint64_t seed) {
  verification_ = true;
  keyed_ = false;
  seed_ = seed;
}

void ProbeCheckpoint::set_keyed(std::uint64_t seed) {
  if (plan_.num_passes() < 2)
    throw Error(ErrorCode::kInvalidArgument, "probe checkpoint: a keyed pass needs a plan of two passes or more");
  pass_ = plan_.num_passes() - 1;
  verification_ = false;
  keyed_ = true;
  seed_ = seed;
}

KeyedDigit::KeyedDigit(std::uint64_t seed, DType dtype, const ProbePlan& plan)
    : seed_key_(mix64(mix64(seed + 2 * kGamma) ^ 0x6b657965645f7061ULL)),
      key16_(static_cast<std::uint16_t>(seed_key_ >> 48)),
      place_(place_value(digit_space(dtype).size, plan.num_passes() - 1)),
      base_(digit_space(dtype).size) {}

std::uint16_t KeyedDigit::block_key(std::uint64_t block) const {
  return block == 0 ? key16_ : static_cast<std::uint16_t>(mix64(seed_key_ ^ mix64(block + kGamma)) >> 48);
}

std::uint64_t KeyedDigit::offset(std::uint64_t low) const {
  // 2-byte codes: a 16-bit hash (vectorized in fill_keyed_run); wider ones 64 bits, scaled by multiply-high.
  if (base_ <= 65536) {
    const std::uint64_t h = hash16(static_cast<std::uint16_t>(static_cast<std::uint16_t>(low) ^ block_key(low >> 16)));
    return h >= base_ ? h - base_ : h;
  }
  return static_cast<std::uint64_t>((static_cast<Uint128>(mix64(low ^ seed_key_)) * base_) >> 64);
}

void ProbeCheckpoint::read_box(std::string_view name, const Box& box, void* destination) const {
  std::size_t t = next_.load(std::memory_order_relaxed);
  if (t > 0 && t <= tensors_.size() && tensors_[t - 1].name == name) {
    --t;  // the same tensor again (a parameter built from several boxes of it)
  } else if (t >= tensors_.size() || tensors_[t].name != name) {
    const auto it = by_name_.find(name);
    if (it == by_name_.end())
      throw Error(ErrorCode::kNotFound, "checkpoint " + source() + ": no tensor named " + std::string(name));
    t = it->second;
  }
  next_.store(t + 1, std::memory_order_relaxed);
  read_box(t, box, destination);
}

void ProbeCheckpoint::read_box(std::size_t t, const Box& box, void* destination) const {
  if (t >= tensors_.size())
    throw Error(ErrorCode::kInvalidArgument, "checkpoint " + source() + ": no tensor " + std::to_string(t) + " (it has " +
                                                 std::to_string(tensors_.size()) + ")");
  const TensorInfo& info = tensors_[t];
  if (box.offset.size() != box.extent.size() || !box.fits_in(info.shape))
    throw Error(ErrorCode::kInvalidArgument, "checkpoint " + source() + ": tensor " + info.name + ": box " +
                                                 box.to_string() + " does not fit the tensor's shape " +
                                                 shape_to_string(info.shape));
  switch (dtype_size(info.dtype)) {
    case 1: return fill<std::uint8_t>(plan_, info, t, verification_, keyed_, seed_, pass_, box, destination);
    case 2: return fill<std::uint16_t>(plan_, info, t, verification_, keyed_, seed_, pass_, box, destination);
    case 4: return fill<std::uint32_t>(plan_, info, t, verification_, keyed_, seed_, pass_, box, destination);
    default: return fill<std::uint64_t>(plan_, info, t, verification_, keyed_, seed_, pass_, box, destination);
  }
}

bool ProbeCheckpoint::box_equals(std::size_t t, const Box& box, const void* data) const {
  if (!keyed_ || t >= tensors_.size() || dtype_size(tensors_[t].dtype) != 2 || box.ndim() == 0 ||
      box.offset.size() != box.extent.size() || !box.fits_in(tensors_[t].shape)) {
    std::vector<std::byte> values(static_cast<std::size_t>(box.numel()) * dtype_size(tensors_.at(t).dtype));
    read_box(t, box, values.data());
    return std::memcmp(values.data(), data, values.size()) == 0;
  }
  // The keyed pass's 2-byte codes, row by row as fill_keyed writes them, compared in registers.
  const DigitSpace ds = digit_space(plan_.dtype(t));
  const KeyedDigit keyed(seed_, plan_.dtype(t), plan_);
  const std::span<const std::uint64_t> places = plan_.places(t);
  std::uint64_t first = plan_.base(t);
  for (std::size_t a = 0; a < box.offset.size(); ++a) first += static_cast<std::uint64_t>(box.offset[a]) * places[a];
  const auto* have = static_cast<const std::uint16_t*>(data);
  bool same = true;
  each_row_key(places, box, first, [&](std::int64_t row, std::uint64_t k) {
    same = same && each_keyed_piece(row, k, keyed, [&](std::int64_t j, std::int64_t len, std::uint64_t low, std::uint64_t top) {
      return keyed_codes16_equal(have + j, len, static_cast<std::uint16_t>(low), keyed.block_key(low >> 16),
                                 keyed_run16(top, ds, keyed));
    });
    have += row;
  });
  return same;
}

std::optional<bool> ProbeCheckpoint::strided_box_equals(std::size_t t, const Box& box, const void* data,
                                                        const Shape& strides) const {
  if (!keyed_ || !keyed_progression16_in_lanes() || t >= tensors_.size() || dtype_size(tensors_[t].dtype) != 2 ||
      box.ndim() == 0 || box.offset.size() != box.extent.size() || strides.size() != box.extent.size() ||
      !box.fits_in(tensors_[t].shape))
    return std::nullopt;
  const DigitSpace ds = digit_space(plan_.dtype(t));
  const KeyedDigit keyed(seed_, plan_.dtype(t), plan_);
  const std::uint64_t place = keyed.place(), base = keyed.base();
  if (place >= 65536 || base >= 65536) return std::nullopt;
  const auto ndim = static_cast<std::size_t>(box.ndim());
  std::size_t line = ndim;  // the axis of stride 1: its keys are the progression
  for (std::size_t a = 0; a < ndim; ++a) {
    if (strides[a] < 0) return std::nullopt;
    if (strides[a] == 1 && box.extent[a] > 1 && line == ndim) line = a;
  }
  // Lines shorter than a vector step: a call per few elements, where the buffer's transposed compare is better.
  if (line == ndim || box.extent[line] < 32 || box.numel() == 0) return std::nullopt;
  const std::span<const std::uint64_t> places = plan_.places(t);
  std::uint64_t first = plan_.base(t);
  for (std::size_t a = 0; a < ndim; ++a) first += static_cast<std::uint64_t>(box.offset[a]) * places[a];
  const std::uint64_t step = places[line];
  KeyedProgression16 keys{0, 0, static_cast<std::uint16_t>(step % place), static_cast<std::uint16_t>(step / place % base),
                          static_cast<std::uint16_t>(place)};
  const KeyedRun16 run = keyed_run16(0, ds, keyed);
  const std::uint16_t block_key = keyed.block_key(0);  // every low < place < 2^16
  const auto* have = static_cast<const std::uint16_t*>(data);
  Shape index(ndim, 0);  // odometer over the other axes
  for (;;) {
    std::uint64_t key = first;
    std::int64_t at = 0;
    for (std::size_t a = 0; a < ndim; ++a) {
      key += static_cast<std::uint64_t>(index[a]) * places[a];
      at += index[a] * strides[a];
    }
    keys.low = static_cast<std::uint16_t>(key % place);
    keys.top = static_cast<std::uint16_t>(key / place % base);
    if (!keyed_progression16_equal(have + at, box.extent[line], block_key, keys, run)) return false;
    std::size_t a = ndim;
    while (a-- > 0) {
      if (a == line) continue;
      if (++index[a] < box.extent[a]) break;
      index[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) return true;
  }
}

std::string ProbeCheckpoint::source() const {
  if (verification_) return "probe verification (seed " + std::to_string(seed_) + ")";
  if (keyed_)
    return "probe pass " + std::to_string(pass_ + 1) + " of " + std::to_string(plan_.num_passes()) + " (" +
           plan_.describe_pass(pass_) + ", keyed by the lower digits, seed " + std::to_string(seed_) + ")";
  return "probe pass " + std::to_string(pass_ + 1) + " of " + std::to_string(plan_.num_passes()) + " (" +
         plan_.describe_pass(pass_) + ")";
}

}  // namespace wb::layout
