// Checkpoints: the canonical full model, named tensors in Hugging Face naming and shapes.
//
// Readers give the tensor list and read one tensor, or one box of it, without loading the rest.
// Formats (README, "Checkpoint files"): HDF5 (one dataset per tensor at the root; the dtype from the
// dataset's own type, and for bf16, f16 and fp8 bits in integers of the same width a string attribute
// `dtype` naming the format) and safetensors (single file, or the multi-file form with
// model.safetensors.index.json, shards inside its directory), read through mmap. Tensors may differ in
// dtype one by one. Only regular files are opened; names defined twice are refused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "weightbridge/dtype.hpp"
#include "weightbridge/tensor.hpp"

namespace wb {

/// Name, dtype and shape of one checkpoint tensor.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kBF16;
  Shape shape;

  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool operator==(const TensorInfo&) const = default;
};

class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;

  /// Every tensor of the checkpoint, in a stable order (the file's order).
  virtual const std::vector<TensorInfo>& tensors() const = 0;

  /// Reads `box` of tensor `name` into `destination`, contiguous and row-major in the box's extent.
  /// Throws wb::Error naming the file, the tensor and the cause (unknown name, box outside the tensor,
  /// truncated or corrupt data).
  virtual void read_box(std::string_view name, const Box& box, void* destination) const = 0;

  /// Where the data comes from, for messages ("/data/ckpt.h5", "probe").
  virtual std::string source() const = 0;

  /// Reads the whole tensor.
  void read(std::string_view name, void* destination) const;
  /// nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  /// Throws kNotFound naming the tensor and the checkpoint when absent.
  const TensorInfo& info(std::string_view name) const;
  /// Sum of nbytes() over all tensors.
  std::size_t total_bytes() const;

 private:
  mutable std::unordered_map<std::string_view, std::size_t> index_;  // built on first lookup
  mutable std::size_t next_ = 0;  // the tensor after the last one found: loaders mostly read in list order
};

enum class CheckpointFormat { kHdf5, kSafetensors };

/// Picks the format from the path: *.h5 / *.hdf5 → HDF5; *.safetensors, *.safetensors.index.json or a
/// directory holding model.safetensors.index.json or one *.safetensors file → safetensors.
std::unique_ptr<CheckpointReader> open_checkpoint(const std::string& path);

std::unique_ptr<CheckpointReader> open_hdf5_checkpoint(const std::string& path);
/// `path` is a .safetensors file or a model.safetensors.index.json (whose shards sit beside it).
std::unique_ptr<CheckpointReader> open_safetensors_checkpoint(const std::string& path);

struct CheckpointWriterOptions {
  /// safetensors only: when > 0, tensors are spread over shards of at most this many bytes and a
  /// model.safetensors.index.json is written; `path` then names the index file.
  std::size_t max_shard_bytes = 0;
};

/// Writes a checkpoint whose tensor list is fixed at creation. Each tensor is written exactly once, in
/// any order; finish() checks that all were written and completes the file(s). A writer destroyed
/// without finish() removes what it wrote, so no partial checkpoint is left behind.
class CheckpointWriter {
 public:
  virtual ~CheckpointWriter() = default;
  /// `data` is contiguous row-major, the tensor's nbytes() bytes. Throws on an unknown or repeated name.
  virtual void write(std::string_view name, const void* data) = 0;
  virtual void finish() = 0;
};

std::unique_ptr<CheckpointWriter> create_checkpoint(const std::string& path, CheckpointFormat format,
                                                    std::vector<TensorInfo> tensors,
                                                    const CheckpointWriterOptions& options = {});

/// Parses "hdf5"/"h5" or "safetensors"; throws otherwise.
CheckpointFormat parse_checkpoint_format(std::string_view text);

}  // namespace wb
