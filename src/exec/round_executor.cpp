// The round executor. One progress loop per update drives every round in flight through its steps:
//
//   trainer:  slot free (its writes of round g - depth done) -> pack -> post one batch per peer (receive
//             stage) as soon as that peer granted round g;
//   rollout:  receive-stage arrivals complete -> post the external-exchange batches; those arrivals complete
//             too -> post the internal-exchange batches; every arrival in -> assemble; assembled and its own
//             forwards done -> release the slot: grant round g + depth to the peers that write then.
//   relay:    a batch with lag 1 forwards what arrived in round g - 1, out of that round's slot: it goes out
//             once round g - 1's arrivals are in, and round g - 1's slot is released only when these
//             batches of round g are done too (the planner never puts them in a schedule's first round).
//
// Rounds are numbered globally across updates (g = update × rounds + r), so a slot released near the end of
// one update is granted to the next update's early rounds and nothing waits at update boundaries. Writes
// carry (g, stage) in their immediate; grants travel as small MPI messages (control only).
//
// CUDA parameters: pack and assemble are kernel launches on the executor's stream, each followed by an
// event; the loop polls the event and counts the step done only then, so writes are posted, and slots
// released, after the kernel's bytes are in place. Slots start 256-byte aligned, so that one compiled
// program per round serves every slot.
#include "exec/round_executor.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "exec/connect_record.hpp"
#include "exec/pack.hpp"
#include "exec/verify.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"
#include "weightbridge/settings.hpp"

#if WB_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../../kernels/pack_kernels.hpp"  // the kernels' host API lives beside them, outside src/
#include "weightbridge/device.hpp"
#endif

namespace wb {
namespace {

using Clock = std::chrono::steady_clock;

// The trace's time base: the steady clock in seconds, as the coordinator's local_seconds().
double seconds_of(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }
double local_seconds_now() { return seconds_of(Clock::now()); }
constexpr std::size_t kMaxTraceSpans = std::size_t{1} << 20;  // about 40 MB of spans per rank

Setting<std::int64_t> idle_sleep_us_setting(
    "idle_sleep_us", 100,
    "Longest sleep of an update's progress loop once nothing has moved for a while, microseconds (0: only "
    "yield). Idle ranks then leave the cores to those that work: the peers they wait for on an oversubscribed "
    "machine, and the kernel's network stack with TCP providers.");
Setting<std::int64_t> max_writes_per_post_setting(
    "max_writes_per_post", 0,
    "Writes the executor hands a transport in one post (0: the transport's own limit). A batch longer than "
    "that goes out in several posts. Lower it only to exercise that path.");

std::size_t writes_per_post(const Transport& transport) {
  const std::size_t limit = std::max<std::size_t>(1, transport.capabilities().max_writes_per_batch);
  const std::int64_t cap = *max_writes_per_post_setting;
  return cap > 0 ? std::min(limit, static_cast<std::size_t>(cap)) : limit;
}

constexpr int kEndpointTag = 0x5742;  // connect-time records
constexpr int kGrantTag = 0x5743;     // "you may write round g into my slot"
constexpr int kDigestTag = 0x5744;    // verify: the segment digests of an update
constexpr std::uint32_t kRoundBits = 24;
constexpr std::uint64_t kRelayToken = std::uint64_t{1} << 63;  // completion token of a lag 1 post: round | this
constexpr std::uint64_t kRoundMask = (std::uint64_t{1} << kRoundBits) - 1;

std::uint32_t encode_immediate(std::uint64_t round, Stage stage) {
  return static_cast<std::uint32_t>(((round & kRoundMask) << 2) | static_cast<std::uint32_t>(stage));
}

// One batch: the writes of one round to one peer in one stage and lag (offsets within the slots).
struct Batch {
  int peer = 0;
  Stage stage = Stage::kReceive;
  std::uint8_t lag = 0;              // 1: relays out of the previous round's receive slot
  std::vector<WriteRequest> writes;  // local/remote offsets relative to the slots; memory ids filled in
  std::int64_t bytes = 0;
  std::size_t writes_per_post = 0;   // the transport takes this many at once: a longer batch goes out in
                                     // several posts, each one notification (the receiver expects them all)
};

struct RoundWork {
  std::vector<Batch> batches;                 // in stage order
  std::array<int, kStageCount> arrivals{};    // regions expected per stage
  std::vector<int> writers;                   // distinct peers that write into this rank in this round
  int relay_batches = 0;                      // batches with lag 1
  std::vector<std::array<int, kStageCount>> expected_from;  // per writer: arrivals per stage (names the missing)
  exec::CopyProgram pack, assemble;           // host parameters
#if WB_HAVE_CUDA
  kernels::DeviceCopyProgram device_pack, device_assemble;  // CUDA parameters
#endif
  bool packs = false;
  std::int64_t assembled_bytes = 0;
};

struct PeerLink {
  Transport* transport = nullptr;
  std::uint32_t receive_memory = 0;         // the peer's receive buffer, imported
  std::int64_t receive_slot_stride = 0;     // the peer's: bytes from one slot to the next
  std::uint64_t granted = 0;                // rounds < granted may be written (first depth rounds are free)
};

// Per global round in flight (a ring of these, indexed g % ring size).
struct RoundProgress {
  std::uint64_t round = UINT64_MAX;
  std::array<int, kStageCount> arrived{};
  int posted = 0;                            // batches of this rank posted completely
  std::size_t next_write = 0;                // in the batch being posted: its first write not yet posted
  int posts = 0, done = 0;                   // posts made (one per batch unless it is split) and completed
  int relay_posted = 0;                      // lag 1 batches posted completely
  int relay_posts = 0, relay_done = 0;       // their posts, made and completed (also counted in posts, done)
  bool packed = false, assembled = false, released = false;
  bool pack_launched = false, assemble_launched = false;  // CUDA parameters: kernel enqueued, not yet seen done
  // options.trace: when the round's first write / forward was posted and since when its next batch has
  // waited for the receiver's credit (0: not yet, not waiting), local_seconds().
  double write_begin = 0, forward_begin = 0, credit_wait_begin = 0;
  int write_posts = 0, write_done = 0;  // posts of the receive stage (the rest forward received bytes)
  std::vector<std::array<int, kStageCount>> arrived_from;  // per writer of the round (sized once, at construction)
};

// Host transfer buffers in a mapping of their own. At destruction the range is not unmapped but replaced by
// one without access: a peer that has not yet noticed that this side failed or ended may still write into
// the buffer (cma writes any mapped address of the process), and must then fail with EFAULT instead of
// landing in memory that the process has handed out again.
class HostTransferMemory {
 public:
  HostTransferMemory() = default;
  HostTransferMemory(const HostTransferMemory&) = delete;
  HostTransferMemory& operator=(const HostTransferMemory&) = delete;
  ~HostTransferMemory() {
    if (data_ == nullptr) return;
    if (::mmap(data_, mapped_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
      ::munmap(data_, mapped_);
  }
  // Zeroed memory of `bytes` (set-up: throws).
  void allocate(std::size_t bytes) {
    if (bytes == 0) return;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    mapped_ = (bytes + page - 1) / page * page;
    // Populated now: a first touch inside an update would be a page fault per 4 KiB on the update path.
    void* memory = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (memory == MAP_FAILED)
      throw Error(ErrorCode::kSystem, "mmap of " + std::to_string(bytes) + " bytes of transfer buffers failed: " +
                                          std::strerror(errno));
    data_ = static_cast<std::byte*>(memory);
    size_ = bytes;
  }
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0, mapped_ = 0;
};

#if WB_HAVE_CUDA
std::string cuda_text(cudaError_t rc) { return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc); }

// Makes a device current for the rest of a scope of set-up code (throws), then restores the caller's.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    WB_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) WB_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// The device side of an executor with CUDA parameters: transfer buffers (device memory, or pinned host
// memory mapped into the device), the stream the kernels run on, and per pipeline slot the events that
// time a pack and an assemble. All made at construction (set-up: throws), released at destruction.
class DeviceResources {
 public:
  // A kernel launch being watched: started and finished are recorded around it.
  struct Timing {
    cudaEvent_t started = nullptr, finished = nullptr;
  };

