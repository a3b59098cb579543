// The rule that every rollout element is accounted for at connect (docs/architecture.md, property 9): after
// the probe, each element of each parameter is a copy of a checkpoint element, a constant that load_weights
// wrote, or part of a parameter the user declared as not loaded (AdapterOptions::not_loaded).
#pragma once

#include <string>
#include <vector>

#include "layout/probe.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::coord {

/// The names in `not_loaded` that are none of `params` (an empty string when all are), for the check at
/// construction.
std::string unknown_not_loaded(const ParameterSet& params, const std::vector<std::string>& not_loaded);

/// This worker's elements after its probe (`accounts`, one per parameter of `params`). An error, naming
/// `who` (the rank), every such parameter and the likely cause, when a rollout parameter is never written
/// by load_weights and not declared, or when a declared parameter is written after all. Otherwise logs once,
/// at warning level, what is kept as the engine holds it: parameters only partly reached and elements
/// written with a constant, with their counts (and, on trainers, parameters never written: never sent).
Status account_elements(const ParameterSet& params, const std::vector<ParameterAccount>& accounts,
                        const std::vector<std::string>& not_loaded, bool rollout, const std::string& who);

}  // namespace wb::coord
