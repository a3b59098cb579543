// HDF5 checkpoints: one dataset per tensor at the file root, named as in Hugging Face. A dataset's dtype
// is what its own HDF5 type says where that type says it (IEEE float16/32/64, 8/32/64-bit integers, and
// bf16 or fp8 declared as HDF5 float types); 16- and 8-bit integer datasets holding bf16, f16 or fp8 bit
// patterns carry a string attribute `dtype` saying which (any string encoding: fixed or variable length,
// ASCII or UTF-8, as h5py and other tools write it). Our writer stores bf16/f16 as uint16 and fp8 as
// uint8, each with the attribute. Box reads are hyperslab selections, so nothing outside the box is read.
//
// Only the serial API with default drivers is used, so the same code works against serial HDF5 and the
// parallel (MPI) build. HDF5 is not thread-safe in the parallel build, so every call into it holds one
// process-wide mutex, as h5py does.
#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "io/checkpoint_internal.hpp"
#include "io/hdf5_check.hpp"
#include "io/hdf5_errors.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

// H5Pset_file_locking arrived in 1.10.7 and 1.12.1 (not 1.12.0).
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
#define WB_HDF5_HAS_FILE_LOCKING_PROPERTY 1
#else
#define WB_HDF5_HAS_FILE_LOCKING_PROPERTY 0
#endif

namespace wb {

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

/// How our writer stores a dtype: the file type and the matching memory type.
struct Storage {
  hid_t file_type;    // little-endian standard type, the same on every machine
  hid_t memory_type;  // native type of the same width
  const char* description;
};

Storage storage_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16, "16-bit unsigned integer"};
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kU8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8, "8-bit unsigned integer"};
    case DType::kI8:
      return {H5T_STD_I8LE, H5T_NATIVE_INT8, "8-bit signed integer"};
    case DType::kI32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32, "32-bit signed integer"};
    case DType::kI64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64, "64-bit signed integer"};
    case DType::kF32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, "32-bit float"};
    case DType::kF64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, "64-bit float"};
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
    case H5T_OPAQUE:
      return std::to_string(bits) + "-bit opaque type";
    case H5T_ENUM:
      return "enum type";
    case H5T_ARRAY:
      return "array type";
    default:
      return "HDF5 type class " + std::to_string(static_cast<int>(type_class));
  }
}

/// Bit layout of a floating-point format as HDF5 describes it (H5Tget_fields, H5Tget_ebias).
struct FloatLayout {
  std::size_t size;
  std::size_t sign_bit, exponent_bit, exponent_bits, mantissa_bits;
  std::size_t bias;
  DType dtype;
};

// mantissa at bit 0, exponent above it, sign on top: IEEE 754 and the formats built like it.
constexpr FloatLayout kFloatLayouts[] = {
    {8, 63, 52, 11, 52, 1023, DType::kF64}, {4, 31, 23, 8, 23, 127, DType::kF32},
    {2, 15, 10, 5, 10, 15, DType::kF16},    {2, 15, 7, 8, 7, 127, DType::kBF16},
    {1, 7, 3, 4, 3, 7, DType::kF8E4M3},     {1, 7, 2, 5, 2, 15, DType::kF8E5M2},
};

