// safetensors checkpoints (the Hugging Face format): an 8-byte little-endian header length N, N bytes of
// JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// raw little-endian data, offsets counted from the first byte after the header. The multi-file form is a
// model.safetensors.index.json whose "weight_map" names each tensor's shard, the shards beside it.
//
// Files are mapped read-only, and every header is validated at open, so a box read is memcpy from the
// mapping and can never reach outside the file. A file changed under the job (truncated, rewritten,
// replaced) is an error naming it at the next read, never SIGBUS (io/mapping_guard.hpp).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "core/log.hpp"
#include "io/checkpoint_internal.hpp"
#include "io/mapping_guard.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kWhat = "safetensors checkpoint";
constexpr std::size_t kLengthBytes = 8;

[[noreturn]] void throw_at(ErrorCode code, std::string_view file, std::string_view tensor, const std::string& cause) {
  throw Error(code, tensor_context(kWhat, file, tensor) + ": " + cause);
}

[[noreturn]] void throw_errno(std::string_view file, const char* call) {
  const int error = errno;
  throw_at(error == ENOENT ? ErrorCode::kNotFound : ErrorCode::kSystem, file, {},
           std::string(call) + " failed: " + std::strerror(error));
}

std::string byte_range(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// --- reading ---------------------------------------------------------------------------------------

/// A whole file mapped read-only.
class MappedFile {
 public:
  explicit MappedFile(std::string path) : path_(std::move(path)) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; the type is checked on the open descriptor.
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw_errno(path_, "open");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      throw_errno(path_, "fstat");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw_at(ErrorCode::kInvalidArgument, path_, {}, "is " + std::string(file_kind(st.st_mode)) + ", not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    opened_ = st;
    if (size_ > 0) {  // mmap refuses length 0; an empty file is reported as too short by the parser
      void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (map == MAP_FAILED) {
        ::close(fd);
        throw_errno(path_, "mmap");
      }
      data_ = static_cast<const std::byte*>(map);
    }
    fd_ = fd;  // kept to see whether the file changed under the job
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    if (fd_ >= 0) ::close(fd_);
  }

  /// Throws, naming the file and `tensor`, when the file changed since it was opened (its size or
  /// modification time) or its path now names another file: what the job reads would no longer be the
  /// checkpoint it validated, or reading it past a truncation would raise SIGBUS.
  void check_unchanged(std::string_view tensor) const {
    if (const std::string change = file_change(fd_, path_, opened_); !change.empty()) changed(tensor, change);
  }

  [[noreturn]] void changed(std::string_view tensor, const std::string& how) const {
    throw_at(ErrorCode::kCorruptData, path_, tensor, changed_file_text(how));
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
  struct stat opened_ {};
};

/// A key that occurs twice in one JSON object, and the key of that object in its parent ("" at the top).
struct DuplicateKey {
  std::string key;
  std::string parent;
};

/// Parses JSON, noting the first key repeated inside one object: nlohmann keeps the last definition
/// silently, and a header naming a tensor twice must not load whichever came last.
json parse_json_noting_duplicates(const char* begin, const char* end, std::optional<DuplicateKey>& duplicate) {
  struct Object {
    std::string name;
    std::set<std::string, std::less<>> keys;
  };
  std::vector<Object> open;
  std::string last_key;
  const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open.push_back({std::move(last_key), {}});
        last_key.clear();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!duplicate && !open.empty() && !open.back().keys.insert(last_key).second)
          duplicate = DuplicateKey{last_key, open.back().name};
        break;
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::array_start:
      case json::parse_event_t::array_end:
      case json::parse_event_t::value:
        last_key.clear();
        break;
    }
    return true;
  };
  return json::parse(begin, end, callback);
}

/// One tensor of one file: where its bytes start in the mapping.
struct Entry {
  TensorInfo info;
  std::uint64_t begin = 0;  // absolute byte offset in the file
  std::uint64_t end = 0;
};

/// A non-negative integer from the header, or nullopt (negative, fractional, not a number, too large).
std::optional<std::uint64_t> header_integer(const json& value) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer() && value.get<std::int64_t>() >= 0) return value.get<std::uint64_t>();
  return std::nullopt;
}

