// The join-by-address operations of the control plane (comm/join.hpp) between jobs started by separate
// mpiruns (run_join_port.sh starts them, with one ompi-server):
//   join_port trainer ADDRESS_FILE JOINS REFUSALS   2 ranks: rank 0 opens the port; exits 0 once JOINS
//                                                    peers were admitted (each is sent one value, 42),
//                                                    REFUSALS refused, and rank 1's knock (with the
//                                                    secret, before rank 0 stopped accepting) ended the
//                                                    accept thread
//   join_port joiner ADDRESS_FILE ok|refused         every rank of this job ends with the outcome its
//                                                    leader met; exits 0 when it is the one expected
//   join_port dead_port ADDRESS_FILE                 1 rank: opens a port there (its accept half at the
//                                                    name server) and SIGKILLs itself
//   join_port replica ADDRESS_FILE                  2 ranks: rank 0 opens the port and takes only a joiner
//                                                    that said "ready" (a fleet replica's port), with one
//                                                    admitted before it that never says it: exits 0 when
//                                                    the one taken had said it, the other is still queued
//                                                    without it, and the take finds its word there
//   join_port joiner_unready ADDRESS_FILE            1 rank: admitted, never says "ready" (its probe failed)
//   join_port joiner_ready_later ADDRESS_FILE        1 rank: admitted, says "ready" 1.5 s later (its probe),
//                                                    a marker just before it, and is taken
//   join_port joiner_after_dead DEAD_FILE ADDRESS_FILE
//                                                    1 rank: its connect to the dead port is given up on
//                                                    (2 s), then it joins by ADDRESS_FILE as an ok joiner:
//                                                    the connect given up on must not keep it from that
#include <mpi.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <sys/stat.h>

#include "comm/backoff.hpp"
#include "comm/deadline.hpp"
#include "comm/join.hpp"
#include "weightbridge/status.hpp"

namespace {

constexpr double kTimeout = 20;

// Trainer rank 1 ends rank 0's accept thread at the end (a knock): nothing wakes it from its own process.
int run_knocker() {
  char name[MPI_MAX_PORT_NAME] = {}, secret[80] = {};
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Bcast(secret, sizeof secret, MPI_CHAR, 0, MPI_COMM_WORLD);
  int go = 0;
  MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!wb::comm::knock(wb::comm::JoinAddress{name, secret}, kTimeout)) {
    std::fprintf(stderr, "trainer 1: the knock did not complete\n");
    return 1;
  }
  return 0;
}

// Rank 0's port and secret to rank 1 (run_knocker's first two broadcasts).
void share_address(const wb::comm::JoinPort& port) {
  char name[MPI_MAX_PORT_NAME] = {}, secret[80] = {};
  std::snprintf(name, sizeof name, "%s", port.port_name().c_str());
  std::snprintf(secret, sizeof secret, "%s", port.address().secret.c_str());
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Bcast(secret, sizeof secret, MPI_CHAR, 0, MPI_COMM_WORLD);
}

// Rank 0: tells rank 1 to knock, then waits for the knock to end the accept thread.
bool knocked_closed(const wb::comm::JoinPort& port, const char* who) {
  int go = 1;
  MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  wb::comm::Backoff backoff;
  for (const double start = wb::comm::local_seconds(); !port.stopped(); backoff.pause())
    if (wb::comm::local_seconds() - start > kTimeout) {
      std::fprintf(stderr, "%s: the accept thread did not end after the knock\n", who);
      return false;
    }
  return true;
}

