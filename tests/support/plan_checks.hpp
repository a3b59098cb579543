// Test support: bounds a plan's balance is judged against.
#pragma once

#include <algorithm>
#include <map>
#include <set>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"

namespace wb::testing_support {

inline std::int64_t atom_bytes(const Correspondence& correspondence, const Atom& atom) {
  return atom.box.numel() * static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
}

/// A lower bound of the busiest trainer's egress in any plan: the atoms whose holders all lie in a set H
/// must be sent by the workers of H (for every holder set H, and for all trainers together).
inline std::int64_t trainer_balance_bound(const Correspondence& correspondence) {
  std::map<std::set<int>, std::int64_t> by_holders;
  for (const Atom& atom : correspondence.atoms) {
    std::set<int> holders;
    for (const AtomEndpoint& h : atom.holders) holders.insert(h.worker);
    by_holders[holders] += atom_bytes(correspondence, atom);
  }
  std::set<int> all;
  for (std::size_t w = 0; w < correspondence.sides.size(); ++w)
    if (correspondence.sides[w] == Side::kTrainer) all.insert(static_cast<int>(w));
  by_holders.try_emplace(all, 0);
  std::int64_t bound = 0;
  for (const auto& [set, unused] : by_holders) {
    std::int64_t bytes = 0;
    for (const auto& [other, other_bytes] : by_holders)
      if (std::includes(set.begin(), set.end(), other.begin(), other.end())) bytes += other_bytes;
    bound = std::max(bound, (bytes + static_cast<std::int64_t>(set.size()) - 1) / static_cast<std::int64_t>(set.size()));
  }
  return bound;
}

/// The unit of balancing: a piece (at most twice the requested size), never less than one slice of an atom.
inline std::int64_t balancing_unit_bytes(const Correspondence& correspondence, const PlanOptions& options) {
  std::int64_t largest = 0;
  const std::int64_t piece = options.piece_bytes > 0 ? options.piece_bytes : std::int64_t{16} << 20;
  for (const Atom& atom : correspondence.atoms) {
    const std::int64_t bytes = atom_bytes(correspondence, atom);
    std::size_t axis = 0;
    while (axis + 1 < atom.box.extent.size() && atom.box.extent[axis] == 1) ++axis;
    const std::int64_t slice = atom.box.extent.empty() ? bytes : bytes / atom.box.extent[axis];
    largest = std::max(largest, std::min(bytes, std::max(2 * piece, slice)));
  }
  return largest;
}

}  // namespace wb::testing_support
