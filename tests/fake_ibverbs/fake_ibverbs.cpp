// A fake libibverbs for the ibverbs transport's device-free tests: the transport loads it with dlopen in
// place of rdma-core's (WB_IB_LIBRARY), and it behaves as a loopback fabric inside one process. Devices
// and ports come from the test (wbfake_add_device, wbfake_add_port, wbfake_add_gid); two transports of one
// process connect their RC queue pairs to each other, and a work request moves bytes with memcpy and
// completes as hardware does: signalled writes only when they succeed, every work request (signalled or
// not) once its queue pair is in the error state, receives consumed by each WRITE_WITH_IMM (none posted:
// RNR, retried on the next call), completion queues that overrun (an IBV_EVENT_CQ_ERR) when the transport
// gives them more than they hold, send queues that refuse more than max_send_wr outstanding. Tests inject
// failures (wbfake_fail_write, wbfake_event) and read what the transport asked for (wbfake_qp_info,
// wbfake_log, wbfake_mr_access, wbfake_opcodes).
//
// Variants (compile definitions): WB_FAKE_OLD leaves out the functions newer than rdma-core 17
// (ibv_reg_mr_iova2, _ibv_query_gid_table, _ibv_query_gid_ex, ibv_reg_dmabuf_mr, ibv_is_fork_initialized);
// WB_FAKE_NO_CREATE_QP leaves out ibv_create_qp, as a library the transport must refuse.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#undef ibv_reg_mr
#undef ibv_query_port
#undef ibv_reg_mr_iova

#define WB_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct FakePort {
  int state = IBV_PORT_ACTIVE;
  int link_layer = IBV_LINK_LAYER_INFINIBAND;
  std::uint16_t lid = 1;
  std::uint8_t flags = 0;
  std::uint32_t max_msg = 1u << 30;
  std::map<int, std::pair<int, std::array<std::uint8_t, 16>>> gids;  // index -> (type, gid)
  std::vector<std::uint16_t> pkeys{0xffff};
};

struct FakeContext;

struct FakeDevice {
  ibv_device device{};
  bool fail_open = false;
  std::uint32_t max_srq_wr = 32767;
  std::uint32_t max_cqe = 4194303;
  std::vector<FakePort> ports;
};

struct FakeCq;
struct FakeQp;

struct FakeContext {
  verbs_context v{};  // first: verbs_get_ctx(&v.context) is this object
  FakeDevice* device = nullptr;
  int pipe_fds[2] = {-1, -1};
  std::deque<ibv_async_event> events;
};

struct Entry {
  ibv_wc wc{};
  FakeQp* qp = nullptr;       // a send completion retires its queue pair's work requests up to `sequence`
  std::uint64_t sequence = 0;
};

struct FakeCq {
  ibv_cq cq{};
  FakeContext* context = nullptr;
  std::size_t capacity = 0;
  std::deque<Entry> entries;
};

struct FakeSrq {
  ibv_srq srq{};
  std::uint32_t max_wr = 0;
  std::deque<std::uint64_t> receives;
};

struct FakeMr {
  ibv_mr mr{};
  int access = 0;
};

struct PendingWr {
  ibv_send_wr wr{};
  ibv_sge sge{};
  std::uint64_t sequence = 0;
};

struct FakeQp {
  ibv_qp qp{};
  FakeContext* context = nullptr;
  FakeCq* send_cq = nullptr;
  FakeCq* recv_cq = nullptr;
  FakeSrq* srq = nullptr;
  std::uint32_t max_send_wr = 0;
  int state = IBV_QPS_RESET;
  std::uint16_t pkey_index = 0;
  std::uint8_t port = 0;
  std::uint32_t dest_qp = 0;
  ibv_ah_attr ah{};
  std::deque<PendingWr> pending;
  std::uint64_t posted = 0;   // work requests ever posted
  std::uint64_t retired = 0;  // of those, freed by a polled completion
  int fail_after = -1;        // the fail_after-th next executed work request fails (-1: none)
  int fail_status = IBV_WC_REM_ACCESS_ERR;
  std::string opcodes;
};