  DeviceResources(int device, bool device_buffers, std::size_t send_bytes, std::size_t receive_bytes, int depth)
      : device_(device), device_buffers_(device_buffers) {
    DeviceScope scope(device);
    try {
      allocate(send_bytes, send_, send_kernel_);
      allocate(receive_bytes, receive_, receive_kernel_);
      WB_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      pack_.resize(static_cast<std::size_t>(depth));
      assemble_.resize(static_cast<std::size_t>(depth));
      for (std::vector<Timing>* timings : {&pack_, &assemble_})
        for (Timing& t : *timings) {
          WB_CHECK_CUDA(cudaEventCreate(&t.started));
          WB_CHECK_CUDA(cudaEventCreate(&t.finished));
        }
    } catch (...) {
      release();
      throw;
    }
  }
  ~DeviceResources() {
    int previous = device_;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ && cudaSetDevice(device_) == cudaSuccess;
    release();
    if (switched) (void)cudaSetDevice(previous);
  }
  DeviceResources(const DeviceResources&) = delete;
  DeviceResources& operator=(const DeviceResources&) = delete;

  // What the transports register, and what the kernels address (the same for device memory).
  std::byte* send() const { return send_; }
  std::byte* receive() const { return receive_; }
  std::byte* send_for_kernels() const { return send_kernel_; }
  std::byte* receive_for_kernels() const { return receive_kernel_; }
  Timing& pack_timing(std::size_t slot) { return pack_[slot]; }
  Timing& assemble_timing(std::size_t slot) { return assemble_[slot]; }

  // Enqueues `program` on `buffer` between the two events of `timing`; returns without waiting.
  Status launch(const kernels::DeviceCopyProgram& program, std::byte* buffer, Timing& timing) {
    int previous = device_;
    WB_TRY_CUDA(cudaGetDevice(&previous));
    if (previous != device_) WB_TRY_CUDA(cudaSetDevice(device_));
    Status status = record_around(program, buffer, timing);
    if (previous != device_) (void)cudaSetDevice(previous);
    return status;
  }

  // True once the launch of `timing` has finished; adds its kernel time to `seconds`.
  Status finished(Timing& timing, bool& done, double& seconds) {
    const cudaError_t rc = cudaEventQuery(timing.finished);
    done = rc == cudaSuccess;
    if (rc == cudaErrorNotReady) return Status::ok();
    if (rc != cudaSuccess) return Status(ErrorCode::kCuda, "a pack or assemble kernel failed: cudaEventQuery: " + cuda_text(rc));
    float milliseconds = 0;
    if (cudaEventElapsedTime(&milliseconds, timing.started, timing.finished) == cudaSuccess) seconds += milliseconds / 1e3;
    return Status::ok();
  }

 private:
  Status record_around(const kernels::DeviceCopyProgram& program, std::byte* buffer, Timing& timing) {
    WB_TRY_CUDA(cudaEventRecord(timing.started, stream_));
    WB_RETURN_IF_ERROR(program.execute(stream_, buffer));
    WB_TRY_CUDA(cudaEventRecord(timing.finished, stream_));
    return Status::ok();
  }

  void allocate(std::size_t bytes, std::byte*& registered, std::byte*& for_kernels) {
    void* memory = nullptr;
    if (device_buffers_) {
      WB_CHECK_CUDA(cudaMalloc(&memory, bytes));
      registered = static_cast<std::byte*>(memory);
      WB_CHECK_CUDA(cudaMemset(memory, 0, bytes));
      for_kernels = registered;
      return;
    }
    WB_CHECK_CUDA(cudaHostAlloc(&memory, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    registered = static_cast<std::byte*>(memory);
    std::memset(memory, 0, bytes);
    void* mapped = nullptr;
    WB_CHECK_CUDA(cudaHostGetDevicePointer(&mapped, memory, 0));
    for_kernels = static_cast<std::byte*>(mapped);
  }

  void release() noexcept {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (std::vector<Timing>* timings : {&pack_, &assemble_})
      for (Timing& t : *timings) {
        if (t.started != nullptr) (void)cudaEventDestroy(t.started);
        if (t.finished != nullptr) (void)cudaEventDestroy(t.finished);
        t = Timing{};
      }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
    for (std::byte** memory : {&send_, &receive_}) {
      if (*memory == nullptr) continue;
      if (device_buffers_) (void)cudaFree(*memory); else (void)cudaFreeHost(*memory);
      *memory = nullptr;
    }
  }

  int device_;
  bool device_buffers_;
  std::byte* send_ = nullptr;
  std::byte* receive_ = nullptr;
  std::byte* send_kernel_ = nullptr;
  std::byte* receive_kernel_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<Timing> pack_, assemble_;
};
#endif

}  // namespace

struct RoundExecutor::State {
  RoundSchedule schedule;
  ParameterMemory parameters;
  MPI_Comm comm = MPI_COMM_NULL;
  ExecutorOptions options;
  ExecutorStats stats;
  int rank = 0, depth = 1, rounds = 0;
  std::int64_t idle_sleep_us = 0;  // the setting, read once

