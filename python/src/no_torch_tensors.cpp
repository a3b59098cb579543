// Builds without torch's C++ headers: no tensor is read in place, and a parameter check reads every
// parameter through a new __dlpack__ export (parameter_watch.cpp), about a hundred times slower.
#include "bindings.hpp"

namespace wb::python::torch_tensors {

bool available() { return false; }
std::uint32_t kind_of(py::handle) { return 0; }
bool unchanged(py::handle, const TensorView&, std::uint32_t) { return false; }
std::int64_t storage_bytes(py::handle) { return -1; }

}  // namespace wb::python::torch_tensors
