#include "calls.hpp"

#include <stdexcept>

namespace wb::python {

void CallGate::enter(const char* method) {
  type_ = value_ = traceback_ = py::object();
  const char* expected = nullptr;
  if (!busy_.compare_exchange_strong(expected, method))
    // Refused rather than serialized: the calls are collective, and one queued behind another thread's
    // could run a version out of the order every other rank runs them in.
    throw std::runtime_error(adapter_ + "." + method + " was called while " + adapter_ + "." + expected +
                             " runs on another thread: an adapter takes one call at a time (make its calls "
                             "from one thread, or wait for the other call to return)");
}

Status CallGate::check_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return Status::ok();
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  type_ = py::reinterpret_steal<py::object>(type);
  value_ = py::reinterpret_steal<py::object>(value);
  traceback_ = py::reinterpret_steal<py::object>(traceback);
  const std::string name = type_ ? std::string(py::str(type_.attr("__name__"))) : std::string("an exception");
  return Status(ErrorCode::kSystem, "interrupted by a signal (" + name + " raised by its handler, e.g. Ctrl-C)");
}

void CallGate::raise_if_interrupted() {
  if (!type_) return;
  PyErr_Restore(type_.release().ptr(), value_.release().ptr(), traceback_.release().ptr());
  throw py::error_already_set();
}

}  // namespace wb::python
