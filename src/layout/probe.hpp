// The correspondence extractor's first step: learn a worker's source map by probing its load_weights.
//
// The probe calls load_weights on a probe checkpoint (the real tensor list, values that encode each
// element's tensor and coordinates, produced box by box), once per digit pass, reads the codes back from
// the parameters, keeps only the nonzeros of their second differences, and decodes those into slice
// copies. A final verification pass with hashed values checks that the decoded copies reproduce
// load_weights exactly (for 2-byte codes the last digit pass, keyed by the lower digits, is that pass too),
// so a load_weights that is not a pure copy (arithmetic, a scale, a dtype conversion) is reported, never
// silently mis-mapped. The verification pass starts from a marker instead of
// zeros, so that it also tells elements load_weights never writes from elements it writes with a constant 0
// (padding rows a loader zeroes): the accounting of every element (ParameterAccount). The parameters'
// contents are restored afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/tensor.hpp"

namespace wb {

/// The worker's own loader: fills `params` from `checkpoint`; called several times by the probe. The same
/// type as the adapters' LoadWeightsFn (weightbridge/adapter.hpp), named here so that layout does not
/// depend on coord.
using ProbeLoader = std::function<void(const CheckpointReader& checkpoint, const ParameterSet& params)>;

struct ProbeOptions {
  std::uint64_t verification_seed = 0x5eedf00dULL;
};

/// What load_weights made of one parameter's elements: every element is one of the three.
struct ParameterAccount {
  std::int64_t copied = 0;     // a copy of a checkpoint element (updated at every version)
  std::int64_t constant = 0;   // written with a constant (0) by load_weights, no checkpoint element
  std::int64_t unwritten = 0;  // never written by load_weights
};

/// What probing cost, for the measurements the tools print, and what it found.
struct ProbeReport {
  int passes = 0;                      // load_weights calls, verification included
  double seconds = 0;                  // wall time of the whole probe
  double cpu_seconds = 0;              // the calling thread's CPU time over the whole probe (user and system)
  double decode_seconds = 0;           // second differences and decoding, without load_weights
  double load_seconds = 0;             // the load_weights passes, with the parameters' fill before each
  double verify_seconds = 0;           // replaying the decoded copies against the verification pass
  double save_seconds = 0;             // saving the parameters' contents and writing them back at the end
  double load_cpu_seconds = 0;         // the calling thread's CPU time in each of the four (a load_weights
  double decode_cpu_seconds = 0;       // that works on threads of its own adds theirs to no field)
  double verify_cpu_seconds = 0;
  double save_cpu_seconds = 0;
  std::size_t parameter_bytes = 0;     // the parameters themselves
  std::size_t scratch_bytes = 0;       // the saved parameter contents (one parameter-sized buffer each)
  std::size_t sparse_bytes = 0;        // the kept nonzeros of every pass
  std::size_t copies = 0;              // slice copies in the decoded map
  std::size_t serialized_bytes = 0;    // the map's compact form
  std::vector<ParameterAccount> accounts;  // per parameter, in the order of `params`
};

/// Probes `load_weights` on `params` (contiguous; host memory, or all in the memory of one CUDA device)
/// against a checkpoint with `checkpoint_tensors`, and returns the normalized source map. Throws
/// wb::Error naming the parameter and the first bad position when load_weights is not a pure copy, and
/// restores the parameters' contents in every case. CUDA parameters are probed through host copies
/// (probe_source_map_through, with device copies).
SourceMap probe_source_map(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params,
                           const ProbeLoader& load_weights, const ProbeOptions& options = {},
                           ProbeReport* report = nullptr);

/// How the probe reaches parameters that it cannot read in place (CUDA memory). Each function throws
/// wb::Error when it fails.
struct ParameterAccess {
  std::function<void(const Parameter& param, void* host)> read;         // the parameter's bytes -> host
  std::function<void(const Parameter& param, const void* host)> write;  // host -> the parameter's bytes
  std::function<void(const Parameter& param)> zero;                     // the parameter's bytes = 0
  std::function<void()> done;  // the reads, writes and zeroes issued so far are complete (may be empty)
};

/// probe_source_map on host copies of `params`: around every load_weights call on the real parameters,
/// they are zeroed before and read back after; their contents are written back at the end. The host copies
/// cost one parameter-sized buffer each, in addition to the probe's own scratch.
SourceMap probe_source_map_through(const std::vector<TensorInfo>& checkpoint_tensors, const ParameterSet& params,
                                   const ProbeLoader& load_weights, const ParameterAccess& access,
                                   const ProbeOptions& options = {}, ProbeReport* report = nullptr);

}  // namespace wb