  HostTransferMemory send_buffer, receive_buffer;  // depth slots each (host parameters)
  std::byte* send_base = nullptr;      // the buffers as registered with the transports
  std::byte* receive_base = nullptr;
  std::int64_t send_slot_stride = 0, receive_slot_stride = 0;  // bytes from one slot to the next
#if WB_HAVE_CUDA
  std::unique_ptr<DeviceResources> device;  // CUDA parameters: buffers, stream, events (outlives the transports)
#endif
  std::map<TransportKind, std::unique_ptr<Transport>> transports;
  std::map<TransportKind, std::pair<std::uint32_t, std::uint32_t>> local_memory;  // send, receive ids
  std::map<TransportKind, std::vector<std::byte>> receive_keys;                    // what peers import
  std::map<int, PeerLink> peers;
  std::vector<RoundWork> work;  // per schedule round

  std::uint64_t next_round = 0;  // global number of the next update's first round
  std::vector<RoundProgress> ring;
  std::vector<Completion> completions;
  std::vector<WriteRequest> scratch;
  std::vector<MPI_Request> grant_requests;
  std::deque<std::uint64_t> grant_buffers;  // one per grant request; a deque, so buffers in flight never move
  std::unique_ptr<exec::Verifier> verifier;  // options.verify

  std::string name(int peer) const {
    return options.describe_rank ? options.describe_rank(peer) : "rank " + std::to_string(peer);
  }

  // What round `g` waits for: a sentence, and the peers it waits on.
  WaitState wait_state(std::uint64_t g) {
    const RoundWork& work = this->work[static_cast<std::size_t>(g % static_cast<std::uint64_t>(rounds))];
    RoundProgress& p = progress(g);
    WaitState state;
    std::string& waiting = state.first;
    for (std::size_t st = 0; st < kStageCount; ++st) {
      if (p.arrived[st] == work.arrivals[st]) continue;
      std::string from;
      for (std::size_t w = 0; w < work.writers.size(); ++w)
        if (p.arrived_from[w][st] < work.expected_from[w][st]) {
          from += (from.empty() ? "" : ", ") + name(work.writers[w]);
          state.second.push_back(work.writers[w]);
        }
      waiting += std::string(waiting.empty() ? "" : "; ") + stage_name(static_cast<Stage>(st)) + " stage writes from " + from;
    }
    if (p.posted < static_cast<int>(work.batches.size())) {
      const Batch& batch = work.batches[static_cast<std::size_t>(p.posted)];
      const bool granted = !(peers.at(batch.peer).granted <= g && g >= static_cast<std::uint64_t>(depth));
      waiting += std::string(waiting.empty() ? "" : "; ") + "its " + stage_name(batch.stage) + " stage write to " +
                 name(batch.peer) + (granted ? "" : ", which has not granted that buffer slot yet");
      if (!granted) state.second.push_back(batch.peer);
    }
    if (p.done < p.posts) waiting += std::string(waiting.empty() ? "" : "; ") + std::to_string(p.posts - p.done) + " posts to complete";
    if (p.pack_launched && !p.packed) waiting += std::string(waiting.empty() ? "" : "; ") + "the pack kernel to finish";
    if (p.assemble_launched && !p.assembled) waiting += std::string(waiting.empty() ? "" : "; ") + "the assemble kernel to finish";
    if (waiting.empty()) waiting = "its own work";
    std::sort(state.second.begin(), state.second.end());
    state.second.erase(std::unique(state.second.begin(), state.second.end()), state.second.end());
    return state;
  }

  // Sends "write round `round` into my slot" to `peer` without blocking.
  Status send_grant(int peer, std::uint64_t round) {
    std::size_t slot = grant_requests.size();
    for (std::size_t i = 0; i < grant_requests.size(); ++i) {
      int done = 1;
      if (grant_requests[i] != MPI_REQUEST_NULL) WB_TRY_MPI(MPI_Test(&grant_requests[i], &done, MPI_STATUS_IGNORE));
      if (done) {
        slot = i;
        break;
      }
    }
    if (slot == grant_requests.size()) {
      grant_requests.push_back(MPI_REQUEST_NULL);
      grant_buffers.push_back(0);
    }
    grant_buffers[slot] = round;
    const int rc = MPI_Isend(&grant_buffers[slot], 1, MPI_UINT64_T, peer, kGrantTag, comm, &grant_requests[slot]);
    if (rc != MPI_SUCCESS)
      return make_call_error(ErrorCode::kMpi, "MPI_Isend", "a grant to " + name(peer) + ": " + detail::mpi_error_string(rc),
                             __FILE__, __LINE__);
    return Status::ok();
  }

#if WB_HAVE_CUDA
  // One pack or assemble of CUDA parameters, without blocking: the first call launches `program` on slot
  // `slot` (`launched`), later ones poll its end (`done`, and its kernel time added to `seconds`). An
  // empty program is done at once.
  Status device_step(const kernels::DeviceCopyProgram& program, std::byte* buffer, std::int64_t slot_stride,
                     std::size_t slot, DeviceResources::Timing& timing, bool& launched, bool& done, double& seconds,
                     bool& progressed, const char* step, std::uint64_t round) {
    if (program.empty()) {
      done = progressed = true;
      return Status::ok();
    }
    Status status;
    if (!launched) {
      status = device->launch(program, buffer + slot * static_cast<std::size_t>(slot_stride), timing);
      if (status) launched = progressed = true;
    } else {
      status = device->finished(timing, done, seconds);
      progressed = progressed || done;
    }
    if (status) return status;
    return Status(status.code(), "rank " + std::to_string(rank) + ", " + step + " of round " +
                                     std::to_string(round % work.size()) + ": " + status.message());
  }
#endif

