#include "emu/reports/trace_file.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>

#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

// Fixed lane order in the viewer: the pipeline's steps as a round goes through them.
const char* const kKinds[] = {"pack", "credit wait", "write", "forward", "assemble", "stall"};

int kind_index(const std::string& kind) {
  for (int k = 0; k < 6; ++k)
    if (kind == kKinds[k]) return k;
  return 6;
}

}  // namespace

nlohmann::json timeline_json(const AdapterStats& stats) {
  nlohmann::json spans = nlohmann::json::array();
  for (const TraceSpan& s : stats.trace) spans.push_back({s.kind, s.version, s.round, s.begin_seconds, s.end_seconds});
  return spans;
}

RankTimeline timeline_from_json(int rank, const std::string& who, const nlohmann::json& report) {
  RankTimeline timeline;
  timeline.rank = rank;
  timeline.who = who;
  if (report.contains("trace"))
    for (const nlohmann::json& s : report.at("trace")) {
      const int k = kind_index(s.at(0).get<std::string>());
      if (k >= 6) continue;
      timeline.spans.push_back({kKinds[k], s.at(1).get<std::uint64_t>(), s.at(2).get<int>(), s.at(3).get<double>(),
                                s.at(4).get<double>()});
    }
  if (report.contains("stalls"))
    for (const nlohmann::json& s : report.at("stalls")) {
      timeline.stalls.push_back({s.at(0).get<std::uint64_t>(), s.at(1).get<double>(), s.at(2).get<double>()});
      if (s.size() > 3) timeline.stall_labels.resize(timeline.stalls.size()), timeline.stall_labels.back() = s.at(3).get<std::string>();
    }
  return timeline;
}

nlohmann::json chrome_trace(const std::vector<RankTimeline>& timelines) {
  double origin = std::numeric_limits<double>::infinity();
  for (const RankTimeline& t : timelines) {
    for (const TraceSpan& s : t.spans) origin = std::min(origin, s.begin_seconds);
    for (const StallInterval& s : t.stalls) origin = std::min(origin, s.begin_seconds);
  }
  if (!std::isfinite(origin)) origin = 0;
  const auto us = [origin](double seconds) { return (seconds - origin) * 1e6; };

  nlohmann::json events = nlohmann::json::array();
  for (const RankTimeline& t : timelines) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", t.rank}, {"args", {{"name", t.who}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", t.rank}, {"args", {{"sort_index", t.rank}}}});
    struct Item {
      int kind;
      std::uint64_t version;
      int round;  // -1: a stall
      double begin, end;
      std::string label;
    };
    std::vector<Item> items;
    for (const TraceSpan& s : t.spans) items.push_back({kind_index(s.kind), s.version, s.round, s.begin_seconds, s.end_seconds, {}});
    for (std::size_t i = 0; i < t.stalls.size(); ++i) {
      const StallInterval& s = t.stalls[i];
      items.push_back({5, s.version, -1, s.begin_seconds, s.end_seconds, i < t.stall_labels.size() ? t.stall_labels[i] : ""});
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.kind != b.kind ? a.kind < b.kind : a.begin < b.begin;
    });
    // Per kind, the first lane free at a span's begin: slices on one thread never overlap.
    std::map<int, std::vector<double>> lane_ends;
    for (const Item& item : items) {
      std::vector<double>& ends = lane_ends[item.kind];
      std::size_t lane = 0;
      while (lane < ends.size() && ends[lane] > item.begin) ++lane;
      if (lane == ends.size()) {
        ends.push_back(0);
        const int tid = item.kind * 100 + static_cast<int>(lane);
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", t.rank}, {"tid", tid},
                          {"args", {{"name", std::string(kKinds[item.kind]) + (lane ? " " + std::to_string(lane + 1) : "")}}}});
        events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", t.rank}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
      }
      ends[lane] = item.end;
      nlohmann::json args = {{"version", item.version}};
      if (item.round >= 0) args["round"] = item.round;
      if (!item.label.empty()) args["method"] = item.label;
      events.push_back({{"name", item.round >= 0 ? std::string(kKinds[item.kind]) + " r" + std::to_string(item.round)
                                                 : "stall v" + std::to_string(item.version) +
                                                       (item.label.empty() ? "" : " (" + item.label + ")")},
                        {"cat", kKinds[item.kind]},
                        {"ph", "X"},
                        {"pid", t.rank},
                        {"tid", item.kind * 100 + static_cast<int>(lane)},
                        {"ts", us(item.begin)},
                        {"dur", std::max(0.0, (item.end - item.begin) * 1e6)},
                        {"args", args}});
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void write_chrome_trace(const std::string& path, const std::vector<RankTimeline>& timelines) {
  std::ofstream out(path);
  out << chrome_trace(timelines).dump() << '\n';
  if (!out) throw Error(ErrorCode::kSystem, "cannot write the trace " + path);
}

}  // namespace wb::emu
