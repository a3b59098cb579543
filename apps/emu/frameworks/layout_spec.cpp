#include "emu/frameworks/layout_spec.hpp"

#include <charconv>
#include <map>
#include <sstream>

#include "layout/fp8_form.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

// "tp=4,pp=2" → {tp: "4", pp: "2"}; rejects keys not in `allowed`.
std::map<std::string, std::string> parse_pairs(std::string_view text, std::string_view kind,
                                               std::initializer_list<std::string_view> allowed) {
  std::map<std::string, std::string> pairs;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) {
      if (comma == text.size()) break;
      continue;
    }
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(kind) + " spec '" + std::string(text) + "': '" + std::string(item) + "' is not key=value");
    const std::string key(item.substr(0, eq));
    bool known = false;
    for (std::string_view a : allowed) known = known || a == key;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      throw Error(ErrorCode::kInvalidArgument, std::string(kind) + " spec '" + std::string(text) + "': unknown key '" +
                                                   key + "' (known: " + list + ")");
    }
    if (!pairs.emplace(key, std::string(item.substr(eq + 1))).second)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(kind) + " spec '" + std::string(text) + "': key '" + key + "' given twice");
    if (comma == text.size()) break;
  }
  return pairs;
}

int positive(const std::map<std::string, std::string>& pairs, const std::string& key, int fallback,
             std::string_view kind, std::string_view text, int minimum = 1) {
  auto it = pairs.find(key);
  if (it == pairs.end()) return fallback;
  int value = 0;
  const auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), value);
  if (ec != std::errc() || end != it->second.data() + it->second.size() || value < minimum)
    throw Error(ErrorCode::kInvalidArgument, std::string(kind) + " spec '" + std::string(text) + "': " + key + "='" +
                                                 it->second + "' is not an integer >= " + std::to_string(minimum));
  return value;
}

}  // namespace

TrainerSpec TrainerSpec::parse(std::string_view text) {
  const auto pairs = parse_pairs(text, "trainer", {"tp", "pp", "cp", "dp", "ep", "etp", "pp_last"});
  TrainerSpec spec;
  spec.tp = positive(pairs, "tp", 1, "trainer", text);
  spec.pp = positive(pairs, "pp", 1, "trainer", text);
  spec.cp = positive(pairs, "cp", 1, "trainer", text);
  spec.dp = positive(pairs, "dp", 1, "trainer", text);
  spec.ep = positive(pairs, "ep", 1, "trainer", text);
  spec.etp = positive(pairs, "etp", 1, "trainer", text);
  spec.pp_last = positive(pairs, "pp_last", 0, "trainer", text, 0);
  if (spec.ranks_per_stage() % spec.ep != 0)
    throw Error(ErrorCode::kInvalidArgument, "trainer spec '" + std::string(text) + "': ep=" + std::to_string(spec.ep) +
                                                 " does not divide tp*cp*dp=" + std::to_string(spec.ranks_per_stage()));
  if (spec.pp_last != 0 && spec.pp == 1)
    throw Error(ErrorCode::kInvalidArgument, "trainer spec '" + std::string(text) + "': pp_last needs pp > 1");
  return spec;
}

std::string TrainerSpec::to_string() const {
  std::ostringstream out;
  out << "tp=" << tp << ",pp=" << pp << ",cp=" << cp << ",dp=" << dp << ",ep=" << ep;
  if (etp != 1) out << ",etp=" << etp;
  if (pp_last != 0) out << ",pp_last=" << pp_last;
  return out.str();
}

std::vector<std::pair<std::int64_t, std::int64_t>> TrainerSpec::stage_layers(std::int64_t num_layers) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> stages;
  if (pp_last == 0) {
    if (num_layers % pp != 0)
      throw Error(ErrorCode::kInvalidArgument, "trainer " + to_string() + ": pp=" + std::to_string(pp) +
                                                   " does not divide " + std::to_string(num_layers) +
                                                   " layers (set pp_last for an uneven last stage)");
    for (int s = 0; s < pp; ++s) stages.emplace_back(s * (num_layers / pp), num_layers / pp);
    return stages;
  }
  const std::int64_t rest = num_layers - pp_last;
  if (pp_last >= num_layers || rest % (pp - 1) != 0 || rest / (pp - 1) == 0)
    throw Error(ErrorCode::kInvalidArgument, "trainer " + to_string() + ": " + std::to_string(num_layers) +
                                                 " layers minus pp_last=" + std::to_string(pp_last) +
                                                 " do not split evenly over the other " + std::to_string(pp - 1) +
                                                 " stages");
  const std::int64_t per = rest / (pp - 1);
  for (int s = 0; s < pp - 1; ++s) stages.emplace_back(s * per, per);
  stages.emplace_back(rest, pp_last);
  return stages;
}

