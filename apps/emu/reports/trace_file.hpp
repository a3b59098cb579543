// Chrome trace-event JSON of a run's timelines (opens in Perfetto or chrome://tracing): one process per
// rank, named by its role; per kind of span (pack, write, credit wait, forward, assemble, stall) as many
// threads as overlapping spans need, since pipelined rounds overlap and a track's slices must nest.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "weightbridge/adapter.hpp"

namespace wb::emu {

/// One rank's timeline, on the job's common clock (seconds).
struct RankTimeline {
  int rank = 0;
  std::string who;                   // "engine 0 worker 1 (world rank 3)"
  std::vector<TraceSpan> spans;      // AdapterStats::trace
  std::vector<StallInterval> stalls; // rollouts: the updates' stall intervals
  std::vector<std::string> stall_labels;  // empty, or one per stall (wb-bench: the method)
};

/// A rank's spans as JSON for a report (compact arrays), and back with the report's "stalls" ([version,
/// begin, end] or [version, begin, end, label]).
nlohmann::json timeline_json(const AdapterStats& stats);
RankTimeline timeline_from_json(int rank, const std::string& who, const nlohmann::json& report);

/// The trace-event document: times in microseconds from the earliest span of any rank.
nlohmann::json chrome_trace(const std::vector<RankTimeline>& timelines);

/// Writes chrome_trace(timelines) to `path`; throws wb::Error naming the file when it cannot.
void write_chrome_trace(const std::string& path, const std::vector<RankTimeline>& timelines);

}  // namespace wb::emu
