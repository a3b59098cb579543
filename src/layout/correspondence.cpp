#include "weightbridge/correspondence.hpp"

#include <algorithm>
#include <map>

#include "core/parallel.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

// The cut grid of one tensor: per axis the sorted boundaries of every box that touches it.
struct Grid {
  std::vector<std::vector<std::int64_t>> cuts;
  std::vector<std::size_t> cells;  // cells per axis
  std::size_t total = 1;

  template <class BoxRange, class Get>
  Grid(const Shape& shape, const BoxRange& boxes, Get&& get) : cuts(shape.size()), cells(shape.size()) {
    for (std::size_t a = 0; a < shape.size(); ++a) {
      auto& c = cuts[a];
      c = {0, shape[a]};
      for (const auto& item : boxes) {
        const Box& box = get(item);
        c.push_back(box.offset[a]);
        c.push_back(box.offset[a] + box.extent[a]);
      }
      std::sort(c.begin(), c.end());
      c.erase(std::unique(c.begin(), c.end()), c.end());
      cells[a] = c.size() - 1;
      total *= cells[a];
    }
  }

  // Calls fn(flat cell index) for every cell inside `box`. (Scratch on the stack up to 8 axes: this runs
  // once per copy of every worker, and allocating would cost more than the walk.)
  template <class Fn>
  void for_each_cell(const Box& box, Fn&& fn) const {
    const std::size_t ndim = cuts.size();
    if (box.numel() == 0) return;
    constexpr std::size_t kInline = 8;
    std::size_t inline_scratch[3 * kInline];
    std::vector<std::size_t> heap_scratch;
    std::size_t* scratch = inline_scratch;
    if (ndim > kInline) {
      heap_scratch.resize(3 * ndim);
      scratch = heap_scratch.data();
    }
    std::size_t* first = scratch;
    std::size_t* last = scratch + ndim;
    std::size_t* index = scratch + 2 * ndim;
    for (std::size_t a = 0; a < ndim; ++a) {
      first[a] = static_cast<std::size_t>(std::lower_bound(cuts[a].begin(), cuts[a].end(), box.offset[a]) - cuts[a].begin());
      last[a] = static_cast<std::size_t>(
          std::lower_bound(cuts[a].begin(), cuts[a].end(), box.offset[a] + box.extent[a]) - cuts[a].begin());
      index[a] = first[a];
    }
    while (true) {
      std::size_t flat = 0;
      for (std::size_t a = 0; a < ndim; ++a) flat = flat * cells[a] + index[a];
      fn(flat);
      std::size_t a = ndim;
      while (a-- > 0) {
        if (++index[a] < last[a]) break;
        index[a] = first[a];
      }
      if (a == static_cast<std::size_t>(-1)) return;
    }
  }

  Box cell_box(std::size_t flat) const {
    const std::size_t ndim = cuts.size();
    Box box{Shape(ndim), Shape(ndim)};
    for (std::size_t a = ndim; a-- > 0;) {
      const std::size_t i = flat % cells[a];
      flat /= cells[a];
      box.offset[a] = cuts[a][i];
      box.extent[a] = cuts[a][i + 1] - cuts[a][i];
    }
    return box;
  }
};

bool same_endpoints(const std::vector<AtomEndpoint>& x, const std::vector<AtomEndpoint>& y) {
  return std::equal(x.begin(), x.end(), y.begin(), y.end(),
                    [](const AtomEndpoint& a, const AtomEndpoint& b) { return a.worker == b.worker && a.copy == b.copy; });
}

// Neighbouring atoms with the same holders and needers become one, axis by axis (last axis first), so
// that a tensor held and needed whole stays one atom however many other boxes cut its neighbours.
void merge_atoms(std::vector<Atom>& atoms) {
  if (atoms.size() < 2) return;  // most tensors are one atom (an expert held once, needed whole)
  const std::size_t ndim = atoms.front().box.extent.size();
  for (std::size_t axis = ndim; axis-- > 0;) {
    std::stable_sort(atoms.begin(), atoms.end(), [axis](const Atom& x, const Atom& y) {
      for (std::size_t a = 0; a < x.box.offset.size(); ++a) {
        if (a == axis) continue;
        if (x.box.offset[a] != y.box.offset[a]) return x.box.offset[a] < y.box.offset[a];
      }
      return x.box.offset[axis] < y.box.offset[axis];
    });
    std::vector<Atom> merged;
    for (Atom& atom : atoms) {
      if (!merged.empty()) {
        Atom& last = merged.back();
        bool continues = same_endpoints(last.holders, atom.holders) && same_endpoints(last.needers, atom.needers) &&
                         last.box.offset[axis] + last.box.extent[axis] == atom.box.offset[axis];
        for (std::size_t a = 0; continues && a < ndim; ++a)
          if (a != axis) continues = last.box.offset[a] == atom.box.offset[a] && last.box.extent[a] == atom.box.extent[a];
        if (continues) {
          last.box.extent[axis] += atom.box.extent[axis];
          continue;
        }
      }
      merged.push_back(std::move(atom));
    }
    atoms = std::move(merged);
  }
}

}  // namespace

std::optional<Box> first_uncovered_box(const Shape& shape, const std::vector<Box>& boxes) {
  if (shape_numel(shape) == 0) return std::nullopt;
  const Grid grid(shape, boxes, [](const Box& box) -> const Box& { return box; });
  std::vector<bool> covered(grid.total, false);
  for (const Box& box : boxes) grid.for_each_cell(box, [&](std::size_t cell) { covered[cell] = true; });
  for (std::size_t cell = 0; cell < grid.total; ++cell)
    if (!covered[cell]) return grid.cell_box(cell);
  return std::nullopt;
}

