#include "comm/join.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "comm/dead_job.hpp"
#include "comm/operation.hpp"
#include "comm/stranded.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"

namespace wb::comm {
namespace {

constexpr int kSecretTag = 31001, kVerdictTag = 31002, kWidenTag = 31003;
constexpr int kPinTag = 31004;  // abandon_link's receive: nothing is ever sent with it
constexpr int kTakeTag = 31005, kReadyTag = 31006;
constexpr int kCopyTag = 31007, kGoTag = 31008;  // a catch-up link made ahead of the joiner's probe
constexpr std::size_t kSecretChars = 64;
// What a peer presents: one character, a join or a knock (ends the accept thread), then the secret.
constexpr char kJoin = 'j', kKnock = 'k';
constexpr std::size_t kPresentedChars = 1 + kSecretChars;
constexpr const char* kHeader = "weightbridge-join-address 1";

// Constant time in the secret's length: a refused peer learns nothing from how long the answer took.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// One blocking MPI call that makes a communicator (no deadline in MPI: connect, merge, widening), run on a
// thread and waited for up to `timeout`. A call given up on keeps its thread and everything it holds to the
// end of the process, and is named to MPI_Finalize's hook (`what`) while inside MPI; one that returns after
// all says so (a connect to a job that died returns only at its mpirun's deadline, comm/dead_job.hpp, and
// tells whether the process can pair again) and abandons what it made: the caller has gone on without it,
// and MPI_Finalize must not wait for that job over it.
struct Bounded {
  bool completed = false;
  int rc = MPI_SUCCESS;
  MPI_Comm result = MPI_COMM_NULL;
};
Bounded run_bounded(std::function<int(MPI_Comm*)> make, double timeout, const std::string& what) {
  enum : int { kRunning, kDone, kGivenUp };
  struct Call {
    std::atomic<int> state{kRunning};
    std::atomic<long> thread{0};  // the maker's kernel id (comm/stranded.hpp)
    std::atomic<double> given_up_at{0};
    int rc = MPI_SUCCESS;
    MPI_Comm result = MPI_COMM_NULL;
  };
  auto call = std::make_shared<Call>();
  std::thread maker([call, make = std::move(make), what] {
    call->thread.store(kernel_thread_id());
    call->rc = make(&call->result);
    int running = kRunning;
    if (call->state.compare_exchange_strong(running, kDone)) return;
    unstrand(call.get());
    WB_LOG(kInfo) << what << " given up on " << seconds_text(local_seconds() - call->given_up_at.load()) << " ago returned ("
                  << (call->rc == MPI_SUCCESS ? std::string("made after all; let go") : detail::mpi_error_string(call->rc)) << ")";
    if (call->rc == MPI_SUCCESS) abandon_link(call->result);
  });
  Backoff backoff;
  for (const double start = local_seconds(); call->state.load() == kRunning; backoff.pause()) {
    if (local_seconds() - start <= timeout) continue;
    call->given_up_at.store(local_seconds());
    strand(call.get(), what, call->thread.load());  // before the thread can see it given up (it then unstrands)
    int running = kRunning;
    if (!call->state.compare_exchange_strong(running, kGivenUp)) {
      unstrand(call.get());  // it completed meanwhile
      break;
    }
    maker.detach();
    keep_alive(call);
    return {};
  }
  maker.join();
  return {true, call->rc, call->result};
}

// MPI_Comm_connect to `port`, bounded by `timeout`, over a duplicate of MPI_COMM_SELF that returns errors
// (a runtime without connect must not abort the job through the application's handler on MPI_COMM_SELF).
Bounded connect_bounded(const std::string& port, double timeout, const std::string& what) {
  return run_bounded(
      [port](MPI_Comm* made) {
        MPI_Comm self = MPI_COMM_NULL;
        int rc = MPI_Comm_dup(MPI_COMM_SELF, &self);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(self, MPI_ERRORS_RETURN);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_connect(port.c_str(), MPI_INFO_NULL, 0, self, made);
        if (self != MPI_COMM_NULL) MPI_Comm_free(&self);
        return rc;
      },
      timeout, what);
}

// The calls of this process given up on and still inside MPI, other than one named `self` (a later
// connect's likely cause when it times out), joined by "; " ("": none).
std::string others_still_inside(const std::string& self) {
  std::vector<std::string> calls = stranded_calls();
  if (auto own = std::ranges::find(calls, self); own != calls.end()) calls.erase(own);
  std::string names;
  for (const std::string& call : calls) names += (names.empty() ? "" : "; ") + call;
  return names;
}

}  // namespace

void require_thread_multiple(const std::string& who, const char* why) {
  int level = MPI_THREAD_SINGLE;
  WB_CHECK_MPI(MPI_Query_thread(&level));
  if (level < MPI_THREAD_MULTIPLE)
    throw Error(ErrorCode::kUnsupported, who + " " + why + " and needs MPI_THREAD_MULTIPLE: use MPI_Init_thread");
}

std::string make_join_secret() {
  std::random_device device;
  static const char digits[] = "0123456789abcdef";
  std::string secret;
  while (secret.size() < kSecretChars) {
    const unsigned bits = device();
    for (int i = 0; i < 8 && secret.size() < kSecretChars; ++i) secret += digits[(bits >> (4 * i)) & 15u];
  }
  return secret;
}

void write_address_file(const std::string& path, const JoinAddress& address) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw Error(ErrorCode::kSystem, "the join address file " + path + " cannot be created (" + std::strerror(errno) +
                                        (errno == EEXIST ? "; a file of an earlier job? remove it" : "") + ")");
  const std::string text = std::string(kHeader) + "\n" + address.port + "\n" + address.secret + "\n";
  const ssize_t written = ::write(fd, text.data(), text.size());
  const int saved = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(text.size())) {
    ::unlink(path.c_str());
    throw Error(ErrorCode::kSystem, "writing the join address file " + path + " failed (" + std::strerror(saved) + ")");
  }
}

