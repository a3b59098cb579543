#include "exec/verify.hpp"

#include "exec/pack.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>

#include "comm/backoff.hpp"
#include "core/checks.hpp"
#include "core/hex.hpp"

namespace wb::exec {
struct Verifier::State {
  struct Table {                            // one buffer's segments, all rounds
    std::vector<std::int64_t> base;         // per round: index of its first segment
    std::vector<std::int64_t> offset, bytes;
    std::int64_t find(int round, std::int64_t at) const {  // segment starting at `at`, -1 if none
      const auto first = offset.begin() + base[static_cast<std::size_t>(round)];
      const auto last = offset.begin() + base[static_cast<std::size_t>(round) + 1];
      const auto it = std::lower_bound(first, last, at);
      return it != last && *it == at ? it - offset.begin() : -1;
    }
  };
  struct Entry {
    bool from_send = false;  // outgoing: the segment is in the send buffer (packed here) or the receive buffer
    std::int64_t segment = 0;
  };
  struct Link {
    int peer = 0;
    Stage stage = Stage::kReceive;
    std::vector<Entry> entries;
    std::vector<std::uint64_t> buffer;  // the message, preallocated
    MPI_Request request = MPI_REQUEST_NULL;
    bool done = false;
  };

  const RoundSchedule& schedule;
  MPI_Comm comm;
  int tag;
  Table send, receive;
  // Per round (empty without the sizes): the round's pack and assemble, compiled with its segments as
  // digest segments, so that they digest as they copy.
  std::vector<CopyProgram> pack_programs, assemble_programs;
  std::vector<DigestSums> partial;  // per segment of the round being packed or assembled
  std::vector<std::uint64_t> packed, arrived, expected;  // per segment: own digest (send, receive), expected (receive)
  std::vector<std::uint64_t> known;                      // per receive segment: the update its expected digest is from
  std::uint64_t update = 0;
  std::vector<Link> outgoing, incoming;

  // Round `round`'s segments of `table`, as digest segments of its programs.
  static std::vector<BufferRange> segments_of(const Table& table, int round) {
    std::vector<BufferRange> out;
    for (auto i = table.base[static_cast<std::size_t>(round)]; i < table.base[static_cast<std::size_t>(round) + 1]; ++i)
      out.push_back({table.offset[static_cast<std::size_t>(i)], table.bytes[static_cast<std::size_t>(i)]});
    return out;
  }

  // The digests a program of `round` adds into, one per segment of the round in `table`, zeroed.
  DigestSums* sums_for(const Table& table, int round) {
    const auto r = static_cast<std::size_t>(round);
    const auto count = static_cast<std::size_t>(table.base[r + 1] - table.base[r]);
    std::fill(partial.begin(), partial.begin() + static_cast<std::ptrdiff_t>(count), DigestSums{});
    return partial.data();
  }

  // Their values, into `out` (per segment of the table).
  void finish(const Table& table, int round, std::vector<std::uint64_t>& out) const {
    const auto r = static_cast<std::size_t>(round);
    for (auto i = table.base[r]; i < table.base[r + 1]; ++i)
      out[static_cast<std::size_t>(i)] = partial[static_cast<std::size_t>(i - table.base[r])].finish(table.bytes[static_cast<std::size_t>(i)]);
  }

