// The planner's settings: declared once, read by connect (coordinator) and by wb-plan alike.
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/settings.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

// 2048 over 4 slots keeps 512 MiB slots, the round count of 1024 over 2.
Setting<std::int64_t> buffer_mib_setting("buffer_mib", 2048,
                                         "Transfer-buffer memory per worker in MiB, all pipeline slots, send and "
                                         "receive; fewer bytes mean more rounds. connect fits the smallest any worker gives.",
                                         1, std::int64_t{1} << 30);
Setting<std::int64_t> pipeline_depth_setting("pipeline_depth", 4,
                                             "Transfer rounds in flight per worker, at least (4 by default: with 2, a link "
                                             "idles while a round's completion travels back). Rounds smaller than their "
                                             "share of the buffer get more slots in flight, up to 8, in the same memory.",
                                             1, 64);
Setting<double> node_gbps_setting("node_gbps", 400,
                                  "Inter-node network bandwidth per node, GB/s each direction, for planning and T_min "
                                  "(the paper's testbed: 400; a 100 Gbit/s NIC: 12.5; 1 Gbit/s: 0.125).",
                                  1e-6, 1e6);
Setting<double> intra_gbps_setting("intra_gbps", 900,
                                   "Intra-node bandwidth per worker, GB/s each direction (NVLink; shared memory on a host).",
                                   1e-6, 1e6);
Setting<double> message_us_setting("message_us", 5, "Link time each one-sided write costs, microseconds (simulator).", 0.0,
                                   1e6);

Setting<std::int64_t> relay_fan_out_setting(
    "relay_fan_out", 0,
    "External exchange between rollout nodes: 0 simulates fan-out 8, 4 (up to 21 nodes) and 16 (where it is "
    "all-to-all, up to 17 nodes) at a few round counts and keeps the fastest; -1 all-to-all at any size; F >= 1 "
    "relay trees in which a node forwards to at most F others per round.",
    -1, 1024);
Setting<std::int64_t> plan_memory_mib_setting(
    "plan_memory_mib", 0,
    "Memory the planning rank may spend on the plan and the schedules, MiB; 0: what the machine has available. "
    "A deployment whose estimate is larger is refused before planning.",
    0, std::int64_t{1} << 40);

// MemAvailable of /proc/meminfo, else the free physical pages; 0 when neither is known.
std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
}

}  // namespace

namespace setting_defaults {
std::int64_t buffer_bytes_per_worker() { return buffer_mib_setting.default_value() << 20; }
int pipeline_depth() { return static_cast<int>(pipeline_depth_setting.default_value()); }
int relay_fan_out() { return static_cast<int>(relay_fan_out_setting.default_value()); }
double node_bandwidth() { return node_gbps_setting.default_value() * 1e9; }
double intra_node_bandwidth() { return intra_gbps_setting.default_value() * 1e9; }
double message_latency() { return message_us_setting.default_value() / 1e6; }  // 5 / 1e6 is exactly the double 5e-6
}  // namespace setting_defaults

PlanOptions plan_options_from_settings() {
  PlanOptions options;
  options.buffer_bytes_per_worker = *buffer_mib_setting << 20;
  options.pipeline_depth = static_cast<int>(*pipeline_depth_setting);
  // The settings' ranges are checked where their values are read (core/settings.hpp).
  options.relay_fan_out = static_cast<int>(*relay_fan_out_setting);
  options.memory_limit_bytes = *plan_memory_mib_setting > 0 ? *plan_memory_mib_setting << 20 : available_memory_bytes();
  return options;
}

NetworkSettings network_from_settings() {
  NetworkSettings network;
  network.node_bandwidth = *node_gbps_setting * 1e9;
  network.intra_node_bandwidth = *intra_gbps_setting * 1e9;
  network.message_latency = *message_us_setting * 1e-6;
  return network;
}

}  // namespace wb
