// libibverbs through dlopen (see ibverbs_library.hpp).
#include "transport/ibverbs/ibverbs_library.hpp"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/log.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {
namespace {

std::mutex loaded_mutex;
// By path; never unloaded, and never destroyed: a transport that outlives static destruction still has it.
auto& loaded = *new std::map<std::string, std::unique_ptr<VerbsLibrary>>;
std::string fork_text;

/// The symbol at the version the header's declarations match; a library built without symbol versions
/// has only the plain name.
void* resolve(void* handle, const char* name, const char* version) {
  void* p = ::dlvsym(handle, name, version);
  if (p == nullptr) p = ::dlsym(handle, name);
  return p;
}

template <class Fn>
void bind(void* handle, Fn& slot, const char* name, const char* version) {
  slot = reinterpret_cast<Fn>(resolve(handle, name, version));
}

std::string fork_init_once(const VerbsLibrary& lib, bool fork_safe) {
  if (!fork_safe) return "ibv_fork_init not called (WB_IB_FORK_SAFE=0): a child process must not touch registered memory";
  if (lib.is_fork_initialized != nullptr && lib.is_fork_initialized() == IBV_FORK_UNNEEDED)
    return "fork-safe without ibv_fork_init (the kernel copies registered pages on fork)";
  const int rc = lib.fork_init();
  if (rc != 0) {
    // EINVAL: another library in this process created verbs objects first (MPI's own RDMA layer).
    const std::string text = std::string("ibv_fork_init failed: ") + std::strerror(rc > 0 ? rc : errno) +
                             " (verbs objects were created before WeightBridge's, by MPI?): a process that forks may "
                             "corrupt registered memory; set RDMAV_FORK_SAFE=1 in the job's environment";
    WB_LOG(kWarn) << "ibverbs: " << text;
    return text;
  }
  return "ibv_fork_init done: registered memory is not shared with forked children";
}

}  // namespace

