// Torch tensors read in place, through torch's C++ headers (libtorch-dev on Debian, torch/include in a
// wheel): a parameter check reads a tensor's storage address, dtype, device, shape and strides from its
// TensorImpl in a few nanoseconds, where the same through Python attributes costs about a microsecond
// (torch.Size and stride tuples are built for every call). Only this file includes them; it needs libc10.
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>

#include "bindings.hpp"

namespace wb::python::torch_tensors {

bool available() { return true; }

namespace {

std::uint32_t code_of(const at::Tensor& t) {
  const c10::Device device = t.device();
  return 1u << 31 | static_cast<std::uint32_t>(static_cast<std::uint8_t>(t.scalar_type())) |
         static_cast<std::uint32_t>(static_cast<std::uint8_t>(device.type())) << 8 |
         static_cast<std::uint32_t>(static_cast<std::uint8_t>(device.index() + 1)) << 16;
}

}  // namespace

std::uint32_t kind_of(py::handle object) {
  // Kept for the process (a static py::object would be released after the interpreter ended).
  static const py::handle tensor_base = py::object(py::module_::import("torch._C").attr("_TensorBase")).release();
  if (!py::isinstance(object, tensor_base)) return 0;
  const at::Tensor& t = THPVariable_Unpack(object.ptr());
  if (!t.defined() || t.is_sparse() || !t.has_storage()) return 0;
  return code_of(t);
}

bool unchanged(py::handle object, const TensorView& view, std::uint32_t kind) {
  try {
    const at::Tensor& t = THPVariable_Unpack(object.ptr());
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl == nullptr || !impl->has_storage()) return false;
    const c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
    if (!std::equal(sizes.begin(), sizes.end(), view.shape.begin(), view.shape.end()) ||
        !std::equal(strides.begin(), strides.end(), view.strides.begin(), view.strides.end()))
      return false;
    const c10::Storage& storage = impl->storage();  // not data_ptr(): it throws for a freed storage
    const auto itemsize = static_cast<std::int64_t>(impl->itemsize());
    const auto* data = static_cast<const std::byte*>(storage.data()) + impl->storage_offset() * itemsize;
    if (storage.data() == nullptr || data != view.data) return false;
    // The storage still holds every byte the view reaches (a storage resized in place keeps its address
    // only when it does not grow, but may shrink).
    std::int64_t last = 0;
    for (std::size_t a = 0; a < sizes.size(); ++a) last += (sizes[a] - 1) * strides[a];
    if (t.numel() > 0 && (impl->storage_offset() + last + 1) * itemsize > static_cast<std::int64_t>(storage.nbytes()))
      return false;
    return code_of(t) == kind;
  } catch (...) {  // a tensor whose storage cannot be read in place (c10::Error): the slow road decides
    return false;
  }
}

std::int64_t storage_bytes(py::handle object) {
  try {
    const c10::TensorImpl* impl = THPVariable_Unpack(object.ptr()).unsafeGetTensorImpl();
    if (impl == nullptr || !impl->has_storage()) return -1;
    const auto offset = impl->storage_offset() * static_cast<std::int64_t>(impl->itemsize());
    return std::max<std::int64_t>(0, static_cast<std::int64_t>(impl->storage().nbytes()) - offset);
  } catch (...) {
    return -1;
  }
}

}  // namespace wb::python::torch_tensors
