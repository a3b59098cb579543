#include "comm/stranded.hpp"

#include <mpi.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "comm/backoff.hpp"
#include "comm/deadline.hpp"
#include "core/log.hpp"

namespace wb::comm {
namespace {

struct Stranded {
  std::mutex mutex;
  std::map<const void*, std::pair<std::string, long>> calls;  // what, and the thread inside MPI
  bool hooked = false;
};
Stranded& registry() {
  static Stranded* r = new Stranded;  // never destroyed: read at MPI_Finalize, after static destructors may run
  return *r;
}

// What the signal handler reads: built beforehand, at the start of MPI_Finalize.
char crash_text[2048];
std::size_t crash_length = 0;
std::array<std::atomic<long>, 16> stranded_threads{};
std::atomic<bool> said_stopped{false};
struct sigaction previous_segv {}, previous_bus {};

void on_crash(int signal) {
  const long self = syscall(SYS_gettid);
  for (const std::atomic<long>& thread : stranded_threads)
    if (thread.load() != 0 && thread.load() == self) {
      // A thread given up on, faulting in MPI's teardown: stopped here for good; MPI_Finalize goes on.
      const char text[] = "[wb] a WeightBridge thread given up on inside MPI faulted in MPI_Finalize's teardown; it "
                          "is stopped, and MPI_Finalize goes on\n";
      if (!said_stopped.exchange(true)) (void)!write(STDERR_FILENO, text, sizeof text - 1);
      for (;;) pause();
    }
  if (crash_length > 0) (void)!write(STDERR_FILENO, crash_text, crash_length);
  sigaction(signal, signal == SIGSEGV ? &previous_segv : &previous_bus, nullptr);  // Open MPI's own report next
  raise(signal);
}

// The attribute's delete callback on MPI_COMM_SELF: MPI_Finalize runs it first, with MPI still whole.
int at_finalize(MPI_Comm, int, void*, void*) {
  const std::vector<std::string> calls = stranded_calls();
  if (calls.empty()) return MPI_SUCCESS;
  {
    Stranded& r = registry();
    std::lock_guard lock(r.mutex);
    std::size_t k = 0;
    for (const auto& [key, call] : r.calls)
      if (k < stranded_threads.size()) stranded_threads[k++].store(call.second);
  }
  std::string names;
  for (const std::string& call : calls) names += (names.empty() ? "" : "; ") + call;
  const double seconds = normalize_timeout(timeout_setting());
  WB_LOG(kError) << "MPI_Finalize with " << calls.size() << " thread(s) of WeightBridge still inside MPI, given up on: "
                 << names << ". Open MPI may fault in MPI_Finalize under such a thread (SIGSEGV in mca_btl_vader, "
                 << "measured): that thread is then stopped" << (seconds == kNoDeadline ? std::string() : "; this process ends with status 1 if "
                 "MPI_Finalize has not returned within " + seconds_text(seconds));
  const std::string text = "[wb] this process crashed in MPI_Finalize, with WeightBridge threads still inside MPI "
                           "(given up on: " + names + "); its work had ended\n";
  crash_length = std::min(text.size(), sizeof crash_text);
  text.copy(crash_text, crash_length);
  struct sigaction crash {};
  crash.sa_handler = on_crash;
  sigemptyset(&crash.sa_mask);
  sigaction(SIGSEGV, &crash, &previous_segv);
  sigaction(SIGBUS, &crash, &previous_bus);
  // The watchdog ends with the process; it acts only while MPI_Finalize has not returned.
  if (seconds == kNoDeadline) return MPI_SUCCESS;
  std::thread([seconds] {
    Backoff backoff;
    for (const double start = local_seconds(); local_seconds() - start < seconds; backoff.pause()) {
      int finalized = 0;
      if (MPI_Finalized(&finalized) == MPI_SUCCESS && finalized) return;
    }
    const char text[] = "[wb] MPI_Finalize did not return in time, with WeightBridge threads still inside MPI: ending "
                        "the process (status 1)\n";
    (void)!write(STDERR_FILENO, text, sizeof text - 1);
    _exit(1);
  }).detach();
  return MPI_SUCCESS;
}

}  // namespace

long kernel_thread_id() { return syscall(SYS_gettid); }

void strand(const void* key, std::string call, long thread) {
  Stranded& r = registry();
  std::lock_guard lock(r.mutex);
  r.calls[key] = {std::move(call), thread};
  if (r.hooked) return;
  int keyval = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, at_finalize, &keyval, nullptr) == MPI_SUCCESS &&
      MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) == MPI_SUCCESS)
    r.hooked = true;
}

void unstrand(const void* key) {
  Stranded& r = registry();
  std::lock_guard lock(r.mutex);
  r.calls.erase(key);
}

std::vector<std::string> stranded_calls() {
  Stranded& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> calls;
  for (const auto& [key, call] : r.calls) calls.push_back(call.first);
  return calls;
}

}  // namespace wb::comm
