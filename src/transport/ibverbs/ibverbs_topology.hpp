// Private: which NICs are near a GPU, from their places in the PCI tree (sysfs paths such as
// /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0) and their NUMA nodes. The decisions are pure
// functions of those, so tests feed canned topologies; reading sysfs is the thin part.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wb::ibv {

/// A PCI device's place: its sysfs path ("" when unknown) and NUMA node (-1 when unknown).
struct PciPlace {
  std::string path;
  int numa = -1;
};

/// How far apart two PCI devices are: the hops between them through their closest common ancestor in
/// the sysfs tree (0: the same device), plus 100 when the path leaves the host bridge (the CPU carries
/// it), plus 1000 more when that crosses to another NUMA node (another socket). -1 when either path is
/// unknown.
int pci_distance(const PciPlace& a, const PciPlace& b);

/// The NICs (by index into `nics`) nearest to `gpu`: under the same PCIe switch as the GPU, else the same
/// root port, the same host bridge, the same socket. Every NIC when the GPU's place is unknown; NICs whose
/// place is unknown only when no NIC's is known.
std::vector<std::size_t> nearest_nics(std::span<const PciPlace> nics, const PciPlace& gpu);

/// "0000:3B:00.0" or "00000000:3b:00.0" (as CUDA writes bus ids) in sysfs form: "0000:3b:00.0".
std::string normalize_pci_bus_id(std::string_view bus_id);

/// The place of the PCI device behind a sysfs link (/sys/class/infiniband/mlx5_0/device,
/// /sys/bus/pci/devices/<bus id>): its realpath and <path>/numa_node; empty when it cannot be resolved
/// (containers without sysfs).
PciPlace read_pci_place(const std::string& link);

}  // namespace wb::ibv
