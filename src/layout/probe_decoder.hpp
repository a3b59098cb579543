// The probe's decoder: the digit passes of one parameter (the nonzeros of their second differences) ->
// the slice copies that load_weights made of checkpoint elements there.
#pragma once

#include <cstdint>
#include <vector>

#include "layout/probe_code.hpp"
#include "layout/second_difference.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::layout {

/// Appends to `out` the copies of parameter `param` (index `index` in the map), from `passes` (pass p's
/// nonzeros in this parameter, plan.num_passes() of them) keyed by `plan`. Copies are not normalized.
/// Throws wb::Error naming the parameter and element where the codes are no copy of checkpoint elements.
void decode_parameter(const Parameter& param, std::uint32_t index, const ProbePlan& plan,
                      const std::vector<TensorInfo>& tensors, const std::vector<const SparseField*>& passes,
                      std::vector<SliceCopy>& out);

}  // namespace wb::layout