/// The dtype a dataset's own type states, or nullopt when it states none (16-bit integers: bf16 or f16
/// bits; any other width or layout we have no dtype for).
std::optional<DType> dtype_of_type(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  // Padding bits or an offset would make the raw bytes differ from the element's value.
  if (size == 0 || H5Tget_precision(type) != size * 8 || H5Tget_offset(type) != 0) return std::nullopt;
  if (type_class == H5T_INTEGER) {
    const H5T_sign_t sign = H5Tget_sign(type);
    if (sign == H5T_SGN_ERROR) return std::nullopt;
    const bool is_signed = sign == H5T_SGN_2;
    if (size == 1) return is_signed ? DType::kI8 : DType::kU8;
    if (size == 4 && is_signed) return DType::kI32;
    if (size == 8 && is_signed) return DType::kI64;
    return std::nullopt;
  }
  if (type_class == H5T_FLOAT) {
    std::size_t sign_bit = 0, exponent_bit = 0, exponent_bits = 0, mantissa_bit = 0, mantissa_bits = 0;
    if (H5Tget_fields(type, &sign_bit, &exponent_bit, &exponent_bits, &mantissa_bit, &mantissa_bits) < 0)
      return std::nullopt;
    if (mantissa_bit != 0 || H5Tget_norm(type) != H5T_NORM_IMPLIED) return std::nullopt;
    const std::size_t bias = H5Tget_ebias(type);
    for (const FloatLayout& layout : kFloatLayouts)
      if (layout.size == size && layout.sign_bit == sign_bit && layout.exponent_bit == exponent_bit &&
          layout.exponent_bits == exponent_bits && layout.mantissa_bits == mantissa_bits && layout.bias == bias)
        return layout.dtype;
  }
  return std::nullopt;
}