int VerbsLibrary::query_port(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) const {
  // What ibv_query_port does inline, without its reference to the exported symbol.
  verbs_context* extended = verbs_get_ctx_op(context, query_port);
  if (extended == nullptr) {
    std::memset(attr, 0, sizeof *attr);
    return query_port_compat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
  return extended->query_port(context, port, attr, sizeof *attr);
}

const VerbsLibrary& load_verbs_library(const std::string& path, bool fork_safe) {
  const std::lock_guard<std::mutex> lock(loaded_mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;

  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    throw Error(ErrorCode::kUnsupported, "no RDMA device: cannot load " + path + " (" +
                                             (error != nullptr ? error : "unknown error") +
                                             "): rdma-core's libibverbs is not installed here (WB_IB_LIBRARY names the file)");
  }
  auto lib = std::make_unique<VerbsLibrary>();
  lib->path = path;
  constexpr const char* v11 = "IBVERBS_1.1";
  bind(handle, lib->get_device_list, "ibv_get_device_list", v11);
  bind(handle, lib->free_device_list, "ibv_free_device_list", v11);
  bind(handle, lib->get_device_name, "ibv_get_device_name", v11);
  bind(handle, lib->open_device, "ibv_open_device", v11);
  bind(handle, lib->close_device, "ibv_close_device", v11);
  bind(handle, lib->query_device, "ibv_query_device", v11);
  bind(handle, lib->query_port_compat, "ibv_query_port", v11);
  bind(handle, lib->query_gid, "ibv_query_gid", v11);
  bind(handle, lib->query_pkey, "ibv_query_pkey", v11);
  bind(handle, lib->alloc_pd, "ibv_alloc_pd", v11);
  bind(handle, lib->dealloc_pd, "ibv_dealloc_pd", v11);
  bind(handle, lib->reg_mr, "ibv_reg_mr", v11);
  bind(handle, lib->dereg_mr, "ibv_dereg_mr", v11);
  bind(handle, lib->create_cq, "ibv_create_cq", v11);
  bind(handle, lib->destroy_cq, "ibv_destroy_cq", v11);
  bind(handle, lib->create_srq, "ibv_create_srq", v11);
  bind(handle, lib->destroy_srq, "ibv_destroy_srq", v11);
  bind(handle, lib->create_qp, "ibv_create_qp", v11);
  bind(handle, lib->modify_qp, "ibv_modify_qp", v11);
  bind(handle, lib->destroy_qp, "ibv_destroy_qp", v11);
  bind(handle, lib->get_async_event, "ibv_get_async_event", v11);
  bind(handle, lib->ack_async_event, "ibv_ack_async_event", v11);
  bind(handle, lib->fork_init, "ibv_fork_init", v11);
  const std::pair<const void*, const char*> required[] = {
      {reinterpret_cast<const void*>(lib->get_device_list), "ibv_get_device_list"},
      {reinterpret_cast<const void*>(lib->free_device_list), "ibv_free_device_list"},
      {reinterpret_cast<const void*>(lib->get_device_name), "ibv_get_device_name"},
      {reinterpret_cast<const void*>(lib->open_device), "ibv_open_device"},
      {reinterpret_cast<const void*>(lib->close_device), "ibv_close_device"},
      {reinterpret_cast<const void*>(lib->query_device), "ibv_query_device"},
      {reinterpret_cast<const void*>(lib->query_port_compat), "ibv_query_port"},
      {reinterpret_cast<const void*>(lib->query_gid), "ibv_query_gid"},
      {reinterpret_cast<const void*>(lib->query_pkey), "ibv_query_pkey"},
      {reinterpret_cast<const void*>(lib->alloc_pd), "ibv_alloc_pd"},
      {reinterpret_cast<const void*>(lib->dealloc_pd), "ibv_dealloc_pd"},
      {reinterpret_cast<const void*>(lib->reg_mr), "ibv_reg_mr"},
      {reinterpret_cast<const void*>(lib->dereg_mr), "ibv_dereg_mr"},
      {reinterpret_cast<const void*>(lib->create_cq), "ibv_create_cq"},
      {reinterpret_cast<const void*>(lib->destroy_cq), "ibv_destroy_cq"},
      {reinterpret_cast<const void*>(lib->create_srq), "ibv_create_srq"},
      {reinterpret_cast<const void*>(lib->destroy_srq), "ibv_destroy_srq"},
      {reinterpret_cast<const void*>(lib->create_qp), "ibv_create_qp"},
      {reinterpret_cast<const void*>(lib->modify_qp), "ibv_modify_qp"},
      {reinterpret_cast<const void*>(lib->destroy_qp), "ibv_destroy_qp"},
      {reinterpret_cast<const void*>(lib->get_async_event), "ibv_get_async_event"},
      {reinterpret_cast<const void*>(lib->ack_async_event), "ibv_ack_async_event"},
      {reinterpret_cast<const void*>(lib->fork_init), "ibv_fork_init"},
  };
  for (const auto& [fn, name] : required) {
    if (fn == nullptr) {
      ::dlclose(handle);
      throw Error(ErrorCode::kUnsupported, "no RDMA device: " + path + " has no " + name +
                                               ": it is not rdma-core's libibverbs, or one too old (rdma-core 13 or "
                                               "later is needed)");
    }
  }
  bind(handle, lib->reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8");
  bind(handle, lib->query_gid_ex, "_ibv_query_gid_ex", "IBVERBS_1.11");
  bind(handle, lib->query_gid_table, "_ibv_query_gid_table", "IBVERBS_1.11");
  bind(handle, lib->reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  bind(handle, lib->is_fork_initialized, "ibv_is_fork_initialized", "IBVERBS_1.13");
  const std::pair<const void*, const char*> optional[] = {
      {reinterpret_cast<const void*>(lib->reg_mr_iova2), "ibv_reg_mr_iova2 (relaxed ordering)"},
      {reinterpret_cast<const void*>(lib->query_gid_table), "ibv_query_gid_table (GID types are read from sysfs)"},
      {reinterpret_cast<const void*>(lib->reg_dmabuf_mr), "ibv_reg_dmabuf_mr (CUDA memory through nvidia-peermem only)"},
      {reinterpret_cast<const void*>(lib->is_fork_initialized), "ibv_is_fork_initialized"},
  };
  for (const auto& [fn, name] : optional)
    if (fn == nullptr) lib->missing_optional += (lib->missing_optional.empty() ? "" : ", ") + std::string(name);

  // Before the first device list: ibv_fork_init must precede every verbs object of the process.
  if (fork_text.empty()) fork_text = fork_init_once(*lib, fork_safe);
  WB_LOG(kDebug) << "ibverbs: loaded " << path << "; " << fork_text
                 << (lib->missing_optional.empty() ? std::string() : "; this rdma-core lacks " + lib->missing_optional);
  const VerbsLibrary& result = *lib;
  loaded.emplace(path, std::move(lib));
  return result;
}

std::string fork_protection() {
  const std::lock_guard<std::mutex> lock(loaded_mutex);
  return fork_text;
}

}  // namespace wb::ibv
