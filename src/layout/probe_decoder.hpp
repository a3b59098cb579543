// The probe's decoder: the digit passes of one parameter (the nonzeros of their second differences) ->
// the slice copies that load_weights made of checkpoint elements there.
#pragma once

#include <cstdint>
#include <vector>

#include "layout/probe_checkpoint.hpp"
#include "layout/probe_code.hpp"
#include "layout/second_difference.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::layout {

/// Appends to `out` the copies of parameter `param` (index `index` in the map), from `passes` (pass p's
/// nonzeros in this parameter, plan.num_passes() of them) keyed by `plan`. Copies are not normalized.
/// Throws wb::Error naming the parameter and element where the codes are no copy of checkpoint elements.
///
/// With `keyed`, `passes` holds the first plan.num_passes() - 1 passes and the parameter itself the keyed
/// pass's codes (KeyedDigit): the cells come from the lower digits, and each cell's corner and the element one
/// step along each of its long axes give its top digit. The other elements are then the check (the replay
/// against the keyed pass; see keyed_copies_checked).
/// Whether every copy decoded with a keyed pass has an element beyond the 1 + (long axes) that its keys need:
/// the corner and the steps of a cell are not checked by the replay (they decided its keys), so a copy must
/// hold a cell's other element or be merged from cells that agree (a value load_weights computed there decodes
/// to a key off the copy's line, but for 1 in D). False for one element or a run of two.
bool keyed_copies_checked(const std::vector<SliceCopy>& copies);

void decode_parameter(const Parameter& param, std::uint32_t index, const ProbePlan& plan,
                      const std::vector<TensorInfo>& tensors, const std::vector<const SparseField*>& passes,
                      std::vector<SliceCopy>& out, const KeyedDigit* keyed = nullptr);

}  // namespace wb::layout
