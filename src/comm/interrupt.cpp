#include "comm/interrupt.hpp"

#include <utility>

#include "comm/deadline.hpp"

namespace wb::comm {
namespace {

// Often enough that Ctrl-C feels immediate, rarely enough that taking the interpreter's lock costs nothing.
constexpr double kAskEverySeconds = 0.1;

thread_local InterruptCheck current_check;
thread_local double last_asked = 0;
thread_local Status tripped;

}  // namespace

InterruptScope::InterruptScope(InterruptCheck check) : previous_(std::move(current_check)), previous_asked_(last_asked) {
  current_check = std::move(check);
  last_asked = local_seconds();
  tripped = Status::ok();
}

InterruptScope::~InterruptScope() {
  current_check = std::move(previous_);
  last_asked = previous_asked_;
  tripped = Status::ok();
}

Status poll_interrupt() {
  if (!current_check) return Status::ok();
  if (!tripped.is_ok()) return tripped;
  const double now = local_seconds();
  if (now - last_asked < kAskEverySeconds) return Status::ok();
  last_asked = now;
  tripped = current_check();
  return tripped;
}

bool interrupted() { return current_check && !tripped.is_ok(); }

}  // namespace wb::comm
