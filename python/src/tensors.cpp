// Python tensors as TensorViews, through the DLPack protocol: torch, numpy and any other producer give
// pointer, dtype, shape and strides without a copy, bf16 included (which numpy's buffer protocol lacks).
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "bindings.hpp"

namespace wb::python {
namespace {

// The DLPack ABI (dlpack.h, the legacy unversioned capsule "dltensor" that every producer returns when
// __dlpack__ is called without max_version). Declared here because no system package ships the header.
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null for compact row-major
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

enum : std::int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
// (Codes 10 and 12: DLPack 1.0's kDLFloat8_e4m3fn and kDLFloat8_e5m2, from producers that export float8.)
enum : std::uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 };

std::string type_name(py::handle object) { return py::str(py::type::handle_of(object).attr("__qualname__")); }

}  // namespace

std::string name_from_python(py::handle name, const std::string& what) {
  Py_ssize_t size = 0;
  if (const char* text = PyUnicode_AsUTF8AndSize(name.ptr(), &size); text != nullptr)
    return std::string(text, static_cast<std::size_t>(size));
  py::error_already_set error;  // UnicodeEncodeError: it names the character and its position
  const std::string shown = py::str(py::module_::import("builtins").attr("ascii")(name));
  throw InputError(what + " " + shown + " is not valid UTF-8 (" + describe_python_error(error) +
                   "): names go to the other ranks and into messages as UTF-8; a lone surrogate comes from decoding "
                   "bytes that were not UTF-8 (os.fsdecode, errors='surrogateescape')");
}

namespace {

DType dtype_from_dlpack(const DLDataType& t, const std::string& what) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 16) return DType::kF16;
    if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
    if (t.code == kDLFloat && t.bits == 64) return DType::kF64;
    if (t.code == kDLBfloat && t.bits == 16) return DType::kBF16;
    if (t.code == kDLInt && t.bits == 8) return DType::kI8;
    if (t.code == kDLInt && t.bits == 32) return DType::kI32;
    if (t.code == kDLInt && t.bits == 64) return DType::kI64;
    if (t.code == kDLUInt && t.bits == 8) return DType::kU8;
    if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return DType::kF8E4M3;
    if (t.code == kDLFloat8_e5m2 && t.bits == 8) return DType::kF8E5M2;
  }
  throw InputError(what + ": its dtype (DLPack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) +
                   " bits, " + std::to_string(t.lanes) +
                   " lanes) has no WeightBridge equivalent (bf16, f16, f32, f64, i8, u8, i32, i64, f8e4m3, f8e5m2)");
}

}  // namespace

DType dtype_from_python(py::handle dtype, const std::string& what) {
  std::string text;
  if (py::isinstance<py::str>(dtype)) {
    text = dtype.cast<std::string>();
  } else if (py::hasattr(dtype, "name") && py::isinstance<py::str>(dtype.attr("name"))) {
    text = dtype.attr("name").cast<std::string>();  // numpy.dtype
  } else if (py::hasattr(dtype, "__name__") && py::hasattr(dtype, "dtype")) {
    text = dtype.attr("__name__").cast<std::string>();  // numpy scalar types such as numpy.float32
  } else {
    text = py::str(dtype).cast<std::string>();  // torch.dtype prints as "torch.bfloat16"
  }
  std::string name = text.rfind("torch.", 0) == 0 ? text.substr(6) : text;
  // torch and numpy spellings; WeightBridge's own ("bf16", "F8_E4M3", ...) are parsed below.
  static const std::pair<const char*, const char*> kAliases[] = {
      {"bfloat16", "bf16"}, {"float16", "f16"}, {"half", "f16"},   {"float32", "f32"},
      {"float", "f32"},     {"float64", "f64"}, {"double", "f64"}, {"int8", "i8"},
      {"uint8", "u8"},      {"int32", "i32"},   {"int", "i32"},    {"int64", "i64"},
      {"long", "i64"},      {"float8_e4m3fn", "f8e4m3"},           {"float8_e5m2", "f8e5m2"}};
  for (const auto& [alias, ours] : kAliases)
    if (name == alias) name = ours;
  if (const auto parsed = parse_dtype(name)) return *parsed;
  throw InputError(what + ": dtype " + text + " has no WeightBridge equivalent (bf16, f16, f32, f64, i8, u8, i32, i64, "
                          "f8e4m3, f8e5m2)");
}

