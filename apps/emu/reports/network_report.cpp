#include "emu/reports/network_report.hpp"

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "core/checks.hpp"
#include "transport/transport.hpp"

namespace wb::emu {
namespace {

std::string host_label(const std::string& machine) { return machine.substr(0, machine.find(':')); }

bool same_machine_transport(const std::string& transport) { return transport == "cma" || transport == "cuda_ipc"; }

}  // namespace

void gather_traffic(const AdapterStats& mine, MPI_Comm comm, int root, std::vector<std::string>& machines,
                    std::vector<RankLink>& links) {
  int rank = 0, size = 0;
  WB_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  constexpr int kIdBytes = 256;
  char id[kIdBytes] = {};
  std::strncpy(id, machine_id().c_str(), kIdBytes - 1);
  std::vector<char> ids(rank == root ? static_cast<std::size_t>(size) * kIdBytes : 0);
  WB_CHECK_MPI(MPI_Gather(id, kIdBytes, MPI_CHAR, ids.data(), kIdBytes, MPI_CHAR, root, comm));
  // (peer, transport kind, bytes) per link.
  std::vector<std::int64_t> flat;
  for (const LinkTraffic& link : mine.traffic)
    flat.insert(flat.end(), {link.peer, static_cast<std::int64_t>(parse_transport_kind(link.transport)), link.bytes});
  const int count = static_cast<int>(flat.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displs(static_cast<std::size_t>(size));
  WB_CHECK_MPI(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
  std::vector<std::int64_t> all;
  if (rank == root) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  WB_CHECK_MPI(MPI_Gatherv(flat.data(), count, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T,
                           root, comm));
  machines.clear();
  links.clear();
  if (rank != root) return;
  for (int r = 0; r < size; ++r) machines.emplace_back(&ids[static_cast<std::size_t>(r) * kIdBytes]);
  for (int r = 0; r < size; ++r)
    for (int i = displs[static_cast<std::size_t>(r)]; i + 2 < displs[static_cast<std::size_t>(r)] + counts[static_cast<std::size_t>(r)]; i += 3)
      links.push_back({r, static_cast<int>(all[static_cast<std::size_t>(i)]),
                       transport_name(static_cast<TransportKind>(all[static_cast<std::size_t>(i) + 1])),
                       all[static_cast<std::size_t>(i) + 2]});
}

NetworkReport network_report(const TransferSummary& summary, const std::vector<std::string>& machines,
                             const std::vector<RankLink>& links, std::int64_t updates) {
  NetworkReport report;
  const auto world = static_cast<int>(machines.size());
  const std::size_t nodes = summary.node_ingress_bytes.size();
  const bool have_plan = summary.node_of_worker.size() == machines.size() && nodes > 0;
  const auto node_of = [&](int rank) { return have_plan ? summary.node_of_worker[static_cast<std::size_t>(rank)] : -1; };

  std::map<std::string, int> machine_index;
  std::vector<std::string> machine_names;
  std::vector<int> machine_of(static_cast<std::size_t>(world));
  std::vector<int> ranks_on;
  for (int r = 0; r < world; ++r) {
    const auto [it, fresh] = machine_index.emplace(machines[static_cast<std::size_t>(r)], static_cast<int>(machine_names.size()));
    if (fresh) {
      machine_names.push_back(machines[static_cast<std::size_t>(r)]);
      ranks_on.push_back(0);
    }
    machine_of[static_cast<std::size_t>(r)] = it->second;
    ++ranks_on[static_cast<std::size_t>(it->second)];
  }
  const std::size_t hosts = machine_names.size();

  // Planned nodes are machines when each node's ranks share one machine and each machine holds one node.
  bool nodes_are_machines = have_plan;
  std::vector<std::set<int>> machines_of_node(nodes), nodes_of_machine(hosts);
  if (have_plan)
    for (int r = 0; r < world; ++r) {
      const int n = node_of(r);
      if (n < 0 || static_cast<std::size_t>(n) >= nodes) {
        nodes_are_machines = false;
        continue;
      }
      machines_of_node[static_cast<std::size_t>(n)].insert(machine_of[static_cast<std::size_t>(r)]);
      nodes_of_machine[static_cast<std::size_t>(machine_of[static_cast<std::size_t>(r)])].insert(n);
    }
  for (const auto& m : machines_of_node) nodes_are_machines = nodes_are_machines && m.size() == 1;
  for (const auto& n : nodes_of_machine) nodes_are_machines = nodes_are_machines && n.size() <= 1;

  std::vector<std::int64_t> host_in(hosts, 0), host_out(hosts, 0), node_in(nodes, 0), node_out(nodes, 0);
  std::map<std::string, std::int64_t> between_by_transport, within_by_transport;
  // Between planned nodes, wherever they run (logical nodes of one machine too): what each node took in and
  // gave out, and each pair's bytes (which node relayed to which).
  std::vector<std::int64_t> planned_node_in(nodes, 0), planned_node_out(nodes, 0);
  std::map<std::pair<int, int>, std::int64_t> node_pairs;
  for (const RankLink& link : links) {
    if (link.peer < 0 || link.peer >= world) continue;
    if (have_plan && node_of(link.rank) >= 0 && node_of(link.peer) >= 0 && node_of(link.rank) != node_of(link.peer) &&
        static_cast<std::size_t>(node_of(link.rank)) < nodes && static_cast<std::size_t>(node_of(link.peer)) < nodes) {
      planned_node_out[static_cast<std::size_t>(node_of(link.rank))] += link.bytes;
      planned_node_in[static_cast<std::size_t>(node_of(link.peer))] += link.bytes;
      node_pairs[{node_of(link.rank), node_of(link.peer)}] += link.bytes;
    }
    const int from = machine_of[static_cast<std::size_t>(link.rank)], to = machine_of[static_cast<std::size_t>(link.peer)];
    if (from == to) {
      within_by_transport[link.transport] += link.bytes;
      continue;
    }
    between_by_transport[link.transport] += link.bytes;
    host_out[static_cast<std::size_t>(from)] += link.bytes;
    host_in[static_cast<std::size_t>(to)] += link.bytes;
    if (have_plan && node_of(link.rank) >= 0 && node_of(link.peer) >= 0 && static_cast<std::size_t>(node_of(link.rank)) < nodes &&
        static_cast<std::size_t>(node_of(link.peer)) < nodes) {
      node_out[static_cast<std::size_t>(node_of(link.rank))] += link.bytes;
      node_in[static_cast<std::size_t>(node_of(link.peer))] += link.bytes;
    }
    if (same_machine_transport(link.transport) && link.bytes > 0)
      report.failures.push_back(std::to_string(link.bytes) + " bytes from rank " + std::to_string(link.rank) + " (" +
                                host_label(machine_names[static_cast<std::size_t>(from)]) + ") to rank " +
                                std::to_string(link.peer) + " (" + host_label(machine_names[static_cast<std::size_t>(to)]) +
                                ") went over " + link.transport + ", a same-machine transport, between machines");
  }
  const std::int64_t k = std::max<std::int64_t>(updates, 1);
  const auto per_update = [&](std::int64_t total) { return total / k; };

  nlohmann::json host_list = nlohmann::json::array();
  for (std::size_t h = 0; h < hosts; ++h) {
    nlohmann::json entry = {{"host", host_label(machine_names[h])},
                            {"ranks", ranks_on[h]},
                            {"network_in_bytes", per_update(host_in[h])},
                            {"network_out_bytes", per_update(host_out[h])}};
    if (nodes_are_machines) {
      const std::size_t n = static_cast<std::size_t>(*nodes_of_machine[h].begin());
      entry["node"] = n;
      entry["planned_in_bytes"] = summary.node_ingress_bytes[n];
      entry["planned_out_bytes"] = summary.node_egress_bytes[n];
      entry["need_bytes"] = summary.node_need_bytes[n];
    }
    host_list.push_back(std::move(entry));
  }

  // The checks: measured == planned per node, rollout nodes' ingress == M_v, trainers' egress == M.
  nlohmann::json matches = nullptr;
  if (nodes_are_machines) {
    bool ok = true;
    std::int64_t trainer_egress = 0;
    for (std::size_t n = 0; n < nodes; ++n) {
      const std::string host = host_label(machine_names[static_cast<std::size_t>(*machines_of_node[n].begin())]);
      const auto check = [&](const char* what, std::int64_t measured, std::int64_t planned) {
        if (measured == planned * k) return;
        ok = false;
        report.failures.push_back(std::string("node ") + std::to_string(n) + " (" + host + "): measured " + what + " " +
                                  std::to_string(measured) + " bytes over " + std::to_string(k) + " updates, planned " +
                                  std::to_string(planned) + " per update");
      };
      check("network ingress", node_in[n], summary.node_ingress_bytes[n]);
      check("network egress", node_out[n], summary.node_egress_bytes[n]);
      if (summary.node_need_bytes[n] > 0) check("network ingress (against M_v)", node_in[n], summary.node_need_bytes[n]);
      else trainer_egress += node_out[n];
    }
    if (trainer_egress != summary.model_bytes * k) {
      ok = false;
      report.failures.push_back("the trainers' measured network egress is " + std::to_string(trainer_egress) + " bytes over " +
                                std::to_string(k) + " updates, but M = " + std::to_string(summary.model_bytes) + " per update");
    }
    matches = ok;
  }
  nlohmann::json by_transport = nlohmann::json::object(), within = nlohmann::json::object();
  for (const auto& [name, bytes] : between_by_transport) by_transport[name] = per_update(bytes);
  for (const auto& [name, bytes] : within_by_transport) within[name] = per_update(bytes);
  nlohmann::json planned_nodes = nlohmann::json::array(), pairs = nlohmann::json::array();
  for (std::size_t n = 0; n < nodes; ++n)
    planned_nodes.push_back({{"node", n},
                             {"measured_in_bytes", per_update(planned_node_in[n])},
                             {"measured_out_bytes", per_update(planned_node_out[n])},
                             {"planned_in_bytes", summary.node_ingress_bytes[n]},
                             {"planned_out_bytes", summary.node_egress_bytes[n]},
                             {"need_bytes", summary.node_need_bytes[n]}});
  for (const auto& [pair, bytes] : node_pairs) pairs.push_back({pair.first, pair.second, per_update(bytes)});
  report.json = {{"updates", updates},
                 {"hosts", host_list},
                 {"planned_nodes", planned_nodes},
                 {"node_to_node_bytes", pairs},
                 {"nodes_are_machines", nodes_are_machines},
                 {"between_machines_bytes_by_transport", by_transport},
                 {"within_machine_bytes_by_transport", within},
                 {"matches_plan", matches}};

  char line[256];
  std::snprintf(line, sizeof line, "%-24s %6s %16s %16s %16s %16s", "host", "ranks", "net in [B]", "planned in", "net out [B]",
                "planned out");
  report.table.emplace_back(line);
  for (std::size_t h = 0; h < hosts; ++h) {
    std::string planned_in = "-", planned_out = "-";
    if (nodes_are_machines) {
      const std::size_t n = static_cast<std::size_t>(*nodes_of_machine[h].begin());
      planned_in = std::to_string(summary.node_ingress_bytes[n]);
      planned_out = std::to_string(summary.node_egress_bytes[n]);
    }
    std::snprintf(line, sizeof line, "%-24s %6d %16lld %16s %16lld %16s", host_label(machine_names[h]).c_str(), ranks_on[h],
                  static_cast<long long>(per_update(host_in[h])), planned_in.c_str(),
                  static_cast<long long>(per_update(host_out[h])), planned_out.c_str());
    report.table.emplace_back(line);
  }
  return report;
}

}  // namespace wb::emu
