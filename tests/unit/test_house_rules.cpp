// House rules of the library that a reader of one file cannot see, read from the source so that they stay
// true as code is added: no library file outgrows a reader's head (700 lines: split it by lifecycle phase),
// and every wait of the library pauses through the one wait policy (comm/backoff.hpp), so that one setting
// says how much of a core a waiting rank takes. The include direction and the collectives' room are
// test_include_direction.cpp's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = WB_SOURCE_DIR;

// The library: what is installed or linked into a user's process.
const char* const kLibraryFolders[] = {"src", "include", "python/src", "kernels"};

struct LibraryFile {
  fs::path relative;
  std::vector<std::string> lines;
};

std::vector<LibraryFile> read_library() {
  std::vector<LibraryFile> files;
  for (const char* folder : kLibraryFolders) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh" && ext != ".h"))
        continue;
      LibraryFile file{fs::relative(entry.path(), kRoot), {}};
      std::ifstream in(entry.path());
      for (std::string line; std::getline(in, line);) file.lines.push_back(line);
      files.push_back(std::move(file));
    }
  }
  return files;
}

TEST(HouseRules, NoLibraryFileIsOver700Lines) {
  const std::vector<LibraryFile> files = read_library();
  for (const LibraryFile& file : files)
    EXPECT_LE(file.lines.size(), 700u) << file.relative.string() << " has " << file.lines.size()
                                       << " lines: split it by lifecycle phase (one concept per file)";
  EXPECT_GT(files.size(), 100u);  // the tree was found
}

TEST(HouseRules, EveryWaitOfTheLibraryPausesThroughTheBackoff) {
  static const std::regex pause(R"(\b(sleep_for|sleep_until|usleep|nanosleep|sched_yield|this_thread::yield)\s*\()");
  const std::vector<LibraryFile> files = read_library();
  for (const LibraryFile& file : files) {
    if (file.relative == fs::path("src/comm/backoff.cpp")) continue;
    for (std::size_t number = 0; number < file.lines.size(); ++number) {
      const std::string& text = file.lines[number];
      const std::string code = text.substr(0, text.find("//"));
      std::smatch match;
      if (std::regex_search(code, match, pause))
        ADD_FAILURE() << file.relative.string() << ":" << number + 1 << ": " << match[0]
                      << " outside src/comm/backoff.cpp (wait through comm::Backoff: one wait policy, WB_IDLE_SLEEP_US)";
    }
  }
}

}  // namespace
