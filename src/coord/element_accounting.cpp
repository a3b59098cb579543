#include "coord/element_accounting.hpp"

#include <algorithm>
#include <unordered_set>

#include "core/log.hpp"

namespace wb::coord {
namespace {

// Names in a message: all of them up to a length a reader takes in, then how many more.
std::string name_list(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 64;
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) out += (i == 0 ? "" : ", ") + names[i];
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

std::string plural(std::size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::string unknown_not_loaded(const ParameterSet& params, const std::vector<std::string>& not_loaded) {
  std::vector<std::string> unknown;
  for (const std::string& name : not_loaded)
    if (params.find(name) == nullptr) unknown.push_back(name);
  return name_list(unknown);
}

Status account_elements(const ParameterSet& params, const std::vector<ParameterAccount>& accounts,
                        const std::vector<std::string>& not_loaded, bool rollout, const std::string& who) {
  const std::unordered_set<std::string> declared(not_loaded.begin(), not_loaded.end());
  std::vector<std::string> unwritten, written_declared, kept;
  std::size_t written_any = 0;
  for (std::size_t i = 0; i < params.size() && i < accounts.size(); ++i) {
    const Parameter& p = params[i];
    const ParameterAccount& a = accounts[i];
    const std::int64_t n = p.view.numel();
    const bool written = a.copied + a.constant > 0;
    if (written) ++written_any;
    if (declared.count(p.name) != 0) {
      if (written)
        written_declared.push_back(p.name + " (" + std::to_string(a.copied + a.constant) + " of " + std::to_string(n) +
                                   " elements)");
      continue;
    }
    if (n > 0 && !written) {
      unwritten.push_back(p.name);
      continue;
    }
    std::string what;
    if (a.unwritten > 0) what = std::to_string(a.unwritten) + " of " + std::to_string(n) + " elements never written";
    if (a.constant > 0)
      what += (what.empty() ? "" : ", ") + std::to_string(a.constant) + " of " + std::to_string(n) +
              " elements written with 0";
    if (!what.empty()) kept.push_back(p.name + " (" + what + ")");
  }
  if (!written_declared.empty())
    return Status(ErrorCode::kInvalidArgument,
                  who + "parameters declared not loaded (not_loaded) are written by load_weights after all: " +
                      name_list(written_declared) +
                      "; the transfers would update them: take them out of not_loaded, or out of the parameters");
  if (rollout && !unwritten.empty()) {
    const bool nothing = written_any == 0;
    const std::string cause =
        nothing ? "load_weights wrote nothing on this rank (it returned before loading, or loads into other tensors "
                  "than the parameters given to the adapter)"
                : "load_weights never writes them: a checkpoint name its mappings miss (a stacked_params_mapping "
                  "entry, say), or a tensor the trainers' tensor list (checkpoint_tensors) lacks";
    return Status(ErrorCode::kInvalidArgument,
                  who + "no update would reach " + plural(unwritten.size(), "parameter", "parameters") + " of " +
                      std::to_string(params.size()) + " on this rank: " + name_list(unwritten) + ". Cause: " + cause +
                      ". Parameters the engine fills itself (a rotary cache, say) are declared in the not_loaded "
                      "option");
  }
  if (!unwritten.empty()) {
    WB_LOG(kWarn) << who << "load_weights never writes " << plural(unwritten.size(), "parameter", "parameters")
                  << " of this trainer, which it therefore never sends: " << name_list(unwritten);
  }
  // A trainer's elements that no checkpoint element fills are simply never sent.
  if (!kept.empty() && rollout) {
    WB_LOG(kWarn) << who << "no update writes these elements, kept as the engine holds them: " << name_list(kept);
  } else if (!kept.empty()) {
    WB_LOG(kDebug) << who << "never sent, as load_weights fills them from no checkpoint element: " << name_list(kept);
  }
  return Status::ok();
}

}  // namespace wb::coord