std::recursive_mutex mutex;
std::vector<std::unique_ptr<FakeDevice>> devices;
std::vector<ibv_device*> device_list;  // what ibv_get_device_list hands out (NULL-terminated)
std::map<std::uint32_t, FakeQp*> qps;  // by qp_num
std::map<std::uint32_t, FakeMr*> mrs;  // by key (lkey == rkey)
std::vector<FakeContext*> contexts;
std::vector<FakeCq*> cqs;
std::uint32_t next_key = 0x1000;
std::uint64_t overruns = 0;
std::string call_log;
bool fork_initialized = false;
bool objects_made = false;

void log_call(const std::string& what) {
  if (!call_log.empty()) call_log += ',';
  call_log += what;
}

FakeContext* fake(ibv_context* context) { return reinterpret_cast<FakeContext*>(verbs_get_ctx(context)); }

void raise_event(FakeContext* context, ibv_async_event event) {
  context->events.push_back(event);
  const char byte = 1;
  (void)!::write(context->pipe_fds[1], &byte, 1);
}

void push(FakeCq* cq, const Entry& entry) {
  if (cq->entries.size() >= cq->capacity) {
    ++overruns;
    ibv_async_event event{};
    event.event_type = IBV_EVENT_CQ_ERR;
    event.element.cq = &cq->cq;
    raise_event(cq->context, event);
    return;
  }
  cq->entries.push_back(entry);
}

void complete(FakeQp* qp, const PendingWr& p, int status, bool force) {
  if (!force && (p.wr.send_flags & IBV_SEND_SIGNALED) == 0) return;
  Entry e;
  e.wc.wr_id = p.wr.wr_id;
  e.wc.status = static_cast<ibv_wc_status>(status);
  e.wc.opcode = IBV_WC_RDMA_WRITE;
  e.wc.qp_num = qp->qp.qp_num;
  e.qp = qp;
  e.sequence = p.sequence;
  push(qp->send_cq, e);
}

FakeMr* find_mr(std::uint32_t key, std::uint64_t address, std::uint64_t length) {
  const auto it = mrs.find(key);
  if (it == mrs.end()) return nullptr;
  const ibv_mr& mr = it->second->mr;
  const auto begin = reinterpret_cast<std::uint64_t>(mr.addr);
  if (address < begin || address + length > begin + mr.length) return nullptr;
  return it->second;
}

void to_error(FakeQp* qp) { qp->state = IBV_QPS_ERR; }

/// Runs the queue pair's pending work requests until one must wait for a receive (RNR).
void progress(FakeQp* qp) {
  while (!qp->pending.empty()) {
    PendingWr& p = qp->pending.front();
    if (qp->state == IBV_QPS_ERR) {
      complete(qp, p, IBV_WC_WR_FLUSH_ERR, true);
      qp->pending.pop_front();
      continue;
    }
    if (qp->fail_after == 0) {
      qp->fail_after = -1;
      complete(qp, p, qp->fail_status, true);
      qp->pending.pop_front();
      to_error(qp);
      continue;
    }
    const bool with_imm = p.wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    const std::uint64_t length = p.wr.num_sge > 0 ? p.sge.length : 0;
    if (length > 0 && find_mr(p.sge.lkey, p.sge.addr, length) == nullptr) {
      complete(qp, p, IBV_WC_LOC_PROT_ERR, true);
      qp->pending.pop_front();
      to_error(qp);
      continue;
    }
    const auto dest = qps.find(qp->dest_qp);
    if (dest == qps.end() || (dest->second->state != IBV_QPS_RTR && dest->second->state != IBV_QPS_RTS)) {
      complete(qp, p, IBV_WC_RETRY_EXC_ERR, true);
      qp->pending.pop_front();
      to_error(qp);
      continue;
    }
    FakeMr* target = nullptr;
    if (length > 0) {
      target = find_mr(p.wr.wr.rdma.rkey, p.wr.wr.rdma.remote_addr, length);
      if (target == nullptr || (target->access & IBV_ACCESS_REMOTE_WRITE) == 0) {
        complete(qp, p, IBV_WC_REM_ACCESS_ERR, true);
        qp->pending.pop_front();
        to_error(qp);
        continue;
      }
    }
    FakeQp* to = dest->second;
    if (with_imm && (to->srq == nullptr || to->srq->receives.empty())) return;  // RNR: retried later
    if (qp->fail_after > 0) --qp->fail_after;
    if (length > 0)
      std::memcpy(reinterpret_cast<void*>(p.wr.wr.rdma.remote_addr), reinterpret_cast<const void*>(p.sge.addr), length);
    qp->opcodes += qp->opcodes.empty() ? "" : " ";
    qp->opcodes += with_imm ? (length == 0 ? "I0" : "I") : "W";
    if (with_imm) {
      Entry e;
      e.wc.wr_id = to->srq->receives.front();
      to->srq->receives.pop_front();
      e.wc.status = IBV_WC_SUCCESS;
      e.wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
      e.wc.wc_flags = IBV_WC_WITH_IMM;
      e.wc.imm_data = p.wr.imm_data;
      e.wc.byte_len = static_cast<std::uint32_t>(length);
      e.wc.qp_num = to->qp.qp_num;
      push(to->recv_cq, e);
    }
    complete(qp, p, IBV_WC_SUCCESS, false);
    qp->pending.pop_front();
  }
}

