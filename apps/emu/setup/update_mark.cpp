#include "emu/setup/update_mark.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "emu/process/bounded_exit.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {

void UpdateMark::write(const std::string& path) const {
  const std::string next = path + ".next";
  {
    std::ofstream out(next, std::ios::trunc);
    char line[64];
    std::snprintf(line, sizeof line, "%llu %.17g\n", static_cast<unsigned long long>(version), began);
    out << line;
    if (!out.flush()) throw Error(ErrorCode::kSystem, "--update-mark: cannot write " + next);
  }
  if (std::rename(next.c_str(), path.c_str()) != 0) throw Error(ErrorCode::kSystem, "--update-mark: cannot rename " + next + " to " + path);
}

UpdateMark UpdateMark::read(const std::string& path) {
  UpdateMark mark;
  std::ifstream in(path);
  unsigned long long version = 0;
  double began = 0;
  if (in >> version >> began) {
    mark.version = version;
    mark.began = began;
  }
  return mark;
}

UpdateMark UpdateMark::wait_into_next(const std::string& path, double ms, double timeout, const std::stop_token& stop) {
  const std::uint64_t now = read(path).version;
  const double until = wall_seconds() + timeout;
  UpdateMark next;
  // Polled every millisecond: the point in the update is what this places, and an update lasts seconds.
  while ((next = read(path)).version <= now) {
    if (stop.stop_requested()) return {};
    if (wall_seconds() > until)
      throw Error(ErrorCode::kTimeout, "--update-mark " + path + ": the trainers began no update after version " +
                                           std::to_string(now) + " within " + std::to_string(timeout) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (double left; (left = next.began + ms * 1e-3 - wall_seconds()) > 0;) {
    if (stop.stop_requested()) return {};
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.01)));
  }
  return next;
}

}  // namespace wb::emu
