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

// Where trainers share a link and relays forward over the rollout hosts' links, a trainer with all its
// slots' writes in flight queues rounds of data ahead of the relays' forwards; a relay then holds its
// slots longer and the other trainers wait for credits. At 4 replicas on 1 Gbit/s links (wb-bench, 10
// updates each): sync 1.848 s with no limit, 1.806 s with 2, 1.817 s with 3; 1 and 2 replicas unchanged.
Setting<std::int64_t> send_rounds_setting(
    "send_rounds_in_flight", 2,
    "Rounds whose receive-stage writes a trainer may have in flight at once (0: as many as the pipeline's "
    "slots): fewer queue less of its data ahead of the relays' forwards on a shared link.",
    0, 1024);

}  // namespace

std::int64_t send_rounds_in_flight_setting() { return *send_rounds_setting; }

bool verify_setting_value() { return *verify_setting; }
bool default_verify() { return verify_setting.default_value(); }
bool timeline_setting_value() { return *timeline_setting; }
bool default_timeline() { return timeline_setting.default_value(); }

}  // namespace wb::exec
