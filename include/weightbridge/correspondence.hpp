// Correspondence: what each trainer worker holds that each rollout worker needs, in checkpoint
// coordinates, with positions on both sides. Built on rank 0 from the all-gathered source maps.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/source_map.hpp"

namespace wb {

enum class Side : std::uint8_t { kTrainer, kRollout };

/// Where a worker holds (trainer) or needs (rollout) the elements of an atom: the copy of its source map
/// that covers them. The position of atom element i is copy.offset + Σ_a (atom.box.offset[a] -
/// copy.box.offset[a] + i[a]) · copy.strides[a] in parameter copy.parameter.
struct AtomEndpoint {
  int worker = 0;           // index into the maps given to build_correspondence (the world rank)
  std::uint32_t copy = 0;   // index into that worker's SourceMap::copies
};

/// A box of one checkpoint tensor with one holder set and one needer set: every element of the box is
/// held by exactly these trainer copies and needed by exactly these rollout copies.
struct Atom {
  std::uint32_t tensor = 0;
  Box box;
  std::vector<AtomEndpoint> holders;  // ascending (worker, copy)
  std::vector<AtomEndpoint> needers;  // ascending (worker, copy)
};

struct Correspondence {
  std::vector<TensorInfo> tensors;
  std::vector<SourceMap> maps;   // one per worker, as given
  std::vector<Side> sides;       // one per worker
  std::vector<Atom> atoms;       // atoms that some rollout needs, grouped by tensor in tensor order

  /// Parameter position (flat element index) of atom element `index` (box-relative) at an endpoint.
  std::int64_t position(const Atom& atom, const AtomEndpoint& endpoint, std::span<const std::int64_t> index) const;
  /// Elements needed in total (each needer counted) and distinct needed elements (M / element size).
  std::int64_t needed_elements() const;
};

/// The first box of a tensor of `shape` that none of `boxes` covers, or nullopt when they cover all of
/// it. Exact: works on the grid of all box boundaries, so partial overlaps are handled.
std::optional<Box> first_uncovered_box(const Shape& shape, const std::vector<Box>& boxes);

/// Cuts every checkpoint tensor into atoms. Throws wb::Error (kInvalidArgument) naming the tensor, the
/// box and a rollout worker when a rollout needs an element no trainer holds. Only the atoms some rollout
/// needs are kept; what trainers hold and no rollout needs is not sent.
Correspondence build_correspondence(const std::vector<TensorInfo>& checkpoint_tensors, std::vector<SourceMap> maps,
                                    std::vector<Side> sides);

}  // namespace wb
