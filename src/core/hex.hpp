#pragma once
// "0x1f" for error messages: addresses, keys, vendor codes and digests.

#include <cstdint>
#include <cstdio>
#include <string>

namespace wb {

inline std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace wb
