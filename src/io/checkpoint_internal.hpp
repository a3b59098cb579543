// Private to src/io: the writer factories behind create_checkpoint and the helpers both formats share.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace wb::io {

std::unique_ptr<CheckpointWriter> create_hdf5_writer(const std::string& path, std::vector<TensorInfo> tensors);
std::unique_ptr<CheckpointWriter> create_safetensors_writer(const std::string& path,
                                                            std::vector<TensorInfo> tensors,
                                                            const CheckpointWriterOptions& options);

/// `text` with control characters and bytes that are not UTF-8 written as \xNN: names from untrusted files
/// go into messages, and a NUL or an escape sequence there would cut or garble them, a stray byte make them
/// unreadable to Python.
std::string printable(std::string_view text);

/// Whether `text` is well-formed UTF-8 (tensor names must be: they are Python str and JSON strings).
bool is_utf8(std::string_view text);

/// "<what> <source>: tensor <name>: <cause>" — every checkpoint message names the file and the tensor.
std::string tensor_context(std::string_view what, std::string_view source, std::string_view tensor);

/// Byte size of a tensor of this shape and element size; nullopt-like -1 when an extent is negative or
/// the product overflows (sizes come from untrusted files).
std::int64_t checked_nbytes(std::span<const std::int64_t> shape, std::size_t element_size);

/// Throws kInvalidArgument (naming the tensor and the checkpoint) unless `box` fits the tensor.
void check_box(std::string_view source, const TensorInfo& info, const Box& box);

/// Throws kInvalidArgument unless names are unique and non-empty and sizes are representable.
void check_writer_tensors(std::string_view path, const std::vector<TensorInfo>& tensors);

/// A name beside `path` for writing before the final rename: the checkpoint appears whole or not at all.
std::string temporary_path_for(const std::string& path);

/// Throws kSystem naming `path` when a file of `bytes` would exceed the file size limit (ulimit -f) or the
/// free space of its file system: for a writer whose library cannot survive a failed write (libhdf5 1.10
/// crashes at exit after a file close that failed), checked before anything is written. A disk that other
/// writers fill meanwhile still fails the write itself.
void check_room_for(std::string_view what, const std::string& path, std::uint64_t bytes);

/// How a checkpoint file changed since it was opened (`opened`: fstat then): its size or modification time,
/// seen through the open descriptor `fd`, or its path now naming another file; "" when it did not. A job
/// must not read a checkpoint that changes under it: it would mix versions, or fault past a truncation.
std::string file_change(int fd, const std::string& path, const struct stat& opened);

/// The cause in a reader's message for such a change (`change` as file_change says it).
std::string changed_file_text(const std::string& change);

/// What kind of file system object `mode` (st_mode) is, for messages: "a FIFO", "a directory", ...
std::string_view file_kind(unsigned mode);

/// Throws unless `path` names a regular file (after following symbolic links): kNotFound when nothing is
/// there, kInvalidArgument naming the kind otherwise. Opening a FIFO or a device would block or read
/// without end, so readers check before they open.
void require_regular_file(std::string_view what, const std::string& path);

}  // namespace wb::io
