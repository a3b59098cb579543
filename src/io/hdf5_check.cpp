#include "io/hdf5_check.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/log.hpp"
#include "core/settings.hpp"
#include "io/checkpoint_internal.hpp"
#include "weightbridge/status.hpp"

extern char** environ;

namespace wb::io {
namespace {

Setting<bool> check_setting(
    "hdf5_check_in_child", true,
    "Walk an HDF5 checkpoint's metadata in a checker process (wb-hdf5-check, started with posix_spawn) "
    "before opening it, so that a corrupt file that crashes libhdf5 is refused with an error instead of "
    "crashing this process.");
// A dataset's metadata takes milliseconds to walk, even on a slow parallel file system.
Setting<std::int64_t> check_idle_setting(
    "hdf5_check_seconds", 60,
    "How long the checker of an HDF5 checkpoint may take over one dataset's metadata before the file is "
    "refused as one that makes libhdf5 loop.",
    1, std::int64_t{1} << 30);  // far beyond any walk, and within the steady clock's range
Setting<std::string> checker_setting(
    "hdf5_checker", "",
    "Path of the HDF5 checker program (wb-hdf5-check); empty: beside the library, or in "
    "../libexec/weightbridge/ from it.");

constexpr std::string_view kWhat = "HDF5 checkpoint";

struct Outcome {
  std::string dataset;  // the last dataset the checker turned to
  std::string error;    // "CODE MESSAGE": the wb::Error its walk threw
  int signal = 0;       // that killed it
  int exit_status = 0;  // when it exited
  bool stalled = false;
};

[[noreturn]] void refuse(const std::string& path, const std::string& dataset, const std::string& cause) {
  throw Error(ErrorCode::kCorruptData, tensor_context(kWhat, path, dataset) + ": " + cause);
}

// The checker beside this library (the build tree) or in ../libexec/weightbridge/ (an installation).
std::string find_checker(std::string& looked) {
  if (!checker_setting.get().empty()) return checker_setting.get();
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&check_hdf5_file), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code error;
  const std::filesystem::path library = std::filesystem::canonical(info.dli_fname, error);
  if (error) return {};
  for (const std::filesystem::path& candidate :
       {library.parent_path() / "wb-hdf5-check", library.parent_path() / ".." / "libexec" / "weightbridge" / "wb-hdf5-check"}) {
    looked += (looked.empty() ? "" : ", ") + candidate.string();
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return {};
}

void record_status(int status, Outcome& outcome) {
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  if (WIFEXITED(status)) outcome.exit_status = WEXITSTATUS(status);
}

// Follows the checker's progress lines until it exits; kills it after `idle_seconds` without one.
Outcome watch(pid_t checker, int progress_fd, std::int64_t idle_seconds) {
  Outcome outcome;
  std::string pending;
  auto last_progress = std::chrono::steady_clock::now();
  const auto idle_limit = std::chrono::seconds(idle_seconds);
  for (bool open = true; open;) {
    pollfd ready{progress_fd, POLLIN, 0};
    const int polled = ::poll(&ready, 1, 200);
    if (polled < 0 && errno != EINTR) break;
    if (polled > 0) {
      char buffer[4096];
      const ssize_t got = ::read(progress_fd, buffer, sizeof buffer);
      if (got > 0) {
        pending.append(buffer, static_cast<std::size_t>(got));
        for (std::size_t newline; (newline = pending.find('\n')) != std::string::npos; pending.erase(0, newline + 1)) {
          const std::string line = pending.substr(0, newline);
          if (line.starts_with("d ") && line.size() > 2) outcome.dataset = line.substr(2);  // "d ": still listing
          if (line.starts_with("e ")) outcome.error = line.substr(2);
        }
        last_progress = std::chrono::steady_clock::now();
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        open = false;  // the checker exited (or closed its end)
      }
    }
    if (open && std::chrono::steady_clock::now() - last_progress > idle_limit) {
      int status = 0;
      if (::waitpid(checker, &status, WNOHANG) == checker) {  // exited, but someone else holds the pipe
        record_status(status, outcome);
        return outcome;
      }
      ::kill(checker, SIGKILL);
      while (::waitpid(checker, &status, 0) < 0 && errno == EINTR) {
      }
      outcome.stalled = true;
      return outcome;
    }
  }
  int status = 0;
  pid_t done = -1;
  while ((done = ::waitpid(checker, &status, 0)) < 0 && errno == EINTR) {
  }
  if (done == checker) record_status(status, outcome);
  return outcome;
}

// Starts the checker on `path`, its standard output into `progress_fd`, its standard error discarded
// (glibc's "free(): invalid size" and the like). -1 when it cannot be started.
pid_t spawn_checker(const std::string& checker, const std::string& path, int progress_fd) {
  posix_spawn_file_actions_t actions;
  if (::posix_spawn_file_actions_init(&actions) != 0) return -1;
  ::posix_spawn_file_actions_adddup2(&actions, progress_fd, STDOUT_FILENO);
  ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> argv = {const_cast<char*>(checker.c_str()), const_cast<char*>(path.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, checker.c_str(), &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

void say_unchecked_once(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    WB_LOG(kWarn) << kWhat << ": " << why << "; HDF5 files are read without the check (WB_HDF5_CHECKER names the "
                  << "checker, WB_HDF5_CHECK_IN_CHILD=0 turns the check off)";
  }
}

}  // namespace

void check_hdf5_file(const std::string& path) {
  if (!check_setting.get()) return;
  const std::int64_t idle_seconds = *check_idle_setting;  // its range is checked as it is read
  std::string looked;
  const std::string checker = find_checker(looked);
  if (checker.empty()) return say_unchecked_once("the checker wb-hdf5-check was not found (looked for " + looked + ")");
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return say_unchecked_once(std::string("pipe2 failed: ") + std::strerror(errno));
  const pid_t pid = spawn_checker(checker, path, pipe_fds[1]);
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    return say_unchecked_once("the checker " + checker + " could not be started");
  }
  const Outcome outcome = watch(pid, pipe_fds[0], idle_seconds);
  ::close(pipe_fds[0]);
  if (outcome.stalled)
    refuse(path, outcome.dataset,
           "its metadata is corrupt: reading it made no progress for " + std::to_string(idle_seconds) +
               " s (libhdf5 loops on some corrupt files; seen in the child process that checks each file before "
               "this one opens it)");
  if (outcome.signal != 0)
    refuse(path, outcome.dataset,
           std::string("its metadata is corrupt: reading it crashed the HDF5 library (") + ::strsignal(outcome.signal) +
               ", in the child process that checks each file before this one opens it)");
  if (outcome.exit_status == kCheckerFoundError && !outcome.error.empty()) {
    // The error the reader's own walk would give: the same walk of the same file.
    const std::size_t space = outcome.error.find(' ');
    const int code = std::atoi(outcome.error.substr(0, space).c_str());
    const bool known = code > 0 && code <= static_cast<int>(ErrorCode::kInternal);
    throw Error(known ? static_cast<ErrorCode>(code) : ErrorCode::kCorruptData,
                space == std::string::npos ? outcome.error : outcome.error.substr(space + 1));
  }
  if (outcome.exit_status != 0 && outcome.exit_status != kCheckerFoundError)  // exit() inside a library, a sanitizer
    refuse(path, outcome.dataset,
           "its metadata is corrupt: reading it ended the child process that checks each file before this one "
           "opens it, with exit status " + std::to_string(outcome.exit_status));
}

}  // namespace wb::io
