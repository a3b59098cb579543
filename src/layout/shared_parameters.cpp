#include "layout/shared_parameters.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>

#include "core/log.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

bool same_memory(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.nbytes() == b.nbytes() && a.dtype == b.dtype && a.shape == b.shape;
}

std::string extent_text(const Parameter& p) {
  return std::string(dtype_name(p.view.dtype)) + " " + shape_to_string(p.view.shape);
}

}  // namespace

SharedParameters find_shared_parameters(const ParameterSet& params) {
  struct Span {
    int memory;  // MemoryKind, then the device: only parameters in one memory can overlap
    int device;
    std::uintptr_t begin, end;
    std::size_t index;
  };
  std::vector<Span> spans;
  spans.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorView& v = params[i].view;
    if (v.nbytes() == 0) continue;  // holds no byte, shares none
    const auto begin = reinterpret_cast<std::uintptr_t>(v.data);
    spans.push_back({static_cast<int>(v.memory), v.memory == MemoryKind::kCuda ? v.device : 0, begin, begin + v.nbytes(), i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.memory, a.device, a.begin, a.end, a.index) < std::tie(b.memory, b.device, b.begin, b.end, b.index);
  });
  std::vector<std::size_t> first(params.size());  // the first parameter (by position) with the same memory
  for (std::size_t i = 0; i < params.size(); ++i) first[i] = i;
  for (std::size_t s = 1, reach = 0; s < spans.size(); ++s) {  // spans[reach]: the one ending last so far
    const Span& a = spans[reach];
    const Span& b = spans[s];
    const bool overlaps = a.memory == b.memory && a.device == b.device && b.begin < a.end;
    if (!overlaps) {
      reach = s;
      continue;
    }
    const Parameter& pa = params[a.index];
    const Parameter& pb = params[b.index];
    if (!same_memory(pa.view, pb.view))
      throw Error(ErrorCode::kInvalidArgument,
                  "parameters " + pa.name + " (" + extent_text(pa) + ") and " + pb.name + " (" + extent_text(pb) +
                      ") overlap in memory without being the same tensor: an update of one would write into the "
                      "other. Pass each memory once (tied weights may share one tensor under two names)");
    first[b.index] = first[a.index];
    if (b.end > a.end) reach = s;
  }
  SharedParameters shared;
  bool any = false;
  for (std::size_t i = 0; i < params.size() && !any; ++i) any = first[i] != i;
  if (!any) return shared;  // the common case: no name index built
  shared.of.resize(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (first[i] != i) {
      shared.of[i] = shared.of[first[i]];  // first[i] < i: already numbered
      continue;
    }
    shared.of[i] = static_cast<std::uint32_t>(shared.distinct.size());
    shared.distinct.add(params[i].name, params[i].view);
  }
  return shared;
}

SourceMap expand_shared_parameters(const SourceMap& distinct_map, const ParameterSet& params,
                                   const SharedParameters& shared, const std::vector<TensorInfo>& checkpoint_tensors,
                                   ProbeReport* report) {
  std::vector<std::vector<std::uint32_t>> names(shared.distinct.size());  // distinct index -> whole-set indices
  for (std::size_t i = 0; i < shared.of.size(); ++i) names[shared.of[i]].push_back(static_cast<std::uint32_t>(i));
  SourceMap map;
  for (const Parameter& p : params) map.parameters.push_back(TensorInfo{p.name, p.view.dtype, p.view.shape});
  map.copies.reserve(distinct_map.copies.size());
  for (const SliceCopy& copy : distinct_map.copies)
    for (const std::uint32_t i : names[copy.parameter]) {
      map.copies.push_back(copy);
      map.copies.back().parameter = i;
    }
  if (report != nullptr && report->accounts.size() == shared.distinct.size()) {
    std::vector<ParameterAccount> accounts(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) accounts[i] = report->accounts[shared.of[i]];
    report->accounts = std::move(accounts);
  }
  std::vector<std::vector<std::uint32_t>> sources(names.size());  // distinct index -> checkpoint tensors
  for (const SliceCopy& copy : distinct_map.copies) sources[copy.parameter].push_back(copy.tensor);
  for (std::size_t d = 0; d < names.size(); ++d) {
    const std::vector<std::uint32_t>& same = names[d];
    if (same.size() < 2) continue;
    WB_LOG(kInfo) << "probe: parameters " << params[same[0]].name << " and " << params[same[1]].name
                  << (same.size() > 2 ? " (and " + std::to_string(same.size() - 2) + " more)" : std::string())
                  << " are one memory (tied weights): probed once, updated under each name";
    // A loader that writes both tied tensors leaves the last one in the memory: say so before planning
    // finds that no worker holds the other.
    for (const std::uint32_t i : same) {
      const auto own = std::find_if(checkpoint_tensors.begin(), checkpoint_tensors.end(),
                                    [&](const TensorInfo& t) { return t.name == params[i].name; });
      if (own == checkpoint_tensors.end() || sources[d].empty()) continue;
      const auto t = static_cast<std::uint32_t>(own - checkpoint_tensors.begin());
      if (std::find(sources[d].begin(), sources[d].end(), t) != sources[d].end()) continue;
      WB_LOG(kWarn) << "probe: parameter " << params[i].name << " shares its memory with " << params[i == same[0] ? same[1] : same[0]].name
                    << ", and load_weights left checkpoint tensor " << checkpoint_tensors[sources[d].front()].name
                    << " there, not tensor " << params[i].name
                    << " (both written, the last one stays): list one of the tied tensors only";
    }
  }
  return normalize_source_map(std::move(map));
}

}  // namespace wb::layout