void progress_all() {
  for (auto& [qpn, qp] : qps) progress(qp);
}

int fake_poll_cq(ibv_cq* cq_base, int num_entries, ibv_wc* wc) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  progress_all();
  FakeCq* cq = reinterpret_cast<FakeCq*>(cq_base);
  int n = 0;
  while (n < num_entries && !cq->entries.empty()) {
    const Entry& e = cq->entries.front();
    wc[n++] = e.wc;
    if (e.qp != nullptr && qps.count(e.wc.qp_num) != 0) e.qp->retired = std::max(e.qp->retired, e.sequence + 1);
    cq->entries.pop_front();
  }
  return n;
}

int fake_post_send(ibv_qp* qp_base, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeQp* qp = reinterpret_cast<FakeQp*>(qp_base);
  if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
    *bad = wr;
    return EINVAL;
  }
  for (; wr != nullptr; wr = wr->next) {
    if (qp->posted - qp->retired >= qp->max_send_wr) {
      *bad = wr;
      return ENOMEM;
    }
    PendingWr p;
    p.wr = *wr;
    p.wr.next = nullptr;
    if (wr->num_sge > 0) p.sge = wr->sg_list[0];
    p.wr.sg_list = nullptr;
    p.sequence = qp->posted++;
    qp->pending.push_back(p);
  }
  progress(qp);
  return 0;
}

int fake_post_srq_recv(ibv_srq* srq_base, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeSrq* srq = reinterpret_cast<FakeSrq*>(srq_base);
  for (; wr != nullptr; wr = wr->next) {
    if (srq->receives.size() >= srq->max_wr) {
      *bad = wr;
      return ENOMEM;
    }
    srq->receives.push_back(wr->wr_id);
  }
  return 0;
}

int fill_port(ibv_context* context, std::uint8_t port_num, ibv_port_attr* attr) {
  FakeContext* c = fake(context);
  if (port_num < 1 || port_num > c->device->ports.size()) return EINVAL;
  const FakePort& port = c->device->ports[port_num - 1u];
  std::memset(attr, 0, sizeof *attr);
  attr->state = static_cast<ibv_port_state>(port.state);
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = 16;
  attr->max_msg_sz = port.max_msg;
  attr->pkey_tbl_len = static_cast<std::uint16_t>(port.pkeys.size());
  attr->lid = port.lid;
  attr->link_layer = static_cast<std::uint8_t>(port.link_layer);
  attr->flags = port.flags;
  return 0;
}

int fake_query_port_ex(ibv_context* context, std::uint8_t port_num, ibv_port_attr* attr, size_t) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  return fill_port(context, port_num, attr);
}

const FakePort* port_of(ibv_context* context, std::uint32_t port_num) {
  FakeContext* c = fake(context);
  if (port_num < 1 || port_num > c->device->ports.size()) return nullptr;
  return &c->device->ports[port_num - 1u];
}

}  // namespace

// --- the libibverbs functions the transport resolves ------------------------------------------------

WB_FAKE_EXPORT ibv_device** ibv_get_device_list(int* count) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  log_call("get_device_list");
  objects_made = true;
  if (devices.empty()) {
    errno = ENOSYS;
    if (count != nullptr) *count = 0;
    return nullptr;
  }
  device_list.clear();
  for (auto& d : devices) device_list.push_back(&d->device);
  if (count != nullptr) *count = static_cast<int>(device_list.size());
  auto* copy = new ibv_device*[device_list.size() + 1];
  std::copy(device_list.begin(), device_list.end(), copy);
  copy[device_list.size()] = nullptr;
  return copy;
}

WB_FAKE_EXPORT void ibv_free_device_list(ibv_device** list) { delete[] list; }