JoinAddress read_address_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kNotFound, "the join address file " + path + " cannot be read (" + std::strerror(errno) + ")");
  std::string header;
  JoinAddress address;
  std::getline(in, header);
  std::getline(in, address.port);
  std::getline(in, address.secret);
  if (header != kHeader || address.port.empty() || address.secret.size() != kSecretChars)
    throw Error(ErrorCode::kInvalidArgument, "the join address file " + path + " is not one a trainer job wrote (\"" +
                                                 kHeader + "\", a port, a secret of " + std::to_string(kSecretChars) +
                                                 " hexadecimal digits)");
  return address;
}

// An accept that fails within this, on a port that never paired, is the runtime's (it has no accept).
constexpr double kNoAcceptSeconds = 1.0;
constexpr int kAcceptFailuresInARow = 3;

struct JoinPort::Shared {
  JoinAddress address;
  double timeout = 0;
  // The accept thread's duplicate of MPI_COMM_SELF (two threads may not run collectives on one
  // communicator at once).
  MPI_Comm accept_comm = MPI_COMM_NULL;
  std::atomic<bool> stopping{false}, finished{false};
  std::atomic<bool> admitting{false};  // between an accept and its verdict: MPI calls in flight on this thread
  std::atomic<std::int64_t> refused{0};
  std::int64_t admit_at_most = 0;  // 0: until a knock
  std::int64_t admitted = 0;       // the accept thread's count
  std::mutex mutex;
  std::vector<MPI_Comm> joined;

