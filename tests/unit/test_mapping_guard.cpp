// io/mapping_guard: a read of a mapped page that the file no longer has is a result, not SIGBUS (the race a
// checkpoint reader's change check cannot close: truncated between the check and the copy).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/mapping_guard.hpp"

namespace wb::io {
namespace {

TEST(MappingGuard, AReadPastATruncationIsFalseAndTheProcessLives) {
  const std::string path = (std::filesystem::temp_directory_path() / ("wb-guard-" + std::to_string(::getpid()))).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  const std::size_t size = 4 * 65536;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  std::vector<char> out(size);
  EXPECT_TRUE(guarded_copy([&] { std::memcpy(out.data(), map, size); }));
  ASSERT_EQ(::ftruncate(fd, 0), 0);
  EXPECT_FALSE(guarded_copy([&] { std::memcpy(out.data(), map, size); }));
  EXPECT_FALSE(guarded_copy([&] { std::memcpy(out.data(), static_cast<char*>(map) + size - 8, 8); }));  // again
  EXPECT_TRUE(guarded_copy([] {}));
  ::munmap(map, size);
  ::close(fd);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace wb::io