WB_FAKE_EXPORT const char* ibv_get_device_name(ibv_device* device) { return device->name; }

WB_FAKE_EXPORT ibv_context* ibv_open_device(ibv_device* device) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeDevice* d = nullptr;
  for (auto& candidate : devices)
    if (&candidate->device == device) d = candidate.get();
  log_call(std::string("open_device ") + device->name);
  if (d == nullptr || d->fail_open) {
    errno = EIO;
    return nullptr;
  }
  auto* c = new FakeContext;
  c->device = d;
  c->v.sz = sizeof(verbs_context);
  c->v.query_port = fake_query_port_ex;
  c->v.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
  c->v.context.device = device;
  c->v.context.ops.poll_cq = fake_poll_cq;
  c->v.context.ops.post_send = fake_post_send;
  c->v.context.ops.post_srq_recv = fake_post_srq_recv;
  if (::pipe(c->pipe_fds) != 0) {
    delete c;
    return nullptr;
  }
  c->v.context.async_fd = c->pipe_fds[0];
  contexts.push_back(c);
  return &c->v.context;
}

WB_FAKE_EXPORT int ibv_close_device(ibv_context* context) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeContext* c = fake(context);
  contexts.erase(std::remove(contexts.begin(), contexts.end(), c), contexts.end());
  ::close(c->pipe_fds[0]);
  ::close(c->pipe_fds[1]);
  delete c;
  return 0;
}

WB_FAKE_EXPORT int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeContext* c = fake(context);
  std::memset(attr, 0, sizeof *attr);
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "fake");
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = 32768;
  attr->max_sge = 30;
  attr->max_cq = 1 << 16;
  attr->max_cqe = static_cast<int>(c->device->max_cqe);
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_srq = c->device->max_srq_wr == 0 ? 0 : 1024;
  attr->max_srq_wr = static_cast<int>(c->device->max_srq_wr);
  attr->max_srq_sge = 1;
  attr->phys_port_cnt = static_cast<std::uint8_t>(c->device->ports.size());
  return 0;
}

WB_FAKE_EXPORT int ibv_query_port(ibv_context* context, std::uint8_t port_num, _compat_ibv_port_attr* attr) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  ibv_port_attr full{};
  const int rc = fill_port(context, port_num, &full);
  // The compatible layout lacks the trailing flags: copy what it has.
  std::memcpy(static_cast<void*>(attr), &full, offsetof(ibv_port_attr, flags));
  return rc;
}

WB_FAKE_EXPORT int ibv_query_gid(ibv_context* context, std::uint8_t port_num, int index, ibv_gid* gid) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const FakePort* port = port_of(context, port_num);
  if (port == nullptr || index < 0 || index >= 16) return EINVAL;
  std::memset(gid, 0, sizeof *gid);
  const auto it = port->gids.find(index);
  if (it != port->gids.end()) std::memcpy(gid->raw, it->second.second.data(), 16);
  return 0;
}

WB_FAKE_EXPORT int ibv_query_pkey(ibv_context* context, std::uint8_t port_num, int index, __be16* pkey) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const FakePort* port = port_of(context, port_num);
  if (port == nullptr || index < 0 || static_cast<std::size_t>(index) >= port->pkeys.size()) return EINVAL;
  *pkey = htons(port->pkeys[static_cast<std::size_t>(index)]);
  return 0;
}

WB_FAKE_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  auto* pd = new ibv_pd{};
  pd->context = context;
  return pd;
}

WB_FAKE_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}

namespace {
ibv_mr* register_memory(ibv_pd* pd, void* address, std::size_t length, int access) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto* m = new FakeMr;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = address;
  m->mr.length = length;
  m->mr.lkey = m->mr.rkey = next_key++;
  m->access = access;
  mrs[m->mr.lkey] = m;
  return &m->mr;
}
}  // namespace

WB_FAKE_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* address, std::size_t length, int access) {
  // rdma-core before 28 refuses the optional flags here.
  if ((access & IBV_ACCESS_RELAXED_ORDERING) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  return register_memory(pd, address, length, access);
}

WB_FAKE_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto* m = reinterpret_cast<FakeMr*>(mr);
  mrs.erase(mr->lkey);
  delete m;
  return 0;
}

