// WB_* variables that name no setting: a typo (WB_BUFER_MIB) would otherwise be ignored without a word.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.hpp"
#include "core/settings.hpp"

extern char** environ;

namespace wb {
namespace {

// The variables of the project's own scripts and tests (scripts/, tests/, .ci/): read by bash or CMake,
// never by the library, so they are not settings; declared here so that a job started from those scripts
// is not warned about them. Each is documented where its script reads it.
constexpr const char* kScriptVariables[] = {
    "WB_BUILD_DIR",          "WB_BUILD_TYPE",     "WB_DEBUG_LEVEL",     "WB_CMAKE_ARGS",       "WB_JOBS",
    "WB_TEST_JOBS",          "WB_GPU_BUILD_DIR",  "WB_GPU_TEST_JOBS",    "WB_SANITIZE",
    "WB_SANITIZE_BUILD_DIR", "WB_SANITIZE_COORD", "WB_SANITIZE_MPI_LEAKS", "WB_SANITIZE_TARGETS",
    "WB_CLUSTER_NAME",       "WB_CLUSTER_SUBNET", "WB_CLUSTER_SLOTS",    "WB_TEST_WATCHDOG",
    "WB_SLURM_DIR",          "WB_SLURM_CPUS",     "WB_SLURMCTLD_PORT",   "WB_SLURMD_PORT",
    "WB_DEMO_DIR",           "WB_REPLAY_DATA",    "WB_TEST_IO_DIR",      "WB_TOOLS_WORK",
    "WB_PYTHON",             "WB_MODEL_CONFIG_DIR", "WB_FAKE_IBVERBS_OLD", "WB_FAKE_IBVERBS_NO_CREATE_QP",
    "WB_FAKE_OLD",           "WB_FAKE_NO_CREATE_QP", "WB_TEST_NO_RDMA_WITH_LIBFABRIC",
    "WB_DEMO_STEPS",         "WB_DEMO_SKIP_BUILD", "WB_WITH_PYTHON",      "WB_WITH_SLURM",
    "WB_CHECKPOINT",         "WB_MODES",          "WB_REPS",             "WB_OUT_DIR",
    "WB_REPLAY_ARGS",        "WB_SANITIZE_BUILD_ONLY", "WB_MPIRUN",         "WB_JOB_HOSTS",
    "WB_SERVER_PREFIX",      "WB_MODEL_ARGS",     "WB_BENCH_ARGS",
};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> unknown_environment_warnings() {
  std::vector<std::string> known;
  for (SettingBase* setting : all_settings()) known.push_back(setting->environment_variable());
  std::vector<std::string> warnings;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (text.substr(0, 3) != "WB_") continue;
    const std::string name(text.substr(0, text.find('=')));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (std::find_if(std::begin(kScriptVariables), std::end(kScriptVariables),
                     [&](const char* v) { return name == v; }) != std::end(kScriptVariables))
      continue;
    std::string closest;
    std::size_t best = std::string::npos;
    for (const std::string& candidate : known) {
      const std::size_t d = edit_distance(name, candidate);
      if (d < best) best = d, closest = candidate;
    }
    std::string warning = "environment variable " + name + " is no WeightBridge setting and is ignored";
    if (!closest.empty()) warning += "; the closest setting is " + closest;
    warnings.push_back(std::move(warning));
  }
  std::sort(warnings.begin(), warnings.end());
  return warnings;
}

void warn_unknown_environment() {
  // Once per process, whoever asks first (a tool at start, or the first adapter a library user constructs).
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& warning : unknown_environment_warnings()) WB_LOG(kWarn) << warning;
  });
}

}  // namespace wb
