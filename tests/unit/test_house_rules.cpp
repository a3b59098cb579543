// House rules of the library that a reader of one file cannot see, read from the source so that they stay
// true as code is added: no library file outgrows a reader's head (700 lines: split it by lifecycle phase),
// and every wait of the library pauses through the one wait policy (comm/backoff.hpp), so that one setting
// says how much of a core a waiting rank takes; every WB_* variable the scripts read is known (a setting or a
// script variable), so that a job started from them is not warned about it. The include direction and the
// collectives' room are test_include_direction.cpp's.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/settings.hpp"

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

// The scripts a user or CI runs (scripts/, slurm/, .ci/, the tests' shell scripts) read WB_* variables that
// reach the library's processes through the environment (sbatch exports them, mpirun passes them on).
TEST(HouseRules, EveryVariableTheScriptsReadIsKnownToTheEnvironmentCheck) {
  static const std::regex variable(R"(\$\{?(WB_[A-Z0-9_]+))");
  std::set<std::string> names;
  for (const char* folder : {"scripts", "slurm", ".ci", "tests"}) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".sh" && ext != ".sbatch" && entry.path().filename() != "run")) continue;
      std::ifstream in(entry.path());
      for (std::string line; std::getline(in, line);)
        for (std::sregex_iterator m(line.begin(), line.end(), variable), end; m != end; ++m) names.insert((*m)[1]);
    }
  }
  ASSERT_GT(names.size(), 20u);  // the scripts were found
  std::vector<std::string> set_here;  // unset again, so that the tests after this one in the process see none
  for (const std::string& name : names)
    if (::getenv(name.c_str()) == nullptr && ::setenv(name.c_str(), "1", 0) == 0) set_here.push_back(name);
  const std::vector<std::string> warnings = wb::unknown_environment_warnings();
  for (const std::string& name : set_here) ::unsetenv(name.c_str());
  for (const std::string& name : names)
    for (const std::string& warning : warnings)
      EXPECT_EQ(warning.find("variable " + name + " "), std::string::npos)
          << warning << " (add it to kScriptVariables in src/core/environment_check.cpp)";
}

}  // namespace