  // options.trace: one span on this rank's timeline (local_seconds), while under the cap.
  void trace(ExecutorSpan::Kind kind, std::uint64_t g, double begin, double end) {
    if (!options.trace) return;
    if (stats.trace.size() >= kMaxTraceSpans) {
      ++stats.trace_dropped;
      return;
    }
    stats.trace.push_back({kind, stats.updates, static_cast<int>(g % static_cast<std::uint64_t>(rounds)), begin, end});
  }

  RoundProgress& progress(std::uint64_t g) {
    RoundProgress& p = ring[g % ring.size()];
    if (p.round != g) {
      // Reset without giving back the per-writer counters' memory: an update allocates nothing.
      std::vector<std::array<int, kStageCount>> from = std::move(p.arrived_from);
      std::fill(from.begin(), from.end(), std::array<int, kStageCount>{});
      p = RoundProgress{};
      p.round = g;
      p.arrived_from = std::move(from);
    }
    return p;
  }
};

namespace {

// Sends `bytes` to `peer` and receives the peer's record (both directions at once).
std::vector<std::byte> swap_record(int peer, const std::vector<std::byte>& bytes, MPI_Comm comm) {
  std::uint64_t size = bytes.size(), peer_size = 0;
  WB_CHECK_MPI(MPI_Sendrecv(&size, 1, MPI_UINT64_T, peer, kEndpointTag, &peer_size, 1, MPI_UINT64_T, peer, kEndpointTag,
                            comm, MPI_STATUS_IGNORE));
  std::vector<std::byte> received(peer_size);
  WB_CHECK_MPI(MPI_Sendrecv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, peer, kEndpointTag, received.data(),
                            static_cast<int>(peer_size), MPI_BYTE, peer, kEndpointTag, comm, MPI_STATUS_IGNORE));
  return received;
}

}  // namespace

MemoryKind choose_buffer_memory(MemoryKind parameters,
                                std::span<const std::pair<TransportKind, TransportCapabilities>> transports) {
  if (parameters == MemoryKind::kHost) return MemoryKind::kHost;
  bool device = true, host = true;
  std::string names;
  for (const auto& [kind, capabilities] : transports) {
    device = device && capabilities.cuda_memory;
    host = host && capabilities.host_memory;
    names += std::string(names.empty() ? "" : ", ") + transport_name(kind) + " (registers " +
             (capabilities.cuda_memory && capabilities.host_memory ? "CUDA and host"
              : capabilities.cuda_memory                           ? "CUDA"
              : capabilities.host_memory                           ? "host"
                                                                   : "no") +
             " memory)";
  }
  if (device) return MemoryKind::kCuda;
  if (host) return MemoryKind::kHost;
  throw Error(ErrorCode::kUnsupported, "no memory for the transfer buffers of CUDA parameters that every transport of "
                                       "this rank can register: " + names +
                                       "; choose one transport for all pairs (WB_TRANSPORT)");
}

RoundExecutor::RoundExecutor(RoundSchedule schedule, ParameterMemory parameters, MPI_Comm comm, ExecutorOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.schedule = std::move(schedule);
  s.parameters = std::move(parameters);
  // A communicator of its own: grants left over from this executor's last update can never be taken
  // for another executor's. Errors return (to the checks) even where the job's handler aborts.
  WB_CHECK_MPI(MPI_Comm_dup(comm, &s.comm));
  WB_CHECK_MPI(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN));
  comm = s.comm;
  s.options = options;
  s.idle_sleep_us = *idle_sleep_us_setting;
  if (s.idle_sleep_us < 0 || s.idle_sleep_us > 100000)
    throw Error(ErrorCode::kInvalidArgument, "idle_sleep_us " + std::to_string(s.idle_sleep_us) +
                                                 " (WB_IDLE_SLEEP_US) is not in [0, 100000]");
  WB_CHECK_MPI(MPI_Comm_rank(comm, &s.rank));
  int size = 0;
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  if (s.schedule.rank != s.rank)
    throw Error(ErrorCode::kInvalidArgument, "round schedule of rank " + std::to_string(s.schedule.rank) +
                                                 " given to rank " + std::to_string(s.rank));
  const bool cuda_parameters = s.parameters.memory == MemoryKind::kCuda;
#if WB_HAVE_CUDA
  if (cuda_parameters && cuda_device_count() == 0)
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(s.rank) + ": parameters in CUDA memory, but no CUDA device (" +
                                             cuda_unavailable_reason() + ")");
  // The parameters' device is current while transports, buffers and programs are made (cuda_ipc, for
  // one, works on the device current when it is created).
  std::optional<DeviceScope> device_scope;
  if (cuda_parameters) device_scope.emplace(s.parameters.device);
#else
  if (cuda_parameters)
    throw Error(ErrorCode::kUnsupported,
                "rank " + std::to_string(s.rank) + ": parameters in CUDA memory, but the library was built without CUDA");
#endif
  s.depth = std::max(1, s.schedule.pipeline_depth);
  s.rounds = static_cast<int>(s.schedule.rounds.size());

  // The machine every rank is on decides the transport of each pair.
  const std::string machine = machine_id();
  constexpr std::size_t kIdBytes = 256;
  std::vector<char> machines(static_cast<std::size_t>(size) * kIdBytes, '\0');
  {
    char mine[kIdBytes] = {};
    std::strncpy(mine, machine.c_str(), kIdBytes - 1);
    WB_CHECK_MPI(MPI_Allgather(mine, static_cast<int>(kIdBytes), MPI_CHAR, machines.data(), static_cast<int>(kIdBytes),
                               MPI_CHAR, comm));
  }
  for (int peer : s.schedule.peers) {
    if (peer < 0 || peer >= size || peer == s.rank)
      throw Error(ErrorCode::kInvalidArgument, "round schedule names peer " + std::to_string(peer));
    const bool same_machine = machine == std::string(&machines[static_cast<std::size_t>(peer) * kIdBytes]);
    const TransportKind kind = choose_transport(same_machine, s.parameters.memory, options.transport);
    if (!s.transports.count(kind)) s.transports.emplace(kind, make_transport(kind, s.rank));
    s.peers[peer].transport = s.transports[kind].get();
  }