  // One accepted peer: its secret within the timeout, then the verdict. Nothing else is sent to it. A knock
  // with the secret ends the accept loop instead (no verdict).
  bool admit(MPI_Comm peer) {
    const Waiter waiter{timeout, {}};
    OperationPtr secret = make_operation(0, kPresentedChars);
    if (MPI_Irecv(secret->in.data(), static_cast<int>(kPresentedChars), MPI_CHAR, 0, kSecretTag, peer, &secret->request) != MPI_SUCCESS)
      return false;
    const Status got = wait_for(secret, waiter, false, "a joiner's secret");
    const char* presented = reinterpret_cast<const char*>(secret->in.data());
    const bool genuine = got && same_secret(std::string(presented + 1, kSecretChars), address.secret);
    if (genuine && presented[0] == kKnock) {
      stopping.store(true);
      return false;
    }
    const bool admitted = genuine && presented[0] == kJoin;
    if (!admitted) {
      WB_LOG(kWarn) << "join port: a peer was refused before any plan or weight reached it: "
                    << (got ? std::string("it presented a wrong secret") : got.message());
    }
    if (!got) {
      refused.fetch_add(1);
      return false;  // a silent peer gets no verdict either
    }
    OperationPtr verdict = make_operation(sizeof(std::int64_t));
    const std::int64_t yes = admitted ? 1 : 0;
    std::memcpy(verdict->out.data(), &yes, sizeof yes);
    if (MPI_Isend(verdict->out.data(), 1, MPI_INT64_T, 0, kVerdictTag, peer, &verdict->request) != MPI_SUCCESS) return false;
    const Status told = wait_for(verdict, waiter, false, "the verdict to a joiner");
    if (!admitted) refused.fetch_add(1);  // counted once told: whoever reads the count may end the process
    return told && admitted;
  }

  void accept_loop() {
    bool paired = false;  // an accept completed on this port
    int failures = 0;     // in a row
    while (!stopping.load()) {
      MPI_Comm peer = MPI_COMM_NULL;
      const double called = local_seconds();
      const int rc = MPI_Comm_accept(address.port.c_str(), MPI_INFO_NULL, 0, accept_comm, &peer);
      if (rc != MPI_SUCCESS) {
        // A runtime without accept (srun --mpi=pmix) fails it at once, before the port ever paired; a joiner
        // whose job died while pairing with this port fails it at its mpirun's deadline (comm/dead_job.hpp):
        // the port then takes the next join. A failure that repeats ends it either way.
        const double waited = local_seconds() - called;
        if ((!paired && waited < kNoAcceptSeconds) || ++failures >= kAcceptFailuresInARow) {
          WB_LOG(kWarn) << "join port: MPI_Comm_accept failed (" << detail::mpi_error_string(rc) << ", after " << seconds_text(waited)
                        << (failures > 1 ? ", " + std::to_string(failures) + " times in a row" : std::string())
                        << "); no more joins are taken";
          break;
        }
        WB_LOG(kWarn) << "join port: MPI_Comm_accept failed after " << seconds_text(waited) << " (" << detail::mpi_error_string(rc)
                      << "): a joiner whose job ended while it connected; the port takes the next join";
        continue;
      }
      paired = true;
      failures = 0;
      admitting.store(true);  // before looking at `stopping`: ~JoinPort sets that, then waits for this
      if (stopping.load()) {
        admitting.store(false);
        abandon_link(peer);  // after stop_accepting (a knock): abandoned unheard
        break;
      }
      MPI_Comm_set_errhandler(peer, MPI_ERRORS_RETURN);
      if (admit(peer)) {
        std::lock_guard lock(mutex);
        joined.push_back(peer);
        if (++admitted == admit_at_most) stopping.store(true);
      } else {
        abandon_link(peer);  // refused or a knock: no disconnect (it may be gone)
      }
      admitting.store(false);
    }
    finished.store(true);
  }
};

JoinPort::JoinPort(std::string path, double timeout, std::int64_t admit_at_most)
    : path_(std::move(path)), shared_(std::make_shared<Shared>()) {
  require_thread_multiple("a trainer job that takes joins by address",
                          "runs MPI_Comm_accept / MPI_Comm_connect on a thread (they have no deadline in MPI)");
  check_dead_job_bound("a job that takes joins by address");
  check_tcp_progress_thread("a job that takes joins by address");
  shared_->timeout = timeout;
  shared_->admit_at_most = admit_at_most;
  // MPI_ERRORS_RETURN: where the runtime has no accept/connect (srun --mpi=pmix: measured), MPI_Comm_accept
  // fails instead of aborting the trainer job; joins are then off, with a warning, and the training goes on.
  shared_->accept_comm = duplicate(MPI_COMM_SELF);
  shared_->address.secret = make_join_secret();
  char port[MPI_MAX_PORT_NAME] = {};
  WB_CHECK_MPI(MPI_Open_port(MPI_INFO_NULL, port));
  shared_->address.port = port;
  write_address_file(path_, shared_->address);
  std::shared_ptr<Shared> shared = shared_;
  thread_ = std::thread([shared] { shared->accept_loop(); });
}

