// register_memory and import_memory, honouring the provider's memory-registration mode:
//   FI_MR_LOCAL      every write passes the local region's descriptor (fi_mr_desc)
//   FI_MR_VIRT_ADDR  writes address the target by virtual address; otherwise by offset in the region
//   FI_MR_PROV_KEY   the provider picks the key; otherwise this rank requests a domain-unique one
//   FI_MR_ALLOCATED  the memory must be allocated: the executor registers only its own allocations
//   FI_MR_ENDPOINT   a region is bound to the endpoint and enabled before use
//   FI_MR_RAW        keys longer than 64 bits travel raw and are mapped by the importer (fi_mr_map_raw)
#include <rdma/fi_errno.h>

#include "core/checks.hpp"
#include "transport/libfabric/fabric_internal.hpp"

namespace wb::fabric {

MemoryRegistration FabricTransport::register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) {
  if (address == nullptr || bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, "libfabric register_memory on rank " + std::to_string(rank_) + ": empty region (" +
                                                 std::to_string(bytes) + " bytes)");
  if (memory == MemoryKind::kCuda && !device_memory_)
    throw Error(ErrorCode::kUnsupported, "libfabric provider '" + provider_ + "' cannot register CUDA memory (no FI_HMEM) on rank " +
                                             std::to_string(rank_) + ": the executor stages through pinned host buffers");
  iovec iov{address, bytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  // Source of this rank's writes and target of its peers'.
  attr.access = FI_WRITE | FI_REMOTE_WRITE;
  attr.requested_key = next_requested_key_++;
  attr.iface = memory == MemoryKind::kCuda ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
  if (memory == MemoryKind::kCuda) attr.device.cuda = device;
  fid_mr* mr = nullptr;
  WB_CHECK_FI(fi_mr_regattr(domain_.get(), &attr, 0, &mr));
  Local region;
  region.address = static_cast<std::byte*>(address);
  region.bytes = bytes;
  region.mr.reset(mr);
  if (endpoint_bound_mr_) {
    WB_CHECK_FI(fi_mr_bind(mr, &ep_->fid, 0));
    WB_CHECK_FI(fi_mr_enable(mr));
  }
  region.desc = fi_mr_desc(mr);

  MemoryKey key;
  key.rank = rank_;
  key.address = reinterpret_cast<std::uint64_t>(address);
  key.bytes = bytes;
  if (raw_keys_) {
    std::size_t key_size = 0;
    std::uint64_t base = 0;
    const int rc = fi_mr_raw_attr(mr, &base, nullptr, &key_size, 0);
    if (rc != -FI_ETOOSMALL && rc != 0) WB_CHECK_FI(rc);
    key.raw_key.resize(key_size);
    WB_CHECK_FI(fi_mr_raw_attr(mr, &base, reinterpret_cast<std::uint8_t*>(key.raw_key.data()), &key_size, 0));
    key.raw_key.resize(key_size);
    key.raw_base = base;
  } else {
    key.key = fi_mr_key(mr);
    if (key.key == FI_KEY_NOTAVAIL)
      throw Error(ErrorCode::kLibfabric, "fi_mr_key on rank " + std::to_string(rank_) + " (provider " + provider_ +
                                             "): no key available for a " + std::to_string(bytes) + "-byte region");
  }
  const std::uint32_t id = regions_.add_local(bytes);  // the same numbering as local_
  local_.push_back(std::move(region));
  return {id, encode_memory_key(key)};
}

std::uint32_t FabricTransport::import_memory(int peer, std::span<const std::byte> remote_key) {
  const MemoryKey key = decode_memory_key(remote_key, rank_, peer);
  Remote region;
  region.peer = peer;
  region.bytes = key.bytes;
  region.target_base = virtual_addresses_ ? key.address : 0;
  if (raw_keys_) {
    if (key.raw_key.empty())
      throw Error(ErrorCode::kInvalidArgument, "libfabric memory key from rank " + std::to_string(peer) +
                                                   " has no raw key, but provider '" + provider_ + "' uses raw keys on rank " +
                                                   std::to_string(rank_));
    std::uint64_t mapped = 0;
    std::vector<std::byte> raw = key.raw_key;  // fi_mr_map_raw takes a non-const pointer
    WB_CHECK_FI(fi_mr_map_raw(domain_.get(), key.raw_base, reinterpret_cast<std::uint8_t*>(raw.data()), raw.size(),
                              &mapped, 0));
    region.key = mapped;
    region.mapped_raw = true;
  } else {
    region.key = key.key;
  }
  const std::uint32_t id = regions_.add_remote(peer, key.bytes);  // the same numbering as remote_
  remote_.push_back(region);
  return id;
}

}  // namespace wb::fabric