  // The buffers: where every transport can register them, allocated once.
  std::vector<std::pair<TransportKind, TransportCapabilities>> capabilities;
  for (const auto& [kind, transport] : s.transports) capabilities.emplace_back(kind, transport->capabilities());
  s.stats.buffer_memory = choose_buffer_memory(s.parameters.memory, capabilities);
  MemoryKind registered_memory = MemoryKind::kHost;
  static std::byte no_buffer{};  // empty buffers still get a registration, so that every peer has a key
  std::size_t send_registered = 1, receive_registered = 1;
  if (!cuda_parameters) {
    s.send_slot_stride = s.schedule.send_slot_bytes;
    s.receive_slot_stride = s.schedule.receive_slot_bytes;
    s.send_buffer.allocate(static_cast<std::size_t>(s.depth * s.send_slot_stride));
    s.receive_buffer.allocate(static_cast<std::size_t>(s.depth * s.receive_slot_stride));
    s.send_base = s.send_buffer.empty() ? &no_buffer : s.send_buffer.data();
    s.receive_base = s.receive_buffer.empty() ? &no_buffer : s.receive_buffer.data();
    send_registered = std::max<std::size_t>(1, s.send_buffer.size());
    receive_registered = std::max<std::size_t>(1, s.receive_buffer.size());
  } else {
#if WB_HAVE_CUDA
    // Slots 256-byte aligned: one compiled program serves every slot (kernels::DeviceCopyProgram::execute).
    constexpr std::int64_t kSlotAlignment = 256;
    const auto aligned = [](std::int64_t bytes) { return (bytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment; };
    s.send_slot_stride = aligned(s.schedule.send_slot_bytes);
    s.receive_slot_stride = aligned(s.schedule.receive_slot_bytes);
    send_registered = static_cast<std::size_t>(std::max(kSlotAlignment, s.depth * s.send_slot_stride));
    receive_registered = static_cast<std::size_t>(std::max(kSlotAlignment, s.depth * s.receive_slot_stride));
    s.device = std::make_unique<DeviceResources>(s.parameters.device, s.stats.buffer_memory == MemoryKind::kCuda,
                                                 send_registered, receive_registered, s.depth);
    s.send_base = s.device->send();
    s.receive_base = s.device->receive();
    registered_memory = s.stats.buffer_memory;
#endif
  }
  for (const auto& [kind, transport] : s.transports) {
    const int device = registered_memory == MemoryKind::kCuda ? s.parameters.device : 0;
    const MemoryRegistration send = transport->register_memory(s.send_base, send_registered, registered_memory, device);
    const MemoryRegistration receive =
        transport->register_memory(s.receive_base, receive_registered, registered_memory, device);
    s.stats.registrations += 2;
    s.local_memory[kind] = {send.id, receive.id};
    s.receive_keys[kind] = receive.remote_key;
  }

  // Batches longer than a transport takes in one post are split; each post notifies the receiver, which
  // must then expect that many arrivals. Per peer: (round, stage, posts) of every split batch, sent with
  // the connect record (a relay's two batches to one peer in one stage, lag 0 and lag 1, are announced
  // apart; the receiver adds up what each adds).
  std::map<int, std::vector<std::uint64_t>> split_batches;  // peer -> round, stage, posts, ...
  {
    std::map<std::tuple<int, int, int, int>, std::size_t> writes;  // (peer, round, stage, lag) -> writes
    for (int r = 0; r < s.rounds; ++r)
      for (const Write& write : s.schedule.rounds[static_cast<std::size_t>(r)].writes)
        ++writes[{write.peer, r, static_cast<int>(write.stage), write.lag}];
    for (const auto& [key, count] : writes) {
      const auto [peer, r, stage, lag] = key;
      const std::size_t per_post = writes_per_post(*s.peers.at(peer).transport);
      if (count <= per_post) continue;
      ++s.stats.split_batches;
      split_batches[peer].insert(split_batches[peer].end(), {static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(stage),
                                                              (count + per_post - 1) / per_post});
    }
  }
  std::vector<std::array<int, kStageCount>> extra_arrivals(static_cast<std::size_t>(s.rounds), std::array<int, kStageCount>{});
  std::vector<std::vector<std::tuple<int, std::size_t, int>>> extra_from(static_cast<std::size_t>(s.rounds));  // peer, stage, posts - 1

  // Connect every pair: both sides send their endpoint for the other, their receive buffer's key and slot
  // size, and their split batches; peers in ascending order on both sides, so the pairwise exchanges cannot
  // deadlock.
  for (auto& [peer, link] : s.peers) {
    const TransportKind kind = link.transport->kind();
    exec::ConnectRecord mine{static_cast<std::uint64_t>(kind), static_cast<std::uint64_t>(s.receive_slot_stride),
                             link.transport->endpoint(peer), s.receive_keys[kind], split_batches[peer]};
    const exec::ConnectRecord theirs = exec::decode_connect_record(swap_record(peer, exec::encode_connect_record(mine), comm), peer);
    const auto their_kind = static_cast<TransportKind>(theirs.transport);
    if (their_kind != kind)
      throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(s.rank) + " would reach rank " +
                                                   std::to_string(peer) + " over " + transport_name(kind) +
                                                   ", the peer over " + transport_name(their_kind));
    link.receive_slot_stride = static_cast<std::int64_t>(theirs.receive_slot_stride);
    link.transport->connect(peer, theirs.endpoint);
    link.receive_memory = link.transport->import_memory(peer, theirs.memory_key);
    for (std::size_t i = 0; i < theirs.split_batches.size(); i += 3) {
      const std::uint64_t r = theirs.split_batches[i], stage = theirs.split_batches[i + 1], posts = theirs.split_batches[i + 2];
      if (r >= static_cast<std::uint64_t>(s.rounds) || stage >= kStageCount || posts < 2 || posts > (1u << 30))
        throw Error(ErrorCode::kCorruptData, "rank " + std::to_string(peer) + " announced a split batch for round " +
                                                 std::to_string(r) + " stage " + std::to_string(stage) + " in " +
                                                 std::to_string(posts) + " posts");
      extra_arrivals[r][stage] += static_cast<int>(posts) - 1;
      extra_from[r].emplace_back(peer, static_cast<std::size_t>(stage), static_cast<int>(posts) - 1);
    }
  }

