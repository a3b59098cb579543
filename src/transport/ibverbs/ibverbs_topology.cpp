// NICs near a GPU in the PCI tree (see ibverbs_topology.hpp).
#include "transport/ibverbs/ibverbs_topology.hpp"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>

namespace wb::ibv {
namespace {

std::vector<std::string_view> components(std::string_view path) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start < path.size()) {
    const std::size_t slash = path.find('/', start);
    const std::size_t end = slash == std::string_view::npos ? path.size() : slash;
    if (end > start) out.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

/// Index of the host bridge ("pci0000:3a") among the components, or the count when there is none.
std::size_t host_bridge(const std::vector<std::string_view>& parts) {
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (parts[i].substr(0, 3) == "pci") return i;
  return parts.size();
}

}  // namespace

int pci_distance(const PciPlace& a, const PciPlace& b) {
  if (a.path.empty() || b.path.empty()) return -1;
  const auto x = components(a.path), y = components(b.path);
  std::size_t common = 0;
  while (common < x.size() && common < y.size() && x[common] == y[common]) ++common;
  int distance = static_cast<int>((x.size() - common) + (y.size() - common));
  if (common <= host_bridge(x)) {
    distance += 100;
    if (a.numa >= 0 && b.numa >= 0 && a.numa != b.numa) distance += 1000;
  }
  return distance;
}

std::vector<std::size_t> nearest_nics(std::span<const PciPlace> nics, const PciPlace& gpu) {
  std::vector<std::size_t> all(nics.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (gpu.path.empty()) return all;
  int best = std::numeric_limits<int>::max();
  for (const PciPlace& nic : nics) {
    const int d = pci_distance(nic, gpu);
    if (d >= 0 && d < best) best = d;
  }
  if (best == std::numeric_limits<int>::max()) return all;
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < nics.size(); ++i)
    if (pci_distance(nics[i], gpu) == best) chosen.push_back(i);
  return chosen;
}

std::string normalize_pci_bus_id(std::string_view bus_id) {
  std::string id;
  for (const char c : bus_id) id += static_cast<char>(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
  const std::size_t colon = id.find(':');
  // A domain wider than 4 digits ("00000000:") keeps its last 4, as sysfs writes it.
  if (colon != std::string::npos && colon > 4 && id.find_first_not_of('0') >= colon - 4) id.erase(0, colon - 4);
  return id;
}

PciPlace read_pci_place(const std::string& link) {
  PciPlace place;
  const std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(link.c_str(), nullptr), &std::free);
  if (!resolved) return place;
  place.path = resolved.get();
  std::ifstream numa(place.path + "/numa_node");
  if (!(numa >> place.numa)) place.numa = -1;
  return place;
}

}  // namespace wb::ibv