WB_FAKE_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void*, ibv_comp_channel*, int) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeContext* c = fake(context);
  if (cqe < 1 || static_cast<std::uint32_t>(cqe) > c->device->max_cqe) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new FakeCq;
  cq->cq.context = context;
  cq->cq.cqe = cqe;
  cq->context = c;
  cq->capacity = static_cast<std::size_t>(cqe);
  cqs.push_back(cq);
  return &cq->cq;
}

WB_FAKE_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto* f = reinterpret_cast<FakeCq*>(cq);
  cqs.erase(std::remove(cqs.begin(), cqs.end(), f), cqs.end());
  delete f;
  return 0;
}

WB_FAKE_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeContext* c = fake(pd->context);
  if (attr->attr.max_wr == 0 || attr->attr.max_wr > c->device->max_srq_wr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* srq = new FakeSrq;
  srq->srq.context = pd->context;
  srq->srq.pd = pd;
  srq->max_wr = attr->attr.max_wr;
  return &srq->srq;
}

WB_FAKE_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  delete reinterpret_cast<FakeSrq*>(srq);
  return 0;
}

#ifndef WB_FAKE_NO_CREATE_QP
namespace {
std::uint32_t next_qpn = 0x100;
}  // namespace

WB_FAKE_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  if (attr->qp_type != IBV_QPT_RC || attr->cap.max_send_wr == 0) {
    errno = EINVAL;
    return nullptr;
  }
  auto* qp = new FakeQp;
  qp->context = fake(pd->context);
  qp->qp.context = pd->context;
  qp->qp.pd = pd;
  qp->qp.qp_num = next_qpn++;
  qp->qp.qp_type = IBV_QPT_RC;
  qp->qp.state = IBV_QPS_RESET;
  qp->send_cq = reinterpret_cast<FakeCq*>(attr->send_cq);
  qp->recv_cq = reinterpret_cast<FakeCq*>(attr->recv_cq);
  qp->srq = reinterpret_cast<FakeSrq*>(attr->srq);
  qp->max_send_wr = attr->cap.max_send_wr;
  qps[qp->qp.qp_num] = qp;
  return &qp->qp;
}
#endif

WB_FAKE_EXPORT int ibv_modify_qp(ibv_qp* qp_base, ibv_qp_attr* attr, int mask) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeQp* qp = reinterpret_cast<FakeQp*>(qp_base);
  if ((mask & IBV_QP_PKEY_INDEX) != 0) qp->pkey_index = attr->pkey_index;
  if ((mask & IBV_QP_PORT) != 0) qp->port = attr->port_num;
  if ((mask & IBV_QP_AV) != 0) qp->ah = attr->ah_attr;
  if ((mask & IBV_QP_DEST_QPN) != 0) qp->dest_qp = attr->dest_qp_num;
  if ((mask & IBV_QP_STATE) != 0) {
    qp->state = attr->qp_state;
    qp->qp.state = attr->qp_state;
    if (attr->qp_state == IBV_QPS_RESET) {
      qp->pending.clear();
      qp->posted = qp->retired = 0;
    }
    if (attr->qp_state == IBV_QPS_ERR) progress(qp);  // flushes what is pending
  }
  return 0;
}

WB_FAKE_EXPORT int ibv_destroy_qp(ibv_qp* qp_base) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeQp* qp = reinterpret_cast<FakeQp*>(qp_base);
  qps.erase(qp->qp.qp_num);
  for (FakeCq* cq : cqs)
    for (Entry& e : cq->entries)
      if (e.qp == qp) e.qp = nullptr;
  delete qp;
  return 0;
}

WB_FAKE_EXPORT int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeContext* c = fake(context);
  char byte = 0;
  if (c->events.empty() || ::read(c->pipe_fds[0], &byte, 1) != 1) {
    errno = EAGAIN;
    return -1;
  }
  *event = c->events.front();
  c->events.pop_front();
  return 0;
}

WB_FAKE_EXPORT void ibv_ack_async_event(ibv_async_event*) {}

WB_FAKE_EXPORT int ibv_fork_init() {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  log_call("fork_init");
  if (objects_made) return EINVAL;  // as rdma-core: too late once verbs objects exist
  fork_initialized = true;
  return 0;
}

#ifndef WB_FAKE_OLD
WB_FAKE_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* address, std::size_t length, std::uint64_t, unsigned int access) {
  return register_memory(pd, address, length, static_cast<int>(access));
}

