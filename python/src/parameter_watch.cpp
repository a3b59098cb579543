// The check of a Python adapter's parameters before every update (bindings.hpp, WatchedParameters). The
// adapters keep raw addresses; holding a tensor does not stop its framework from freeing or replacing its
// storage (resize_(), `p.data = ...`, an FSDP-style storage().resize_(0)). Each update first reads every
// parameter again: the torch tensors in place (torch_tensors.cpp), and where that finds a change, or for
// other objects, through a new DLPack export, which also says what changed.
#include <string>
#include <utility>

#include "bindings.hpp"

namespace wb::python {
namespace {

std::string memory_text(const TensorView& v) {
  return v.memory == MemoryKind::kCuda ? "cuda:" + std::to_string(v.device) : "host memory";
}

// What changed between `was` and `now` that the adapter cannot follow; empty when only the address did.
std::string unfollowable(const TensorView& was, const TensorView& now) {
  if (now.dtype != was.dtype)
    return "its dtype changed from " + std::string(dtype_name(was.dtype)) + " to " + std::string(dtype_name(now.dtype));
  if (now.shape != was.shape)
    return "its shape changed from " + shape_to_string(was.shape) + " to " + shape_to_string(now.shape) +
           " (resize_(), or rebound to a tensor of another shape)";
  if (now.strides != was.strides)
    return "its strides changed from " + shape_to_string(was.strides) + " to " + shape_to_string(now.strides);
  if (now.memory != was.memory || now.device != was.device)
    return "it moved from " + memory_text(was) + " to " + memory_text(now);
  if (now.data == nullptr && now.nbytes() > 0) return "its storage was freed (no memory behind it)";  // not torch
  return {};
}

std::string refusal(const std::string& name, const std::string& why) {
  return "parameter " + name + ": " + why + " since the adapter took it; nothing of this version was written or sent "
         "(keep its memory in place, or construct the adapter after the framework has moved it)";
}

}  // namespace

WatchedParameters::WatchedParameters(const ParameterSet& params, py::list keep_alive) : keep_alive_(std::move(keep_alive)) {
  entries_.reserve(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    py::handle tensor = py::reinterpret_borrow<py::list>(keep_alive_[p])[0];
    entries_.push_back({params[p].name, params[p].view, torch_tensors::kind_of(tensor), tensor.ptr()});
  }
}

std::size_t WatchedParameters::read_in_place() const {
  std::size_t n = 0;
  for (const Entry& e : entries_) n += e.kind != 0 ? 1 : 0;
  return n;
}

Status WatchedParameters::check(std::vector<coord::MovedParameter>& moved, bool follow) {
  py::gil_scoped_acquire gil;
  for (std::size_t p = 0; p < entries_.size(); ++p) {
    Entry& e = entries_[p];
    const py::handle tensor(e.tensor);
    if (e.kind != 0 && torch_tensors::unchanged(tensor, e.view, e.kind)) continue;
    py::list fresh;
    TensorView now;
    // A storage freed under the tensor (storage().resize_(0), as FSDP does) cannot even be exported.
    const std::int64_t left = e.kind != 0 ? torch_tensors::storage_bytes(tensor) : -1;
    if (left >= 0 && left < static_cast<std::int64_t>(e.view.nbytes()))
      return Status(ErrorCode::kInvalidArgument, refusal(e.name, "its storage was freed or shrunk (" + std::to_string(left) +
                                                                     " bytes left of its " + std::to_string(e.view.nbytes()) + ")"));
    try {
      now = view_of(tensor, "parameter " + e.name, fresh);
    } catch (const InputError& error) {
      return Status(ErrorCode::kInvalidArgument, std::string(error.what()) + " (read again before the update)");
    } catch (py::error_already_set& error) {  // an attribute of an odd object that raised: no exception crosses into C++
      return Status(ErrorCode::kInvalidArgument, "parameter " + e.name + ": reading it again before the update raised " +
                                                     describe_python_error(error));
    }
    if (now.data == e.view.data && now.dtype == e.view.dtype && now.shape == e.view.shape && now.strides == e.view.strides &&
        now.memory == e.view.memory && now.device == e.view.device)
      continue;  // not read in place, and as it was
    if (const std::string why = unfollowable(e.view, now); !why.empty())
      return Status(ErrorCode::kInvalidArgument, refusal(e.name, why));
    // Rebound to new memory of the same form: followed. The new export keeps that memory alive; the old
    // one is let go of (holding it would keep a second copy of the parameter for nothing).
    moved.push_back({p, now.data});
    if (!follow) continue;
    e.view.data = now.data;
    keep_alive_[p] = fresh;
  }
  return Status::ok();
}

}  // namespace wb::python
