// How the Python adapters call into C++ for anything that may wait: one call at a time per adapter (a
// second thread is refused, never queued behind a collective), the GIL released, and Ctrl-C noticed
// within 100 ms of any wait on the calling thread (comm/interrupt.hpp): the wait ends, the update fails
// on every rank as after a timeout, and the signal's exception (KeyboardInterrupt) is raised.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <string>
#include <utility>

#include "comm/interrupt.hpp"
#include "weightbridge/status.hpp"

namespace wb::python {

namespace py = pybind11;

class CallGate {
 public:
  explicit CallGate(std::string adapter) : adapter_(std::move(adapter)) {}
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  /// Runs `f` (which may wait) without the GIL; called with it. Raises RuntimeError naming `method` and the
  /// call in progress when another thread is inside this adapter; the signal's exception when one came.
  template <class F>
  auto run(const char* method, F&& f) {
    enter(method);
    struct Leave {
      CallGate& gate;
      ~Leave() { gate.busy_.store(nullptr); }
    } leave{*this};
    auto result = [&] {
      comm::InterruptScope scope([this] { return check_signals(); });
      py::gil_scoped_release release;
      return f();
    }();
    raise_if_interrupted();
    return result;
  }

 private:
  void enter(const char* method);
  Status check_signals();
  void raise_if_interrupted();

  std::string adapter_;
  std::atomic<const char*> busy_{nullptr};  // the method running, null when none
  py::object type_, value_, traceback_;     // the exception a signal handler raised during the call
};

}  // namespace wb::python