WB_FAKE_EXPORT int _ibv_query_gid_ex(ibv_context* context, std::uint32_t port_num, std::uint32_t index, ibv_gid_entry* entry,
                                     std::uint32_t, size_t) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const FakePort* port = port_of(context, port_num);
  if (port == nullptr) return EINVAL;
  const auto it = port->gids.find(static_cast<int>(index));
  if (it == port->gids.end()) return ENODATA;
  std::memset(entry, 0, sizeof *entry);
  std::memcpy(entry->gid.raw, it->second.second.data(), 16);
  entry->gid_index = index;
  entry->port_num = port_num;
  entry->gid_type = static_cast<std::uint32_t>(it->second.first);
  return 0;
}

WB_FAKE_EXPORT ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, std::uint32_t,
                                            size_t) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakeContext* c = fake(context);
  size_t n = 0;
  for (std::size_t p = 0; p < c->device->ports.size(); ++p) {
    for (const auto& [index, gid] : c->device->ports[p].gids) {
      if (n == max_entries) return -ENOMEM;
      ibv_gid_entry& e = entries[n++];
      std::memset(&e, 0, sizeof e);
      std::memcpy(e.gid.raw, gid.second.data(), 16);
      e.gid_index = static_cast<std::uint32_t>(index);
      e.port_num = static_cast<std::uint32_t>(p + 1);
      e.gid_type = static_cast<std::uint32_t>(gid.first);
    }
  }
  return static_cast<ssize_t>(n);
}

WB_FAKE_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, std::uint64_t, size_t, std::uint64_t, int, int) {
  errno = EOPNOTSUPP;
  return nullptr;
}

WB_FAKE_EXPORT ibv_fork_status ibv_is_fork_initialized() {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  return fork_initialized ? IBV_FORK_ENABLED : IBV_FORK_DISABLED;
}
#endif

// --- control, for the tests ---------------------------------------------------------------------------

struct wbfake_qp_info {
  int state;
  int is_global;
  std::uint16_t dlid;
  std::uint8_t sgid_index;
  std::uint8_t port;
  std::uint16_t pkey_index;
  std::uint32_t dest_qp;
  std::uint32_t max_send_wr;
  std::uint8_t dgid[16];
};

/// Forgets the devices (the objects of transports still alive stay valid until they are destroyed).
WB_FAKE_EXPORT void wbfake_reset() {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  devices.clear();
  call_log.clear();
  overruns = 0;
}

/// Adds a device; returns its index. `sysfs_dir` is its ibdev_path (GID types are read below it when the
/// library has no GID table query).
WB_FAKE_EXPORT int wbfake_add_device(const char* name, const char* sysfs_dir, int fail_open, std::uint32_t max_srq_wr,
                                     std::uint32_t max_cqe) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  auto d = std::make_unique<FakeDevice>();
  std::snprintf(d->device.name, sizeof d->device.name, "%s", name);
  std::snprintf(d->device.dev_name, sizeof d->device.dev_name, "uverbs%zu", devices.size());
  std::snprintf(d->device.ibdev_path, sizeof d->device.ibdev_path, "%s", sysfs_dir);
  d->device.node_type = IBV_NODE_CA;
  d->device.transport_type = IBV_TRANSPORT_IB;
  d->fail_open = fail_open != 0;
  d->max_srq_wr = max_srq_wr;
  d->max_cqe = max_cqe;
  devices.push_back(std::move(d));
  return static_cast<int>(devices.size() - 1);
}

/// Adds a port to device `device`; returns its number (from 1).
WB_FAKE_EXPORT int wbfake_add_port(int device, int state, int link_layer, std::uint16_t lid, std::uint8_t flags) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakePort port;
  port.state = state;
  port.link_layer = link_layer;
  port.lid = lid;
  port.flags = flags;
  devices[static_cast<std::size_t>(device)]->ports.push_back(port);
  return static_cast<int>(devices[static_cast<std::size_t>(device)]->ports.size());
}

/// Sets GID `index` of a port (type: IBV_GID_TYPE_*); an all-zero GID removes it.
WB_FAKE_EXPORT void wbfake_set_gid(int device, int port, int index, int type, const std::uint8_t* gid) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  FakePort& p = devices[static_cast<std::size_t>(device)]->ports[static_cast<std::size_t>(port - 1)];
  std::array<std::uint8_t, 16> bytes{};
  std::memcpy(bytes.data(), gid, 16);
  if (std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; })) p.gids.erase(index);
  else p.gids[index] = {type, bytes};
}

