#include "comm/backoff.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/deadline.hpp"
#include "core/settings.hpp"

namespace wb::comm {
namespace {

Setting<std::int64_t> idle_sleep_us_setting(
    "idle_sleep_us", 100,
    "Longest sleep of any wait (an update's progress loop, the control plane's operations, acknowledgements, "
    "teardowns) once nothing has moved for a while, microseconds (0: only yield); ten times this once nothing "
    "has moved for 100 ms (a stalled peer, a deadline waited out). Idle ranks then leave the cores to those "
    "that work: the peers they wait for on an oversubscribed machine, and the kernel's network stack with TCP "
    "providers.",
    0, 100000);

// Below this idle time a pause only yields.
constexpr double kYieldSeconds = 50e-6;
// A wait idle this long is no answer on its way but a stall (a peer stopped, a deadline waited out, a port
// nobody knocks at): its sleeps may grow to kStalledCapFactor times the setting. Progress is then noticed
// within 1 ms (the default's), at most 1% of the wait so far; a rank waiting out a 5 s deadline wakes 1,000
// times a second instead of 10,000, each wake a context switch (on a VM a hypercall: 29% of the engine-job
// tests' samples, four of them at once).
constexpr double kStalledSeconds = 0.1;
constexpr std::int64_t kStalledCapFactor = 10;

}  // namespace

std::int64_t idle_sleep_setting() { return *idle_sleep_us_setting; }  // its range is checked as it is read

Backoff::Backoff() : Backoff(idle_sleep_setting()) {}

Backoff::Backoff(std::int64_t longest_sleep_us) : longest_sleep_us_(std::max<std::int64_t>(0, longest_sleep_us)), idle_since_(local_seconds()) {}

void Backoff::progressed() { idle_since_ = local_seconds(); }

double Backoff::idle_seconds() const { return local_seconds() - idle_since_; }

void Backoff::pause() {
  const double idle = idle_seconds();
  if (idle < kYieldSeconds || longest_sleep_us_ == 0) {
    std::this_thread::yield();
    return;
  }
  const std::int64_t cap = idle < kStalledSeconds ? longest_sleep_us_ : kStalledCapFactor * longest_sleep_us_;
  const auto sleep_us = std::min<std::int64_t>(static_cast<std::int64_t>(idle * 1e6) / 8 + 1, cap);
  std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
}

Pace::Pace(double interval_seconds) : interval_seconds_(interval_seconds) {}

void Pace::before_step() {
  if (!quiet_ || interval_seconds_ <= 0) return;
  const double rest = quiet_at_ + interval_seconds_ - local_seconds();
  if (rest > 0) std::this_thread::sleep_for(std::chrono::duration<double>(rest));
}

void Pace::after_step(bool quiet) {
  quiet_ = quiet;
  if (quiet) quiet_at_ = local_seconds();
}

}  // namespace wb::comm
