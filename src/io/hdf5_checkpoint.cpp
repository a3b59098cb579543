// HDF5 checkpoints: one dataset per tensor at the file root, named as in Hugging Face, each with a string
// attribute `dtype` (wb::dtype_name). bf16/f16 are stored as uint16 and fp8 as uint8, the other dtypes as
// their native HDF5 types. Box reads are hyperslab selections, so nothing outside the box is read.
//
// Only the serial API with default drivers is used, so the same code works against serial HDF5 and the
// parallel (MPI) build. HDF5 is not thread-safe in the parallel build, so every call into it holds one
// process-wide mutex, as h5py does.
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "io/checkpoint_internal.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"
#include "weightbridge/status.hpp"

// H5Pset_file_locking arrived in 1.10.7 and 1.12.1 (not 1.12.0).
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
#define WB_HDF5_HAS_FILE_LOCKING_PROPERTY 1
#else
#define WB_HDF5_HAS_FILE_LOCKING_PROPERTY 0
#endif

namespace wb {

namespace detail {

namespace {
struct Hdf5Failure {
  bool found = false;
  std::string text;
  hid_t minor = H5I_INVALID_HID;  // H5E_NOTHDF5, H5E_TRUNCATED, ... for classifying the failure
};

Hdf5Failure innermost_hdf5_failure() {
  // Walking upward starts at the function that detected the error: its text says what is wrong
  // ("truncated file: eof = ..."), where the API-level entry only says "unable to open file".
  Hdf5Failure failure;
  const auto visit = [](unsigned, const H5E_error2_t* entry, void* data) -> herr_t {
    auto* out = static_cast<Hdf5Failure*>(data);
    if (out->found) return 0;
    out->found = true;
    out->minor = entry->min_num;
    out->text = entry->desc != nullptr && entry->desc[0] != '\0' ? entry->desc : "no description";
    if (entry->func_name != nullptr) out->text.append(" (in ").append(entry->func_name).append(")");
    return 0;
  };
  if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, visit, &failure) < 0 || !failure.found) {
    failure.found = false;
    failure.text = "HDF5 reported no details";
  }
  return failure;
}
}  // namespace

std::string hdf5_error_string() { return innermost_hdf5_failure().text; }

}  // namespace detail

