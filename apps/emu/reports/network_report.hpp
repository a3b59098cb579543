// What crossed between machines in a run, measured by the transports' own byte counters, next to what the
// plan says should have: per host and per planned node, bytes in and out over the network (writes between
// ranks on different machines), by transport. For wb-replay and wb-bench.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weightbridge/adapter.hpp"

namespace wb::emu {

/// One rank's writes over one transport to one peer, all updates (AdapterStats::traffic).
struct RankLink {
  int rank = 0;
  int peer = 0;
  std::string transport;
  std::int64_t bytes = 0;
};

struct NetworkReport {
  nlohmann::json json;                // hosts, nodes, by transport, checks; per planned node (logical ones
                                      // of one machine too) the bytes measured between nodes, and per pair
  std::vector<std::string> failures;  // measured traffic that contradicts the plan, or a same-machine
                                      // transport used between machines
  std::vector<std::string> table;     // printable lines, one per host
};

/// `machines[r]`: machine_id() of world rank r. `links`: every rank's traffic. `updates`: updates every
/// rank took part in (the counters add up over all of them). The planned per-node bytes are compared
/// with the measured ones only where planned nodes are machines (each node's ranks on one machine, and
/// no two nodes on one); on one machine split into logical nodes, there is no network to measure.
NetworkReport network_report(const TransferSummary& summary, const std::vector<std::string>& machines,
                             const std::vector<RankLink>& links, std::int64_t updates);

/// Collective over `comm` (the world): every rank's machine id and traffic, on `root`.
void gather_traffic(const AdapterStats& mine, MPI_Comm comm, int root, std::vector<std::string>& machines,
                    std::vector<RankLink>& links);

}  // namespace wb::emu
