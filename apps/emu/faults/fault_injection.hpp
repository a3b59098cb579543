// Faults on purpose, for the fault-injection tests (tests/faults/): --fault KIND,rank=R,version=K[,seconds=S]
// makes world rank R, at version K, stop for S seconds (SIGSTOP; a child process sends SIGCONT), kill
// itself (SIGKILL) or throw; when=FILE instead of version=K: at the first version it meets once FILE exists
// (a script's trigger: an engine job joins at a version nobody knows in advance); with at=MS as well, an
// engine job's fault falls MS milliseconds into the trainers' first update that begins once FILE exists (by
// their --update-mark, emu/setup/update_mark), wherever the engine is then. Where the programs call
// inject() is theirs to say (wb-replay, wb-bench).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace wb::emu {

/// The help text of the --fault option, the same in every program that takes it.
inline constexpr const char* kFaultOptionHelp =
    "For fault-injection tests: KIND,rank=R,version=K[,seconds=S] makes world rank R stop for S seconds (KIND stop), "
    "kill itself (kill) or throw (throw) at version K: a trainer in its training step, a rollout in before_update_hook; "
    "when=FILE instead of version=K: at the first version it meets once FILE exists; kill or stop with when=FILE,at=MS "
    "(an engine job with --update-mark): MS milliseconds into the trainers' first update that begins once FILE exists.";

struct Fault {
  std::string kind;  // "" (none), stop, kill, throw
  int rank = -1;
  std::uint64_t version = 0;
  double seconds = 0;
  std::string when;                // a file: due at the first version met once it exists
  mutable std::uint64_t met = 0;   // by file: that version, once met
  std::optional<double> at_ms;      // by file and the trainers' update mark: this far into their next update

  /// "" is no fault; anything else that is not KIND,rank=R,(version=K|when=FILE[,at=MS])[,seconds=S] throws
  /// wb::Error (at=MS: kill or stop only).
  static Fault parse(const std::string& text);
  /// A fault by file is due at the first call that finds the file (which records `v` in `met`), and at `met`
  /// only; one placed in the trainers' update (at=MS) never is: its program runs it (placed()).
  bool due(int world_rank, std::uint64_t v) const;
  bool placed() const { return at_ms.has_value(); }
};

/// Does `fault` now, after the line "PROGRAM: fault: WHO: KIND at version K, at t=T" (and, after a stop,
/// "PROGRAM: fault: WHO resumed at t=T"); `throw` throws std::runtime_error.
void inject(const Fault& fault, const std::string& program, const std::string& who);

}  // namespace wb::emu