void JoinPort::stop_accepting() {
  // No new joiner finds the port from here on. A file that names another port by now is left alone: a
  // joined replica dropped while stopped, resumed later, must not remove the address of the one appointed
  // after it.
  try {
    if (read_address_file(path_).port == shared_->address.port) unlink(path_.c_str());
  } catch (const Error&) {
    // gone already (a second call, or the trainers removed a dropped replica's file)
  }
  shared_->stopping.store(true);
}

bool JoinPort::stopped() const { return shared_->finished.load(); }

void JoinPort::keep_fresh(double interval) {
  if (fresh_.joinable()) return;
  fresh_ = std::thread([shared = shared_, path = path_, interval] {
    Pace pace(interval);
    while (!shared->stopping.load()) {
      pace.before_step();
      (void)utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // gone (removed by the trainers): nothing to keep
      pace.after_step(true);
    }
  });
}

bool address_touched(const std::string& path, double seconds) {
  struct stat first {};
  if (stat(path.c_str(), &first) != 0) return false;
  Backoff backoff;
  for (const double start = local_seconds(); local_seconds() - start < seconds;) {
    backoff.pause();
    struct stat now {};
    if (stat(path.c_str(), &now) != 0) return false;
    if (now.st_mtim.tv_sec != first.st_mtim.tv_sec || now.st_mtim.tv_nsec != first.st_mtim.tv_nsec) return true;
  }
  return false;
}

AddressWatch::AddressWatch(std::string path, double silence)
    : path_(std::move(path)), silence_(silence), changed_at_(local_seconds()) {}

AddressWatch::Verdict AddressWatch::look() {
  const double now = local_seconds();
  if (last_ != Verdict::kAlive || now - read_at_ < 0.25) return last_;
  read_at_ = now;
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return last_ = Verdict::kGone;
  if (st.st_mtim.tv_sec != seen_sec_ || st.st_mtim.tv_nsec != seen_nsec_) {
    seen_sec_ = st.st_mtim.tv_sec;
    seen_nsec_ = st.st_mtim.tv_nsec;
    changed_at_ = now;
  } else if (now - changed_at_ > silence_) {
    last_ = Verdict::kSilent;
  }
  return last_;
}

Status AddressWatch::why(Verdict verdict) const {
  switch (verdict) {
    case Verdict::kAlive: return Status::ok();
    case Verdict::kGone:
      return Status(ErrorCode::kNotFound, "the address file " + path_ + " is gone: the trainers stopped taking joins (they shut "
                                                                        "down, or their port failed) before they took this engine");
    case Verdict::kSilent: break;
  }
  return Status(ErrorCode::kTimeout, "the trainers' port did not touch the address file " + path_ + " for " + seconds_text(silence_) +
                                         " (their job is stopped or dead; a live one touches it every " +
                                         seconds_text(kAddressTouchSeconds) + "), and had not taken this engine");
}

const std::string& JoinPort::port_name() const { return shared_->address.port; }

const JoinAddress& JoinPort::address() const { return shared_->address; }

JoinPort::~JoinPort() {
  stop_accepting();
  if (fresh_.joinable()) fresh_.join();  // ends within its interval once stopping
  // A joiner being admitted is finished with first (its secret and verdict have deadlines), and a knock
  // ends the accept: no MPI call of this thread may outlive MPI_Finalize (a thread left in MPI_Comm_accept
  // hung the process's MPI_Finalize in libevent, measured).
  Backoff backoff;
  for (const double start = local_seconds();
       (shared_->admitting.load() || !shared_->finished.load()) && local_seconds() - start < 2 * shared_->timeout;)
    backoff.pause();
  // Nothing wakes MPI_Comm_accept from inside its own process in Open MPI 4.1 (a connection to one's own
  // port never completes; measured): a thread still waiting there is left to the end of the process.
  if (!shared_->finished.load()) {
    WB_LOG(kWarn) << "join port " << path_ << ": the accept thread still waits in MPI_Comm_accept (nobody knocked)";
    thread_.detach();
    keep_alive(shared_);
    return;
  }
  thread_.join();
  MPI_Close_port(shared_->address.port.c_str());
}

