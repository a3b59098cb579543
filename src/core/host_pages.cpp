#include "core/host_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace wb {
namespace {

std::size_t page_bytes() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

std::uintptr_t round_up(std::uintptr_t value, std::size_t to) { return (value + to - 1) / to * to; }

}  // namespace

std::byte* map_host_pages(std::size_t bytes, std::size_t& mapped) {
  mapped = round_up(bytes, page_bytes());
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (mapped < kHugePageBytes) {
    void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, flags, -1, 0);
    return memory == MAP_FAILED ? nullptr : static_cast<std::byte*>(memory);
  }
  // Mapped with room to spare, then trimmed to the boundary: mmap itself aligns only to the page.
  const std::size_t spare = kHugePageBytes - page_bytes();
  void* memory = ::mmap(nullptr, mapped + spare, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(memory);
  const std::uintptr_t start = round_up(base, kHugePageBytes);
  if (start > base) ::munmap(memory, start - base);
  if (const std::size_t tail = base + mapped + spare - (start + mapped); tail > 0)
    ::munmap(reinterpret_cast<void*>(start + mapped), tail);
  return reinterpret_cast<std::byte*>(start);
}

void advise_huge_pages(std::byte* first, std::byte* last) {
  const std::uintptr_t begin = round_up(reinterpret_cast<std::uintptr_t>(first), kHugePageBytes);
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(last) / kHugePageBytes * kHugePageBytes;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

bool populate_host_pages(std::byte* data, std::size_t bytes) {
  if (bytes == 0 || ::madvise(data, bytes, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) return false;  // EINVAL: a kernel without the advice
  const std::size_t page = page_bytes();
  for (std::size_t at = 0; at < bytes; at += page) static_cast<volatile std::byte*>(data)[at] = std::byte{0};
  return true;
}

}  // namespace wb
