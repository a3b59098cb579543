// The executor's settings, declared once: the coordinator's options and ExecutorOptions default from them.
// The deadline and the idle sleep of every wait are the control plane's (comm/deadline.cpp, comm/backoff.cpp).

#include "core/settings.hpp"
#include "exec/executor_state.hpp"
#include "exec/round_executor.hpp"

namespace wb::exec {
namespace {

Setting<bool> verify_setting("verify", false,
                             "Check every update end to end: digests of what each writer sends, per planned segment, "
                             "against what each receiver installs; a mismatch fails the update naming the parameter.");
Setting<bool> timeline_setting("timeline", false,
                               "Record every update's timeline per worker (pack, write, credit wait, forward, assemble "
                               "per round) into AdapterStats::trace; wb-replay and wb-bench write it with --trace.");

}  // namespace

bool verify_setting_value() { return *verify_setting; }
bool default_verify() { return verify_setting.default_value(); }
bool timeline_setting_value() { return *timeline_setting; }
bool default_timeline() { return timeline_setting.default_value(); }

}  // namespace wb::exec