std::optional<MPI_Comm> JoinPort::take() {
  return take([](MPI_Comm) { return true; });
}

std::optional<MPI_Comm> JoinPort::take(const std::function<bool(MPI_Comm)>& ready) {
  std::lock_guard lock(shared_->mutex);
  const auto found = std::find_if(shared_->joined.begin(), shared_->joined.end(), ready);
  if (found == shared_->joined.end()) return std::nullopt;
  const MPI_Comm peer = *found;
  shared_->joined.erase(found);
  return peer;
}

std::int64_t JoinPort::refused() const { return shared_->refused.load(); }

namespace {
// Open MPI pairs a connect with an accept by publishing "PORT:connect" and "PORT:accept" at the name server
// and looking up the other, each read once: two joiners connecting to one port at once may each take
// another's half, and then neither pair completes (measured: engine jobs started at once never joined, the
// accept thread stayed in MPI_Comm_accept, once the trainer job crashed in MPI_Finalize). So one joiner at a
// time connects: an exclusive flock on the address file, which every joiner opens anyway, held from before
// its connect until that connect returned (the accept's next publication is then the next joiner's). The
// kernel releases it when a joiner dies. A file system without flock (ENOLCK, ENOSYS): joiners go
// unordered, with a warning.
class ConnectTurn {
 public:
  ConnectTurn(const std::string& path, double deadline) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(ErrorCode::kNotFound, "the join address file " + path + " cannot be opened (" + std::strerror(errno) + ")");
    Backoff backoff;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        WB_LOG(kWarn) << "joining by " << path << ": the address file cannot be locked (" << std::strerror(errno)
                      << "); engine jobs that join at the same moment may then not join";
        return;
      }
      if (local_seconds() > deadline) {
        ::close(fd_);
        throw Error(ErrorCode::kTimeout, "joining by " + path + ": another engine job held its turn to connect until the deadline");
      }
      backoff.pause();
    }
  }
  /// The connect did not return: its half stays published, so the turn is kept to the end of this process.
  void keep() { fd_ = -1; }
  ~ConnectTurn() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  ConnectTurn(const ConnectTurn&) = delete;
  ConnectTurn& operator=(const ConnectTurn&) = delete;

 private:
  int fd_ = -1;
};
}  // namespace

MPI_Comm join_by_address(const std::string& path, double timeout) {
  require_thread_multiple("an engine that joins by address",
                          "runs MPI_Comm_accept / MPI_Comm_connect on a thread (they have no deadline in MPI)");
  check_dead_job_bound("an engine that joins by address");
  check_tcp_progress_thread("an engine that joins by address");
  const double deadline = local_seconds() + timeout;
  const JoinAddress address = read_address_file(path);
  const std::string what = "joining by " + path + ": the MPI_Comm_connect";
  Bounded call;
  {
    ConnectTurn turn(path, deadline);
    call = connect_bounded(address.port, std::max(0.0, deadline - local_seconds()), what);
    if (!call.completed) {
      turn.keep();
      const std::string earlier = others_still_inside(what);
      throw Error(ErrorCode::kTimeout,
                  "joining by " + path + ": MPI_Comm_connect did not complete within " + seconds_text(timeout) +
                      (earlier.empty() ? std::string(" (is the trainer job running, and were both jobs started with mpirun "
                                                     "--ompi-server file:URI of one ompi-server?)")
                                       : " while calls of this process given up on earlier were still inside MPI (" + earlier +
                                             "): one whose peer's job died holds Open MPI's TCP transport until this job's "
                                             "mpirun gives up on that job, which it never does under Open MPI's default: "
                                             "start every job that joins with mpirun --mca pmix_server_max_wait 5"));
    }
  }
  if (call.rc != MPI_SUCCESS)
    throw Error(ErrorCode::kMpi, "joining by " + path + ": MPI_Comm_connect failed: " + detail::mpi_error_string(call.rc) +
                                     " (jobs launched by srun --mpi=pmix have no accept/connect in Open MPI 4.1: start "
                                     "each job with mpirun --ompi-server file:URI, inside the allocation too)");
  const MPI_Comm peer = call.result;
  WB_CHECK_MPI(MPI_Comm_set_errhandler(peer, MPI_ERRORS_RETURN));
  const Waiter waiter{timeout, {}};
  OperationPtr secret = make_operation(kPresentedChars);
  secret->out[0] = static_cast<std::byte>(kJoin);
  std::memcpy(secret->out.data() + 1, address.secret.data(), kSecretChars);
  WB_CHECK_MPI(MPI_Isend(secret->out.data(), static_cast<int>(kPresentedChars), MPI_CHAR, 0, kSecretTag, peer, &secret->request));
  OperationPtr verdict = make_operation(0, sizeof(std::int64_t));
  WB_CHECK_MPI(MPI_Irecv(verdict->in.data(), 1, MPI_INT64_T, 0, kVerdictTag, peer, &verdict->request));
  wait_or_throw(secret, waiter, "joining by " + path + ": presenting the secret");
  wait_or_throw(verdict, waiter, "joining by " + path + ": the trainers' answer");
  std::int64_t yes = 0;
  std::memcpy(&yes, verdict->in.data(), sizeof yes);
  if (yes != 1) {
    abandon_link(peer);
    throw Error(ErrorCode::kInvalidArgument, "joining by " + path + ": the trainers refused the secret (the address file "
                                                                    "is not the one this trainer job wrote)");
  }
  return peer;
}