/// bf16, f16 and fp8 have no HDF5 integer type of their own: their bit patterns may sit in any integer
/// dataset of their width, the attribute saying which format they are.
bool stored_as_integer_bits(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

/// The attribute's text as a dtype: our names, the safetensors names, and torch/numpy spellings
/// ("bfloat16", "torch.bfloat16", "float8_e4m3fn").
std::optional<DType> parse_dtype_attribute(std::string_view text) {
  for (const std::string_view prefix : {"torch.", "numpy.", "np."})
    if (text.size() > prefix.size() && text.substr(0, prefix.size()) == prefix) text.remove_prefix(prefix.size());
  return parse_dtype(text);
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

/// Reads a string attribute holding one string: fixed or variable length, ASCII or UTF-8, scalar or a
/// one-element array (h5py writes a variable-length UTF-8 scalar for a Python str, a fixed-length ASCII
/// scalar for numpy bytes).
std::string read_string_attribute(hid_t object, const char* name, const Where& where) {
  // Strings longer than this are no dtype name; the bound keeps a corrupt size from allocating much.
  constexpr std::size_t kMaxLength = 256;
  Handle attribute(WB_H5(kCorruptData, where, H5Aopen(object, name, H5P_DEFAULT)), H5Aclose);
  Handle type(WB_H5(kCorruptData, where, H5Aget_type(attribute.get())), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw_corrupt(where, std::string("attribute '") + name + "' is a " + describe_type(type.get()) +
                             ", not a string");
  // Reading writes one element per point of the dataspace: anything but one would overrun the buffer.
  Handle space(WB_H5(kCorruptData, where, H5Aget_space(attribute.get())), H5Sclose);
  const hssize_t points = WB_H5(kCorruptData, where, H5Sget_simple_extent_npoints(space.get()));
  if (points != 1)
    throw_corrupt(where, std::string("attribute '") + name + "' holds " + std::to_string(points) +
                             " strings, expected one");
  const H5T_cset_t charset = H5Tget_cset(type.get());
  if (charset != H5T_CSET_ASCII && charset != H5T_CSET_UTF8)
    throw_corrupt(where, std::string("attribute '") + name + "' has an unknown character set");
  std::string value;
  if (WB_H5(kCorruptData, where, H5Tis_variable_str(type.get())) > 0) {
    // The memory type takes the file's character set: HDF5 converts no strings between ASCII and UTF-8.
    Handle memory_type(WB_H5(kHdf5, where, H5Tcopy(H5T_C_S1)), H5Tclose);
    WB_H5(kHdf5, where, H5Tset_size(memory_type.get(), H5T_VARIABLE));
    WB_H5(kHdf5, where, H5Tset_cset(memory_type.get(), charset));
    char* text = nullptr;
    WB_H5(kCorruptData, where, H5Aread(attribute.get(), memory_type.get(), &text));
    if (text != nullptr) {
      value.assign(text, strnlen(text, kMaxLength + 1));
      H5free_memory(text);
    }
  } else {
    const std::size_t size = H5Tget_size(type.get());
    if (size == 0 || size > kMaxLength)
      throw_corrupt(where, std::string("attribute '") + name + "' is a string of " + std::to_string(size) +
                               " bytes, not a dtype name");
    // Read as it is stored (same type, so no conversion); the extra byte keeps it NUL-terminated.
    std::vector<char> buffer(size + 1, '\0');
    WB_H5(kCorruptData, where, H5Aread(attribute.get(), type.get(), buffer.data()));
    value.assign(buffer.data());  // stops at the first NUL of NULLTERM/NULLPAD strings
  }
  if (value.size() > kMaxLength)
    throw_corrupt(where, std::string("attribute '") + name + "' is longer than " + std::to_string(kMaxLength) +
                             " bytes, not a dtype name");
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
    require_regular_file(kWhat, path_);  // HDF5 would block opening a FIFO
    // A file that crashes or hangs libhdf5 is refused before this process opens it (io/hdf5_check.hpp).
    check_hdf5_file(path_);
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    try {
      open_file();
    } catch (...) {
      close();  // under the lock, not later when the members are destroyed
      throw;
    }
  }

  ~Hdf5Reader() override {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    close();
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
    const hid_t memory_type = memory_types_[static_cast<std::size_t>(info - tensors_.data())].get();

    // Read through libhdf5's own descriptor, a file rewritten in place would give another checkpoint's bytes.
    if (const std::string change = file_change(watch_fd_, path_, opened_); !change.empty())
      throw_corrupt(where, changed_file_text(change));
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

  /// The checker's walk (walk_hdf5_metadata): opens the file as a reader does, logs nothing, and writes
  /// the name of each dataset it turns to, one per line, to `progress_fd`.
  struct Walk {
    int progress_fd;
  };
  Hdf5Reader(std::string path, Walk walk) : path_(std::move(path)), progress_fd_(walk.progress_fd) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    silence_hdf5();
    try {
      open_file();
    } catch (...) {
      close();
      throw;
    }
  }

 private:
  void open_file() {
    const Where where{path_, {}};
    Handle fapl = file_access(false, where);
    const hid_t file = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (file < 0) {
      const detail::Hdf5Failure failure = detail::innermost_hdf5_failure();
      if (failure.minor == H5E_NOTHDF5 || failure.minor == H5E_TRUNCATED || failure.minor == H5E_BADFILE)
        throw_corrupt(where, "not an HDF5 file, or truncated or corrupt: " + failure.text);
      throw Error(ErrorCode::kHdf5, std::string(kWhat) + " " + path_ + ": cannot open: " + failure.text);
    }
    file_ = Handle(file, H5Fclose);
    watch_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (watch_fd_ < 0 || ::fstat(watch_fd_, &opened_) != 0)
      throw Error(ErrorCode::kSystem, std::string(kWhat) + " " + path_ + ": open: " + std::strerror(errno));
    hsize_t file_bytes = 0;
    WB_H5(kCorruptData, where, H5Fget_filesize(file_.get(), &file_bytes));
    std::unordered_set<std::string> seen;  // a corrupt link table can repeat a name
    for (const std::string& name : dataset_names()) {
      if (!seen.insert(name).second) throw_corrupt(Where{path_, name}, "the file's root group names it twice");
      if (!is_utf8(name)) throw_corrupt(Where{path_, name}, "the name is not UTF-8 (bytes shown as \\xNN), as tensor names must be");
      add_tensor(name, file_bytes);
    }
  }

  /// Links of the root group, in creation order when the file tracks it, else in name order.
  std::vector<std::string> dataset_names() const {
    const Where where{path_, {}};
    Handle root(WB_H5(kCorruptData, where, H5Gopen2(file_.get(), "/", H5P_DEFAULT)), H5Gclose);
    Handle gcpl(WB_H5(kCorruptData, where, H5Gget_create_plist(root.get())), H5Pclose);
    unsigned order_flags = 0;
    WB_H5(kCorruptData, where, H5Pget_link_creation_order(gcpl.get(), &order_flags));
    const H5_index_t index = (order_flags & H5P_CRT_ORDER_TRACKED) != 0 ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    struct Listing {
      const Hdf5Reader* reader;
      std::vector<std::string> names;
    } listing{this, {}};
    const auto visit = [](hid_t, const char* name, const H5L_info_t* link, void* data) -> herr_t {
      auto* out = static_cast<Listing*>(data);
      if (link->type == H5L_TYPE_HARD) out->names.emplace_back(name);
      if (out->names.size() % 1024 == 0) out->reader->report_progress({});  // a long listing is progress too
      return 0;
    };
    hsize_t position = 0;
    WB_H5(kCorruptData, where, H5Literate(root.get(), index, H5_ITER_INC, &position, visit, &listing));
    return std::move(listing.names);
  }

  void close() {
    memory_types_.clear();
    file_.reset();
    if (watch_fd_ >= 0) ::close(watch_fd_);
    watch_fd_ = -1;
  }

  /// In the checker: tells the process that waits for it which dataset comes next (one line, "d NAME"; a
  /// newline in a name would split it, so it is replaced; "d " alone says the listing goes on).
  void report_progress(std::string name) const {
    if (progress_fd_ < 0) return;
    for (char& c : name)
      if (c == '\n') c = ' ';
    name = "d " + name + '\n';
    for (std::size_t done = 0; done < name.size();) {
      const ssize_t wrote = ::write(progress_fd_, name.data() + done, name.size() - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) return;
      done += static_cast<std::size_t>(wrote);
    }
  }

  /// The dtype of a dataset: its own type's where that says one, the `dtype` attribute where the type
  /// holds bit patterns of a format HDF5 has no type for; both, when present, must agree.
  DType dataset_dtype(hid_t dataset, hid_t type, const Where& where) const {
    const std::optional<DType> own = dtype_of_type(type);
    const H5T_class_t type_class = H5Tget_class(type);
    if (WB_H5(kCorruptData, where, H5Aexists(dataset, "dtype")) == 0) {
      if (own) return *own;
      if (type_class == H5T_INTEGER && H5Tget_size(type) == 2)  // 8-bit integers are i8/u8 without one
        throw_corrupt(where, "stored as " + describe_type(type) +
                                 " with no 'dtype' attribute saying which format its bits hold (bf16 or f16)");
      throw_corrupt(where, "stored as " + describe_type(type) +
                               ", which is no WeightBridge dtype (bf16, f16, f32, f64, i8, u8, i32, i64, f8e4m3, "
                               "f8e5m2)");
    }
    const std::string text = read_string_attribute(dataset, "dtype", where);
    const std::optional<DType> named = parse_dtype_attribute(text);
    if (!named) throw_corrupt(where, "unknown dtype attribute '" + text + "'");
    if (own == named) return *named;
    // Integer storage of bf16/f16/fp8 bits: any sign, the same width, no padding bits.
    if (type_class == H5T_INTEGER && stored_as_integer_bits(*named) && H5Tget_size(type) == dtype_size(*named) &&
        H5Tget_precision(type) == H5Tget_size(type) * 8 && H5Tget_offset(type) == 0)
      return *named;
    const std::string expected = stored_as_integer_bits(*named)
                                     ? std::to_string(8 * dtype_size(*named)) + "-bit integers" +
                                           (*named == DType::kF16 ? " or IEEE float16" : "")
                                     : storage_of(*named).description;
    throw_corrupt(where, "stored as " + describe_type(type) + " but its dtype attribute says " + text +
                             ", which is stored as " + expected);
  }

  void add_tensor(const std::string& name, hsize_t file_bytes) {
    const Where where{path_, name};
    Handle object(WB_H5(kCorruptData, where, H5Oopen(file_.get(), name.c_str(), H5P_DEFAULT)), H5Oclose);
    if (H5Iget_type(object.get()) != H5I_DATASET) {
      if (progress_fd_ < 0) {
        WB_LOG(kDebug) << kWhat << " " << path_ << ": skipping '" << name << "', not a dataset";
      }
      return;
    }
    const hid_t dataset = object.get();
    report_progress(name);
    Handle type(WB_H5(kCorruptData, where, H5Dget_type(dataset)), H5Tclose);
    const DType dtype = dataset_dtype(dataset, type.get(), where);

    Handle space(WB_H5(kCorruptData, where, H5Dget_space(dataset)), H5Sclose);
    const H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
    Shape shape;
    if (space_class == H5S_SIMPLE) {
      const int ndim = WB_H5(kCorruptData, where, H5Sget_simple_extent_ndims(space.get()));
      std::vector<hsize_t> dims(static_cast<std::size_t>(ndim));
      WB_H5(kCorruptData, where, H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
      for (const hsize_t extent : dims) {
        if (extent > static_cast<hsize_t>(INT64_MAX)) throw_corrupt(where, "dataset extent " + std::to_string(extent) + " is too large");
        shape.push_back(static_cast<std::int64_t>(extent));
      }
    } else if (space_class != H5S_SCALAR) {
      throw_corrupt(where, "dataset has a null or unknown dataspace");
    }
    const std::int64_t nbytes = checked_nbytes(shape, dtype_size(dtype));
    if (nbytes < 0) throw_corrupt(where, "shape " + shape_to_string(shape) + " is too large");
    check_storage(dataset, static_cast<hsize_t>(nbytes), file_bytes, where);

    // The memory type is the file type in this machine's byte order: HDF5 swaps bytes where the file's
    // order differs and otherwise copies them, never converting a value.
    Handle memory_type(WB_H5(kHdf5, where, H5Tcopy(type.get())), H5Tclose);
    if (H5Tget_order(memory_type.get()) != H5T_ORDER_NONE)
      WB_H5(kCorruptData, where, H5Tset_order(memory_type.get(), H5Tget_order(H5T_NATIVE_INT)));
    tensors_.push_back(TensorInfo{name, dtype, std::move(shape)});
    memory_types_.push_back(std::move(memory_type));
  }

  /// Refuses data kept outside this file (external files, virtual datasets: the checkpoint would reach
  /// files nobody named) and a contiguous dataset whose bytes would end past the end of the file (a
  /// corrupt dataspace claiming a huge shape).
  void check_storage(hid_t dataset, hsize_t nbytes, hsize_t file_bytes, const Where& where) const {
    Handle dcpl(WB_H5(kCorruptData, where, H5Dget_create_plist(dataset)), H5Pclose);
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout == H5D_VIRTUAL || WB_H5(kCorruptData, where, H5Pget_external_count(dcpl.get())) > 0)
      throw_corrupt(where, "dataset keeps its data in other files (external storage or a virtual dataset), "
                           "which a checkpoint may not do");
    if (layout != H5D_CONTIGUOUS) return;  // chunked (perhaps compressed) or compact: no such bound
    const haddr_t offset = H5Dget_offset(dataset);
    if (offset == HADDR_UNDEF) return;  // never written: reads give the fill value
    if (offset > file_bytes || nbytes > file_bytes - offset)
      throw_corrupt(where, "dataset of " + std::to_string(nbytes) + " bytes at offset " + std::to_string(offset) +
                               " ends past the end of the file (" + std::to_string(file_bytes) +
                               " bytes): truncated or corrupt");
  }

  std::string path_;
  Handle file_;
  std::vector<TensorInfo> tensors_;
  std::vector<Handle> memory_types_;  // parallel to tensors_
  int progress_fd_ = -1;  // >= 0 only in the checker's walk
  int watch_fd_ = -1;     // the file as opened, to see whether it changes under the job (file_change)
  struct stat opened_ {};
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

void walk_hdf5_metadata(const std::string& path, int progress_fd) {
  require_regular_file(kWhat, path);
  const Hdf5Reader walk(path, Hdf5Reader::Walk{progress_fd});
}

std::unique_ptr<CheckpointWriter> create_hdf5_writer(const std::string& path, std::vector<TensorInfo> tensors) {
  return std::make_unique<Hdf5Writer>(path, std::move(tensors));
}

}  // namespace io

std::unique_ptr<CheckpointReader> open_hdf5_checkpoint(const std::string& path) {
  return std::make_unique<io::Hdf5Reader>(path);
}

}  // namespace wb
