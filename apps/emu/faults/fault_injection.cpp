#include "emu/faults/fault_injection.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <stdexcept>

#include "emu/process/bounded_exit.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {

Fault Fault::parse(const std::string& text) {
  Fault fault;
  if (text.empty()) return fault;
  std::stringstream in(text);
  std::string item;
  std::getline(in, fault.kind, ',');
  if (fault.kind != "stop" && fault.kind != "kill" && fault.kind != "throw")
    throw Error(ErrorCode::kInvalidArgument, "--fault " + text + ": the kind is stop, kill or throw");
  try {
    while (std::getline(in, item, ',')) {
      const auto eq = item.find('=');
      const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
      if (key == "rank") fault.rank = std::stoi(value);
      else if (key == "version") fault.version = std::stoull(value);
      else if (key == "seconds") fault.seconds = std::stod(value);
      else if (key == "when" && !value.empty()) fault.when = value;
      else if (key == "at") fault.at_ms = std::stod(value);
      else throw Error(ErrorCode::kInvalidArgument, "--fault " + text + ": unknown key " + key);
    }
  } catch (const std::logic_error&) {  // std::stoi and friends: not a number, or out of range
    throw Error(ErrorCode::kInvalidArgument, "--fault " + text + ": a value is not a number");
  }
  if (fault.rank < 0 || (fault.version == 0) == fault.when.empty() || (fault.kind == "stop" && !(fault.seconds > 0)))
    throw Error(ErrorCode::kInvalidArgument,
                "--fault " + text + ": needs rank=R and one of version=K or when=FILE (and seconds=S for stop)");
  if (fault.at_ms && (!(*fault.at_ms >= 0 && *fault.at_ms <= 3600e3) || fault.when.empty() || fault.kind == "throw"))
    throw Error(ErrorCode::kInvalidArgument, "--fault " + text + ": at=MS (0 to an hour) goes with when=FILE, for kill or stop");
  return fault;
}

bool Fault::due(int world_rank, std::uint64_t v) const {
  if (kind.empty() || world_rank != rank || placed()) return false;
  if (when.empty()) return v == version;
  if (met != 0) return v == met;  // found already: that version only
  if (::access(when.c_str(), F_OK) != 0) return false;
  met = v;
  return true;
}

void inject(const Fault& fault, const std::string& program, const std::string& who) {
  std::fprintf(stderr, "%s: fault: %s: %s at version %llu, at t=%.3f\n", program.c_str(), who.c_str(), fault.kind.c_str(),
               static_cast<unsigned long long>(fault.when.empty() ? fault.version : fault.met), wall_seconds());
  std::fflush(stderr);
  if (fault.kind == "kill") ::raise(SIGKILL);
  if (fault.kind == "throw") throw std::runtime_error("injected fault: " + who + " threw at version " + std::to_string(fault.when.empty() ? fault.version : fault.met));
  // stop: a child wakes this process up again; it touches nothing but the clock and one signal.
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    timespec pause{static_cast<time_t>(fault.seconds), static_cast<long>((fault.seconds - std::floor(fault.seconds)) * 1e9)};
    while (::nanosleep(&pause, &pause) != 0) {}
    ::kill(parent, SIGCONT);
    ::_exit(0);
  }
  if (child > 0) {
    ::raise(SIGSTOP);
    ::waitpid(child, nullptr, 0);
  }
  std::fprintf(stderr, "%s: fault: %s resumed at t=%.3f\n", program.c_str(), who.c_str(), wall_seconds());
  std::fflush(stderr);
}

}  // namespace wb::emu