  // Per round: the batches (one per peer and stage, writes in schedule order), the arrivals expected, the
  // writers to grant, the compiled pack and assemble.
  const std::vector<std::int64_t> parameter_bytes(s.parameters.bytes.begin(), s.parameters.bytes.end());
  s.work.resize(static_cast<std::size_t>(s.rounds));
  for (int r = 0; r < s.rounds; ++r) {
    const RoundPlan& plan = s.schedule.rounds[static_cast<std::size_t>(r)];
    RoundWork& work = s.work[static_cast<std::size_t>(r)];
    for (const Write& write : plan.writes) {
      if (work.batches.empty() || work.batches.back().peer != write.peer || work.batches.back().stage != write.stage ||
          work.batches.back().lag != write.lag) {
        work.batches.push_back({write.peer, write.stage, write.lag, {}, 0, writes_per_post(*s.peers.at(write.peer).transport)});
        if (write.lag != 0) ++work.relay_batches;
      }
      Batch& batch = work.batches.back();
      const TransportKind kind = s.peers.at(write.peer).transport->kind();
      const auto [send_id, receive_id] = s.local_memory.at(kind);
      batch.writes.push_back({write.stage == Stage::kReceive ? send_id : receive_id, static_cast<std::uint64_t>(write.local_offset),
                              s.peers.at(write.peer).receive_memory, static_cast<std::uint64_t>(write.remote_offset),
                              static_cast<std::uint64_t>(write.bytes)});
      batch.bytes += write.bytes;
    }
    for (const Arrival& arrival : plan.arrivals) {
      ++work.arrivals[static_cast<std::size_t>(arrival.stage)];
      work.writers.push_back(arrival.peer);
    }
    for (std::size_t stage = 0; stage < kStageCount; ++stage)
      work.arrivals[stage] += extra_arrivals[static_cast<std::size_t>(r)][stage];
    std::sort(work.writers.begin(), work.writers.end());
    work.writers.erase(std::unique(work.writers.begin(), work.writers.end()), work.writers.end());
    work.expected_from.assign(work.writers.size(), std::array<int, kStageCount>{});
    const auto writer_index = [&work](int peer) {
      return static_cast<std::size_t>(std::lower_bound(work.writers.begin(), work.writers.end(), peer) - work.writers.begin());
    };
    for (const Arrival& arrival : plan.arrivals) ++work.expected_from[writer_index(arrival.peer)][static_cast<std::size_t>(arrival.stage)];
    for (const auto& [peer, stage, extra] : extra_from[static_cast<std::size_t>(r)]) work.expected_from[writer_index(peer)][stage] += extra;
    work.packs = !plan.pack.empty();
    if (!cuda_parameters) {
      work.pack = exec::CopyProgram(exec::CopyDirection::kPack, plan.pack, parameter_bytes, s.schedule.send_slot_bytes);
      work.assemble =
          exec::CopyProgram(exec::CopyDirection::kAssemble, plan.assemble, parameter_bytes, s.schedule.receive_slot_bytes);
      work.assembled_bytes = work.assemble.bytes();
    } else {
#if WB_HAVE_CUDA
      // Compiled for slot 0; every other slot has its alignment.
      work.device_pack = kernels::DeviceCopyProgram(
          kernels::compile_copy_work(exec::CopyDirection::kPack, plan.pack, s.parameters.data, parameter_bytes,
                                     s.device->send_for_kernels(), s.schedule.send_slot_bytes),
          s.parameters.device);
      work.device_assemble = kernels::DeviceCopyProgram(
          kernels::compile_copy_work(exec::CopyDirection::kAssemble, plan.assemble, s.parameters.data, parameter_bytes,
                                     s.device->receive_for_kernels(), s.schedule.receive_slot_bytes),
          s.parameters.device);
      work.assembled_bytes = work.device_assemble.bytes();
#endif
    }
    std::size_t most = 0;
    for (const Batch& batch : work.batches) most = std::max(most, std::min(batch.writes.size(), batch.writes_per_post));
    s.scratch.reserve(std::max(s.scratch.capacity(), most));
  }
  s.ring.assign(static_cast<std::size_t>(4 * s.depth + 4), RoundProgress{});
  std::size_t most_writers = 0;
  for (const RoundWork& work : s.work) most_writers = std::max(most_writers, work.writers.size());
  for (RoundProgress& p : s.ring) p.arrived_from.assign(most_writers, std::array<int, kStageCount>{});
  if (options.verify) {
    if (cuda_parameters)
      throw Error(ErrorCode::kUnsupported, "verify checks host transfer buffers; these parameters are in CUDA memory");
    s.verifier = std::make_unique<exec::Verifier>(s.schedule, comm, kDigestTag, parameter_bytes, s.schedule.send_slot_bytes,
                                                  s.schedule.receive_slot_bytes);
  }
  s.completions.reserve(1024);
  s.grant_requests.reserve(256);
  WB_CHECK_MPI(MPI_Barrier(comm));  // every pair connected before anyone writes
}

Status RoundExecutor::run_update() {
  State& s = *state_;
  const auto started = Clock::now();
  auto last_progress = started;
  const auto depth = static_cast<std::uint64_t>(s.depth);
  const std::uint64_t first = s.next_round, end = first + static_cast<std::uint64_t>(s.rounds);
  std::uint64_t oldest = first;  // the oldest round of this update this rank has not finished
  const auto slot_of = [&](std::uint64_t g) { return static_cast<std::size_t>(g % depth); };
  // A peer that gave up before this update began: nothing is written or assembled.
  if (s.options.interrupt) WB_RETURN_IF_ERROR(s.options.interrupt(nullptr));
  if (s.verifier) s.verifier->begin_update();
  auto last_interrupt_check = started;

  while (oldest < end) {
    bool progressed = false;
    s.completions.clear();
    for (auto& [kind, transport] : s.transports) {
      Status status = transport->poll(s.completions);
      if (!status) return status;
    }
    for (const Completion& c : s.completions) {
      progressed = true;
      if (c.kind == Completion::Kind::kWritesDone) {
        const std::uint64_t g = c.token & ~kRelayToken;
        RoundProgress& done = s.progress(g);
        ++done.done;
        if (c.token & kRelayToken) ++done.relay_done;
        if (s.options.trace && done.done == done.posts && done.posted == static_cast<int>(s.work[static_cast<std::size_t>(
                                                                              g % static_cast<std::uint64_t>(s.rounds))].batches.size())) {
          // Transports complete a peer's posts in order but not across peers: one span per round and kind,
          // from its first post to the last completion.
          const double now = local_seconds_now();
          if (done.write_begin > 0) s.trace(ExecutorSpan::kWrite, g, done.write_begin, now);
          if (done.forward_begin > 0) s.trace(ExecutorSpan::kForward, g, done.forward_begin, now);
        }
        continue;
      }
      const std::uint64_t tag = c.immediate >> 2;
      const std::uint64_t g = oldest + ((tag - oldest) & kRoundMask);
      const auto stage = static_cast<std::size_t>(c.immediate & 3u);
      if (stage >= kStageCount || g >= oldest + 2 * depth + 1)
        return Status(ErrorCode::kCorruptData, s.name(s.rank) + " got a write notification for round " + std::to_string(g) +
                                                   " stage " + std::to_string(stage) + " from " + s.name(c.peer) +
                                                   " while at round " + std::to_string(oldest));
      RoundProgress& arrived = s.progress(g);
      ++arrived.arrived[stage];
      const std::vector<int>& writers = s.work[static_cast<std::size_t>(g % static_cast<std::uint64_t>(s.rounds))].writers;
      const auto writer = std::lower_bound(writers.begin(), writers.end(), c.peer);
      if (writer != writers.end() && *writer == c.peer)
        ++arrived.arrived_from[static_cast<std::size_t>(writer - writers.begin())][stage];
    }
    // Grants: MPI delivers one peer's messages in order, so the latest is the largest.
    for (;;) {
      int flag = 0;
      MPI_Status status;
      WB_TRY_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kGrantTag, s.comm, &flag, &status));
      if (!flag) break;
      std::uint64_t granted = 0;
      WB_TRY_MPI(MPI_Recv(&granted, 1, MPI_UINT64_T, status.MPI_SOURCE, kGrantTag, s.comm, MPI_STATUS_IGNORE));
      auto it = s.peers.find(status.MPI_SOURCE);
      if (it != s.peers.end()) it->second.granted = std::max(it->second.granted, granted + 1);
      progressed = true;
    }

