// Transport names, the machine identity, the choice of a transport for a pair of ranks, and the factory.
#include "transport/transport.hpp"

#include <unistd.h>

#include <atomic>
#include <climits>
#include <fstream>
#include <mutex>
#include <string>

#include "transport/cma/cma_transport.hpp"
#include "transport/ibverbs/ibverbs_transport.hpp"
#ifdef WB_HAVE_LIBFABRIC
#include "transport/libfabric/libfabric_transport.hpp"
#endif
#include "core/log.hpp"
#include "core/settings.hpp"
#ifdef WB_HAVE_CUDA
#include "transport/cuda_ipc/cuda_ipc_transport.hpp"
#endif

namespace wb {
namespace {

Setting<std::string> transport_setting(
    "transport", "auto",
    "Transport of every pair of ranks: auto (cma for host memory and cuda_ipc for CUDA memory on one "
    "machine; between machines ibverbs where an RDMA device is present, else libfabric), ibverbs, libfabric, "
    "cma or cuda_ipc.");
Setting<std::string> machine_id_setting(
    "machine_id", "",
    "This machine's identity: ranks with equal ids share memory (cma, cuda_ipc). Empty: the host name and "
    "boot id. Setting it splits one host into logical machines (tests).");

std::string trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string detected_machine_id() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  boot_id = trim(boot_id);
  if (boot_id.empty()) {
    WB_LOG(kWarn) << "cannot read /proc/sys/kernel/random/boot_id: machine id is the host name alone ('" << host << "')";
  }
  return boot_id.empty() ? std::string(host) : std::string(host) + ":" + boot_id;
}

}  // namespace

const char* transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kIbverbs: return "ibverbs";
    case TransportKind::kCma: return "cma";
    case TransportKind::kCudaIpc: return "cuda_ipc";
    case TransportKind::kLibfabric: return "libfabric";
  }
  return "unknown";
}

TransportKind parse_transport_kind(std::string_view name) {
  for (TransportKind kind : {TransportKind::kIbverbs, TransportKind::kCma, TransportKind::kCudaIpc, TransportKind::kLibfabric})
    if (name == transport_name(kind)) return kind;
  throw Error(ErrorCode::kInvalidArgument,
              "transport '" + std::string(name) + "' is not one of ibverbs, libfabric, cma, cuda_ipc");
}

std::string machine_id() {
  if (const std::string& forced = *machine_id_setting; !forced.empty()) return forced;
  static const std::string detected = detected_machine_id();
  return detected;
}

TransportKind network_transport_kind() {
  static const TransportKind kind = [] {
    std::string why;
    if (rdma_device_present(why)) return TransportKind::kIbverbs;
#ifdef WB_HAVE_LIBFABRIC
    WB_LOG(kInfo) << "no RDMA device for ibverbs (" << why << "): libfabric carries the writes between machines";
    return TransportKind::kLibfabric;
#else
    return TransportKind::kIbverbs;  // built without libfabric: creating ibverbs reports why it cannot run
#endif
  }();
  return kind;
}

TransportKind choose_transport(bool same_machine, MemoryKind memory, std::string_view forced) {
  const std::string setting = forced.empty() ? *transport_setting : std::string(forced);
  const std::string source = forced.empty() ? "WB_TRANSPORT=" + setting : "the adapter's transport option " + setting;
  TransportKind kind;
  if (setting == "auto" || setting.empty()) {
    kind = !same_machine ? network_transport_kind()
                         : (memory == MemoryKind::kCuda ? TransportKind::kCudaIpc : TransportKind::kCma);
  } else {
    try {
      kind = parse_transport_kind(setting);
    } catch (const Error&) {
      throw Error(ErrorCode::kInvalidArgument, source + " is not one of auto, ibverbs, libfabric, cma, cuda_ipc");
    }
  }
  static std::atomic<unsigned> logged{0};
  const unsigned bit = 1u << static_cast<unsigned>(kind);
  if ((logged.fetch_or(bit, std::memory_order_relaxed) & bit) == 0) {
    WB_LOG(kInfo) << "transport " << transport_name(kind) << " for "
                  << (memory == MemoryKind::kCuda ? "CUDA" : "host") << " memory "
                  << (same_machine ? "on this machine" : "on another machine") << " ("
                  << (setting == "auto" || setting.empty() ? "chosen automatically" : source) << ")";
  }
  return kind;
}

std::unique_ptr<Transport> make_transport(TransportKind kind, int rank) {
  if (rank < 0) throw Error(ErrorCode::kInvalidArgument, "make_transport: rank " + std::to_string(rank));
  switch (kind) {
    case TransportKind::kIbverbs: return make_ibverbs_transport(rank);
    case TransportKind::kCma: return make_cma_transport(rank);
    case TransportKind::kLibfabric:
#ifdef WB_HAVE_LIBFABRIC
      return make_libfabric_transport(rank);
#else
      throw Error(ErrorCode::kUnsupported, "the libfabric transport is not available: built without libfabric "
                                           "(install libfabric-dev and reconfigure)");
#endif
    case TransportKind::kCudaIpc:
#ifdef WB_HAVE_CUDA
      return make_cuda_ipc_transport(rank);
#else
      throw Error(ErrorCode::kUnsupported, "the cuda_ipc transport is not available: built without CUDA");
#endif
  }
  throw Error(ErrorCode::kInvalidArgument, "make_transport: unknown transport kind " +
                                               std::to_string(static_cast<int>(kind)));
}

}  // namespace wb
