// Requests to stop from outside the library (Python's Ctrl-C): a check that the caller installs on its own
// thread for the length of one call, asked by every wait of the control plane and of an update's progress
// loop on that thread, at most every 100 ms. Other threads (a staged side's transfer thread) never ask it:
// signals reach the caller's thread only, and the transfer there ends through the failure it then announces.
#pragma once

#include <functional>

#include "weightbridge/status.hpp"

namespace wb::comm {

/// Returns a non-ok status when the caller asked to stop (the wait then ends with it).
using InterruptCheck = std::function<Status()>;

/// Installs `check` on this thread until destruction (then the previous one is back).
class InterruptScope {
 public:
  explicit InterruptScope(InterruptCheck check);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  InterruptCheck previous_;
  double previous_asked_ = 0;
};

/// This thread's check, asked when 100 ms have passed since it was last asked; ok when none is installed.
/// A check that failed once keeps failing (with the same status) until its scope ends.
Status poll_interrupt();

/// Whether this thread's check has failed in the current scope: the failure is then this rank's own, and
/// there is no peer's notice of its cause to wait for.
bool interrupted();

}  // namespace wb::comm
