// The start of every update of wb-bench, bounded and through world rank 0: each rank tells rank 0 it is
// ready (or that its part failed, and why), and rank 0 answers every rank with go, or with why not: a rank
// that failed, or the ranks that did not come within the timeout, by name. Unlike MPI_Barrier it ends
// whatever the others do, and unlike an MPI_Ibarrier given up on it says who held it. A rank past a stop,
// or one that left, takes part in no further start. Beside emu/process/bounded_exit (how the programs
// end), on MPI_COMM_WORLD's tag 0x7e03.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace wb::emu {

class StartLine {
 public:
  StartLine(int rank, int world, double seconds, std::function<std::string(int)> name)
      : rank_(rank), world_(world), seconds_(seconds), name_(std::move(name)) {}

  /// Every rank ready for `what` (version `version`): "" when all are, else why not. `idle` runs while
  /// this rank waits; when it returns false the wait ends ("", and the caller leaves). `note` (optional):
  /// rank 0's goes to every rank with the go (what rank 0 alone decides, e.g. that engine jobs still join).
  std::string wait(std::uint64_t version, const std::string& what, const std::function<bool()>& idle,
                   std::string* note = nullptr);

  /// This rank's part failed (before or during update `version`): nobody waits for it at a start. Rank 0
  /// tells every rank; the others tell rank 0. Once per rank, and not after a start that stopped.
  void leave(std::uint64_t version, const std::string& why);

 private:
  static constexpr int kStartTag = 0x7e03;  // beside emu/process/bounded_exit's report and verdict tags
  static constexpr std::size_t kMaxBytes = 2048;
  enum Kind : std::int64_t { kReady = 0, kFailed = 1, kGo = 2, kStop = 3 };

  // [version, kind] as int64, then the text; cut to kMaxBytes. Not waited for: the peer may be gone.
  void send(int peer, std::uint64_t version, Kind kind, const std::string& text);
  static std::uint64_t version_of(const std::vector<std::byte>& bytes);
  static std::pair<std::int64_t, std::string> decode(const std::vector<std::byte>& bytes);

  int rank_, world_;
  double seconds_;
  std::function<std::string(int)> name_;
  std::string failed_;  // rank 0: why the starts stop (sticky)
  bool left_ = false;   // this rank takes part in no further start
};

}  // namespace wb::emu
