#include "io/mapping_guard.hpp"

#include <csetjmp>
#include <csignal>
#include <mutex>

namespace wb::io {
namespace {

thread_local sigjmp_buf* active = nullptr;
struct sigaction previous {};

void on_sigbus(int signal, siginfo_t* info, void* context) {
  if (active != nullptr) siglongjmp(*active, 1);
  // Not ours: what was there before handles it (a faulting read repeats once the default is back).
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(signal, info, context);
    return;
  }
  if (previous.sa_handler == SIG_IGN) return;
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != nullptr) {
    previous.sa_handler(signal);
    return;
  }
  ::sigaction(SIGBUS, &previous, nullptr);
}

void install() {
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, &previous);
}

}  // namespace

bool guarded_copy(const std::function<void()>& copy) {
  static std::once_flag installed;
  std::call_once(installed, install);
  sigjmp_buf here;
  sigjmp_buf* const outer = active;
  if (sigsetjmp(here, 1) != 0) {
    active = outer;
    return false;
  }
  active = &here;
  copy();
  active = outer;
  return true;
}

}  // namespace wb::io
