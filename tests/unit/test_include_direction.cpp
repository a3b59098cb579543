// The dependency direction of docs/architecture.md, read from the source: every #include under src/,
// kernels/, apps/ and include/weightbridge/ goes from a component to one it may use, private headers are
// named through the private include directory (never "../" or "src/..."), no header includes itself back
// through others, the public data headers need no <mpi.h>, and nothing the CUDA kernels compile reaches
// <mpi.h>. UCX keeps its layers in separate libraries so that a wrong-way include cannot compile; this test
// is our cheap substitute.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = WB_SOURCE_DIR;

// Who may include whom: each component and the ones it builds on directly (docs/architecture.md):
//   core <- io <- layout <- plan <- exec <- coord <- apps;  core <- comm <- layout;  core <- transport <- exec;
//   exec <- kernels.
// A component may include those reachable from it: the control plane (comm) from layout on, never from io
// or transport. Nothing builds on kernels: exec reaches the kernels only through the host functions it
// declares (exec/copy_kernel_launch.hpp).
const std::map<std::string, std::vector<std::string>> kBuildsOn = {
    {"core", {}},
    {"comm", {"core"}},
    {"io", {"core"}},
    {"layout", {"io", "comm"}},
    {"plan", {"layout"}},
    {"transport", {"core"}},
    {"exec", {"plan", "transport"}},
    {"coord", {"exec"}},
    {"apps", {"coord"}},
    {"kernels", {"exec"}},
};

// The component of each installed header.
const std::map<std::string, std::string> kPublicHeaders = {
    {"adapter.hpp", "coord"},   {"checkpoint.hpp", "io"},      {"correspondence.hpp", "layout"},
    {"dtype.hpp", "core"},      {"job_clock.hpp", "coord"},    {"plan.hpp", "plan"},
    {"simulator.hpp", "plan"},  {"source_map.hpp", "layout"},  {"status.hpp", "core"},
    {"tensor.hpp", "core"},
};

// Installed headers that exist to exchange things over MPI: the only ones that may include <mpi.h>.
const std::set<std::string> kMpiPublicHeaders = {"adapter.hpp", "job_clock.hpp"};

struct Include {
  std::string target;  // as written
  bool system = false;
  int line = 0;
};

struct SourceFile {
  fs::path path;  // relative to the root
  std::string component;
  std::vector<Include> includes;
};

std::optional<std::string> component_of_file(const fs::path& relative) {
  auto it = relative.begin();
  const std::string top = it->string();
  if (top == "kernels" || top == "apps") return top;
  if (top == "include") return kPublicHeaders.contains(relative.filename().string())
                                   ? std::optional(kPublicHeaders.at(relative.filename().string()))
                                   : std::nullopt;
  if (top == "src" && ++it != relative.end() && kBuildsOn.contains(it->string())) return it->string();
  return std::nullopt;
}

std::vector<SourceFile> read_tree() {
  static const std::regex include(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::vector<SourceFile> files;
  for (const char* top : {"src", "kernels", "apps", "include/weightbridge"}) {
    if (!fs::exists(kRoot / top)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / top)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".cpp" && ext != ".cu" && ext != ".h")) continue;
      SourceFile file;
      file.path = fs::relative(entry.path(), kRoot);
      file.component = component_of_file(file.path).value_or("?");
      std::ifstream in(entry.path());
      std::string text;
      for (int number = 1; std::getline(in, text); ++number) {
        std::smatch match;
        if (std::regex_search(text, match, include)) file.includes.push_back({match[2], match[1] == "<", number});
      }
      files.push_back(std::move(file));
    }
  }
  std::sort(files.begin(), files.end(), [](const SourceFile& a, const SourceFile& b) { return a.path < b.path; });
  return files;
}

// The file a quoted include names, relative to the root (the library's include directories: include/ and
// the private src/; apps/ for the emulated backends; the including file's own folder).
fs::path resolve(const SourceFile& from, const std::string& target) {
  const fs::path name(target);
  const std::string first = name.begin()->string();
  if (first == "weightbridge") return fs::path("include") / name;
  if (kBuildsOn.contains(first) && first != "apps" && first != "kernels") return fs::path("src") / name;
  if (first == "emu" || first == "baselines") return fs::path("apps") / name;  // apps/ is on their include path
  return from.path.parent_path() / name;
}

std::set<std::string> reachable(const std::string& component) {
  std::set<std::string> seen{component};
  std::vector<std::string> todo{component};
  while (!todo.empty()) {
    const std::string c = todo.back();
    todo.pop_back();
    for (const std::string& next : kBuildsOn.at(c))
      if (seen.insert(next).second) todo.push_back(next);
  }
  return seen;
}

std::string where(const SourceFile& file, const Include& include) {
  return file.path.string() + ":" + std::to_string(include.line) + ": #include " + (include.system ? "<" : "\"") +
         include.target + (include.system ? ">" : "\"");
}

