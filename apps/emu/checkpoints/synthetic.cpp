#include "emu/checkpoints/synthetic.hpp"

#include <algorithm>
#include <bit>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // splitmix64 increment

// splitmix64's finalizer: element i of a tensor gets mix64(key + (i + 1) * kGamma), the splitmix64
// stream of that tensor, so any element costs one add and one mix, wherever the box starts.
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t tensor_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the name, then mixed with the seed
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ULL;
  return mix64(mix64(seed + kGamma) ^ mix64(h));
}

// A bell-shaped value like a trained weight: the Irwin-Hall sum of four 16-bit uniforms, made odd so it
// is never zero. |x| in [9.2e-7, 0.24]: normal in f32/bf16, and 0.24 cannot round up to 0.25 in bf16.
constexpr double kStep = 0.24 / 262144.0;
inline std::int32_t centred(std::uint64_t h) {
  const auto s = static_cast<std::int32_t>((h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48));
  return 2 * s - 262139;  // s in [0, 262140]
}
inline float small_float(std::uint64_t h) { return static_cast<float>(centred(h)) * static_cast<float>(kStep); }

inline std::uint16_t to_bf16(std::uint64_t h) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(small_float(h));
  bits += 0x7fffU + ((bits >> 16) & 1U);  // round to nearest even; no NaN or overflow can occur here
  return static_cast<std::uint16_t>(bits >> 16);
}

inline std::uint16_t to_f16(std::uint64_t h) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(small_float(h));
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  if (exponent < 1)  // below f16's normal range (|x| < 2^-14): the smallest normal binade instead
    return static_cast<std::uint16_t>(sign | 0x0400U | ((h >> 20) & 0x3ffU));
  const std::uint32_t mantissa = bits & 0x7fffffU;
  auto half = static_cast<std::uint32_t>(sign | (exponent << 10) | (mantissa >> 13));
  const std::uint32_t rest = mantissa & 0x1fffU;
  if (rest > 0x1000U || (rest == 0x1000U && (half & 1U))) ++half;  // a carry only moves to the next binade
  return static_cast<std::uint16_t>(half);
}

// fp8: sign, a normal exponent below the bias (|x| < 0.25), random mantissa; never NaN, inf or denormal.
inline std::uint8_t to_e4m3(std::uint64_t h) {
  const auto exponent = static_cast<std::uint32_t>(1 + ((h >> 56) & 3));  // 2^-6 .. 2^-3 (bias 7)
  return static_cast<std::uint8_t>(((h >> 63) << 7) | (exponent << 3) | ((h >> 48) & 7));
}
inline std::uint8_t to_e5m2(std::uint64_t h) {
  const auto exponent = static_cast<std::uint32_t>(5 + ((h >> 56) & 7));  // 2^-10 .. 2^-3 (bias 15)
  return static_cast<std::uint8_t>(((h >> 63) << 7) | (exponent << 2) | ((h >> 48) & 3));
}

// Walks the box row by row (last axis contiguous in both the tensor and the destination).
template <typename T, typename Convert>
void fill_rows(const Shape& shape, const Box& box, std::uint64_t key, void* destination, Convert convert) {
  T* out = static_cast<T*>(destination);
  const int ndim = static_cast<int>(shape.size());
  if (ndim == 0) {
    out[0] = convert(mix64(key + kGamma));
    return;
  }
  if (box.numel() == 0) return;
  const Shape strides = contiguous_strides(shape);
  const std::int64_t row = box.extent[ndim - 1];
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < ndim; ++d) rows *= box.extent[d];
  Shape index(ndim, 0);  // odometer over the outer axes of the box
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t flat = box.offset[ndim - 1];
    for (int d = 0; d + 1 < ndim; ++d) flat += (box.offset[d] + index[d]) * strides[d];
    std::uint64_t state = key + static_cast<std::uint64_t>(flat + 1) * kGamma;
    for (std::int64_t j = 0; j < row; ++j, state += kGamma) out[j] = convert(mix64(state));
    out += row;
    for (int d = ndim - 2; d >= 0; --d) {
      if (++index[d] < box.extent[d]) break;
      index[d] = 0;
    }
  }
}

void check_box(const TensorInfo& info, const Box& box, const std::string& where) {
  if (!box.fits_in(info.shape))
    throw Error(ErrorCode::kInvalidArgument, where + "tensor " + info.name + ": box " + box.to_string() +
                                                 " does not fit its shape " + shape_to_string(info.shape));
}