Entry parse_entry(const MappedFile& file, const std::string& name, const json& entry, std::uint64_t data_start) {
  const std::string& path = file.path();
  if (!entry.is_object()) throw_at(ErrorCode::kCorruptData, path, name, "header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key))
      throw_at(ErrorCode::kCorruptData, path, name, std::string("header entry has no \"") + key + "\"");

  const json& dtype_json = entry["dtype"];
  if (!dtype_json.is_string()) throw_at(ErrorCode::kCorruptData, path, name, "\"dtype\" is not a string");
  const std::optional<DType> dtype = parse_dtype(dtype_json.get<std::string>());
  if (!dtype)
    throw_at(ErrorCode::kCorruptData, path, name,
             "unknown or unsupported dtype \"" + dtype_json.get<std::string>() +
                 "\" (supported: BF16, F16, F32, F64, I8, U8, I32, I64, F8_E4M3, F8_E5M2)");

  const json& shape_json = entry["shape"];
  if (!shape_json.is_array()) throw_at(ErrorCode::kCorruptData, path, name, "\"shape\" is not an array");
  Shape shape;
  for (const json& extent : shape_json) {
    const std::optional<std::uint64_t> value = header_integer(extent);
    if (!value || *value > static_cast<std::uint64_t>(INT64_MAX))
      throw_at(ErrorCode::kCorruptData, path, name,
               "\"shape\" " + shape_json.dump() + " holds something other than a non-negative integer");
    shape.push_back(static_cast<std::int64_t>(*value));
  }
  const std::int64_t nbytes = checked_nbytes(shape, dtype_size(*dtype));
  if (nbytes < 0)
    throw_at(ErrorCode::kCorruptData, path, name, "shape " + shape_to_string(shape) + " is too large");

  const json& offsets = entry["data_offsets"];
  std::optional<std::uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = header_integer(offsets[0]);
    end = header_integer(offsets[1]);
  }
  if (!begin || !end || *end < *begin)
    throw_at(ErrorCode::kCorruptData, path, name,
             "\"data_offsets\" " + offsets.dump() + " is not a pair [begin, end] of integers with begin <= end");
  if (*end - *begin != static_cast<std::uint64_t>(nbytes))
    throw_at(ErrorCode::kCorruptData, path, name,
             "\"data_offsets\" " + offsets.dump() + " hold " + std::to_string(*end - *begin) + " bytes but " +
                 std::string(dtype_name(*dtype)) + " " + shape_to_string(shape) + " needs " + std::to_string(nbytes));
  const std::uint64_t data_bytes = file.size() - data_start;
  if (*end > data_bytes)
    throw_at(ErrorCode::kCorruptData, path, name,
             "\"data_offsets\" " + offsets.dump() + " end past the data section, which holds " +
                 std::to_string(data_bytes) + " bytes (truncated file?)");
  return Entry{TensorInfo{name, *dtype, std::move(shape)}, data_start + *begin, data_start + *end};
}