int run_trainer(const std::string& path, int joins, int refusals) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) return run_knocker();
  int admitted = 0;
  {
    wb::comm::JoinPort port(path, kTimeout);
    share_address(port);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0 || (st.st_mode & 0777) != 0600) {
      std::fprintf(stderr, "trainer: the address file %s is not mode 0600 (%o)\n", path.c_str(), st.st_mode & 0777);
      return 1;
    }
    wb::comm::Backoff backoff;
    for (const double start = wb::comm::local_seconds(); admitted < joins || port.refused() < refusals; backoff.pause()) {
      if (wb::comm::local_seconds() - start > 60) {
        std::fprintf(stderr, "trainer: %d of %d joins, %lld of %d refusals within 60 s\n", admitted, joins,
                     static_cast<long long>(port.refused()), refusals);
        return 1;
      }
      if (auto peer = port.take()) {
        const std::int64_t value = 42;
        MPI_Send(&value, 1, MPI_INT64_T, 0, 7, *peer);  // kept: a disconnect here raced the accept thread (measured)
        ++admitted;
      }
    }
    if (!knocked_closed(port, "trainer")) return 1;  // before stop_accepting
    port.stop_accepting();
    if (port.refused() != refusals) {
      std::fprintf(stderr, "trainer: %lld refusals, %d expected\n", static_cast<long long>(port.refused()), refusals);
      return 1;
    }
  }
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    std::fprintf(stderr, "trainer: the address file %s is still there after the port closed\n", path.c_str());
    return 1;
  }
  std::printf("trainer: %d joins admitted, %d refused, port closed, accept thread ended\n", admitted, refusals);
  return 0;
}

int run_joiner(const std::string& path, bool expect_ok) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char message[512] = {};
  std::int64_t outcome = 0;  // 1 admitted and the trainers' value received, 0 refused or failed
  if (rank == 0) {
    try {
      MPI_Comm peer = wb::comm::join_by_address(path, kTimeout);
      std::int64_t value = 0;
      MPI_Recv(&value, 1, MPI_INT64_T, 0, 7, peer, MPI_STATUS_IGNORE);
      outcome = value == 42 ? 1 : 0;
      std::snprintf(message, sizeof message, "admitted; the trainers sent %lld", static_cast<long long>(value));
    } catch (const wb::Error& error) {
      std::snprintf(message, sizeof message, "%s", error.status().message().c_str());
    }
  }
  // Every rank of the joining job ends with its leader's outcome, in the same words.
  MPI_Bcast(&outcome, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  MPI_Bcast(message, sizeof message, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::printf("joiner rank %d: %s\n", rank, message);
  const bool refused_as_such = std::strstr(message, "the trainers refused the secret") != nullptr;
  return expect_ok ? (outcome == 1 ? 0 : 1) : (outcome == 0 && refused_as_such ? 0 : 1);
}

constexpr int kMarkerTag = 9;  // a ready-later joiner's word just before its "ready"

void pause_for(double seconds) {
  wb::comm::Backoff backoff;
  for (const double start = wb::comm::local_seconds(); wb::comm::local_seconds() - start < seconds;) backoff.pause();
}

bool marker_came(MPI_Comm peer) {
  int found = 0;
  return MPI_Iprobe(0, kMarkerTag, peer, &found, MPI_STATUS_IGNORE) == MPI_SUCCESS && found != 0;
}

// A fleet replica's port: joiners connect while they probe, and only one that said "ready" is taken.
int run_replica(const std::string& path) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) return run_knocker();
  int rc = 0;
  {
    wb::comm::JoinPort port(path, kTimeout);
    share_address(port);
    std::optional<MPI_Comm> taken;
    wb::comm::Backoff backoff;
    for (const double start = wb::comm::local_seconds(); !(taken = port.take(wb::comm::said_ready)); backoff.pause())
      if (wb::comm::local_seconds() - start > 60) {
        std::fprintf(stderr, "replica: no joiner said ready within 60 s\n");
        return 1;
      }
    // Messages of one sender on one communicator keep their order: the marker came before the "ready".
    if (!marker_came(*taken)) {
      std::fprintf(stderr, "replica: took a joiner that had not said ready\n");
      rc = 1;
    }
    // Its "ready" is there, unreceived, for the take's exchange to find.
    if (!wb::comm::said_ready(*taken) || !wb::comm::confirm_take(*taken, kTimeout)) {
      std::fprintf(stderr, "replica: the take of a ready joiner did not find its word\n");
      rc = 1;
    }
    const std::int64_t value = 42;
    MPI_Send(&value, 1, MPI_INT64_T, 0, 7, *taken);
    const std::optional<MPI_Comm> left = port.take();
    if (!left || wb::comm::said_ready(*left)) {
      std::fprintf(stderr, "replica: the joiner that never said ready is %s\n", left ? "ready after all" : "not queued");
      rc = 1;
    }
    if (!knocked_closed(port, "replica")) return 1;
  }
  if (rc == 0) std::printf("replica: took the joiner that said ready, left the one admitted before it queued\n");
  return rc;
}

