// libFuzzer target: one .safetensors file (the 8-byte length, the JSON header, the data). Whatever the
// bytes, opening either lists tensors whose every byte lies inside the file, or throws wb::Error; each
// listed tensor then reads whole and in a box without touching memory outside the mapping.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_util.hpp"
#include "weightbridge/checkpoint.hpp"

namespace {
wb::fuzz::InputFile& input() {
  static wb::fuzz::InputFile file;
  return file;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = input().put(data, size);
  try {
    const auto reader = wb::open_safetensors_checkpoint(path);
    std::size_t total = 0;
    for (const wb::TensorInfo& info : reader->tensors()) {
      total += info.nbytes();
      if (total > size) std::abort();  // tensors may not share bytes, so together they fit in the file
      std::vector<std::byte> out(info.nbytes());
      reader->read(info.name, out.data());
      if (info.shape.empty() || info.numel() == 0) continue;
      wb::Box box = wb::Box::whole(info.shape);
      for (std::size_t a = 0; a < info.shape.size(); ++a) {  // the inner half of each axis
        box.offset[a] = info.shape[a] / 4;
        box.extent[a] = (info.shape[a] + 1) / 2;
      }
      reader->read_box(info.name, box, out.data());
    }
  } catch (const wb::Error&) {
  }
  return 0;
}