TEST(IncludeDirection, EveryIncludeFollowsTheDependencyDirection) {
  const std::vector<SourceFile> files = read_tree();
  ASSERT_GT(files.size(), 50u) << "no sources under " << kRoot;
  for (const SourceFile& file : files) {
    if (file.component == "?") {
      ADD_FAILURE() << file.path << " belongs to no component of docs/architecture.md (an installed header missing "
                    << "from this test's table?)";
      continue;
    }
    const std::set<std::string> allowed = reachable(file.component);
    for (const Include& include : file.includes) {
      if (include.system) continue;
      if (include.target.starts_with("../") || include.target.starts_with("src/") || include.target.starts_with("kernels/") ||
          include.target.starts_with("include/")) {
        ADD_FAILURE() << where(file, include) << ": private headers go through the private include directory "
                      << "(\"exec/pack.hpp\"), public ones as \"weightbridge/...\"";
        continue;
      }
      const fs::path target = resolve(file, include.target);
      if (!fs::exists(kRoot / target)) {
        ADD_FAILURE() << where(file, include) << ": no such file " << target;
        continue;
      }
      const std::optional<std::string> component = component_of_file(target);
      if (!component) {
        ADD_FAILURE() << where(file, include) << ": " << target << " belongs to no component";
        continue;
      }
      EXPECT_TRUE(allowed.contains(*component))
          << where(file, include) << ": " << file.component << " may not include " << *component
          << " (docs/architecture.md, dependency direction)";
    }
  }
}

// Every MPI collective of the library (and every call that makes or joins a communicator, collective too)
// is called in src/comm/, where the collectives have deadlines and one error behaviour: nothing else may
// run its own all-gather or scatter beside connect's.
TEST(CommRoom, EveryMpiCollectiveOfTheLibraryIsCalledInComm) {
  static const std::regex collective(
      R"(\bMPI_I?(Allgatherv?|Gatherv?|Scatterv?|Bcast|Barrier|Allreduce|Reduce|Reduce_scatter(_block)?|Alltoall[vw]?|Scan|)"
      R"(Exscan|Comm_dup|Comm_split(_type)?|Comm_create(_group)?|Intercomm_create|Intercomm_merge|Comm_accept|Comm_connect)\s*\()",
      std::regex::icase);  // the non-blocking forms too: MPI_Iallgather, MPI_Ibcast
  int files = 0;
  // python/src too: a collective of the Python binding's own would wait for the C++ ranks of a mixed job,
  // which never join it (tests/python/check_mixed.py).
  std::vector<fs::path> files_in;
  for (const char* folder : {"src", "python/src"})
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / folder)) files_in.push_back(entry.path());
  for (const fs::path& path : files_in) {
    const std::string ext = path.extension().string();
    if (!fs::is_regular_file(path) || (ext != ".hpp" && ext != ".cpp")) continue;
    const fs::path relative = fs::relative(path, kRoot);
    if (*std::next(relative.begin()) == "comm") continue;
    ++files;
    std::ifstream in(path);
    std::string text;
    for (int number = 1; std::getline(in, text); ++number) {
      const std::string code = text.substr(0, text.find("//"));
      std::smatch match;
      if (std::regex_search(code, match, collective))
        ADD_FAILURE() << relative.string() << ":" << number << ": " << match[0]
                      << " outside src/comm/ (use comm/collectives.hpp: deadlines, one error behaviour)";
    }
  }
  EXPECT_GT(files, 50);
}

TEST(IncludeDirection, NoHeaderIncludesItselfBack) {
  const std::vector<SourceFile> files = read_tree();
  std::map<fs::path, std::vector<fs::path>> edges;
  for (const SourceFile& file : files)
    for (const Include& include : file.includes)
      if (!include.system) {
        const fs::path target = resolve(file, include.target).lexically_normal();
        if (fs::exists(kRoot / target)) edges[file.path].push_back(target);
      }
  // Depth-first search; a back edge is a cycle, reported with its path.
  std::map<fs::path, int> state;  // 1: on the stack, 2: done
  std::vector<fs::path> stack;
  std::function<void(const fs::path&)> visit = [&](const fs::path& node) {
    state[node] = 1;
    stack.push_back(node);
    for (const fs::path& next : edges[node]) {
      if (state[next] == 1) {
        std::string cycle;
        for (auto it = std::find(stack.begin(), stack.end(), next); it != stack.end(); ++it) cycle += it->string() + " -> ";
        ADD_FAILURE() << "include cycle: " << cycle << next.string();
      } else if (state[next] == 0) {
        visit(next);
      }
    }
    stack.pop_back();
    state[node] = 2;
  };
  for (const SourceFile& file : files)
    if (state[file.path] == 0) visit(file.path);
}

TEST(IncludeDirection, DataHeadersAndTheKernelsNeedNoMpi) {
  const std::vector<SourceFile> files = read_tree();
  std::map<fs::path, const SourceFile*> by_path;
  for (const SourceFile& file : files) by_path[file.path] = &file;
  const auto includes_mpi = [](const SourceFile& file) {
    return std::any_of(file.includes.begin(), file.includes.end(),
                       [](const Include& i) { return i.system && i.target == "mpi.h"; });
  };
  for (const SourceFile& file : files) {
    if (file.path.begin()->string() != "include" || !includes_mpi(file)) continue;
    EXPECT_TRUE(kMpiPublicHeaders.contains(file.path.filename().string()))
        << file.path << " includes <mpi.h>: move what needs MPI into an exchange header of its own";
  }
  // Everything nvcc compiles for the kernels, transitively (nvcc builds them without MPI's include path).
  for (const SourceFile& file : files) {
    if (file.component != "kernels") continue;
    std::vector<fs::path> todo{file.path};
    std::set<fs::path> seen;
    while (!todo.empty()) {
      const fs::path path = todo.back();
      todo.pop_back();
      if (!seen.insert(path).second || !by_path.contains(path)) continue;
      const SourceFile& f = *by_path.at(path);
      EXPECT_FALSE(includes_mpi(f)) << f.path << " includes <mpi.h> and is compiled into " << file.path;
      for (const Include& include : f.includes)
        if (!include.system) todo.push_back(resolve(f, include.target).lexically_normal());
    }
  }
}

}  // namespace
