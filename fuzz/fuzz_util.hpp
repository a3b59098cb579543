// Helpers shared by the libFuzzer targets: inputs as files (the checkpoint readers take paths) and the
// one rule every target checks, that bad input is a wb::Error and nothing else.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

#include "core/settings.hpp"
#include "weightbridge/status.hpp"

namespace wb::fuzz {

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

/// Writes all of `size` bytes to `fd` from offset 0 and cuts the file there.
inline void fill_fd(int fd, const std::uint8_t* data, std::size_t size) {
  if (::ftruncate(fd, 0) != 0) std::abort();
  for (std::size_t done = 0; done < size;) {
    const ssize_t wrote = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (wrote <= 0) std::abort();
    done += static_cast<std::size_t>(wrote);
  }
}

/// An in-memory file (memfd) that holds each input; readers open it again as /proc/self/fd/N.
class InputFile {
 public:
  InputFile() : fd_(::memfd_create("wb-fuzz-input", 0)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& put(const std::uint8_t* data, std::size_t size) {
    fill_fd(fd_, data, size);
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

/// A fresh directory for the whole fuzzing run (removed by nobody: the run ends in a crash or a kill).
inline std::filesystem::path scratch_directory(const char* name) {
  const char* base = std::getenv("TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") /
                              (std::string(name) + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

/// Sets a library setting for the run (as --flag would).
inline void set_setting(const char* name, const char* value) {
  SettingBase* setting = find_setting(name);
  if (setting == nullptr) std::abort();
  setting->override_from_text(value);
}

}  // namespace wb::fuzz
