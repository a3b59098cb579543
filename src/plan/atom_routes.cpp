// Per atom: its size, the axis it is cut along, its distinct holders, and its distinct needers grouped by
// node in ascending node order (the order of a segment's landers).
#include "plan/atom_routes.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

namespace wb::plan_detail {

Box slice_box(const Box& atom_box, int axis, std::int64_t begin, std::int64_t end) {
  Box box = atom_box;
  if (axis < box.ndim()) {
    box.offset[static_cast<std::size_t>(axis)] += begin;
    box.extent[static_cast<std::size_t>(axis)] = end - begin;
  }
  return box;
}

AtomRoutes atom_routes(const Correspondence& correspondence, const Topology& topology) {
  AtomRoutes routes;
  routes.atoms.reserve(correspondence.atoms.size());
  std::vector<std::pair<int, std::uint32_t>> holders;        // (worker, holder index)
  std::vector<std::tuple<int, int, std::uint32_t>> needers;  // (node, worker, needer index)
  for (const Atom& atom : correspondence.atoms) {
    AtomRoute route;
    route.element_bytes = static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
    route.bytes = atom.box.numel() * route.element_bytes;
    route.axis = 0;
    while (route.axis + 1 < atom.box.ndim() && atom.box.extent[static_cast<std::size_t>(route.axis)] == 1) ++route.axis;
    const std::int64_t units = atom.box.ndim() == 0 ? 1 : atom.box.extent[static_cast<std::size_t>(route.axis)];
    route.unit_bytes = units > 0 ? route.bytes / units : 0;

    holders.clear();
    bool sorted = true;  // holders come by worker: sorted already, unless hand-built
    for (std::uint32_t i = 0; i < atom.holders.size(); ++i) {
      holders.emplace_back(atom.holders[i].worker, i);
      sorted = sorted && (i == 0 || holders[i - 1] < holders[i]);
    }
    if (!sorted) std::sort(holders.begin(), holders.end());
    route.first_holder = static_cast<std::uint32_t>(routes.holders.size());
    for (std::size_t i = 0; i < holders.size(); ++i)
      if (i == 0 || holders[i].first != holders[i - 1].first) routes.holders.push_back(holders[i].second);
    route.holder_count = static_cast<std::uint16_t>(routes.holders.size() - route.first_holder);

    route.first_node = static_cast<std::uint32_t>(routes.nodes.size());
    const auto add_needer = [&](int node, int worker, std::uint32_t index, int previous_worker) {
      if (previous_worker == worker) return;  // the worker's first copy stands for it
      if (routes.nodes.size() == route.first_node || routes.nodes.back().node != node)
        routes.nodes.push_back({node, static_cast<std::uint32_t>(routes.needers.size()), 0});
      routes.needers.push_back(index);
      ++routes.nodes.back().count;
    };
    // Needers come by worker; where nodes ascend with workers (as in every topology of consecutive ranks
    // per node), by node too, and are taken as they come.
    bool by_node = true;
    for (std::uint32_t i = 1; by_node && i < atom.needers.size(); ++i) {
      const int before = atom.needers[i - 1].worker, worker = atom.needers[i].worker;
      const int before_node = topology.node_of_worker[static_cast<std::size_t>(before)];
      const int node = topology.node_of_worker[static_cast<std::size_t>(worker)];
      by_node = before_node < node || (before_node == node && before <= worker);
    }
    if (by_node) {
      for (std::uint32_t i = 0; i < atom.needers.size(); ++i) {
        const int worker = atom.needers[i].worker;
        add_needer(topology.node_of_worker[static_cast<std::size_t>(worker)], worker, i, i > 0 ? atom.needers[i - 1].worker : -1);
      }
    } else {
      needers.clear();
      for (std::uint32_t i = 0; i < atom.needers.size(); ++i) {
        const int worker = atom.needers[i].worker;
        needers.emplace_back(topology.node_of_worker[static_cast<std::size_t>(worker)], worker, i);
      }
      std::sort(needers.begin(), needers.end());
      for (std::size_t i = 0; i < needers.size(); ++i) {
        const auto [node, worker, index] = needers[i];
        add_needer(node, worker, index, i > 0 ? std::get<1>(needers[i - 1]) : -1);
      }
    }
    route.node_count = static_cast<std::uint16_t>(routes.nodes.size() - route.first_node);
    routes.atoms.push_back(route);
  }
  return routes;
}

}  // namespace wb::plan_detail
