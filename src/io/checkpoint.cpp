// CheckpointReader's shared methods, format dispatch and the helpers both formats use.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "io/checkpoint_internal.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace wb {

namespace fs = std::filesystem;

namespace {

// The lookup index is built lazily inside const methods and readers are shared between threads, so its
// construction (and every read of it) is serialised. Lookups are set-up work, not the update path.
std::mutex& index_mutex() {
  static std::mutex mutex;
  return mutex;
}

bool ends_with_ci(std::string_view text, std::string_view suffix) {
  if (text.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), text.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                    [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b)); });
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

void CheckpointReader::read(std::string_view name, void* destination) const {
  read_box(name, Box::whole(info(name).shape), destination);
}

const TensorInfo* CheckpointReader::find(std::string_view name) const {
  const std::vector<TensorInfo>& all = tensors();
  std::lock_guard<std::mutex> lock(index_mutex());
  if (index_.size() != all.size()) {
    index_.clear();
    index_.reserve(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) index_.emplace(all[i].name, i);
  }
  // The next tensor in list order first, then the last one found again (a loader asks for a tensor's info
  // before reading it): no hash of the name, no probe of a table that misses the cache.
  std::size_t found = next_;  // (with repeated names, index_ is smaller and keeps the first: then no hint)
  const bool hinted = index_.size() == all.size();
  if (!hinted || found >= all.size() || all[found].name != name) {
    if (hinted && found > 0 && found <= all.size() && all[found - 1].name == name) {
      --found;
    } else {
      const auto it = index_.find(name);
      if (it == index_.end()) return nullptr;
      found = it->second;
    }
  }
  next_ = found + 1;
  return &all[found];
}

const TensorInfo& CheckpointReader::info(std::string_view name) const {
  const TensorInfo* found = find(name);
  if (found == nullptr)
    throw Error(ErrorCode::kNotFound, "checkpoint " + source() + ": no tensor named '" + std::string(name) + "'");
  return *found;
}

std::size_t CheckpointReader::total_bytes() const {
  std::size_t total = 0;
  for (const TensorInfo& tensor : tensors()) total += tensor.nbytes();
  return total;
}

std::unique_ptr<CheckpointReader> open_checkpoint(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw Error(ErrorCode::kNotFound, "checkpoint " + path + ": no such file or directory");
  if (!fs::is_directory(status)) io::require_regular_file("checkpoint", path);

  if (fs::is_directory(status)) {
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(index, ec)) return open_safetensors_checkpoint(index.string());
    std::vector<fs::path> candidates;
    for (const fs::directory_entry& entry : fs::directory_iterator(path, ec))
      if (entry.is_regular_file(ec) && ends_with_ci(entry.path().filename().string(), ".safetensors"))
        candidates.push_back(entry.path());
    if (ec) throw Error(ErrorCode::kSystem, "checkpoint " + path + ": cannot list directory: " + ec.message());
    if (candidates.size() == 1) return open_safetensors_checkpoint(candidates.front().string());
    if (candidates.empty())
      throw Error(ErrorCode::kNotFound, "checkpoint directory " + path +
                                            ": holds neither model.safetensors.index.json nor a *.safetensors file");
    std::sort(candidates.begin(), candidates.end());
    throw Error(ErrorCode::kInvalidArgument,
                "checkpoint directory " + path + ": holds " + std::to_string(candidates.size()) +
                    " *.safetensors files (" + candidates[0].filename().string() + ", " +
                    candidates[1].filename().string() +
                    ", ...) but no model.safetensors.index.json saying which tensor is where");
  }

  if (ends_with_ci(path, ".h5") || ends_with_ci(path, ".hdf5")) return open_hdf5_checkpoint(path);
  if (ends_with_ci(path, ".safetensors") || ends_with_ci(path, ".json")) return open_safetensors_checkpoint(path);
  throw Error(ErrorCode::kInvalidArgument,
              "checkpoint " + path +
                  ": cannot tell the format from the name (expected *.h5, *.hdf5, *.safetensors, "
                  "*.safetensors.index.json or a directory)");
}

CheckpointFormat parse_checkpoint_format(std::string_view text) {
  const std::string name = lower(text);
  if (name == "hdf5" || name == "h5") return CheckpointFormat::kHdf5;
  if (name == "safetensors") return CheckpointFormat::kSafetensors;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown checkpoint format '" + std::string(text) + "' (expected hdf5, h5 or safetensors)");
}

std::unique_ptr<CheckpointWriter> create_checkpoint(const std::string& path, CheckpointFormat format,
                                                    std::vector<TensorInfo> tensors,
                                                    const CheckpointWriterOptions& options) {
  io::check_writer_tensors(path, tensors);
  switch (format) {
    case CheckpointFormat::kHdf5:
      if (options.max_shard_bytes != 0)
        throw Error(ErrorCode::kInvalidArgument,
                    "checkpoint " + path + ": max_shard_bytes applies to safetensors only; HDF5 is one file");
      {
        // libhdf5 1.10 crashes at exit after a failed write (its file close fails and leaves a freed file
        // behind): the room is checked first. Metadata measured at 380-430 bytes a tensor; 1 KiB allowed.
        std::uint64_t bytes = std::uint64_t{64} << 10;
        for (const TensorInfo& t : tensors) bytes += static_cast<std::uint64_t>(t.nbytes()) + 1024;
        io::check_room_for("HDF5 checkpoint", path, bytes);
      }
      return io::create_hdf5_writer(path, std::move(tensors));
    case CheckpointFormat::kSafetensors:
      return io::create_safetensors_writer(path, std::move(tensors), options);
  }
  throw Error(ErrorCode::kInvalidArgument, "checkpoint " + path + ": unknown checkpoint format");
}