  State(const RoundSchedule& s, MPI_Comm c, int t) : schedule(s), comm(c), tag(t) {
    const auto build = [&](Table& table, bool pack) {
      table.base.push_back(0);
      for (const RoundPlan& round : s.rounds) {
        std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
        for (const BufferCopy& copy : pack ? round.pack : round.assemble) ranges.emplace_back(copy.buffer_offset, copy.bytes());
        std::sort(ranges.begin(), ranges.end());
        ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
        // A segment is digested as a whole wherever it is: one that overlaps another could not be.
        for (std::size_t i = 1; i < ranges.size(); ++i)
          if (ranges[i].first < ranges[i - 1].first + ranges[i - 1].second)
            throw Error(ErrorCode::kUnsupported, std::string("verify: two ") + (pack ? "pack" : "assemble") + " copies of round " +
                                                     std::to_string(table.base.size()) + " read overlapping but different ranges of the buffer, at byte " +
                                                     std::to_string(ranges[i].first));
        for (const auto& [offset, bytes] : ranges) {
          table.offset.push_back(offset);
          table.bytes.push_back(bytes);
        }
        table.base.push_back(static_cast<std::int64_t>(table.offset.size()));
      }
    };
    build(send, true);
    build(receive, false);
    packed.assign(send.offset.size(), 0);
    arrived.assign(receive.offset.size(), 0);
    expected.assign(receive.offset.size(), 0);
    known.assign(receive.offset.size(), 0);
    // Cover [at, at + bytes) of a buffer with whole segments of `table`, appending them to `out`.
    const auto cover = [&](const Table& table, bool from_send, int round, std::int64_t at, std::int64_t bytes,
                           std::vector<Entry>& out, const char* what) {
      const std::int64_t end = at + bytes;
      while (at < end) {
        const std::int64_t segment = table.find(round, at);
        if (segment < 0 || at + table.bytes[static_cast<std::size_t>(segment)] > end)
          throw Error(ErrorCode::kUnsupported, std::string("verify: a ") + what + " of round " + std::to_string(round) +
                                                   " does not cover whole segments of the buffer at byte " + std::to_string(at));
        out.push_back({from_send, segment});
        at += table.bytes[static_cast<std::size_t>(segment)];
      }
    };
    std::map<int, std::size_t> out_index, in_index;
    const auto link = [](std::vector<Link>& links, std::map<int, std::size_t>& index, int peer, Stage stage) -> Link& {
      const auto [it, fresh] = index.emplace(peer, links.size());
      if (fresh) links.push_back({peer, stage, {}, {}, MPI_REQUEST_NULL, false});
      return links[it->second];
    };
    for (int r = 0; r < static_cast<int>(s.rounds.size()); ++r) {
      const RoundPlan& round = s.rounds[static_cast<std::size_t>(r)];
      // Writes are in (stage, peer, remote offset) order: per peer, the order its arrival regions have.
      for (const Write& w : round.writes) {
        const bool from_send = w.stage == Stage::kReceive;
        // A relay (lag 1) forwards bytes out of the previous round's receive slot: that round's segments.
        cover(from_send ? send : receive, from_send, r - static_cast<int>(w.lag), w.local_offset, w.bytes,
              link(outgoing, out_index, w.peer, w.stage).entries, "write");
      }
      for (const Arrival& a : round.arrivals) cover(receive, false, r, a.offset, a.bytes, link(incoming, in_index, a.peer, a.stage).entries, "region");
    }
    for (Link& l : outgoing) l.buffer.assign(l.entries.size(), 0);
    for (Link& l : incoming) l.buffer.assign(l.entries.size(), 0);
    std::size_t most = 0;  // segments of one round, in either buffer
    for (std::size_t r = 0; r < s.rounds.size(); ++r)
      most = std::max({most, static_cast<std::size_t>(send.base[r + 1] - send.base[r]),
                       static_cast<std::size_t>(receive.base[r + 1] - receive.base[r])});
    partial.resize(most);
  }
};

Verifier::Verifier(const RoundSchedule& schedule, MPI_Comm comm, int tag, std::span<const std::int64_t> parameter_bytes,
                   std::int64_t send_slot_bytes, std::int64_t receive_slot_bytes)
    : state_(new State(schedule, comm, tag)) {
  State& s = *state_;
  if (parameter_bytes.empty()) return;  // digests only (tests)
  for (int r = 0; r < static_cast<int>(schedule.rounds.size()); ++r) {
    const RoundPlan& round = schedule.rounds[static_cast<std::size_t>(r)];
    // The programs the executor would run (same stores), digesting too.
    const std::vector<BufferRange> sends = State::segments_of(s.send, r), receives = State::segments_of(s.receive, r);
    CopyProgramOptions options;
    options.digest_segments = sends;
    s.pack_programs.emplace_back(CopyDirection::kPack, round.pack, parameter_bytes, send_slot_bytes, options);
    options.digest_segments = receives;
    s.assemble_programs.emplace_back(CopyDirection::kAssemble, round.assemble, parameter_bytes, receive_slot_bytes, options);
  }
}

void Verifier::pack(int round, std::span<std::byte* const> parameters, std::byte* send_slot) {
  State& s = *state_;
  s.pack_programs[static_cast<std::size_t>(round)].execute(parameters, send_slot, s.sums_for(s.send, round));
  s.finish(s.send, round, s.packed);
}

void Verifier::assemble(int round, std::span<std::byte* const> parameters, std::byte* receive_slot) {
  State& s = *state_;
  s.assemble_programs[static_cast<std::size_t>(round)].execute(parameters, receive_slot, s.sums_for(s.receive, round));
  s.finish(s.receive, round, s.arrived);
}

Verifier::~Verifier() {
  // Sends still pending belong to a failed update; their buffers must outlive them.
  bool pending = false;
  for (State::Link& l : state_->outgoing) {
    int done = 1;
    if (l.request != MPI_REQUEST_NULL && MPI_Test(&l.request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) pending = true;
  }
  if (pending) return;  // kept: a peer may still receive from these buffers (a small, deliberate leak)
  delete state_;
}

std::int64_t Verifier::segments() const {
  return static_cast<std::int64_t>(state_->send.offset.size() + state_->receive.offset.size());
}

void Verifier::begin_update() { ++state_->update; }

void Verifier::packed(int round, const std::byte* send_slot) {
  State& s = *state_;
  const auto r = static_cast<std::size_t>(round);
  for (auto i = s.send.base[r]; i < s.send.base[r + 1]; ++i)
    s.packed[static_cast<std::size_t>(i)] =
        digest_bytes(send_slot + s.send.offset[static_cast<std::size_t>(i)], static_cast<std::size_t>(s.send.bytes[static_cast<std::size_t>(i)]));
}

void Verifier::arrived(int round, const std::byte* receive_slot) {
  State& s = *state_;
  const auto r = static_cast<std::size_t>(round);
  for (auto i = s.receive.base[r]; i < s.receive.base[r + 1]; ++i)
    s.arrived[static_cast<std::size_t>(i)] = digest_bytes(receive_slot + s.receive.offset[static_cast<std::size_t>(i)],
                                                          static_cast<std::size_t>(s.receive.bytes[static_cast<std::size_t>(i)]));
}

Status Verifier::exchange(double timeout, const std::function<Status()>& poll, const std::function<std::string(int)>& describe_rank,
                          const std::function<std::string(std::uint32_t, std::int64_t)>& describe_element,
                          std::int64_t idle_sleep_us) {
  State& s = *state_;
  const std::uint64_t update = s.update;
  for (State::Link& l : s.outgoing) l.done = false;
  for (State::Link& l : s.incoming) l.done = false;
  const auto stage_text = [](Stage stage) { return std::string(stage_name(stage)); };
  auto last_progress = std::chrono::steady_clock::now();
  comm::Backoff backoff(idle_sleep_us);
  for (int polls = 0;; ++polls) {
    bool progressed = false, waiting = false;
    for (State::Link& l : s.incoming) {
      if (l.done) continue;
      waiting = true;
      int found = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status probe;
      WB_TRY_MPI(MPI_Improbe(l.peer, s.tag, s.comm, &found, &message, &probe));
      if (!found) continue;
      int count = 0;
      WB_TRY_MPI(MPI_Get_count(&probe, MPI_BYTE, &count));
      if (static_cast<std::size_t>(count) != l.buffer.size() * 8) {
        std::vector<std::byte> sink(static_cast<std::size_t>(std::max(count, 0)));
        WB_TRY_MPI(MPI_Mrecv(sink.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
        return Status(ErrorCode::kCorruptData, "verify: " + describe_rank(l.peer) + " sent " + std::to_string(count / 8) +
                                                   " segment digests, the schedule has " + std::to_string(l.buffer.size()));
      }
      WB_TRY_MPI(MPI_Mrecv(l.buffer.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
      for (std::size_t i = 0; i < l.entries.size(); ++i) {
        const auto segment = static_cast<std::size_t>(l.entries[i].segment);
        s.expected[segment] = l.buffer[i];
        s.known[segment] = update;
      }
      l.done = progressed = true;
    }
    for (State::Link& l : s.outgoing) {
      if (l.done) continue;
      waiting = true;
      // A forwarder passes on what it was sent: only once all of it is known.
      bool ready = true;
      for (const State::Entry& e : l.entries)
        if (!e.from_send && s.known[static_cast<std::size_t>(e.segment)] != update) {
          ready = false;
          break;
        }
      if (!ready) continue;
      if (l.request != MPI_REQUEST_NULL) {  // last update's message to this peer, not yet taken
        int done = 0;
        WB_TRY_MPI(MPI_Test(&l.request, &done, MPI_STATUS_IGNORE));
        if (!done) continue;
      }
      for (std::size_t i = 0; i < l.entries.size(); ++i) {
        const auto segment = static_cast<std::size_t>(l.entries[i].segment);
        l.buffer[i] = l.entries[i].from_send ? s.packed[segment] : s.expected[segment];
      }
      WB_TRY_MPI(MPI_Isend(l.buffer.data(), static_cast<int>(l.buffer.size() * 8), MPI_BYTE, l.peer, s.tag, s.comm, &l.request));
      l.done = progressed = true;
    }
    if (!waiting) break;
    const auto now = std::chrono::steady_clock::now();
    if (progressed) {
      last_progress = now;
      backoff.progressed();
      continue;
    }
    if (poll && polls % 16 == 0) WB_RETURN_IF_ERROR(poll());
    if (std::chrono::duration<double>(now - last_progress).count() > timeout) {
      std::string missing;
      for (const State::Link& l : s.incoming)
        if (!l.done) missing += (missing.empty() ? "" : ", ") + describe_rank(l.peer);
      for (const State::Link& l : s.outgoing)
        if (!l.done) missing += (missing.empty() ? "" : ", ") + ("what it forwards to " + describe_rank(l.peer));
      std::ostringstream text;
      text << "verify: the segment digests of " << missing << " did not come within " << timeout << " s";
      return Status(ErrorCode::kTimeout, text.str());
    }
    backoff.pause();
  }
  // Compare: every segment that arrived, against what its writer says was packed.
  for (const State::Link& l : s.incoming)
    for (const State::Entry& e : l.entries) {
      const auto segment = static_cast<std::size_t>(e.segment);
      if (s.arrived[segment] == s.expected[segment]) continue;
      // Name the elements: the assemble copies that read this segment.
      int round = 0;
      while (s.receive.base[static_cast<std::size_t>(round) + 1] <= e.segment) ++round;
      const std::int64_t offset = s.receive.offset[segment];
      std::string where;
      for (const BufferCopy& copy : s.schedule.rounds[static_cast<std::size_t>(round)].assemble) {
        if (copy.buffer_offset != offset) continue;
        std::int64_t last = copy.copy.offset;
        for (std::size_t a = 0; a < copy.copy.strides.size(); ++a) last += (copy.copy.box.extent[a] - 1) * copy.copy.strides[a];
        where += (where.empty() ? "" : " and ") + describe_element(copy.copy.parameter, copy.copy.offset) + " to " +
                 describe_element(copy.copy.parameter, last) + " (" + std::to_string(copy.copy.numel()) + " elements)";
      }
      return Status(ErrorCode::kCorruptData,
                    "verify: " + where + " received from " + describe_rank(l.peer) + " (" + stage_text(l.stage) +
                        " stage, round " + std::to_string(round + 1) + " of " + std::to_string(s.schedule.rounds.size()) +
                        ") differ from what the trainer packed: digest " + hex(s.arrived[segment]) + ", expected " +
                        hex(s.expected[segment]) + " over " + std::to_string(s.receive.bytes[segment]) + " bytes");
    }
  return Status::ok();
}

}  // namespace wb::exec