RolloutSpec RolloutSpec::parse(std::string_view text) {
  const auto pairs = parse_pairs(text, "rollout", {"engines", "tp", "ep", "dp_attn", "transpose", "fp8", "fp8_rule", "bf16_engines"});
  RolloutSpec spec;
  // engines=0: a trainer job whose engines all join by address (resolve_deployment refuses it otherwise).
  spec.engines = positive(pairs, "engines", 1, "rollout", text, 0);
  spec.tp = positive(pairs, "tp", 1, "rollout", text);
  spec.ep = positive(pairs, "ep", 1, "rollout", text);
  spec.dp_attn = positive(pairs, "dp_attn", 1, "rollout", text);
  if (auto it = pairs.find("transpose"); it != pairs.end()) {
    if (it->second == "experts") spec.transpose_experts = true;
    else if (it->second != "none")
      throw Error(ErrorCode::kInvalidArgument, "rollout spec '" + std::string(text) + "': transpose='" + it->second +
                                                   "' (known: experts, none)");
  }
  const std::string where = "rollout spec '" + std::string(text) + "': ";
  if (auto it = pairs.find("fp8"); it != pairs.end())
    layout::parse_block_shape(it->second, spec.fp8_block_rows, spec.fp8_block_cols, where + "fp8");
  if (auto it = pairs.find("fp8_rule"); it != pairs.end()) {
    if (!spec.fp8()) throw Error(ErrorCode::kInvalidArgument, where + "fp8_rule needs fp8=BLOCK (e.g. fp8=128x128)");
    (void)layout::parse_scale_rule_or_throw(it->second, where + "fp8_rule");
    spec.fp8_rule = it->second;
  }
  spec.bf16_engines = positive(pairs, "bf16_engines", 0, "rollout", text, 0);
  if (spec.bf16_engines > 0 && !spec.fp8())
    throw Error(ErrorCode::kInvalidArgument, where + "bf16_engines needs fp8=BLOCK (the others' form)");
  if (spec.bf16_engines > 0 && spec.bf16_engines >= spec.engines)
    throw Error(ErrorCode::kInvalidArgument, where + "bf16_engines=" + std::to_string(spec.bf16_engines) +
                                                 " leaves none of the " + std::to_string(spec.engines) +
                                                 " engines in FP8 (drop fp8 for BF16 engines only)");
  if (spec.tp % spec.ep != 0)
    throw Error(ErrorCode::kInvalidArgument, "rollout spec '" + std::string(text) + "': ep=" + std::to_string(spec.ep) +
                                                 " does not divide tp=" + std::to_string(spec.tp));
  if (spec.tp % spec.dp_attn != 0)
    throw Error(ErrorCode::kInvalidArgument, "rollout spec '" + std::string(text) + "': dp_attn=" +
                                                 std::to_string(spec.dp_attn) + " does not divide tp=" +
                                                 std::to_string(spec.tp));
  return spec;
}

std::string RolloutSpec::to_string() const {
  std::ostringstream out;
  out << "engines=" << engines << ",tp=" << tp << ",ep=" << ep;
  if (dp_attn != 1) out << ",dp_attn=" << dp_attn;
  if (transpose_experts) out << ",transpose=experts";
  if (fp8()) out << ",fp8=" << fp8_block_rows << "x" << fp8_block_cols << ",fp8_rule=" << fp8_rule;
  if (bf16_engines > 0) out << ",bf16_engines=" << bf16_engines;
  return out.str();
}

RolloutSpec RolloutSpec::of_engine(int engine) const {
  RolloutSpec spec = *this;
  spec.bf16_engines = 0;
  if (!fp8_engine(engine)) {
    spec.fp8_block_rows = spec.fp8_block_cols = 0;
    spec.fp8_rule = RolloutSpec{}.fp8_rule;
  }
  return spec;
}

std::vector<Side> Deployment::sides() const {
  std::vector<Side> out;
  for (int r = 0; r < world_size(); ++r) out.push_back(is_trainer(r) ? Side::kTrainer : Side::kRollout);
  return out;
}

std::string Deployment::worker_name(int world_rank) const {
  const int trainers = trainer.world_size();
  const std::string role = is_trainer(world_rank) ? "trainer " + std::to_string(world_rank)
                                                  : "engine " + std::to_string((world_rank - trainers) / rollout.tp) + " worker " +
                                                        std::to_string((world_rank - trainers) % rollout.tp);
  return role + " (world rank " + std::to_string(world_rank) + ")";
}

}  // namespace wb::emu
