// Parameters that share memory. Tied weights (an input embedding that is also the output head) are one
// tensor under two names, and a state_dict lists both. The probe sees such memory once: probed under both
// names, its verification would set the copies of one back to its marker under the other. So each memory is
// probed under its first name and the other names get the same copies: an update writes them (the same
// bytes) once per name.
#pragma once

#include <cstdint>
#include <vector>

#include "layout/probe.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::layout {

/// Filled only when some memory has two names (any()); empty otherwise.
struct SharedParameters {
  ParameterSet distinct;            // each memory once, under the first name that has it
  std::vector<std::uint32_t> of;    // per parameter of the whole set: its index in `distinct`
  bool any() const { return !of.empty(); }
};

/// Groups the parameters that are the same memory (same address, bytes, dtype and shape). Throws
/// kInvalidArgument naming both parameters when two overlap otherwise (a view into another parameter, the
/// same bytes with another shape): neither could be updated without writing into the other.
SharedParameters find_shared_parameters(const ParameterSet& params);

/// The source map (and the report's accounts) of the distinct memories as that of the whole set: every
/// name of a memory gets its copies. Warns when one of those names is a checkpoint tensor that the memory
/// does not hold (a loader that wrote both tied tensors into it: the last one stays).
SourceMap expand_shared_parameters(const SourceMap& distinct_map, const ParameterSet& params,
                                   const SharedParameters& shared, const std::vector<TensorInfo>& checkpoint_tensors,
                                   ProbeReport* report);

}  // namespace wb::layout
