#include "transport/spare_transports.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/log.hpp"
#ifdef WB_HAVE_LIBFABRIC
#include "transport/libfabric/libfabric_transport.hpp"
#endif

namespace wb {
namespace {

// Opens one libfabric spare; null when it cannot (make_transport, called instead, then says why).
std::unique_ptr<Transport> open_spare() noexcept {
#ifdef WB_HAVE_LIBFABRIC
  try {
    return open_libfabric_spare();
  } catch (const std::exception& error) {
    WB_LOG(kDebug) << "opening a spare libfabric transport failed: " << error.what();
  }
#endif
  return nullptr;
}

}  // namespace

SpareTransports::SpareTransports(std::string forced) : forced_(std::move(forced)) {}

SpareTransports::~SpareTransports() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  if (opener_.joinable()) opener_.join();  // ends after the opening under way, if any
}

void SpareTransports::prepare(int count) {
  std::lock_guard<std::mutex> lock(mutex_);
  urgent_ += count;
  refill();
}

void SpareTransports::keep(int count, int after_take) {
  std::lock_guard<std::mutex> lock(mutex_);
  count_ = count;
  after_take_ = after_take;
  refill();
}

void SpareTransports::refill() {
  if (failed_ || stopping_ || opening_) return;
  if (static_cast<int>(ready_.size()) >= count_ && urgent_ == 0) return;
  if (usable_ < 0) {
#ifdef WB_HAVE_LIBFABRIC
    try {
      usable_ = choose_transport(false, MemoryKind::kHost, forced_) == TransportKind::kLibfabric ? 1 : 0;
    } catch (const Error&) {
      usable_ = 0;  // a transport option that connect refuses too: it says so there
    }
#else
    usable_ = 0;
#endif
  }
  if (usable_ == 0) return;
  if (opener_.joinable()) opener_.join();  // it has ended (opening_ is false): nothing was missing then
#ifdef WB_HAVE_LIBFABRIC
  prepare_libfabric_environment();  // on this thread, not the opener's
#endif
  opening_ = true;
  opener_ = std::thread([this] { open_missing(); });
}

void SpareTransports::open_missing() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_ && !failed_ && (urgent_ > 0 || static_cast<int>(ready_.size()) < count_)) {
    if (urgent_ > 0) --urgent_;
    lock.unlock();
    std::unique_ptr<Transport> spare = open_spare();
    lock.lock();
    if (spare) ready_.push_back(std::move(spare));
    else failed_ = true;
    changed_.notify_all();
  }
  opening_ = false;
  changed_.notify_all();
}

std::unique_ptr<Transport> SpareTransports::take(TransportKind kind, int rank) {
  if (kind != TransportKind::kLibfabric) return nullptr;
  std::unique_ptr<Transport> spare;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wanted_ = true;
    // A spare under way is waited for: no longer than opening one here, which would contend with it.
    changed_.wait(lock, [this] { return !ready_.empty() || !opening_ || failed_ || stopping_; });
    if (!ready_.empty()) {
      spare = std::move(ready_.front());
      ready_.erase(ready_.begin());
    }
    // A link wanted one: from now on this process keeps `after_take` for the next.
    count_ = std::max(count_, after_take_);
    refill();
  }
  if (!spare) return nullptr;
#ifdef WB_HAVE_LIBFABRIC
  return adopt_libfabric_spare(std::move(spare), rank);
#else
  (void)rank;
  return nullptr;
#endif
}

bool SpareTransports::wanted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return wanted_;
}

}  // namespace wb
