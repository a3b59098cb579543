// What the pieces of the `weightbridge` extension module share: turning Python objects (tensors, dtypes,
// communicators, options) into the C++ API's types, and C++ errors into weightbridge.Error.
#pragma once

#include <pybind11/pybind11.h>

#include <mpi.h>

#include <string>
#include <vector>

#include "coord/binding_checks.hpp"
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
/// model.named_parameters(). Declaration order is kept. Appends one list per parameter to `keep_alive`:
/// what view_of keeps for it, the tensor first. Throws InputError.
ParameterSet parameters_from_python(py::handle params, py::list& keep_alive);

// ---- parameters that move (parameter_watch.cpp, torch_tensors.cpp) ----------------------------------

/// The check before every update of a Python adapter's parameters against what it registered: storage
/// address, dtype, shape, strides and device. A parameter rebound to new memory of the same dtype, shape
/// and strides (`p.data = p.data.clone()`) is followed; any other change (resize_(), a new dtype or shape,
/// storage freed) is refused, naming the parameter and what changed. torch tensors are read in place
/// through torch's C++ headers where the build found them (torch_tensors.cpp); other objects, and torch
/// tensors that changed, through a new __dlpack__ export.
class WatchedParameters {
 public:
  /// `params` as parameters_from_python made them, `keep_alive` its lists (one per parameter).
  WatchedParameters(const ParameterSet& params, py::list keep_alive);
  /// The check, taking the GIL (coord::ParameterWatch): fills `moved`, and keeps the moved parameters'
  /// new memory alive (the old is let go of). `follow` false: only looks (what the benchmark times), and
  /// the next call reports the same.
  Status check(std::vector<coord::MovedParameter>& moved, bool follow = true);
  /// The parameters read in place (torch tensors, where torch's C++ headers were found at build time).
  std::size_t read_in_place() const;

 private:
  struct Entry {
    std::string name;
    TensorView view;         // as registered (or last followed)
    std::uint32_t kind = 0;  // torch_tensors::kind_of, 0: not read in place
    PyObject* tensor = nullptr;  // the caller's object, first of its keep_alive_ list (which holds it)
  };
  std::vector<Entry> entries_;
  py::list keep_alive_;
};

/// Torch tensors read in place (torch_tensors.cpp; absent where the build found no torch C++ headers).
namespace torch_tensors {
/// True when the build has torch's C++ headers.
bool available();
/// A torch tensor's dtype and device as one nonzero code; 0 for anything else (or without the headers).
std::uint32_t kind_of(py::handle object);
/// Whether a torch tensor of code `kind` still views `view`'s memory: same address (its storage holding
/// the bytes), dtype, device, shape and strides. False too when it cannot be read in place.
bool unchanged(py::handle object, const TensorView& view, std::uint32_t kind);
/// The bytes of a torch tensor's storage past its offset; -1 when it cannot be read in place.
std::int64_t storage_bytes(py::handle object);
}  // namespace torch_tensors

/// The checkpoint's tensor list: TensorInfo objects, (name, dtype, shape) tuples, or a mapping of name ->
/// anything with .dtype and .shape (tensors, including torch "meta" tensors). Throws InputError.
std::vector<TensorInfo> tensor_infos_from_python(py::handle tensors);

// ---- adapters (adapters.cpp) ------------------------------------------------------------------------

/// AdapterOptions from an AdapterOptions object (or None) with keyword overrides; TypeError on an unknown
/// keyword.
AdapterOptions options_from_python(py::handle options, const py::kwargs& overrides);

void bind_adapters(py::module_& m);

}  // namespace wb::python