/// Validates the header of one mapped file; returns its tensors in data order.
std::vector<Entry> parse_file(const MappedFile& file) {
  const std::string& path = file.path();
  if (file.size() < kLengthBytes)
    throw_at(ErrorCode::kCorruptData, path, {},
             "file is " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
  std::uint64_t header_bytes = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i)
    header_bytes |= static_cast<std::uint64_t>(file.data()[i]) << (8 * i);  // little-endian on any host
  if (header_bytes > file.size() - kLengthBytes)
    throw_at(ErrorCode::kCorruptData, path, {},
             "header length " + std::to_string(header_bytes) + " is larger than the rest of the file (" +
                 std::to_string(file.size() - kLengthBytes) + " bytes)");
  const char* header = reinterpret_cast<const char*>(file.data() + kLengthBytes);
  json document;
  std::optional<DuplicateKey> duplicate;
  try {
    document = parse_json_noting_duplicates(header, header + header_bytes, duplicate);
  } catch (const json::exception& e) {
    throw_at(ErrorCode::kCorruptData, path, {}, std::string("header is not valid JSON: ") + e.what());
  }
  if (!document.is_object()) throw_at(ErrorCode::kCorruptData, path, {}, "header is not a JSON object");
  if (duplicate) {
    if (duplicate->parent.empty())
      throw_at(ErrorCode::kCorruptData, path, duplicate->key, "the header defines it twice");
    throw_at(ErrorCode::kCorruptData, path, duplicate->parent,
             "its header entry has the key \"" + duplicate->key + "\" twice");
  }

  const std::uint64_t data_start = kLengthBytes + header_bytes;
  std::vector<Entry> entries;
  entries.reserve(document.size());
  for (const auto& [name, entry] : document.items()) {
    if (name == "__metadata__") continue;  // free-form strings; nothing we need
    entries.push_back(parse_entry(file, name, entry, data_start));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by start, a tensor overlaps an earlier one exactly when it starts before the furthest end so
  // far. Empty tensors hold no bytes and overlap nothing.
  const Entry* furthest = nullptr;
  for (const Entry& entry : entries) {
    if (entry.begin == entry.end) continue;
    if (furthest != nullptr && entry.begin < furthest->end)
      throw_at(ErrorCode::kCorruptData, path, entry.info.name,
               "bytes " + byte_range(entry.begin - data_start, entry.end - data_start) + " overlap tensor " +
                   furthest->info.name + " at " + byte_range(furthest->begin - data_start, furthest->end - data_start));
    if (furthest == nullptr || entry.end > furthest->end) furthest = &entry;
  }
  return entries;
}

/// Copies `box` of a row-major tensor at `tensor` into `destination`, contiguous in the box's extent:
/// trailing axes the box covers whole join the first partial axis into one run, copied with one memcpy
/// per position of the remaining outer axes (one memcpy in all for a range of rows).
void copy_box(const std::byte* tensor, const Shape& shape, std::size_t element_size, const Box& box,
              std::byte* destination) {
  const int ndim = static_cast<int>(shape.size());
  std::vector<std::size_t> stride(static_cast<std::size_t>(ndim));  // bytes
  std::size_t base = 0;
  std::size_t step = element_size;
  for (int axis = ndim - 1; axis >= 0; --axis) {
    stride[axis] = step;
    base += static_cast<std::size_t>(box.offset[axis]) * step;
    step *= static_cast<std::size_t>(shape[axis]);
  }
  std::size_t run = element_size;
  int outer = ndim;  // axes [0, outer) are walked; [outer, ndim) form the run
  while (outer > 0 && box.extent[outer - 1] == shape[outer - 1]) run *= static_cast<std::size_t>(shape[--outer]);
  if (outer > 0) run *= static_cast<std::size_t>(box.extent[--outer]);

  const std::byte* source = tensor + base;
  if (outer == 0) {
    std::memcpy(destination, source, run);
    return;
  }
  // The last outer axis is the tight loop; the axes before it advance like an odometer.
  const int inner = outer - 1;
  const std::size_t rows = static_cast<std::size_t>(box.extent[inner]);
  const std::size_t row_stride = stride[inner];
  std::vector<std::int64_t> index(static_cast<std::size_t>(inner), 0);
  while (true) {
    const std::byte* row = source;
    for (std::size_t r = 0; r < rows; ++r, row += row_stride, destination += run) std::memcpy(destination, row, run);
    int axis = inner - 1;
    for (; axis >= 0; --axis) {
      source += stride[axis];
      if (++index[axis] < box.extent[axis]) break;
      source -= stride[axis] * static_cast<std::size_t>(box.extent[axis]);
      index[axis] = 0;
    }
    if (axis < 0) return;
  }
}

class SafetensorsReader final : public CheckpointReader {
 public:
  /// A single .safetensors file.
  explicit SafetensorsReader(const std::string& path) : source_(path) {
    files_.push_back(std::make_unique<MappedFile>(path));
    for (Entry& entry : parse_file(*files_.back())) add(std::move(entry), 0);
  }

  /// A model.safetensors.index.json and the shards it names.
  struct FromIndex {};
  SafetensorsReader(const std::string& index_path, FromIndex) : source_(index_path) {
    const json document = read_index();
    const fs::path directory = fs::path(index_path).parent_path();
    // tensor → shard, and the shards in the order of their names (model-00001-of-... first).
    std::map<std::string, std::string> shard_of;
    std::map<std::string, std::string> first_tensor_of;  // shard → a tensor it holds, for messages
    for (const auto& [name, shard] : document["weight_map"].items()) {
      if (!shard.is_string())
        throw_at(ErrorCode::kCorruptData, source_, name, "weight_map entry is not a file name string");
      const std::string& file = shard.get_ref<const std::string&>();
      check_shard_name(name, file, directory);
      shard_of.emplace(name, file);
      first_tensor_of.emplace(file, name);
    }
    for (const auto& [shard, listed_tensor] : first_tensor_of) {
      const std::string shard_path = (directory / shard).string();
      std::error_code ec;
      if (!fs::exists(shard_path, ec))
        throw_at(ErrorCode::kNotFound, source_, listed_tensor, "its shard " + shard_path + " is missing");
      files_.push_back(std::make_unique<MappedFile>(shard_path));
      std::vector<std::string> unlisted;
      for (Entry& entry : parse_file(*files_.back())) {
        const auto listed = shard_of.find(entry.info.name);
        if (listed == shard_of.end() || listed->second != shard) {
          unlisted.push_back(entry.info.name);  // the index is the checkpoint: stray tensors are not part of it
          continue;
        }
        add(std::move(entry), files_.size() - 1);
      }
      if (!unlisted.empty()) {
        std::string names;
        for (std::size_t i = 0; i < unlisted.size() && i < 8; ++i) names += (i == 0 ? "" : ", ") + unlisted[i];
        if (unlisted.size() > 8) names += ", and " + std::to_string(unlisted.size() - 8) + " more";
        WB_LOG(kWarn) << kWhat << " " << source_ << ": shard " << shard << " holds " << unlisted.size()
                      << " tensor(s) the weight_map does not assign to it, ignored: " << names;
      }
    }
    if (tensors_.size() != shard_of.size()) {
      std::unordered_map<std::string_view, bool> present;
      for (const TensorInfo& info : tensors_) present.emplace(info.name, true);
      for (const auto& [name, shard] : shard_of)
        if (!present.contains(name))
          throw_at(ErrorCode::kCorruptData, source_, name,
                   "the index places it in shard " + (directory / shard).string() + ", which does not hold it");
    }
  }

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  std::string source() const override { return source_; }

  void read_box(std::string_view name, const Box& box, void* destination) const override {
    const TensorInfo* info = find(name);
    if (info == nullptr) throw_at(ErrorCode::kNotFound, source_, name, "no such tensor in the checkpoint");
    check_box(source_, *info, box);
    if (box.numel() == 0) return;
    const Location& at = locations_[static_cast<std::size_t>(info - tensors_.data())];
    const MappedFile& file = *files_[at.file];
    file.check_unchanged(name);
    // A truncation between the check and the copy still ends in an error, not SIGBUS.
    const bool read = guarded_copy([&] {
      copy_box(file.data() + at.begin, info->shape, dtype_size(info->dtype), box, static_cast<std::byte*>(destination));
    });
    if (!read) file.changed(name, "reading it raised SIGBUS: it was truncated");
  }

 private:
  struct Location {
    std::size_t file;
    std::uint64_t begin;
  };

  json read_index() const {
    const MappedFile file(source_);  // refuses a FIFO or device without blocking on it
    const char* text = reinterpret_cast<const char*>(file.data());
    json document;
    std::optional<DuplicateKey> duplicate;
    try {
      document = parse_json_noting_duplicates(text, text + file.size(), duplicate);
    } catch (const json::exception& e) {
      throw_at(ErrorCode::kCorruptData, source_, {}, std::string("index is not valid JSON: ") + e.what());
    }
    if (!document.is_object() || !document.contains("weight_map") || !document["weight_map"].is_object())
      throw_at(ErrorCode::kCorruptData, source_, {}, "index has no \"weight_map\" object");
    if (duplicate && duplicate->parent == "weight_map")
      throw_at(ErrorCode::kCorruptData, source_, duplicate->key, "the index's weight_map names it twice");
    return document;
  }

  /// Shards must lie inside the index's directory: a relative path without "..". The check is on the
  /// name, not on where symbolic links lead: the Hugging Face cache links every shard to a blob elsewhere.
  void check_shard_name(const std::string& tensor, const std::string& shard, const fs::path& directory) const {
    const auto refuse = [&](const std::string& why) {
      throw_at(ErrorCode::kInvalidArgument, source_, tensor,
               "its shard \"" + printable(shard) + "\" " + why + "; shards must be files in the index's directory " +
                   (directory.empty() ? std::string(".") : directory.string()) + " or below it");
    };
    if (shard.empty()) refuse("is an empty name");
    if (shard.find('\0') != std::string::npos) refuse("holds a NUL character");
    const fs::path path(shard);
    if (path.is_absolute() || path.has_root_name() || path.has_root_directory()) refuse("is an absolute path");
    for (const fs::path& part : path)
      if (part == "..") refuse("leads out of it through \"..\"");
  }

  void add(Entry entry, std::size_t file) {
    locations_.push_back(Location{file, entry.begin});
    tensors_.push_back(std::move(entry.info));
  }

  std::string source_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<TensorInfo> tensors_;
  std::vector<Location> locations_;  // parallel to tensors_
};

// --- writing ---------------------------------------------------------------------------------------

/// The header of one file: __metadata__ first (transformers expects {"format": "pt"}), then the tensors
/// in data order, padded with spaces so the data starts 8-byte aligned, as the reference writer does.
std::string make_header(const std::vector<TensorInfo>& tensors, const std::vector<std::size_t>& members,
                        const std::vector<std::uint64_t>& begins) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  for (std::size_t i : members)
    header[tensors[i].name] = {{"dtype", dtype_safetensors_name(tensors[i].dtype)},
                               {"shape", tensors[i].shape},
                               {"data_offsets", {begins[i], begins[i] + tensors[i].nbytes()}}};
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return text;
}