namespace {
// One small message each way, with rank `peer` (rank 0 on the leaders' intercommunicator): sends `word`
// with `say`, waits for `hear` as `waiter` says (its word in `heard`); the first when `first`, else the
// other way round.
Status exchange(MPI_Comm comm, int say, int hear, bool first, const Waiter& waiter, const std::string& what, int peer = 0,
                std::int64_t word = 1, std::int64_t* heard = nullptr) {
  OperationPtr in = make_operation(0, sizeof(std::int64_t));
  WB_TRY_MPI(MPI_Irecv(in->in.data(), 1, MPI_INT64_T, peer, hear, comm, &in->request));
  const auto tell = [&]() -> Status {
    OperationPtr out = make_operation(sizeof(std::int64_t));
    std::memcpy(out->out.data(), &word, sizeof word);
    WB_TRY_MPI(MPI_Isend(out->out.data(), 1, MPI_INT64_T, peer, say, comm, &out->request));
    abandon(std::move(out));  // small, sent eagerly; a peer that is gone never takes it
    return Status::ok();
  };
  if (first) WB_RETURN_IF_ERROR(tell());
  WB_RETURN_IF_ERROR(wait_for(in, waiter, false, what));
  if (heard != nullptr) std::memcpy(heard, in->in.data(), sizeof *heard);
  if (!first) WB_RETURN_IF_ERROR(tell());
  return Status::ok();
}

void tell(MPI_Comm comm, int peer, int tag, std::int64_t word) {
  OperationPtr out = make_operation(sizeof(std::int64_t));
  std::memcpy(out->out.data(), &word, sizeof word);
  if (MPI_Isend(out->out.data(), 1, MPI_INT64_T, peer, tag, comm, &out->request) == MPI_SUCCESS) abandon(std::move(out));
}
}  // namespace

Status ask_copy(MPI_Comm link, const Waiter& waiter, std::uint64_t& version) {
  std::int64_t go = 0;
  WB_RETURN_IF_ERROR(exchange(link, kCopyTag, kGoTag, true, waiter, "the replica's answer to the copy", 0, 1, &go));
  if (go <= 0)
    return Status(ErrorCode::kNotFound, "the replica engine let this engine go before the copy (it asked later than the replica's "
                                        "timeout, or the replica left)");
  version = static_cast<std::uint64_t>(go);
  return Status::ok();
}

void decline_copy(MPI_Comm link) { tell(link, 0, kCopyTag, 0); }

