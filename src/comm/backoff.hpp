// The one wait policy of the library: what a rank does between two polls of something that has not moved.
// Every wait loop (an MPI operation with a deadline, an update's progress loop, the verify digests, the
// acknowledgements, a teardown) pauses through a Backoff, so that one setting (WB_IDLE_SLEEP_US) says how
// much of a core a waiting rank takes.
//
// Yield while the wait is young (answers usually come within microseconds, and on a machine whose ranks
// outnumber its cores the peer waited for gets the core); once idle for longer, sleep a little, growing
// with the idle time (an eighth of it) up to the setting, and up to ten times the setting once idle for
// 100 ms (a stall, not an answer on its way): a wait of milliseconds then costs no core, and progress is
// still noticed within one sleep.
#pragma once

#include <cstdint>

namespace wb::comm {

/// The idle_sleep_us setting, validated (throws wb::Error kInvalidArgument outside its range).
std::int64_t idle_sleep_setting();

class Backoff {
 public:
  /// `longest_sleep_us`: the cap of a sleep; 0 only yields. Default: the setting.
  Backoff();
  explicit Backoff(std::int64_t longest_sleep_us);

  /// Something moved: the next pauses start short again.
  void progressed();
  /// Nothing moved since the last poll: yield or sleep, by how long nothing has.
  void pause();
  /// Seconds since the last progress (or since construction).
  double idle_seconds() const;

 private:
  std::int64_t longest_sleep_us_ = 0;
  double idle_since_ = 0;
};

/// The other pause of the policy: a step repeated by a caller's loop (a rollout's poll_requests) that
/// found nothing new is followed by the next no sooner than `interval_seconds` later; the next call
/// sleeps the rest first. Steps that found something are not paced.
class Pace {
 public:
  /// `interval_seconds` <= 0: never pauses.
  explicit Pace(double interval_seconds);
  /// Before a step: sleeps the rest of the interval when the last step was quiet.
  void before_step();
  /// After a step: whether it found nothing new.
  void after_step(bool quiet);

 private:
  double interval_seconds_ = 0;
  double quiet_at_ = 0;  // local_seconds() when the last quiet step ended
  bool quiet_ = false;
};

}  // namespace wb::comm