void fill_checked(const TensorInfo& info, const Box& box, std::uint64_t seed, void* destination) {
  const std::uint64_t key = tensor_key(seed, info.name);
  const Shape& s = info.shape;
  switch (info.dtype) {
    case DType::kBF16: return fill_rows<std::uint16_t>(s, box, key, destination, to_bf16);
    case DType::kF16: return fill_rows<std::uint16_t>(s, box, key, destination, to_f16);
    case DType::kF32: return fill_rows<float>(s, box, key, destination, small_float);
    case DType::kF64:
      return fill_rows<double>(s, box, key, destination, [](std::uint64_t h) { return centred(h) * kStep; });
    case DType::kF8E4M3: return fill_rows<std::uint8_t>(s, box, key, destination, to_e4m3);
    case DType::kF8E5M2: return fill_rows<std::uint8_t>(s, box, key, destination, to_e5m2);
    case DType::kI8:
      return fill_rows<std::int8_t>(s, box, key, destination, [](std::uint64_t h) { return static_cast<std::int8_t>(h); });
    case DType::kU8:
      return fill_rows<std::uint8_t>(s, box, key, destination, [](std::uint64_t h) { return static_cast<std::uint8_t>(h); });
    case DType::kI32:
      return fill_rows<std::int32_t>(s, box, key, destination, [](std::uint64_t h) { return static_cast<std::int32_t>(h); });
    case DType::kI64:
      return fill_rows<std::int64_t>(s, box, key, destination, [](std::uint64_t h) { return static_cast<std::int64_t>(h); });
  }
  throw Error(ErrorCode::kUnsupported, "tensor " + info.name + ": no synthetic values for dtype " +
                                           std::to_string(static_cast<int>(info.dtype)));
}

// Large tensors are filled by several threads, each a band of rows (the values do not depend on who
// computes them), so writing a full-size checkpoint is bound by the disk rather than by the hash.
void fill_parallel(const TensorInfo& info, std::uint64_t seed, std::byte* destination) {
  constexpr std::size_t kMinBytesPerThread = 8u << 20;
  const std::size_t threads_wanted = std::min<std::size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), 16, info.nbytes() / kMinBytesPerThread});
  const Box whole = Box::whole(info.shape);
  if (threads_wanted <= 1 || info.shape.empty() || info.shape[0] < 2) {
    fill_checked(info, whole, seed, destination);
    return;
  }
  const std::int64_t rows = info.shape[0];
  const std::int64_t parts = std::min<std::int64_t>(static_cast<std::int64_t>(threads_wanted), rows);
  const std::size_t row_bytes = info.nbytes() / static_cast<std::size_t>(rows);
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(parts));
  for (std::int64_t p = 0; p < parts; ++p) {
    const std::int64_t begin = rows * p / parts, end = rows * (p + 1) / parts;
    pool.emplace_back([&, p, begin, end] {
      try {
        Box band = whole;
        band.offset[0] = begin;
        band.extent[0] = end - begin;
        fill_checked(info, band, seed, destination + static_cast<std::size_t>(begin) * row_bytes);
      } catch (...) {
        errors[static_cast<std::size_t>(p)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

void fill_synthetic(const TensorInfo& info, const Box& box, std::uint64_t seed, void* destination) {
  check_box(info, box, "synthetic values: ");
  fill_checked(info, box, seed, destination);
}

SyntheticCheckpoint::SyntheticCheckpoint(std::vector<TensorInfo> tensors, std::uint64_t seed)
    : tensors_(std::move(tensors)), seed_(seed) {
  by_name_.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (!by_name_.emplace(tensors_[i].name, i).second)
      throw Error(ErrorCode::kInvalidArgument, source() + ": tensor " + tensors_[i].name + " listed twice");
}

void SyntheticCheckpoint::read_box(std::string_view name, const Box& box, void* destination) const {
  const auto it = by_name_.find(std::string(name));
  if (it == by_name_.end())
    throw Error(ErrorCode::kNotFound, source() + ": no tensor named " + std::string(name));
  const TensorInfo& info = tensors_[it->second];
  check_box(info, box, source() + ": ");
  fill_checked(info, box, seed_, destination);
}

std::string SyntheticCheckpoint::source() const { return "synthetic checkpoint (seed " + std::to_string(seed_) + ")"; }

void write_synthetic_checkpoint(const std::string& path, CheckpointFormat format,
                                const std::vector<TensorInfo>& tensors, std::uint64_t seed,
                                const CheckpointWriterOptions& options, const std::function<void()>& between_tensors) {
  std::unordered_set<std::string_view> seen;
  std::size_t largest = 0;
  for (const TensorInfo& t : tensors) {
    if (!seen.insert(t.name).second)
      throw Error(ErrorCode::kInvalidArgument, path + ": tensor " + t.name + " listed twice");
    largest = std::max(largest, t.nbytes());
  }
  auto writer = create_checkpoint(path, format, tensors, options);
  // One buffer for all tensors, left uninitialised: every byte is overwritten before it is written.
  std::unique_ptr<std::byte[]> buffer(new std::byte[std::max<std::size_t>(largest, 1)]);
  for (const TensorInfo& t : tensors) {
    if (between_tensors) between_tensors();
    fill_parallel(t, seed, buffer.get());
    writer->write(t.name, buffer.get());
  }
  if (between_tensors) between_tensors();
  writer->finish();
}

}  // namespace wb::emu