void pwrite_all(int fd, const void* data, std::size_t bytes, std::uint64_t offset, std::string_view file,
                std::string_view tensor) {
  const auto* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t done = ::pwrite(fd, cursor, std::min<std::size_t>(bytes, std::size_t{1} << 30),
                                  static_cast<off_t>(offset));
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0)
      throw_at(ErrorCode::kSystem, file, tensor, std::string("pwrite failed: ") + (done < 0 ? std::strerror(errno) : "wrote nothing"));
    cursor += done;
    offset += static_cast<std::uint64_t>(done);
    bytes -= static_cast<std::size_t>(done);
  }
}

class SafetensorsWriter final : public CheckpointWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorInfo> tensors, const CheckpointWriterOptions& options)
      : path_(path), sharded_(options.max_shard_bytes > 0), tensors_(std::move(tensors)),
        slots_(tensors_.size()) {
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
    try {
      create(options.max_shard_bytes);
    } catch (...) {
      discard();
      throw;
    }
  }

  ~SafetensorsWriter() override {
    if (!finished_) discard();
  }

  void write(std::string_view name, const void* data) override {
    const auto found = index_.find(name);
    if (found == index_.end())
      throw_at(ErrorCode::kInvalidArgument, path_, name, "not in the checkpoint's tensor list");
    Slot& slot = slots_[found->second];
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finished_) throw_at(ErrorCode::kInvalidArgument, path_, name, "writer already finished");
      if (slot.state != State::kEmpty) throw_at(ErrorCode::kInvalidArgument, path_, name, "written twice");
      slot.state = State::kWriting;  // claims the slot, so concurrent writers of other tensors run in parallel
    }
    const Shard& shard = shards_[slot.shard];
    try {
      pwrite_all(shard.fd, data, tensors_[found->second].nbytes(), slot.offset, shard.final_path, name);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      slot.state = State::kEmpty;
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot.state = State::kWritten;
  }

  void finish() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) throw_at(ErrorCode::kInvalidArgument, path_, {}, "finish() called twice");
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (slots_[i].state != State::kWritten)
        throw_at(ErrorCode::kInvalidArgument, path_, tensors_[i].name, "finish() before the tensor was written");
    for (Shard& shard : shards_) {
      const int fd = shard.fd;
      shard.fd = -1;
      if (::close(fd) != 0) throw_at(ErrorCode::kSystem, shard.final_path, {}, std::string("close failed: ") + std::strerror(errno));
    }
    if (sharded_) write_index();
    // Shards first, the index last: whoever finds the index finds every shard.
    for (Shard& shard : shards_) publish(shard.temporary_path, shard.final_path);
    if (sharded_) publish(index_temporary_, path_);
    finished_ = true;
  }

 private:
  enum class State : std::uint8_t { kEmpty, kWriting, kWritten };
  struct Slot {
    std::size_t shard = 0;
    std::uint64_t offset = 0;  // absolute, in the shard file
    State state = State::kEmpty;
  };
  struct Shard {
    std::string final_path;
    std::string temporary_path;
    int fd = -1;
    bool created = false;
  };

  void create(std::size_t max_shard_bytes) {
    // Greedy in the given order, as transformers' save_pretrained shards: a tensor larger than the limit
    // gets a shard of its own.
    std::vector<std::vector<std::size_t>> members(1);
    std::size_t shard_bytes = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const std::size_t bytes = tensors_[i].nbytes();
      if (max_shard_bytes > 0 && !members.back().empty() && shard_bytes + bytes > max_shard_bytes) {
        members.emplace_back();
        shard_bytes = 0;
      }
      members.back().push_back(i);
      shard_bytes += bytes;
    }
    const fs::path directory = fs::path(path_).parent_path();
    shards_.resize(members.size());
    for (std::size_t s = 0; s < members.size(); ++s) {
      Shard& shard = shards_[s];
      if (sharded_) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, members.size());
        shard.final_path = (directory / name).string();
      } else {
        shard.final_path = path_;
      }
      std::vector<std::uint64_t> begins(tensors_.size(), 0);
      std::uint64_t data_bytes = 0;
      for (std::size_t i : members[s]) {
        begins[i] = data_bytes;
        data_bytes += tensors_[i].nbytes();
      }
      const std::string header = make_header(tensors_, members[s], begins);
      const std::uint64_t data_start = kLengthBytes + header.size();
      for (std::size_t i : members[s]) slots_[i] = Slot{s, data_start + begins[i], State::kEmpty};

      shard.temporary_path = temporary_path_for(shard.final_path);
      shard.fd = ::open(shard.temporary_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (shard.fd < 0) throw_errno(shard.final_path, "open");
      shard.created = true;
      unsigned char length[kLengthBytes];
      for (std::size_t b = 0; b < kLengthBytes; ++b) length[b] = static_cast<unsigned char>(header.size() >> (8 * b));
      pwrite_all(shard.fd, length, kLengthBytes, 0, shard.final_path, {});
      pwrite_all(shard.fd, header.data(), header.size(), kLengthBytes, shard.final_path, {});
      // The full size up front: tensors land by pwrite in any order.
      if (::ftruncate(shard.fd, static_cast<off_t>(data_start + data_bytes)) != 0) throw_errno(shard.final_path, "ftruncate");
    }
  }

  void write_index() {
    json weight_map = json::object();
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      weight_map[tensors_[i].name] = fs::path(shards_[slots_[i].shard].final_path).filename().string();
      total += tensors_[i].nbytes();
    }
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    index_temporary_ = temporary_path_for(path_);
    std::ofstream out(index_temporary_, std::ios::binary | std::ios::trunc);
    out << index.dump(2) << '\n';
    out.close();
    if (!out) throw_at(ErrorCode::kSystem, path_, {}, "cannot write the index file " + index_temporary_);
  }

  static void publish(const std::string& from, const std::string& to) {
    std::error_code ec;
    fs::rename(from, to, ec);
    if (ec) throw_at(ErrorCode::kSystem, to, {}, "rename from " + from + " failed: " + ec.message());
  }

  /// Removes everything written so far (a destroyed or failed writer leaves nothing behind).
  void discard() noexcept {
    for (Shard& shard : shards_) {
      if (shard.fd >= 0) ::close(shard.fd);
      shard.fd = -1;
      if (shard.created) std::remove(shard.temporary_path.c_str());
    }
    if (!index_temporary_.empty()) std::remove(index_temporary_.c_str());
  }

  std::string path_;
  bool sharded_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, std::size_t> index_;  // views into tensors_
  std::vector<Slot> slots_;                                  // parallel to tensors_
  std::vector<Shard> shards_;
  std::string index_temporary_;
  std::mutex mutex_;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<CheckpointWriter> create_safetensors_writer(const std::string& path, std::vector<TensorInfo> tensors,
                                                            const CheckpointWriterOptions& options) {
  return std::make_unique<SafetensorsWriter>(path, std::move(tensors), options);
}

}  // namespace io

std::unique_ptr<CheckpointReader> open_safetensors_checkpoint(const std::string& path) {
  const bool is_index = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (is_index) return std::make_unique<io::SafetensorsReader>(path, io::SafetensorsReader::FromIndex{});
  return std::make_unique<io::SafetensorsReader>(path);
}

}  // namespace wb