    for (std::uint64_t g = oldest; g < end && g < oldest + depth; ++g) {
      const auto r = static_cast<std::size_t>(g % static_cast<std::uint64_t>(s.rounds));
      RoundWork& work = s.work[r];
      RoundProgress& p = s.progress(g);
      if (work.packs && !p.packed) {
#if WB_HAVE_CUDA
        if (s.device) {
          Status status = s.device_step(work.device_pack, s.device->send_for_kernels(), s.send_slot_stride, slot_of(g),
                                        s.device->pack_timing(slot_of(g)), p.pack_launched, p.packed,
                                        s.stats.pack_seconds, progressed, "pack", g);
          if (!status) return status;
        } else
#endif
        {
          const auto t0 = Clock::now();
          std::byte* slot = s.send_base + slot_of(g) * static_cast<std::size_t>(s.send_slot_stride);
          if (s.verifier) s.verifier->pack(static_cast<int>(r), s.parameters.data, slot);  // packs and digests
          else work.pack.execute(s.parameters.data, slot);
          const auto t1 = Clock::now();
          s.stats.pack_seconds += std::chrono::duration<double>(t1 - t0).count();
          s.trace(ExecutorSpan::kPack, g, seconds_of(t0), seconds_of(t1));
          p.packed = true;
          progressed = true;
        }
      }
      const auto complete = [&](Stage stage) {
        return p.arrived[static_cast<std::size_t>(stage)] == work.arrivals[static_cast<std::size_t>(stage)];
      };
      // A relay batch reads round g - 1's slot, which stays unreleased until it is done (below).
      const auto previous_complete = [&] {
        const RoundWork& before = s.work[static_cast<std::size_t>((g - 1) % static_cast<std::uint64_t>(s.rounds))];
        const RoundProgress& q = s.progress(g - 1);
        return q.arrived[0] == before.arrivals[0] && q.arrived[1] == before.arrivals[1];
      };
      while (p.posted < static_cast<int>(work.batches.size())) {
        const Batch& batch = work.batches[static_cast<std::size_t>(p.posted)];
        const bool ready = batch.stage == Stage::kReceive ? (!work.packs || p.packed)
                           : batch.lag != 0 ? g > first && previous_complete()
                           : batch.stage == Stage::kExternalExchange
                               ? complete(Stage::kReceive)
                               : complete(Stage::kReceive) && complete(Stage::kExternalExchange);
        PeerLink& link = s.peers.at(batch.peer);
        if (!ready) break;
        if (g >= depth && link.granted <= g) {  // ready, but the receiver's slot is not free yet
          if (s.options.trace && p.credit_wait_begin == 0) p.credit_wait_begin = local_seconds_now();
          break;
        }
        if (p.credit_wait_begin > 0) {
          s.trace(ExecutorSpan::kCreditWait, g, p.credit_wait_begin, local_seconds_now());
          p.credit_wait_begin = 0;
        }
        const std::size_t count = std::min(batch.writes_per_post, batch.writes.size() - p.next_write);
        const auto chunk = batch.writes.begin() + static_cast<std::ptrdiff_t>(p.next_write);
        s.scratch.assign(chunk, chunk + static_cast<std::ptrdiff_t>(count));
        const std::uint64_t local_base =
            slot_of(g - batch.lag) * static_cast<std::uint64_t>(batch.stage == Stage::kReceive ? s.send_slot_stride : s.receive_slot_stride);
        const std::uint64_t remote_base = slot_of(g) * static_cast<std::uint64_t>(link.receive_slot_stride);
        for (WriteRequest& w : s.scratch) {
          w.local_offset += local_base;
          w.remote_offset += remote_base;
        }
        Status status = link.transport->post_writes(batch.peer, s.scratch, encode_immediate(g, batch.stage),
                                                    batch.lag != 0 ? g | kRelayToken : g);
        if (status.code() == ErrorCode::kRetryLater) break;
        if (!status)
          return Status(status.code(), s.name(s.rank) + ": its " + stage_name(batch.stage) + " stage write to " +
                                           s.name(batch.peer) + " failed: " + status.message());
        for (const WriteRequest& w : s.scratch) s.stats.bytes_written += static_cast<std::int64_t>(w.bytes);
        if (s.options.trace) {
          double& begin = batch.stage == Stage::kReceive ? p.write_begin : p.forward_begin;
          if (begin == 0) begin = local_seconds_now();
        }
        ++p.posts;
        if (batch.lag != 0) ++p.relay_posts;
        p.next_write += count;
        if (p.next_write == batch.writes.size()) {
          ++p.posted;
          if (batch.lag != 0) ++p.relay_posted;
          p.next_write = 0;
        }
        progressed = true;
      }
      if (!p.assembled && complete(Stage::kReceive) && complete(Stage::kExternalExchange) &&
          complete(Stage::kInternalExchange)) {
#if WB_HAVE_CUDA
        if (s.device) {
          Status status = s.device_step(work.device_assemble, s.device->receive_for_kernels(), s.receive_slot_stride,
                                        slot_of(g), s.device->assemble_timing(slot_of(g)), p.assemble_launched,
                                        p.assembled, s.stats.assemble_seconds, progressed, "assemble", g);
          if (!status) return status;
        } else
#endif
        {
          const auto t0 = Clock::now();
          std::byte* slot = s.receive_base + slot_of(g) * static_cast<std::size_t>(s.receive_slot_stride);
          if (s.verifier) s.verifier->assemble(static_cast<int>(r), s.parameters.data, slot);  // digests and assembles
          else work.assemble.execute(s.parameters.data, slot);
          const auto t1 = Clock::now();
          s.stats.assemble_seconds += std::chrono::duration<double>(t1 - t0).count();
          if (work.assembled_bytes > 0) s.trace(ExecutorSpan::kAssemble, g, seconds_of(t0), seconds_of(t1));
          p.assembled = true;
          progressed = true;
        }
        if (p.assembled) s.stats.bytes_assembled += work.assembled_bytes;
      }
      // Slots are released in round order, so that a peer's grants arrive in order and the latest one
      // stands for every round before it; a slot that round g + 1 relays out of, only once those relays
      // are done (g + 1 < oldest + depth: depth >= 2 wherever a schedule relays).
      const auto relays_done = [&] {
        const RoundWork& next = s.work[static_cast<std::size_t>((g + 1) % static_cast<std::uint64_t>(s.rounds))];
        if (next.relay_batches == 0 || g + 1 >= end) return true;
        const RoundProgress& q = s.progress(g + 1);
        return q.relay_posted == next.relay_batches && q.relay_done == q.relay_posts;
      };
      if (!p.released && p.assembled && (!work.packs || p.packed) && p.posted == static_cast<int>(work.batches.size()) &&
          p.done == p.posts && (g == oldest || s.progress(g - 1).released) && relays_done()) {
        // The slot is free again: whoever writes into it depth rounds later may go ahead.
        const std::uint64_t next = g + depth;
        for (int writer : s.work[static_cast<std::size_t>(next % static_cast<std::uint64_t>(s.rounds))].writers) {
          Status status = s.send_grant(writer, next);
          if (!status) return status;
        }
        p.released = true;
        progressed = true;
      }
    }
    while (oldest < end && s.progress(oldest).released) ++oldest;

