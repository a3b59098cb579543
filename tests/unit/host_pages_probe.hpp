// What the kernel says of a mapping, for tests of core/host_pages and of what maps through it (staging):
// whether the mapping holding an address asked for huge pages (its "hg" flag in /proc/self/smaps), how
// many of a range's pages are resident (mincore), and whether the kernel gives huge pages unasked.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace wb {

inline std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

inline bool asks_for_huge_pages(const void* address) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t first = 0, last = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> first >> dash >> last && dash == '-' && line.find(':') > line.find(' ')) {
      inside = at >= first && at < last;
      continue;
    }
    if (inside && line.starts_with("VmFlags:")) return (line + " ").find(" hg ") != std::string::npos;
  }
  return false;
}

inline std::size_t resident_pages(const std::byte* first, std::size_t bytes) {
  std::vector<unsigned char> pages((bytes + page_size() - 1) / page_size());
  if (::mincore(const_cast<std::byte*>(first), bytes, pages.data()) != 0) return static_cast<std::size_t>(-1);
  std::size_t n = 0;
  for (unsigned char p : pages) n += p & 1;
  return n;
}

inline bool huge_pages_always() {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(mode, text);
  return text.find("[always]") != std::string::npos;
}

}  // namespace wb
