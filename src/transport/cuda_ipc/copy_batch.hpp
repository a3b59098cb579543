// The copies of one cuda_ipc batch, gathered for one batched copy call instead of one cudaMemcpyAsync per
// write (a batch may hold 65,536 writes): each write's source in this rank's registered memory and its
// destination in the peer's memory opened here, writes that continue one another on both sides merged.
// Device-free, so that it is tested without a GPU (tests/unit/test_cuda_ipc_batch.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/transport.hpp"

namespace wb::cuda_ipc {

struct CopyBatch {
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<std::size_t> sizes;
  std::size_t bytes = 0;

  std::size_t size() const { return sizes.size(); }
  void clear() {
    dst.clear(), src.clear(), sizes.clear();
    bytes = 0;
  }
};

/// Appends the copies of `writes` (checked against the region table before): write w copies w.bytes from
/// local(w.local_memory) + w.local_offset to remote(w.remote_memory) + w.remote_offset, where local and
/// remote give a region's base address. Writes of 0 bytes are skipped.
template <class LocalBase, class RemoteBase>
void collect_copies(std::span<const WriteRequest> writes, LocalBase&& local, RemoteBase&& remote, CopyBatch& batch) {
  for (const WriteRequest& w : writes) {
    if (w.bytes == 0) continue;
    const std::uint64_t from = static_cast<std::uint64_t>(local(w.local_memory)) + w.local_offset;
    const std::uint64_t to = static_cast<std::uint64_t>(remote(w.remote_memory)) + w.remote_offset;
    if (!batch.sizes.empty()) {
      const std::size_t last = batch.sizes.size() - 1;
      if (reinterpret_cast<std::uint64_t>(batch.src[last]) + batch.sizes[last] == from &&
          reinterpret_cast<std::uint64_t>(batch.dst[last]) + batch.sizes[last] == to) {
        batch.sizes[last] += static_cast<std::size_t>(w.bytes);
        batch.bytes += static_cast<std::size_t>(w.bytes);
        continue;
      }
    }
    batch.dst.push_back(reinterpret_cast<void*>(to));
    batch.src.push_back(reinterpret_cast<const void*>(from));
    batch.sizes.push_back(static_cast<std::size_t>(w.bytes));
    batch.bytes += static_cast<std::size_t>(w.bytes);
  }
}

}  // namespace wb::cuda_ipc
