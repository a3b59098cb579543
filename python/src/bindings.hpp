// What the pieces of the `weightbridge` extension module share: turning Python objects (tensors, dtypes,
// communicators, options) into the C++ API's types, and C++ errors into weightbridge.Error.
#pragma once

#include <pybind11/pybind11.h>

#include <mpi.h>

#include <string>
#include <vector>

#include "weightbridge/adapter.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::python {

namespace py = pybind11;

// ---- errors (module.cpp) ----------------------------------------------------------------------------

/// Sets weightbridge.Error for `status` as the pending Python exception, with `cause` as its __cause__
/// when given, and throws py::error_already_set so that pybind11 raises it.
[[noreturn]] void raise_error(const Status& status, py::object cause = py::object());

/// "ValueError: bad shape" for the Python exception held by `error` (its type's qualified name outside
/// builtins, then str() of the exception).
std::string describe_python_error(py::error_already_set& error);

// ---- tensors and dtypes (tensors.cpp) ---------------------------------------------------------------

/// Bad input found while converting Python objects; the message names what was converted.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The UTF-8 text of `name` (a str). Throws InputError naming `what` and the name as ascii() writes it
/// when the str cannot be UTF-8 (a lone surrogate), instead of pybind11's "Unable to cast Python instance".
std::string name_from_python(py::handle name, const std::string& what);

/// A dtype given as a torch.dtype, a numpy dtype or type, or a name ("bf16", "bfloat16", "torch.float32").
/// Throws InputError naming `what` when it has no WeightBridge equivalent.
DType dtype_from_python(py::handle dtype, const std::string& what);

/// The view of a torch.Tensor or any object with __dlpack__ (numpy arrays, ...), without copying. A torch
/// tensor that requires grad is detached first (same storage). The objects that keep the memory valid are
/// appended to `keep_alive`. Throws InputError naming `what`.
TensorView view_of(py::handle tensor, const std::string& what, py::list& keep_alive);

/// name -> tensor: a mapping (dict, OrderedDict, state_dict) or an iterable of (name, tensor) pairs such as
/// model.named_parameters(). Declaration order is kept. Throws InputError.
ParameterSet parameters_from_python(py::handle params, py::list& keep_alive);

/// The checkpoint's tensor list: TensorInfo objects, (name, dtype, shape) tuples, or a mapping of name ->
/// anything with .dtype and .shape (tensors, including torch "meta" tensors). Throws InputError.
std::vector<TensorInfo> tensor_infos_from_python(py::handle tensors);

// ---- adapters (adapters.cpp) ------------------------------------------------------------------------

/// AdapterOptions from an AdapterOptions object (or None) with keyword overrides; TypeError on an unknown
/// keyword.
AdapterOptions options_from_python(py::handle options, const py::kwargs& overrides);

void bind_adapters(py::module_& m);

}  // namespace wb::python
