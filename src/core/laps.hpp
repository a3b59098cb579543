#pragma once
// The seconds of a set-up's steps, for one debug line: where a connect (a join's) spends its time.

#include <chrono>
#include <cstdio>
#include <string>

namespace wb {

class Laps {
 public:
  /// Ends the step begun at the last call (or the construction), named `step`.
  void operator()(const char* step) {
    const double now = seconds();
    char ms[32];
    std::snprintf(ms, sizeof ms, " %.1f ms", 1e3 * (now - last_));
    text_ += (text_.empty() ? "" : ", ") + std::string(step) + ms;
    last_ = now;
  }
  const std::string& text() const { return text_; }

 private:
  static double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
  double last_ = seconds();
  std::string text_;
};

}  // namespace wb