namespace io {
namespace {

constexpr std::string_view kWhat = "HDF5 checkpoint";

std::mutex& hdf5_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Called under hdf5_mutex at every entry: HDF5 would otherwise print its error stack to stderr, and in
// thread-safe builds the setting is per thread, so setting it once is not enough.
void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

/// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  /// Closes now; returns the closer's result (closing a file flushes it, which can fail).
  herr_t reset() {
    herr_t rc = 0;
    if (id_ >= 0 && closer_ != nullptr) rc = closer_(id_);
    id_ = H5I_INVALID_HID;
    return rc;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

/// Where a call was made, for messages: the file and (when there is one) the tensor.
struct Where {
  std::string_view file;
  std::string_view tensor;
};

[[noreturn]] void throw_hdf5(ErrorCode code, const Where& where, const char* call, const char* file, int line) {
  const Status status = make_call_error(code, call, detail::hdf5_error_string(), file, line);
  throw Error(code, tensor_context(kWhat, where.file, where.tensor) + ": " + status.message());
}

template <class T>
T checked(T rc, ErrorCode code, const Where& where, const char* call, const char* file, int line) {
  if (rc < 0) throw_hdf5(code, where, call, file, line);
  return rc;
}

// Like WB_CHECK_HDF5, but the message also names the checkpoint file and tensor.
#define WB_H5(code, where, call) checked((call), ::wb::ErrorCode::code, (where), #call, __FILE__, __LINE__)

[[noreturn]] void throw_corrupt(const Where& where, const std::string& cause) {
  throw Error(ErrorCode::kCorruptData, tensor_context(kWhat, where.file, where.tensor) + ": " + cause);
}

/// How a dtype is stored: class, width and sign of the file type, and the matching memory type.
struct Storage {
  H5T_class_t type_class;
  std::size_t size;
  H5T_sign_t sign;
  hid_t file_type;    // little-endian standard type, the same on every machine
  hid_t memory_type;  // native type of the same width: HDF5 swaps bytes if the file is big-endian
  const char* description;
};

Storage storage_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return {H5T_INTEGER, 2, H5T_SGN_NONE, H5T_STD_U16LE, H5T_NATIVE_UINT16, "16-bit unsigned integer"};
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kU8:
      return {H5T_INTEGER, 1, H5T_SGN_NONE, H5T_STD_U8LE, H5T_NATIVE_UINT8, "8-bit unsigned integer"};
    case DType::kI8:
      return {H5T_INTEGER, 1, H5T_SGN_2, H5T_STD_I8LE, H5T_NATIVE_INT8, "8-bit signed integer"};
    case DType::kI32:
      return {H5T_INTEGER, 4, H5T_SGN_2, H5T_STD_I32LE, H5T_NATIVE_INT32, "32-bit signed integer"};
    case DType::kI64:
      return {H5T_INTEGER, 8, H5T_SGN_2, H5T_STD_I64LE, H5T_NATIVE_INT64, "64-bit signed integer"};
    case DType::kF32:
      return {H5T_FLOAT, 4, H5T_SGN_ERROR, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, "32-bit float"};
    case DType::kF64:
      return {H5T_FLOAT, 8, H5T_SGN_ERROR, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, "64-bit float"};
  }
  throw Error(ErrorCode::kInternal, "HDF5 checkpoint: unhandled dtype");
}

std::string describe_type(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  const std::size_t bits = H5Tget_size(type) * 8;
  switch (type_class) {
    case H5T_INTEGER:
      return std::to_string(bits) + "-bit " + (H5Tget_sign(type) == H5T_SGN_NONE ? "unsigned" : "signed") +
             " integer";
    case H5T_FLOAT:
      return std::to_string(bits) + "-bit float";
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound type";
    default:
      return "HDF5 type class " + std::to_string(static_cast<int>(type_class));
  }
}

/// A file access property list: file locking off for readers (several MPI ranks open one file at once,
/// and parallel file systems often refuse locks); for writers on, but ignored where unsupported.
Handle file_access(bool for_writing, const Where& where) {
  Handle fapl(WB_H5(kHdf5, where, H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
#if WB_HDF5_HAS_FILE_LOCKING_PROPERTY
  WB_H5(kHdf5, where, H5Pset_file_locking(fapl.get(), for_writing, true));
#else
  // Older HDF5 reads only the environment; an explicit user setting wins (overwrite = 0).
  if (!for_writing) ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 0);
#endif
  return fapl;
}

/// Reads a string attribute, fixed- or variable-length (h5py writes the latter).
std::string read_string_attribute(hid_t object, const char* name, const Where& where) {
  Handle attribute(WB_H5(kCorruptData, where, H5Aopen(object, name, H5P_DEFAULT)), H5Aclose);
  Handle type(WB_H5(kCorruptData, where, H5Aget_type(attribute.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw_corrupt(where, std::string("attribute '") + name + "' is a " + describe_type(type.get()) +
                             ", not a string");
  std::string value;
  if (WB_H5(kCorruptData, where, H5Tis_variable_str(type.get())) > 0) {
    Handle memory_type(WB_H5(kHdf5, where, H5Tcopy(H5T_C_S1)), H5Tclose);
    WB_H5(kHdf5, where, H5Tset_size(memory_type.get(), H5T_VARIABLE));
    char* text = nullptr;
    WB_H5(kCorruptData, where, H5Aread(attribute.get(), memory_type.get(), &text));
    if (text != nullptr) {
      value = text;
      H5free_memory(text);
    }
  } else {
    const std::size_t size = H5Tget_size(type.get());
    std::vector<char> buffer(size + 1, '\0');
    WB_H5(kCorruptData, where, H5Aread(attribute.get(), type.get(), buffer.data()));
    value.assign(buffer.data());  // stops at the first NUL of NULLTERM/NULLPAD strings
  }
  while (!value.empty() && (value.back() == ' ' || value.back() == '\0')) value.pop_back();  // SPACEPAD
  return value;
}

void write_string_attribute(hid_t object, const char* name, std::string_view value, const Where& where) {
  Handle type(WB_H5(kHdf5, where, H5Tcopy(H5T_C_S1)), H5Tclose);
  WB_H5(kHdf5, where, H5Tset_size(type.get(), value.size()));
  WB_H5(kHdf5, where, H5Tset_strpad(type.get(), H5T_STR_NULLPAD));
  Handle space(WB_H5(kHdf5, where, H5Screate(H5S_SCALAR)), H5Sclose);
  Handle attribute(WB_H5(kHdf5, where, H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)),
                   H5Aclose);
  WB_H5(kHdf5, where, H5Awrite(attribute.get(), type.get(), value.data()));
}

/// A dataspace for `shape`: scalar for 0-d tensors, simple otherwise.
Handle make_space(const Shape& shape, const Where& where) {
  if (shape.empty()) return Handle(WB_H5(kHdf5, where, H5Screate(H5S_SCALAR)), H5Sclose);
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Handle(WB_H5(kHdf5, where, H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
                H5Sclose);
}

// --- reader ----------------------------------------------------------------------------------------

class Hdf5Reader final : public CheckpointReader {
 public:
  explicit Hdf5Reader(std::string path) : path_(std::move(path)) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    const Where where{path_, {}};
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path_, ec))
      throw Error(ErrorCode::kNotFound, std::string(kWhat) + " " + path_ + ": no such file");
    try {
      Handle fapl = file_access(false, where);
      const hid_t file = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
      if (file < 0) {
        const detail::Hdf5Failure failure = detail::innermost_hdf5_failure();
        if (failure.minor == H5E_NOTHDF5 || failure.minor == H5E_TRUNCATED || failure.minor == H5E_BADFILE)
          throw_corrupt(where, "not an HDF5 file, or truncated or corrupt: " + failure.text);
        throw Error(ErrorCode::kHdf5, std::string(kWhat) + " " + path_ + ": cannot open: " + failure.text);
      }
      file_ = Handle(file, H5Fclose);
      for (const std::string& name : dataset_names()) add_tensor(name);
    } catch (...) {
      file_.reset();  // under the lock, not later when the members are destroyed
      throw;
    }
  }

  ~Hdf5Reader() override {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    file_.reset();
  }

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  std::string source() const override { return path_; }

  void read_box(std::string_view name, const Box& box, void* destination) const override {
    const TensorInfo* info = find(name);
    if (info == nullptr)
      throw Error(ErrorCode::kNotFound, std::string(kWhat) + " " + path_ + ": no tensor named '" + std::string(name) + "'");
    check_box(path_, *info, box);
    if (box.numel() == 0) return;
    const Where where{path_, info->name};
    const hid_t memory_type = memory_types_[static_cast<std::size_t>(info - tensors_.data())];

    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    Handle dataset(WB_H5(kCorruptData, where, H5Dopen2(file_.get(), info->name.c_str(), H5P_DEFAULT)), H5Dclose);
    if (box.extent == info->shape) {  // the whole tensor: one H5Dread straight into the destination
      WB_H5(kCorruptData, where, H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, destination));
      return;
    }
    Handle file_space(WB_H5(kCorruptData, where, H5Dget_space(dataset.get())), H5Sclose);
    const std::vector<hsize_t> start(box.offset.begin(), box.offset.end());
    const std::vector<hsize_t> count(box.extent.begin(), box.extent.end());
    WB_H5(kCorruptData, where,
          H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
    Handle memory_space(WB_H5(kHdf5, where, H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)),
                        H5Sclose);
    WB_H5(kCorruptData, where,
          H5Dread(dataset.get(), memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, destination));
  }

 private:
  /// Links of the root group, in creation order when the file tracks it, else in name order.
  std::vector<std::string> dataset_names() const {
    const Where where{path_, {}};
    Handle root(WB_H5(kCorruptData, where, H5Gopen2(file_.get(), "/", H5P_DEFAULT)), H5Gclose);
    Handle gcpl(WB_H5(kCorruptData, where, H5Gget_create_plist(root.get())), H5Pclose);
    unsigned order_flags = 0;
    WB_H5(kCorruptData, where, H5Pget_link_creation_order(gcpl.get(), &order_flags));
    const H5_index_t index = (order_flags & H5P_CRT_ORDER_TRACKED) != 0 ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    std::vector<std::string> names;
    const auto visit = [](hid_t, const char* name, const H5L_info_t* link, void* data) -> herr_t {
      if (link->type == H5L_TYPE_HARD) static_cast<std::vector<std::string>*>(data)->emplace_back(name);
      return 0;
    };
    hsize_t position = 0;
    WB_H5(kCorruptData, where, H5Literate(root.get(), index, H5_ITER_INC, &position, visit, &names));
    return names;
  }

  void add_tensor(const std::string& name) {
    const Where where{path_, name};
    Handle object(WB_H5(kCorruptData, where, H5Oopen(file_.get(), name.c_str(), H5P_DEFAULT)), H5Oclose);
    if (H5Iget_type(object.get()) != H5I_DATASET) {
      WB_LOG(kDebug) << kWhat << " " << path_ << ": skipping '" << name << "', not a dataset";
      return;
    }
    const hid_t dataset = object.get();
    if (WB_H5(kCorruptData, where, H5Aexists(dataset, "dtype")) == 0)
      throw_corrupt(where, "dataset has no 'dtype' attribute (expected one of bf16, f16, f32, f64, i8, u8, i32, "
                           "i64, f8e4m3, f8e5m2)");
    const std::string dtype_text = read_string_attribute(dataset, "dtype", where);
    const std::optional<DType> dtype = parse_dtype(dtype_text);
    if (!dtype) throw_corrupt(where, "unknown dtype attribute '" + dtype_text + "'");

    const Storage expected = storage_of(*dtype);
    Handle type(WB_H5(kCorruptData, where, H5Dget_type(dataset)), H5Tclose);
    const H5T_class_t type_class = H5Tget_class(type.get());
    const bool matches = type_class == expected.type_class && H5Tget_size(type.get()) == expected.size &&
                         (type_class != H5T_INTEGER || H5Tget_sign(type.get()) == expected.sign);
    if (!matches)
      throw_corrupt(where, "stored as " + describe_type(type.get()) + " but its dtype attribute says " +
                               dtype_text + ", which is stored as " + expected.description);

    Handle space(WB_H5(kCorruptData, where, H5Dget_space(dataset)), H5Sclose);
    const H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
    Shape shape;
    if (space_class == H5S_SIMPLE) {
      const int ndim = WB_H5(kCorruptData, where, H5Sget_simple_extent_ndims(space.get()));
      std::vector<hsize_t> dims(static_cast<std::size_t>(ndim));
      WB_H5(kCorruptData, where, H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
      shape.assign(dims.begin(), dims.end());
    } else if (space_class != H5S_SCALAR) {
      throw_corrupt(where, "dataset has a null or unknown dataspace");
    }
    if (checked_nbytes(shape, dtype_size(*dtype)) < 0)
      throw_corrupt(where, "shape " + shape_to_string(shape) + " is too large");
    tensors_.push_back(TensorInfo{name, *dtype, std::move(shape)});
    memory_types_.push_back(expected.memory_type);
  }

  std::string path_;
  Handle file_;
  std::vector<TensorInfo> tensors_;
  std::vector<hid_t> memory_types_;  // parallel to tensors_
};

// --- writer ----------------------------------------------------------------------------------------

class Hdf5Writer final : public CheckpointWriter {
 public:
  Hdf5Writer(std::string path, std::vector<TensorInfo> tensors)
      : path_(std::move(path)), temporary_(temporary_path_for(path_)), tensors_(std::move(tensors)),
        written_(tensors_.size(), false) {
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    try {
      create();
    } catch (...) {
      discard();
      throw;
    }
  }

  ~Hdf5Writer() override {
    if (finished_) return;
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    discard();
  }

  void write(std::string_view name, const void* data) override {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    check_open(name);
    const auto found = index_.find(name);
    if (found == index_.end())
      throw Error(ErrorCode::kInvalidArgument, tensor_context(kWhat, path_, name) + ": not in the checkpoint's tensor list");
    const std::size_t i = found->second;
    if (written_[i])
      throw Error(ErrorCode::kInvalidArgument, tensor_context(kWhat, path_, name) + ": written twice");
    const TensorInfo& info = tensors_[i];
    const Where where{path_, info.name};
    if (info.numel() > 0) {
      Handle dataset(WB_H5(kHdf5, where, H5Dopen2(file_.get(), info.name.c_str(), H5P_DEFAULT)), H5Dclose);
      WB_H5(kHdf5, where,
            H5Dwrite(dataset.get(), storage_of(info.dtype).memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
    }
    written_[i] = true;
  }

  void finish() override {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    check_open({});
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (!written_[i])
        throw Error(ErrorCode::kInvalidArgument,
                    tensor_context(kWhat, path_, tensors_[i].name) + ": finish() before the tensor was written");
    const Where where{path_, {}};
    WB_H5(kHdf5, where, file_.reset());  // closing flushes: a full disk shows here
    std::error_code ec;
    std::filesystem::rename(temporary_, path_, ec);
    if (ec) throw Error(ErrorCode::kSystem, std::string(kWhat) + " " + path_ + ": rename from " + temporary_ + ": " + ec.message());
    finished_ = true;
  }

 private:
  void create() {
    const Where where{path_, {}};
    // Creation order is tracked (and indexed, so iterating it stays cheap with many datasets): the
    // reader lists tensors in the order they were declared.
    Handle fcpl(WB_H5(kHdf5, where, H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
    WB_H5(kHdf5, where, H5Pset_link_creation_order(fcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
    Handle fapl = file_access(true, where);
    file_ = Handle(WB_H5(kHdf5, where, H5Fcreate(temporary_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get())), H5Fclose);
    created_ = true;

    // Every element is written, so fill values would only be written twice.
    Handle dcpl(WB_H5(kHdf5, where, H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    WB_H5(kHdf5, where, H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
    for (const TensorInfo& info : tensors_) {
      const Where at{path_, info.name};
      Handle space = make_space(info.shape, at);
      Handle dataset(WB_H5(kHdf5, at, H5Dcreate2(file_.get(), info.name.c_str(), storage_of(info.dtype).file_type,
                                                   space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
                     H5Dclose);
      write_string_attribute(dataset.get(), "dtype", dtype_name(info.dtype), at);
    }
  }

  void check_open(std::string_view name) const {
    if (finished_)
      throw Error(ErrorCode::kInvalidArgument, tensor_context(kWhat, path_, name) + ": writer already finished");
  }

  /// Drops the partial file (a destroyed or failed writer leaves nothing behind).
  void discard() noexcept {
    file_.reset();
    if (created_) std::remove(temporary_.c_str());
    created_ = false;
  }

  std::string path_;
  std::string temporary_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, std::size_t> index_;  // views into tensors_
  std::vector<bool> written_;
  Handle file_;
  bool created_ = false;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<CheckpointWriter> create_hdf5_writer(const std::string& path, std::vector<TensorInfo> tensors) {
  return std::make_unique<Hdf5Writer>(path, std::move(tensors));
}

}  // namespace io

std::unique_ptr<CheckpointReader> open_hdf5_checkpoint(const std::string& path) {
  return std::make_unique<io::Hdf5Reader>(path);
}

}  // namespace wb