    const auto now = Clock::now();
    if (progressed) {
      last_progress = now;
    } else if (s.options.interrupt && now - last_interrupt_check > std::chrono::milliseconds(1)) {
      // Idle: a peer that gave up ends this update at once rather than at the deadline; a peer that asks
      // what this rank waits for is told.
      last_interrupt_check = now;
      WB_RETURN_IF_ERROR(s.options.interrupt([&s, oldest] { return s.wait_state(oldest); }));
    }
    if (!progressed && std::chrono::duration<double>(now - last_progress).count() > s.options.timeout_seconds) {
      const WaitState state = s.wait_state(oldest);
      std::ostringstream timeout;
      timeout << s.options.timeout_seconds;
      return Status(ErrorCode::kTimeout, s.name(s.rank) + ": no progress for " + timeout.str() + " s in round " +
                                             std::to_string(oldest % static_cast<std::uint64_t>(s.rounds) + 1) + " of " +
                                             std::to_string(s.rounds) + ", waiting for " + state.first +
                                             (s.options.explain ? s.options.explain(state.second) : std::string()));
    }
    // Nothing moved: let the processes that have work run first (on one machine ranks often outnumber
    // cores, and a spinning rank would take the core from the peer it waits for). Yield at first; once idle
    // for longer, sleep a little, growing to idle_sleep_us: a wait of milliseconds (a round on the wire)
    // then costs no core, and a busy link is noticed within the sleep.
    if (!progressed) {
      const auto idle = std::chrono::duration_cast<std::chrono::microseconds>(now - last_progress).count();
      if (idle < 50 || s.idle_sleep_us == 0)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(std::min<std::int64_t>(idle / 8 + 1, s.idle_sleep_us)));
    }
  }
  // Grants still in flight complete in the background; reap the finished ones.
  for (MPI_Request& request : s.grant_requests) {
    int done = 0;
    if (request != MPI_REQUEST_NULL) WB_TRY_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  }
  if (s.verifier) {
    const std::function<std::string(std::uint32_t, std::int64_t)> element =
        s.options.describe_element ? s.options.describe_element : [](std::uint32_t parameter, std::int64_t e) {
          return "parameter " + std::to_string(parameter) + " element " + std::to_string(e);
        };
    const std::function<Status()> poll = [&s]() { return s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok(); };
    WB_RETURN_IF_ERROR(s.verifier->exchange(s.options.timeout_seconds, poll,
                                            [&s](int peer) { return s.name(peer); }, element));
  }
  s.next_round = end;
  ++s.stats.updates;
  s.stats.last_update_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  s.stats.traffic.clear();
  for (const auto& [kind, transport] : s.transports)
    for (const PeerTraffic& link : transport->traffic()) s.stats.traffic.emplace_back(kind, link);
  return Status::ok();
}

RoundExecutor::~RoundExecutor() {
  if (!state_) return;
  // Grants are eager 8-byte messages: their sends complete whether or not anyone receives them.
  for (MPI_Request& request : state_->grant_requests)
    if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
  state_->transports.clear();
  // Not freed: a freed context id goes to the next communicator, and a grant still in flight after a failed
  // update would then credit that communicator's executor with a slot it never released.
}

const ExecutorStats& RoundExecutor::stats() const { return state_->stats; }
const RoundSchedule& RoundExecutor::schedule() const { return state_->schedule; }

}  // namespace wb