WB_FAKE_EXPORT void wbfake_set_pkeys(int device, int port, const std::uint16_t* pkeys, int count) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  devices[static_cast<std::size_t>(device)]->ports[static_cast<std::size_t>(port - 1)].pkeys.assign(pkeys, pkeys + count);
}

/// The `after`-th next work request the queue pair executes (0: the next) completes with `status`.
WB_FAKE_EXPORT void wbfake_fail_write(std::uint32_t qp_num, int after, int status) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const auto it = qps.find(qp_num);
  if (it == qps.end()) return;
  it->second->fail_after = after;
  it->second->fail_status = status;
}

/// Raises an asynchronous event on every open context of device `device`: for queue pair events on the
/// queue pair `number`, for port events on port `number`, for CQ and SRQ events on the number-th CQ
/// created on the context (SRQ events: the SRQ attached to that queue pair number).
WB_FAKE_EXPORT int wbfake_event(int device, int type, std::uint32_t number) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  int raised = 0;
  for (FakeContext* c : contexts) {
    if (c->device != devices[static_cast<std::size_t>(device)].get()) continue;
    ibv_async_event event{};
    event.event_type = static_cast<ibv_event_type>(type);
    switch (type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
      case IBV_EVENT_COMM_EST:
      case IBV_EVENT_QP_LAST_WQE_REACHED: {
        const auto it = qps.find(number);
        if (it == qps.end() || it->second->context != c) continue;
        event.element.qp = &it->second->qp;
        break;
      }
      case IBV_EVENT_CQ_ERR: {
        std::uint32_t seen = 0;
        for (FakeCq* cq : cqs)
          if (cq->context == c && seen++ == number) event.element.cq = &cq->cq;
        if (event.element.cq == nullptr) continue;
        break;
      }
      case IBV_EVENT_SRQ_ERR:
      case IBV_EVENT_SRQ_LIMIT_REACHED: {
        const auto it = qps.find(number);
        if (it == qps.end() || it->second->context != c || it->second->srq == nullptr) continue;
        event.element.srq = &it->second->srq->srq;
        break;
      }
      default: event.element.port_num = static_cast<int>(number);
    }
    raise_event(c, event);
    ++raised;
  }
  return raised;
}

WB_FAKE_EXPORT int wbfake_qp_info(std::uint32_t qp_num, wbfake_qp_info* out) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const auto it = qps.find(qp_num);
  if (it == qps.end()) return -1;
  const FakeQp* qp = it->second;
  out->state = qp->state;
  out->is_global = qp->ah.is_global;
  out->dlid = qp->ah.dlid;
  out->sgid_index = qp->ah.grh.sgid_index;
  out->port = qp->port;
  out->pkey_index = qp->pkey_index;
  out->dest_qp = qp->dest_qp;
  out->max_send_wr = qp->max_send_wr;
  std::memcpy(out->dgid, qp->ah.grh.dgid.raw, 16);
  return 0;
}

/// The opcodes the queue pair executed, oldest first: "W" RDMA_WRITE, "I" RDMA_WRITE_WITH_IMM with bytes,
/// "I0" a zero-length one.
WB_FAKE_EXPORT const char* wbfake_opcodes(std::uint32_t qp_num) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  static std::string copy;
  const auto it = qps.find(qp_num);
  copy = it == qps.end() ? std::string() : it->second->opcodes;
  return copy.c_str();
}

WB_FAKE_EXPORT const char* wbfake_log() {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  static std::string copy;
  copy = call_log;
  return copy.c_str();
}

WB_FAKE_EXPORT std::uint64_t wbfake_overruns() {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  return overruns;
}

WB_FAKE_EXPORT int wbfake_mr_access(std::uint32_t key) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const auto it = mrs.find(key);
  return it == mrs.end() ? -1 : it->second->access;
}

/// Receives posted and not yet consumed on the SRQ of queue pair `qp_num`, and its capacity.
WB_FAKE_EXPORT int wbfake_srq_receives(std::uint32_t qp_num, std::uint32_t* capacity) {
  std::lock_guard<std::recursive_mutex> lock(mutex);
  const auto it = qps.find(qp_num);
  if (it == qps.end() || it->second->srq == nullptr) return -1;
  if (capacity != nullptr) *capacity = it->second->srq->max_wr;
  return static_cast<int>(it->second->srq->receives.size());
}
