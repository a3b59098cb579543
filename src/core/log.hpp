// Leveled, rank-prefixed logging to stderr. The level comes from WB_LOG_LEVEL
// (error|warn|info|debug|trace, default warn). Lines are written whole, so ranks sharing a terminal do
// not interleave within a line.
#pragma once

#include <sstream>
#include <string_view>

namespace wb {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

/// The level in force (read from WB_LOG_LEVEL on first use; set_log_level overrides it).
LogLevel log_level();
void set_log_level(LogLevel level);
/// Parses "error|warn|info|debug|trace" (or 0..4); throws wb::Error on anything else.
LogLevel parse_log_level(std::string_view text);

/// This process's rank in MPI_COMM_WORLD when MPI is initialized, otherwise from the launcher's
/// environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID), otherwise -1.
int process_rank();

namespace detail {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace wb

/// WB_LOG(kInfo) << "connected " << n << " peers";  Arguments are not evaluated when the level is off.
#define WB_LOG(level)                                           \
  if (::wb::LogLevel::level > ::wb::log_level()) {              \
  } else                                                        \
    ::wb::detail::LogLine(::wb::LogLevel::level, __FILE__, __LINE__).stream()
