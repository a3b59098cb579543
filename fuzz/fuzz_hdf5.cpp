// libFuzzer target: an HDF5 checkpoint file. Opening either lists datasets whose every tensor then reads
// whole, or throws wb::Error. libhdf5 itself crashes or loops on some corrupt metadata; in production the
// checking child (setting hdf5_check_in_child) turns that into an error, but forking per input is slow
// under the sanitizers, so by default this target explores with the check off and scripts/fuzz.sh
// replays every crashing or hanging input with WB_HDF5_CHECK_IN_CHILD=1, where each must be an error.
// Run with -detect_leaks=0: libhdf5 keeps free lists and caches across files.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "fuzz_util.hpp"
#include "weightbridge/checkpoint.hpp"

namespace {

struct Setup {
  std::string path;
  int fd = -1;
  Setup() {
    // /dev/shm when there is one: a file per input, no disk.
    const std::filesystem::path dir = std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                          : wb::fuzz::scratch_directory("wb-fuzz-hdf5");
    path = (dir / ("wb-fuzz-" + std::to_string(::getpid()) + ".h5")).string();
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) std::abort();
    // A stalled child is reported after one idle second, not a minute.
    wb::fuzz::set_setting("hdf5_check_seconds", "1");
    if (std::getenv("WB_HDF5_CHECK_IN_CHILD") == nullptr) wb::fuzz::set_setting("hdf5_check_in_child", "false");
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Setup& s = setup();
  wb::fuzz::fill_fd(s.fd, data, size);
  try {
    const auto reader = wb::open_hdf5_checkpoint(s.path);
    for (const wb::TensorInfo& info : reader->tensors()) {
      if (info.nbytes() > (std::size_t{64} << 20)) continue;  // a chunked dataset may claim a huge shape
      std::vector<std::byte> out(info.nbytes());
      reader->read(info.name, out.data());
    }
  } catch (const wb::Error&) {
  }
  return 0;
}