std::optional<bool> copy_asked(MPI_Comm link) {
  int found = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kCopyTag, link, &found, &status) != MPI_SUCCESS || found == 0) return std::nullopt;
  std::int64_t word = 0;
  if (MPI_Recv(&word, 1, MPI_INT64_T, status.MPI_SOURCE, kCopyTag, link, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
  return word == 1;
}

void answer_copy(MPI_Comm link, int joiner_leader, std::uint64_t version) {
  tell(link, joiner_leader, kGoTag, static_cast<std::int64_t>(version));
}

bool confirm_take(MPI_Comm leaders, double seconds) {
  return exchange(leaders, kTakeTag, kReadyTag, true, Waiter{seconds, {}}, "the joiner's ready").is_ok();
}

Status answer_take(MPI_Comm leaders, double seconds) { return answer_take(leaders, Waiter{seconds, {}}); }

Status answer_take(MPI_Comm leaders, const Waiter& waiter) {
  return exchange(leaders, kReadyTag, kTakeTag, false, waiter, "the take");
}

Status say_ready(MPI_Comm leaders, const Waiter& waiter) { return exchange(leaders, kReadyTag, kTakeTag, true, waiter, "the take"); }

bool said_ready(MPI_Comm leaders) {
  int found = 0;
  return MPI_Iprobe(0, kReadyTag, leaders, &found, MPI_STATUS_IGNORE) == MPI_SUCCESS && found != 0;
}

bool take_began(MPI_Comm leaders) {
  int found = 0;
  return MPI_Iprobe(0, kTakeTag, leaders, &found, MPI_STATUS_IGNORE) == MPI_SUCCESS && found != 0;
}

bool knock(const JoinAddress& address, double timeout) {
  const Bounded call = connect_bounded(address.port, timeout, "knocking at the join port: the MPI_Comm_connect");
  if (!call.completed || call.rc != MPI_SUCCESS) return false;
  MPI_Comm_set_errhandler(call.result, MPI_ERRORS_RETURN);
  // Not waited for (small, sent eagerly); the connection is let go (no disconnect: the accept side
  // abandons its end too, and after stop_accepting it reads nothing).
  OperationPtr knocked = make_operation(kPresentedChars);
  knocked->out[0] = static_cast<std::byte>(kKnock);
  std::memcpy(knocked->out.data() + 1, address.secret.data(), kSecretChars);
  if (MPI_Isend(knocked->out.data(), static_cast<int>(kPresentedChars), MPI_CHAR, 0, kSecretTag, call.result,
                &knocked->request) == MPI_SUCCESS)
    abandon(std::move(knocked));
  abandon_link(call.result);
  return true;
}

namespace {
// run_bounded, throwing: kTimeout when given up on, kMpi when the call failed.
MPI_Comm bounded(std::function<int(MPI_Comm*)> make, double timeout, const std::string& what) {
  const Bounded call = run_bounded(std::move(make), timeout, what);
  if (!call.completed)
    throw Error(ErrorCode::kTimeout, what + " did not complete within " + seconds_text(timeout) + " (the other job died in it?)");
  if (call.rc != MPI_SUCCESS) throw Error(ErrorCode::kMpi, what + " failed: " + detail::mpi_error_string(call.rc));
  if (call.result != MPI_COMM_NULL) WB_CHECK_MPI(MPI_Comm_set_errhandler(call.result, MPI_ERRORS_RETURN));
  return call.result;
}

// Open MPI's TCP links to another job outlive it: a write to one after that job ended raises SIGPIPE,
// which killed processes at MPI_Finalize after every check passed (measured). A process connected to
// another job ignores it, unless the application installed a handler of its own.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}
}  // namespace

MPI_Comm bridge_join(MPI_Comm leaders, bool high, double timeout, const std::string& what) {
  ignore_sigpipe();
  // Open MPI refuses an intercommunicator as the bridge of MPI_Intercomm_create: the leaders merge theirs
  // (trainers' leader rank 0 of the two, the joiner's rank 1); complete, it goes (MPI_Finalize would
  // otherwise synchronize over it with the other job; see part()).
  return bounded([leaders, high](MPI_Comm* bridge) mutable {
    const int rc = MPI_Intercomm_merge(leaders, high ? 1 : 0, bridge);
    if (rc == MPI_SUCCESS) MPI_Comm_free(&leaders);
    return rc;
  }, timeout, what + ": merging the leaders' link");
}

MPI_Comm widen_join(MPI_Comm local, MPI_Comm bridge, bool high, double timeout, const std::string& what) {
  ignore_sigpipe();
  // Over a duplicate of `local` of its own: a widening given up on (the other job died in it) leaves its
  // thread in MPI with a collective pending there, which then never meets a later one (the next widening,
  // a step of the group: measured, the next join's widening matched the stuck one's and MPI aborted the job).
  MPI_Comm own = duplicate(local, Waiter{timeout, {}}, what + ": widening the join");
  return bounded([own, bridge, high](MPI_Comm* merged) mutable {
    MPI_Comm inter = MPI_COMM_NULL;
    int rc = MPI_Intercomm_create(own, 0, bridge, high ? 0 : 1, kWidenTag, &inter);
    if (rc == MPI_SUCCESS) rc = MPI_Intercomm_merge(inter, high ? 1 : 0, merged);
    // The steps are complete, nothing is pending on them: they go now (see above).
    if (rc == MPI_SUCCESS) {
      MPI_Comm_free(&own);
      MPI_Comm_free(&inter);
      if (bridge != MPI_COMM_NULL) MPI_Comm_free(&bridge);
    }
    return rc;
  }, timeout, what + ": widening the join to every rank of both jobs");
}

MPI_Comm split(MPI_Comm comm, bool member, int key, double timeout, const std::string& what) {
  int level = MPI_THREAD_SINGLE;
  WB_CHECK_MPI(MPI_Query_thread(&level));
  const int color = member ? 0 : MPI_UNDEFINED;
  if (level == MPI_THREAD_MULTIPLE)
    return bounded([comm, color, key](MPI_Comm* part) { return MPI_Comm_split(comm, color, key, part); }, timeout,
                   what + ": splitting");
  barrier(comm, Waiter{timeout, {}}, what + ": before splitting");
  MPI_Comm part = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_split(comm, color, key, &part));
  if (part != MPI_COMM_NULL) WB_CHECK_MPI(MPI_Comm_set_errhandler(part, MPI_ERRORS_RETURN));
  return part;
}

