// The executor's settings, declared once: the coordinator's options and ExecutorOptions default from them.
// The timeout is declared here, not in the coordinator, because the executor's waits are the innermost ones.
#include <cstdint>
#include <limits>

#include "core/settings.hpp"
#include "exec/executor_state.hpp"
#include "exec/round_executor.hpp"

namespace wb::exec {
namespace {

Setting<std::int64_t> idle_sleep_us_setting(
    "idle_sleep_us", 100,
    "Longest sleep of an update's progress loop once nothing has moved for a while, microseconds (0: only "
    "yield). Idle ranks then leave the cores to those that work: the peers they wait for on an oversubscribed "
    "machine, and the kernel's network stack with TCP providers.",
    0, 100000);
Setting<double> timeout_seconds_setting("timeout_seconds", 120.0,
                                        "Deadline of every wait of the coordinator and the executor, in seconds (0 or "
                                        "inf: none).",
                                        0.0, std::numeric_limits<double>::infinity());
Setting<bool> verify_setting("verify", false,
                             "Check every update end to end: digests of what each writer sends, per planned segment, "
                             "against what each receiver installs; a mismatch fails the update naming the parameter.");
Setting<bool> timeline_setting("timeline", false,
                               "Record every update's timeline per worker (pack, write, credit wait, forward, assemble "
                               "per round) into AdapterStats::trace; wb-replay and wb-bench write it with --trace.");

}  // namespace

std::int64_t idle_sleep_setting() { return *idle_sleep_us_setting; }  // its range is checked as it is read
double timeout_setting() { return *timeout_seconds_setting; }
double default_timeout_seconds() { return timeout_seconds_setting.default_value(); }
bool verify_setting_value() { return *verify_setting; }
bool default_verify() { return verify_setting.default_value(); }
bool timeline_setting_value() { return *timeline_setting; }
bool default_timeline() { return timeline_setting.default_value(); }

}  // namespace wb::exec
