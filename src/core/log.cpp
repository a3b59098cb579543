#include "core/log.hpp"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/settings.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

Setting<std::string> log_level_setting("log_level", "warn",
                                       "Log verbosity: error, warn, info, debug or trace.");

constexpr int kUnset = -1;
std::atomic<int> level_override{kUnset};
std::atomic<int> cached_level{kUnset};

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kTrace: return "TRACE";
  }
  return "?";
}

int rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return std::atoi(value);
  }
  return -1;
}

}  // namespace

LogLevel parse_log_level(std::string_view text) {
  if (text == "error" || text == "0") return LogLevel::kError;
  if (text == "warn" || text == "warning" || text == "1") return LogLevel::kWarn;
  if (text == "info" || text == "2") return LogLevel::kInfo;
  if (text == "debug" || text == "3") return LogLevel::kDebug;
  if (text == "trace" || text == "4") return LogLevel::kTrace;
  throw Error(ErrorCode::kInvalidArgument,
              "log level '" + std::string(text) + "' is not one of error, warn, info, debug, trace (WB_LOG_LEVEL)");
}

LogLevel log_level() {
  if (const int forced = level_override.load(std::memory_order_relaxed); forced != kUnset)
    return static_cast<LogLevel>(forced);
  int level = cached_level.load(std::memory_order_relaxed);
  if (level == kUnset) {
    // A bad WB_LOG_LEVEL must not make every log call throw: report it once and use the default.
    try {
      level = static_cast<int>(parse_log_level(log_level_setting.get()));
    } catch (const Error& error) {
      std::fprintf(stderr, "weightbridge: %s; using warn\n", error.what());
      level = static_cast<int>(LogLevel::kWarn);
    }
    cached_level.store(level, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(level);
}

void set_log_level(LogLevel level) { level_override.store(static_cast<int>(level), std::memory_order_relaxed); }

int process_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int rank = -1;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS) return rank;
  }
  return rank_from_environment();
}

namespace detail {

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  stream_ << "[wb " << level_tag(level) << " rank " << process_rank() << "] ";
  if (level >= LogLevel::kDebug) stream_ << (base ? base + 1 : file) << ":" << line << ": ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write per line so concurrent ranks do not interleave inside it.
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
}

}  // namespace detail
}  // namespace wb
