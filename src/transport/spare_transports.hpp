// Transports opened ahead of need, for the links a join makes (issue 31). Opening a libfabric transport is
// the costliest step of a link's connect between jobs: tcp;ofi_rxm spent 0.20 s of a joined link's
// connect and 0.11 s of its catch-up link's in it (traced on one host, the jobs as machines of their own),
// where the connect's other steps took 0.05 s. So a process that joins opens its transports while it
// waits to be taken, and the trainers and a replica, once one of their links wanted one, keep one opened
// for the next join, on a thread of the pool. A spare is the network transport between machines
// (libfabric here; ibverbs and the transports of one machine are opened when needed, as before); one
// that is never taken is closed with its pool. Spares open at the process's own priority: opened at nice
// 19, the kept ones were not ready after 10 s among ranks that poll (the emulated cluster, 8 ranks on 2
// cores), and every rank of the next link waited 1.5-2.9 s for the one rank that then opened its own
// (0.01-0.02 s with them ready).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.hpp"

namespace wb {

class SpareTransports {
 public:
  /// `forced`: the adapter's transport option (empty: WB_TRANSPORT). Spares are opened only where the
  /// transport it chooses between machines is libfabric (decided at the first opening); otherwise the pool
  /// stays empty. Opens none yet.
  explicit SpareTransports(std::string forced = {});
  /// Waits for an opening under way (as long as opening a transport takes), then closes the spares.
  ~SpareTransports();
  SpareTransports(const SpareTransports&) = delete;
  SpareTransports& operator=(const SpareTransports&) = delete;

  /// Opens `count` spares now, one after another on a thread of the pool (the first is ready soonest): they
  /// are wanted soon (a joiner's links), and take() waits for them. None of them is opened again once taken.
  void prepare(int count);
  /// From now on keeps `count` spares opened, and after a spare is asked for at least `after_take` (a
  /// process whose links want the network transport keeps one for the next).
  void keep(int count, int after_take);
  /// A spare of `kind` for world rank `rank` (waiting for one being opened: no longer than opening one);
  /// null when the pool holds none of that kind and opens none, or its opening failed (the caller then
  /// opens one itself, which reports why).
  std::unique_ptr<Transport> take(TransportKind kind, int rank);
  /// Whether a link of this process asked for a spare (take) since the pool was made.
  bool wanted() const;

 private:
  void refill();        // with mutex_ held: starts the opener when spares are missing
  void open_missing();  // the opener thread

  std::string forced_;
  int usable_ = -1;  // whether the transport between machines is libfabric; -1: not decided yet
  int urgent_ = 0;  // prepare()'s spares not opened yet
  int count_ = 0, after_take_ = 0;
  bool wanted_ = false;
  bool opening_ = false;  // the opener thread runs
  bool failed_ = false;   // an opening failed: no more are tried
  bool stopping_ = false;
  std::vector<std::unique_ptr<Transport>> ready_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::thread opener_;
};

}  // namespace wb