namespace io {

namespace {

// The length of the well-formed UTF-8 sequence that starts text[at] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when none starts there.
std::size_t utf8_sequence_at(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF) length = 3, low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
  else if (lead >= 0xF0 && lead <= 0xF4) length = 4, low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
  if (length == 0 || at + length > text.size()) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (std::size_t i = at + 2; i < at + length; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return length;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::size_t length = byte >= 0x80 ? utf8_sequence_at(text, i) : (byte >= 0x20 && byte != 0x7f ? 1 : 0);
    if (length > 0) {
      out.append(text.substr(i, length));
      i += length;
      continue;
    }
    const char* hex = "0123456789abcdef";
    out.append("\\x").push_back(hex[byte >> 4]);
    out.push_back(hex[byte & 0xF]);
    ++i;
  }
  return out;
}

bool is_utf8(std::string_view text) {
  for (std::size_t i = 0, length = 0; i < text.size(); i += length)
    if ((length = utf8_sequence_at(text, i)) == 0) return false;
  return true;
}

std::string tensor_context(std::string_view what, std::string_view source, std::string_view tensor) {
  std::string out;
  out.reserve(what.size() + source.size() + tensor.size() + 16);
  out.append(what).append(" ").append(printable(source));
  if (!tensor.empty()) out.append(": tensor ").append(printable(tensor));
  return out;
}

std::int64_t checked_nbytes(std::span<const std::int64_t> shape, std::size_t element_size) {
  std::int64_t total = static_cast<std::int64_t>(element_size);
  for (const std::int64_t extent : shape) {
    if (extent < 0) return -1;
    if (__builtin_mul_overflow(total, extent, &total)) return -1;
  }
  return total;
}

void check_box(std::string_view source, const TensorInfo& info, const Box& box) {
  if (box.offset.size() != box.extent.size() || !box.fits_in(info.shape))
    throw Error(ErrorCode::kInvalidArgument, tensor_context("checkpoint", source, info.name) + ": box " +
                                                 box.to_string() + " does not fit the tensor's shape " +
                                                 shape_to_string(info.shape));
}

void check_writer_tensors(std::string_view path, const std::vector<TensorInfo>& tensors) {
  std::vector<std::string_view> names;
  names.reserve(tensors.size());
  for (const TensorInfo& tensor : tensors) {
    if (tensor.name.empty())
      throw Error(ErrorCode::kInvalidArgument, "checkpoint " + std::string(path) + ": a tensor has an empty name");
    if (checked_nbytes(tensor.shape, dtype_size(tensor.dtype)) < 0)
      throw Error(ErrorCode::kInvalidArgument, tensor_context("checkpoint", path, tensor.name) + ": invalid shape " +
                                                   shape_to_string(tensor.shape));
    names.push_back(tensor.name);
  }
  std::sort(names.begin(), names.end());
  const auto duplicate = std::adjacent_find(names.begin(), names.end());
  if (duplicate != names.end())
    throw Error(ErrorCode::kInvalidArgument,
                tensor_context("checkpoint", path, *duplicate) + ": listed more than once");
}

std::string temporary_path_for(const std::string& path) {
  // pid and a counter keep concurrent writers (threads or processes) of the same path apart.
  static std::atomic<unsigned> counter{0};
  return path + ".partial-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

void check_room_for(std::string_view what, const std::string& path, std::uint64_t bytes) {
  const std::string needs = "it needs up to " + std::to_string(bytes) + " bytes";
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && bytes > limit.rlim_cur)
    throw Error(ErrorCode::kSystem, std::string(what) + " " + path + ": " + std::strerror(EFBIG) + ": " + needs +
                                        ", beyond the file size limit of " + std::to_string(limit.rlim_cur) +
                                        " bytes (ulimit -f); nothing was written");
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  struct statvfs room {};
  if (::statvfs(folder.c_str(), &room) == 0 && static_cast<std::uint64_t>(room.f_bavail) * room.f_frsize < bytes)
    throw Error(ErrorCode::kSystem, std::string(what) + " " + path + ": " + std::strerror(ENOSPC) + ": " + needs + ", and " +
                                        folder.string() + " has " +
                                        std::to_string(static_cast<std::uint64_t>(room.f_bavail) * room.f_frsize) +
                                        " bytes free; nothing was written");
}

std::string file_change(int fd, const std::string& path, const struct stat& opened) {
  struct stat now {};
  if (::fstat(fd, &now) != 0) return std::string("fstat failed: ") + std::strerror(errno);
  if (now.st_size != opened.st_size)
    return "its size went from " + std::to_string(opened.st_size) + " to " + std::to_string(now.st_size) + " bytes";
  if (now.st_mtim.tv_sec != opened.st_mtim.tv_sec || now.st_mtim.tv_nsec != opened.st_mtim.tv_nsec)
    return "it was modified";
  struct stat named {};
  if (::stat(path.c_str(), &named) == 0 && (named.st_ino != opened.st_ino || named.st_dev != opened.st_dev))
    return "its path now names another file (replaced)";
  return {};
}

std::string changed_file_text(const std::string& change) {
  return "the file changed while the job reads it (" + change + "): a checkpoint must stay as it is while a job "
         "reads it; write a new one beside it";
}

std::string_view file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

void require_regular_file(std::string_view what, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    throw Error(error == ENOENT || error == ENOTDIR ? ErrorCode::kNotFound : ErrorCode::kSystem,
                std::string(what) + " " + path + ": " + (error == ENOENT ? "no such file" : std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " " + path + ": is " +
                                                 std::string(file_kind(st.st_mode)) + ", not a regular file");
}

}  // namespace io
}  // namespace wb
