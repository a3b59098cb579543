// Private: libibverbs, loaded with dlopen when the ibverbs transport is first made, never linked. A host
// without rdma-core (or with an old one) loads WeightBridge and runs every other transport; the ibverbs
// transport then says why it cannot run. Functions newer than rdma-core 17 are optional and the
// transport falls back where one is missing (GID types from sysfs, no relaxed ordering, no dma-buf).
//
// Only the types and the inline helpers of <infiniband/verbs.h> that go through a context's function
// table (ibv_post_send, ibv_poll_cq, ibv_post_srq_recv) may be used directly in this folder: every
// exported libibverbs function goes through this table. The test install.no_ibverbs_link checks that
// the library has no undefined ibv_ symbol and no libibverbs in its NEEDED entries.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::ibv {

struct VerbsLibrary {
  std::string path;  // as given to dlopen

  // IBVERBS_1.1 (rdma-core 13 and later): required.
  ibv_device** (*get_device_list)(int* count) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*query_port_compat)(ibv_context* context, std::uint8_t port, _compat_ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid) = nullptr;
  int (*query_pkey)(ibv_context* context, std::uint8_t port, int index, __be16* pkey) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* address, std::size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  ibv_srq* (*create_srq)(ibv_pd* pd, ibv_srq_init_attr* attr) = nullptr;
  int (*destroy_srq)(ibv_srq* srq) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*get_async_event)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ack_async_event)(ibv_async_event* event) = nullptr;
  int (*fork_init)() = nullptr;

  // Newer: nullptr where the library predates them.
  ibv_mr* (*reg_mr_iova2)(ibv_pd* pd, void* address, std::size_t length, std::uint64_t iova,
                          unsigned int access) = nullptr;  // IBVERBS_1.8, rdma-core 28
  int (*query_gid_ex)(ibv_context* context, std::uint32_t port, std::uint32_t index, ibv_gid_entry* entry,
                      std::uint32_t flags, std::size_t entry_size) = nullptr;  // IBVERBS_1.11, rdma-core 32
  ssize_t (*query_gid_table)(ibv_context* context, ibv_gid_entry* entries, std::size_t max_entries, std::uint32_t flags,
                             std::size_t entry_size) = nullptr;  // IBVERBS_1.11
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd,
                           int access) = nullptr;  // IBVERBS_1.12, rdma-core 34
  ibv_fork_status (*is_fork_initialized)() = nullptr;  // IBVERBS_1.13, rdma-core 35

  /// ibv_query_port: the provider's extended entry where it has one (it fills the port flags), else the
  /// library's compatible one (the flags then read 0).
  int query_port(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) const;
  /// The newer functions this library lacks, for the log ("" when none).
  std::string missing_optional;
};

/// The library at `path`, loaded once per path and process and kept loaded (contexts and the providers
/// libibverbs loads refer into it). The first load in a process calls ibv_fork_init when `fork_safe`,
/// before any other verbs call, and logs what it did. Throws wb::Error(kUnsupported) naming the path with
/// dlerror's text, or the first required function the library lacks.
const VerbsLibrary& load_verbs_library(const std::string& path, bool fork_safe);

/// The outcome of ibv_fork_init in this process, for messages ("" before any load).
std::string fork_protection();

}  // namespace wb::ibv

// Set-up checks of calls through the table, naming the verbs function as a user knows it (the checks.hpp
// macros would name the table's member): "ibv_open_device(mlx5_0) failed: <errno text> (file:line, rank)".
/// A call returning a pointer, NULL with errno on failure.
#define WB_IBV_CHECK_PTR(what, call)                                                                       \
  ([&]() {                                                                                                 \
    auto* wb_ptr_ = (call);                                                                                \
    if (wb_ptr_ == nullptr)                                                                                \
      throw ::wb::Error(::wb::make_call_error(::wb::ErrorCode::kIbverbs, what, std::strerror(errno), __FILE__, __LINE__)); \
    return wb_ptr_;                                                                                        \
  }())
/// A call returning 0, or an errno value (or -1 with errno), on failure.
#define WB_IBV_CHECK(what, call)                                                                           \
  do {                                                                                                     \
    const int wb_rc_ = (call);                                                                             \
    if (wb_rc_ != 0)                                                                                       \
      throw ::wb::Error(::wb::make_call_error(::wb::ErrorCode::kIbverbs, what,                           \
                                              std::strerror(wb_rc_ > 0 ? wb_rc_ : errno), __FILE__, __LINE__)); \
  } while (0)
