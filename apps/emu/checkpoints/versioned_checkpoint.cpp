#include "emu/checkpoints/versioned_checkpoint.hpp"

#include <cstring>
#include <vector>

namespace wb::emu {
namespace {

inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <class Word>
void perturb_row(Word* row, std::int64_t count, std::uint64_t key, std::int64_t first, Word mask) {
  for (std::int64_t i = 0; i < count; ++i) {
    const auto change = static_cast<Word>((mix64(key + static_cast<std::uint64_t>(first + i)) & mask) | 1u);
    row[i] = static_cast<Word>(row[i] ^ change);
  }
}

}  // namespace

void VersionedCheckpoint::read_box(std::string_view name, const Box& box, void* destination) const {
  base_.read_box(name, box, destination);
  if (version_ == 0 || box.numel() == 0) return;
  const TensorInfo& tensor = info(name);
  std::uint64_t key = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) key = (key ^ c) * 0x100000001b3ULL;
  key = mix64(key ^ mix64(version_));
  // Row by row along the innermost axis: flat index of each row's first element in the whole tensor.
  const int ndim = box.ndim();
  const std::int64_t row = ndim == 0 ? 1 : box.extent[static_cast<std::size_t>(ndim - 1)];
  const std::size_t element = dtype_size(tensor.dtype);
  std::vector<std::int64_t> index(static_cast<std::size_t>(ndim > 0 ? ndim - 1 : 0), 0);
  auto* out = static_cast<std::byte*>(destination);
  for (std::int64_t rows = box.numel() / row, r = 0; r < rows; ++r) {
    std::int64_t flat = 0;
    for (int a = 0; a < ndim; ++a) {
      const std::int64_t at = box.offset[static_cast<std::size_t>(a)] + (a < ndim - 1 ? index[static_cast<std::size_t>(a)] : 0);
      flat = flat * tensor.shape[static_cast<std::size_t>(a)] + at;
    }
    std::byte* p = out + static_cast<std::size_t>(r * row) * element;
    switch (element) {
      case 1: perturb_row(reinterpret_cast<std::uint8_t*>(p), row, key, flat, std::uint8_t{0x3}); break;
      case 2: perturb_row(reinterpret_cast<std::uint16_t*>(p), row, key, flat, std::uint16_t{0xf}); break;
      case 4: perturb_row(reinterpret_cast<std::uint32_t*>(p), row, key, flat, std::uint32_t{0xff}); break;
      default:
        for (std::int64_t i = 0; i < row; ++i) {
          std::uint64_t word = 0;
          std::memcpy(&word, p + static_cast<std::size_t>(i) * element, 8);
          word ^= (mix64(key + static_cast<std::uint64_t>(flat + i)) & 0xffff) | 1u;
          std::memcpy(p + static_cast<std::size_t>(i) * element, &word, 8);
        }
    }
    for (int a = ndim - 2; a >= 0; --a) {  // next row
      if (++index[static_cast<std::size_t>(a)] < box.extent[static_cast<std::size_t>(a)]) break;
      index[static_cast<std::size_t>(a)] = 0;
    }
  }
}

std::string VersionedCheckpoint::source() const { return base_.source() + " version " + std::to_string(version_); }

}  // namespace wb::emu
