#include "comm/deadline.hpp"

#include <chrono>
#include <cmath>
#include <sstream>

#include "core/settings.hpp"
#include "weightbridge/status.hpp"

namespace wb::comm {
namespace {

// Declared here, in the innermost room that waits: the control plane's operations, the executor's updates
// and the adapters' steps all take their deadline from it.
Setting<double> timeout_seconds_setting("timeout_seconds", 120.0,
                                        "Deadline of every wait of the coordinator and the executor, in seconds (0 or "
                                        "inf: none).",
                                        0.0, std::numeric_limits<double>::infinity());

}  // namespace

double normalize_timeout(double seconds) {
  if (std::isnan(seconds)) throw Error(ErrorCode::kInvalidArgument, "timeout_seconds is not a number");
  // Refused where it is given: a negative deadline would otherwise fail the first wait "within -1 s".
  if (seconds < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "timeout_seconds " + std::to_string(seconds) + " is negative (0 or inf: no deadline)");
  if (seconds <= 0 || seconds >= 1e9) return kNoDeadline;  // 0 = none; 1e9 s (31 years) is none too
  return seconds;
}

std::string seconds_text(double seconds) {
  if (std::isinf(seconds)) return "no deadline";
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

double local_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double timeout_setting() { return *timeout_seconds_setting; }
double default_timeout_seconds() { return timeout_seconds_setting.default_value(); }

}  // namespace wb::comm