std::int64_t Correspondence::position(const Atom& atom, const AtomEndpoint& endpoint,
                                      std::span<const std::int64_t> index) const {
  const SliceCopy& copy = maps[static_cast<std::size_t>(endpoint.worker)].copies[endpoint.copy];
  std::int64_t at = copy.offset;
  for (std::size_t a = 0; a < copy.strides.size(); ++a)
    at += (atom.box.offset[a] - copy.box.offset[a] + (a < index.size() ? index[a] : 0)) * copy.strides[a];
  return at;
}

std::int64_t Correspondence::needed_elements() const {
  std::int64_t total = 0;
  for (const Atom& atom : atoms) total += atom.box.numel() * static_cast<std::int64_t>(atom.needers.size());
  return total;
}

namespace {

struct CopyRef {
  int worker;
  std::uint32_t copy;
};

// The atoms of tensor `t` from the copies that touch it, merged; none when no rollout worker needs it.
std::vector<Atom> tensor_atoms(std::size_t t, const std::vector<TensorInfo>& checkpoint_tensors, const std::vector<SourceMap>& maps,
                               const std::vector<Side>& sides, const std::vector<CopyRef>& refs) {
  bool needed = false;
  for (const CopyRef& r : refs) needed = needed || sides[static_cast<std::size_t>(r.worker)] == Side::kRollout;
  if (!needed) return {};
  const Grid grid(checkpoint_tensors[t].shape, refs, [&](const CopyRef& r) -> const Box& {
    return maps[static_cast<std::size_t>(r.worker)].copies[r.copy].box;
  });
  std::vector<std::vector<AtomEndpoint>> holders(grid.total), needers(grid.total);
  {
    // Count first, so that every cell's lists are allocated once (a cell many replicas need gets a needer
    // from each).
    std::vector<std::uint32_t> holder_count(grid.total, 0), needer_count(grid.total, 0);
    for (const CopyRef& r : refs) {
      auto& count = sides[static_cast<std::size_t>(r.worker)] == Side::kRollout ? needer_count : holder_count;
      grid.for_each_cell(maps[static_cast<std::size_t>(r.worker)].copies[r.copy].box, [&](std::size_t cell) { ++count[cell]; });
    }
    for (std::size_t cell = 0; cell < grid.total; ++cell) {
      holders[cell].reserve(holder_count[cell]);
      needers[cell].reserve(needer_count[cell]);
    }
  }
  for (const CopyRef& r : refs) {
    const bool rollout = sides[static_cast<std::size_t>(r.worker)] == Side::kRollout;
    grid.for_each_cell(maps[static_cast<std::size_t>(r.worker)].copies[r.copy].box, [&](std::size_t cell) {
      (rollout ? needers : holders)[cell].push_back(AtomEndpoint{r.worker, r.copy});
    });
  }
  std::vector<Atom> atoms;
  for (std::size_t cell = 0; cell < grid.total; ++cell) {
    if (needers[cell].empty()) continue;
    Atom atom{static_cast<std::uint32_t>(t), grid.cell_box(cell), std::move(holders[cell]), std::move(needers[cell])};
    if (atom.holders.empty()) {
      const AtomEndpoint& needer = atom.needers.front();
      const SourceMap& map = maps[static_cast<std::size_t>(needer.worker)];
      throw Error(ErrorCode::kInvalidArgument, "rollout worker " + std::to_string(needer.worker) + " needs " +
                                                   checkpoint_tensors[t].name + atom.box.to_string() + " (parameter " +
                                                   map.parameters[map.copies[needer.copy].parameter].name +
                                                   "), which no trainer worker holds");
    }
    atoms.push_back(std::move(atom));
  }
  merge_atoms(atoms);
  return atoms;
}

}  // namespace

Correspondence build_correspondence(const std::vector<TensorInfo>& checkpoint_tensors, std::vector<SourceMap> maps,
                                    std::vector<Side> sides) {
  if (maps.size() != sides.size())
    throw Error(ErrorCode::kInvalidArgument, "build_correspondence: " + std::to_string(maps.size()) + " maps but " +
                                                 std::to_string(sides.size()) + " sides");
  Correspondence result;
  result.tensors = checkpoint_tensors;
  // Maps and tensors are independent of one another: checked and cut on the host's cores (a Kimi-K2
  // deployment has 512 maps and 70,000 tensors), the atoms kept in tensor order.
  for_each_index(maps.size(), 16, [&](std::size_t w) { validate_source_map(maps[w], checkpoint_tensors); });
  // Every copy, bucketed by tensor.
  std::vector<std::vector<CopyRef>> by_tensor(checkpoint_tensors.size());
  for (std::size_t w = 0; w < maps.size(); ++w)
    for (std::size_t c = 0; c < maps[w].copies.size(); ++c)
      by_tensor[maps[w].copies[c].tensor].push_back(CopyRef{static_cast<int>(w), static_cast<std::uint32_t>(c)});
  std::vector<std::vector<Atom>> atoms(checkpoint_tensors.size());
  for_each_index(checkpoint_tensors.size(), 256, [&](std::size_t t) {
    atoms[t] = tensor_atoms(t, checkpoint_tensors, maps, sides, by_tensor[t]);
    by_tensor[t] = {};
  });
  std::size_t total = 0;
  for (const std::vector<Atom>& list : atoms) total += list.size();
  result.atoms.reserve(total);
  for (std::vector<Atom>& list : atoms) {
    for (Atom& atom : list) result.atoms.push_back(std::move(atom));
    list = {};
  }
  result.maps = std::move(maps);
  result.sides = std::move(sides);
  return result;
}

}  // namespace wb
