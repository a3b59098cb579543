// Deadlines of the control plane: how a timeout is given and said, the clock every wait reads, and the one
// setting that bounds every wait of the library (WB_TIMEOUT_SECONDS).
#pragma once

#include <limits>
#include <string>

namespace wb::comm {

inline constexpr double kNoDeadline = std::numeric_limits<double>::infinity();

/// A timeout as the user gives it: 0 or infinite means no deadline (kNoDeadline); NaN and negatives are refused
/// (kInvalidArgument). Values are only ever compared, never turned into a clock duration, so none overflows.
double normalize_timeout(double seconds);

/// "2 s", "0.5 s", or "no deadline".
std::string seconds_text(double seconds);

/// Seconds on this process's steady clock.
double local_seconds();

/// The timeout_seconds setting (WB_TIMEOUT_SECONDS, --timeout-seconds) as given: 0 or inf for none.
double timeout_setting();
/// Its declared default, whatever the environment says (what option structs built in code start from).
double default_timeout_seconds();

}  // namespace wb::comm
