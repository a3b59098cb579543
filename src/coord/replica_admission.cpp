// How a joiner finds the trainers' joined replica (catch_up.hpp): the replica's address file and the
// tensor list beside it, the probe against that list before the joiner connects, and the admission at the
// replica's port (a thread beside the probe).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <span>
#include <string>
#include <vector>

#include "comm/collectives.hpp"
#include "comm/join.hpp"
#include "coord/catch_up.hpp"
#include "coord/connection.hpp"
#include "coord/join_links.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"

namespace wb::coord {

namespace {
// A replica's port touches its address file this often; a joiner connects only to one it sees touched
// within the other bound (the process runs): ten touches of margin for a loaded machine.
constexpr double kReplicaTouchSeconds = 0.1, kReplicaFreshSeconds = 1.0;
}  // namespace

std::string replica_address(const std::string& join_address) { return join_address + ".replica"; }

void keep_replica_fresh(comm::JoinPort& port) { port.keep_fresh(kReplicaTouchSeconds); }

std::string replica_tensors_path(const std::string& join_address) { return replica_address(join_address) + ".tensors"; }

void write_replica_tensors(const std::string& join_address, const std::vector<TensorInfo>& tensors) {
  // Owner-only as the address is, and whole or absent: written aside, then renamed.
  const std::string path = replica_tensors_path(join_address), aside = path + ".writing";
  const std::vector<std::byte> bytes = serialize_source_map(SourceMap{tensors, {}});
  const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool written = fd >= 0;
  for (std::size_t done = 0; written && done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    written = n > 0;
    if (written) done += static_cast<std::size_t>(n);
  }
  if (fd >= 0) written = ::close(fd) == 0 && written;
  if (written && std::rename(aside.c_str(), path.c_str()) == 0) return;
  std::remove(aside.c_str());
  WB_LOG(kWarn) << "engine worker 0: cannot write " << path << " (joiners then probe while this replica waits for them)";
}

void remove_replica_address(const std::string& join_address) {
  std::remove(replica_address(join_address).c_str());
  std::remove(replica_tensors_path(join_address).c_str());
}

EarlyProbe probe_before_replica(MPI_Comm engine, const std::string& join_address, const ParameterSet& params, const LoadWeightsFn& load,
                                const ResolvedOptions& options, std::vector<TensorInfo>& tensors, SourceMap& probed, double& seconds) {
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  const comm::Waiter waiter{options.timeout_seconds, {}};
  std::vector<std::byte> bytes;
  // For the form a replica's file lists (the checkpoint's). Whether the replica runs is connect_replica's
  // check, after the probe: it must be fresh when the joiner connects, and waiting for a touch here too
  // cost every join up to a touch's interval (a stale list costs a probe the trainers' connect repeats).
  const std::string path = replica_tensors_path(join_address);
  if (rank == 0 && !options.fp8) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (in) {
      bytes.resize(static_cast<std::size_t>(in.tellg()));
      in.seekg(0);
      in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!in) bytes.clear();
    }
  }
  bytes = comm::broadcast(bytes, 0, engine, waiter, "joining the trainers: the tensor list beside the replica's address");
  if (bytes.empty()) return EarlyProbe::kNoList;
  const double began = comm::local_seconds();
  Status status;
  try {
    tensors = deserialize_source_map(bytes).parameters;
    status = probe_load_weights(tensors, params, load, options.not_loaded, true, "joining engine worker " + std::to_string(rank) + ": ",
                                probed);
  } catch (const Error& error) {
    status = Status(error.code(), "joining engine worker " + std::to_string(rank) + ": the tensor list in " + path + ": " +
                                      error.status().message());
  }
  try {
    comm::agree(status, engine, waiter, "joining the trainers: the probe before the replica's copy");
  } catch (const Error& error) {
    // The trainers' connect probes again and says why there; the copy is not tried.
    if (rank == 0) {
      WB_LOG(kInfo) << "engine worker 0: no copy from the replica (the trainers' connect probes again and says why): "
                    << error.status().message();
    }
    probed = SourceMap{};
    return EarlyProbe::kFailed;
  }
  seconds = comm::local_seconds() - began;
  if (rank == 0) {
    WB_LOG(kInfo) << "engine worker 0: probed its load_weights against the replica's tensor list before connecting ("
                  << comm::seconds_text(seconds) << ")";
  }
  return EarlyProbe::kProbed;
}

ReplicaAdmission start_replica_admission(MPI_Comm engine, const std::string& join_address, double timeout) {
  int rank = 0;
  WB_CHECK_MPI(MPI_Comm_rank(engine, &rank));
  if (rank != 0) return {};
  return std::async(std::launch::async, [path = replica_address(join_address), timeout]() -> MPI_Comm {
    // Only a replica whose process runs (its port touches the file: JoinPort::keep_fresh, seen now) is
    // connected to: a connect to a stopped or dead one stays inside MPI and holds this process's later
    // connects, the one to the trainers included (30 s, measured with the replica SIGSTOPped).
    if (::access(path.c_str(), F_OK) != 0) return MPI_COMM_NULL;
    if (!comm::address_touched(path, kReplicaFreshSeconds)) {
      WB_LOG(kInfo) << "engine worker 0: the trainers' replica engine at " << path << " did not touch its address within "
                    << comm::seconds_text(kReplicaFreshSeconds) << " (stopped or gone); its first version will be the trainers' next";
      return MPI_COMM_NULL;
    }
    try {
      const double began = comm::local_seconds();
      const MPI_Comm leaders = comm::join_by_address(path, join_answer_seconds(timeout));
      WB_LOG(kDebug) << "engine worker 0: admitted at the replica's port in " << comm::seconds_text(comm::local_seconds() - began);
      return leaders;
    } catch (const Error& error) {
      WB_LOG(kWarn) << "engine worker 0: the trainers' replica engine at " << path << " did not admit this engine ("
                    << error.status().message() << "); its first version will be the trainers' next";
    }
    return MPI_COMM_NULL;
  });
}

void settle_replica_admission(MPI_Comm engine, ReplicaAdmission admission, double timeout, JoinedComms& comms) {
  // Bounded: the freshness check and the connect's own bound (join_answer_seconds, at most half the timeout).
  if (admission.valid()) comms.replica_leaders = admission.get();
  std::int32_t connected = comms.replica_leaders != MPI_COMM_NULL ? 1 : 0;
  comm::broadcast_fixed(std::as_writable_bytes(std::span(&connected, 1)), 0, engine, comm::Waiter{timeout, {}},
                        "joining the trainers: whether the replica admitted this engine");
  comms.from_replica = connected != 0;
}

void connect_replica(MPI_Comm engine, const std::string& join_address, double timeout, JoinedComms& comms) {
  settle_replica_admission(engine, start_replica_admission(engine, join_address, timeout), timeout, comms);
}

}  // namespace wb::coord