int run_joiner_unready(const std::string& path) {
  (void)wb::comm::join_by_address(path, kTimeout);  // never says ready; exits unheard (the port keeps it queued)
  std::printf("joiner_unready: admitted\n");
  std::fflush(stdout);
  pause_for(3);
  return 0;
}

int run_joiner_ready_later(const std::string& path) {
  const MPI_Comm peer = wb::comm::join_by_address(path, kTimeout);
  pause_for(1.5);  // its probe: the replica must not take it meanwhile
  const std::int64_t marker = 1;
  MPI_Send(&marker, 1, MPI_INT64_T, 0, kMarkerTag, peer);
  if (const wb::Status taken = wb::comm::say_ready(peer, wb::comm::Waiter{kTimeout, {}}); !taken) {
    std::fprintf(stderr, "joiner_ready_later: %s\n", taken.message().c_str());
    return 1;
  }
  std::int64_t value = 0;
  MPI_Recv(&value, 1, MPI_INT64_T, 0, 7, peer, MPI_STATUS_IGNORE);
  std::printf("joiner_ready_later: taken; the replica sent %lld\n", static_cast<long long>(value));
  return value == 42 ? 0 : 1;
}

// A port whose job dies once its half of a pairing is at the name server.
int run_dead_port(const std::string& path) {
  wb::comm::JoinPort port(path, kTimeout);
  wb::comm::Backoff backoff;
  for (const double start = wb::comm::local_seconds(); wb::comm::local_seconds() - start < 0.5;) backoff.pause();
  std::printf("dead port: published, and gone\n");
  std::fflush(stdout);
  std::raise(SIGKILL);
  return 1;
}

int run_joiner_after_dead(const std::string& dead, const std::string& path) {
  try {
    (void)wb::comm::join_by_address(dead, 2);
    std::fprintf(stderr, "joiner: connected to the dead port\n");
    return 1;
  } catch (const wb::Error& error) {
    std::printf("joiner: the dead port: %s\n", error.status().message().c_str());
  }
  std::fflush(stdout);
  return run_joiner(path, true);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 2;
  const std::string mode = argc > 2 ? argv[1] : "";
  if (mode == "trainer" && argc == 5) rc = run_trainer(argv[2], std::stoi(argv[3]), std::stoi(argv[4]));
  else if (mode == "joiner" && argc == 4) rc = run_joiner(argv[2], std::string(argv[3]) == "ok");
  else if (mode == "dead_port" && argc == 3) rc = run_dead_port(argv[2]);
  else if (mode == "replica" && argc == 3) rc = run_replica(argv[2]);
  else if (mode == "joiner_unready" && argc == 3) rc = run_joiner_unready(argv[2]);
  else if (mode == "joiner_ready_later" && argc == 3) rc = run_joiner_ready_later(argv[2]);
  else if (mode == "joiner_after_dead" && argc == 4) rc = run_joiner_after_dead(argv[2], argv[3]);
  else std::fprintf(stderr, "usage: join_port trainer FILE JOINS REFUSALS | joiner FILE ok|refused\n");
  MPI_Finalize();
  return rc;
}