MPI_Comm rebuild_link(MPI_Comm link, const std::vector<int>& survivors, int tag, double timeout, const std::string& what) {
  MPI_Group all = MPI_GROUP_NULL, kept = MPI_GROUP_NULL;
  WB_CHECK_MPI(MPI_Comm_group(link, &all));
  const int rc = MPI_Group_incl(all, static_cast<int>(survivors.size()), survivors.data(), &kept);
  MPI_Group_free(&all);
  WB_CHECK_MPI(rc);
  // Given up on (bounded throws), the group stays with the thread that still uses it.
  MPI_Comm rebuilt = bounded([link, kept, tag](MPI_Comm* made) { return MPI_Comm_create_group(link, kept, tag, made); },
                             timeout, what + ": rebuilding the link from its survivors");
  MPI_Group_free(&kept);
  return rebuilt;
}

bool part(MPI_Comm comm, double seconds) noexcept {
  if (comm == MPI_COMM_NULL) return true;
  if (!barrier_within(comm, seconds)) {
    abandon_link(comm);
    return false;
  }
  return MPI_Comm_free(&comm) == MPI_SUCCESS;
}

bool spans_jobs(MPI_Comm comm) noexcept {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  int size = 0;
  bool other = false;
  if (MPI_Comm_group(comm, &group) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS &&
      MPI_Group_size(group, &size) == MPI_SUCCESS) {
    std::vector<int> ranks(static_cast<std::size_t>(size)), in_world(ranks.size());
    for (int r = 0; r < size; ++r) ranks[static_cast<std::size_t>(r)] = r;
    if (MPI_Group_translate_ranks(group, size, ranks.data(), world, in_world.data()) == MPI_SUCCESS)
      other = std::find(in_world.begin(), in_world.end(), MPI_UNDEFINED) != in_world.end();
  }
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
  return other;
}

void abandon_link(MPI_Comm comm) noexcept {
  if (comm == MPI_COMM_NULL) return;
  OperationPtr pin = make_operation();
  if (MPI_Irecv(nullptr, 0, MPI_BYTE, MPI_ANY_SOURCE, kPinTag, comm, &pin->request) == MPI_SUCCESS) abandon(std::move(pin));
  MPI_Comm_free(&comm);
}

}  // namespace wb::comm