TensorView view_of(py::handle tensor, const std::string& what, py::list& keep_alive) {
  py::object exporter = py::reinterpret_borrow<py::object>(tensor);
  // torch refuses to export a tensor that requires grad (nn.Parameter); detach() shares its storage.
  if (py::hasattr(exporter, "requires_grad") && py::hasattr(exporter, "detach") &&
      exporter.attr("requires_grad").cast<bool>())
    exporter = exporter.attr("detach")();
  // A torch float8 tensor goes as its bytes, uint8 (torch's DLPack export refuses float8 in the versions
  // that have it without DLPack 1.0's codes), and keeps its dtype here.
  std::optional<DType> float8;
  if (py::hasattr(exporter, "dtype") && py::hasattr(exporter, "view")) {
    const std::string dtype = py::str(exporter.attr("dtype"));
    if (dtype == "torch.float8_e4m3fn") float8 = DType::kF8E4M3;
    if (dtype == "torch.float8_e5m2") float8 = DType::kF8E5M2;
    if (float8) exporter = exporter.attr("view")(py::module_::import("torch").attr("uint8"));
  }
  if (!py::hasattr(exporter, "__dlpack__"))
    throw InputError(what + " is a " + type_name(tensor) +
                     ", neither a torch.Tensor nor an object with __dlpack__ (numpy arrays have it)");
  py::object capsule;
  try {
    capsule = exporter.attr("__dlpack__")();
  } catch (py::error_already_set& error) {
    throw InputError(what + ": __dlpack__() raised " + describe_python_error(error));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw InputError(what + ": __dlpack__() returned " + type_name(capsule) + ", not an unused DLPack capsule");
  }
  // The capsule, unconsumed, owns the exported tensor: holding it (and the object) keeps the memory valid.
  keep_alive.append(tensor);
  keep_alive.append(exporter);
  keep_alive.append(capsule);

  const DLTensor& t = managed->dl_tensor;
  TensorView view;
  view.dtype = float8 ? *float8 : dtype_from_dlpack(t.dtype, what);
  view.data = static_cast<std::byte*>(t.data) + t.byte_offset;
  view.shape.assign(t.shape, t.shape + t.ndim);
  if (t.strides == nullptr) {
    view.strides = contiguous_strides(view.shape);
  } else {
    view.strides.assign(t.strides, t.strides + t.ndim);
  }
  for (int a = 0; a < t.ndim; ++a)
    if (view.strides[static_cast<std::size_t>(a)] < 0)
      throw InputError(what + ": negative stride " + std::to_string(view.strides[static_cast<std::size_t>(a)]) +
                       " along axis " + std::to_string(a) + " (shape " + shape_to_string(view.shape) + ")");
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory
      view.memory = MemoryKind::kHost;
      break;
    case kDLCUDA:
    case kDLCUDAManaged:
      view.memory = MemoryKind::kCuda;
      view.device = t.device.device_id;
      break;
    default:
      throw InputError(what + ": DLPack device type " + std::to_string(t.device.device_type) +
                       " is neither host nor CUDA memory");
  }
  return view;
}

ParameterSet parameters_from_python(py::handle params, py::list& keep_alive) {
  py::iterator items;
  try {
    items = py::hasattr(params, "items") ? py::iter(params.attr("items")()) : py::iter(params);
  } catch (py::error_already_set& error) {
    throw InputError("params is a " + type_name(params) +
                     ", neither a mapping of name -> tensor nor an iterable of (name, tensor) pairs (" +
                     describe_python_error(error) + ")");
  }
  ParameterSet set;
  for (py::handle item : items) {
    if (!py::isinstance<py::tuple>(item) || py::len(item) != 2 || !py::isinstance<py::str>(item[py::int_(0)]))
      throw InputError("params: an entry is " + std::string(py::repr(item)) + ", not a (name, tensor) pair");
    const std::string name = name_from_python(item[py::int_(0)], "params: the parameter name");
    if (set.find(name) != nullptr) throw InputError("params: parameter " + name + " appears twice");
    py::list mine;  // the tensor first (the object the caller holds: a parameter watch reads it again)
    set.add(name, view_of(item[py::int_(1)], "parameter " + name, mine));
    keep_alive.append(mine);
  }
  return set;
}

std::vector<TensorInfo> tensor_infos_from_python(py::handle tensors) {
  std::vector<TensorInfo> infos;
  auto shape_of = [](py::handle shape, const std::string& what) {
    try {
      return shape.cast<Shape>();  // tuples, lists and torch.Size
    } catch (const py::cast_error&) {
      throw InputError(what + ": shape " + std::string(py::repr(shape)) + " is not a sequence of integers");
    }
  };
  if (py::hasattr(tensors, "items")) {
    for (py::handle item : py::iter(tensors.attr("items")())) {
      const std::string name = name_from_python(py::str(item[py::int_(0)]), "checkpoint_tensors: the name");
      py::handle value = item[py::int_(1)];
      const std::string what = "checkpoint tensor " + name;
      if (!py::hasattr(value, "dtype") || !py::hasattr(value, "shape"))
        throw InputError(what + " is a " + type_name(value) + " without .dtype and .shape");
      infos.push_back({name, dtype_from_python(value.attr("dtype"), what), shape_of(value.attr("shape"), what)});
    }
    return infos;
  }
  for (py::handle item : py::iter(tensors)) {
    if (py::isinstance<TensorInfo>(item)) {
      infos.push_back(item.cast<TensorInfo>());
      continue;
    }
    if (!py::isinstance<py::sequence>(item) || py::isinstance<py::str>(item) || py::len(item) != 3)
      throw InputError("checkpoint_tensors: an entry is " + std::string(py::repr(item)) +
                       ", neither a TensorInfo nor a (name, dtype, shape) tuple");
    const std::string name = name_from_python(py::str(item[py::int_(0)]), "checkpoint_tensors: the name");
    const std::string what = "checkpoint tensor " + name;
    infos.push_back({name, dtype_from_python(item[py::int_(1)], what), shape_of(item[py::int_(2)], what)});
  }
  return infos;
}

}  // namespace wb::python
