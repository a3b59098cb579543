#include "exec/verify.hpp"

#include "exec/pack.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "core/checks.hpp"

namespace wb::exec {
namespace {

constexpr std::uint64_t kPrime1 = 0x9E3779B97F4A7C15ULL, kPrime2 = 0xC2B2AE3D27D4EB4FULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t mix(std::uint64_t h, std::uint64_t v) { return rotl((h ^ v) * kPrime1, 29) * kPrime2; }

std::string hex(std::uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

}  // namespace

void Digest::block(const std::byte* data) {
  std::uint64_t w[4];
  std::memcpy(w, data, sizeof w);
  for (int k = 0; k < 4; ++k) {
    sum_[k] += w[k];
    sums_[k] += sum_[k];
  }
}

void Digest::update(const std::byte* data, std::size_t bytes) {
  length_ += bytes;
  if (tail_bytes_ > 0) {
    const std::size_t take = std::min(bytes, sizeof tail_ - tail_bytes_);
    std::memcpy(tail_ + tail_bytes_, data, take);
    tail_bytes_ += take;
    data += take;
    bytes -= take;
    if (tail_bytes_ < sizeof tail_) return;
    block(tail_);
    tail_bytes_ = 0;
  }
  // The hot loop: two adds per 16 bytes on 64-bit lanes of SSE2 registers (every x86-64 has them), four
  // independent chains.
  std::size_t at = 0;
#if defined(__SSE2__)
  __m128i sum0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sum_)), sum1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sum_ + 2));
  __m128i sums0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums_)), sums1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums_ + 2));
  for (; at + 32 <= bytes; at += 32) {
    sum0 = _mm_add_epi64(sum0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + at)));
    sum1 = _mm_add_epi64(sum1, _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + at + 16)));
    sums0 = _mm_add_epi64(sums0, sum0);
    sums1 = _mm_add_epi64(sums1, sum1);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sum_), sum0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sum_ + 2), sum1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sums_), sums0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(sums_ + 2), sums1);
#else
  for (; at + 32 <= bytes; at += 32) block(data + at);
#endif
  tail_bytes_ = bytes - at;
  std::memcpy(tail_, data + at, tail_bytes_);
}

std::uint64_t Digest::finish() const {
  Digest last = *this;
  if (last.tail_bytes_ > 0) {
    std::memset(last.tail_ + last.tail_bytes_, 0, sizeof tail_ - last.tail_bytes_);
    last.block(last.tail_);
  }
  std::uint64_t h = mix(kPrime2, length_);
  for (int k = 0; k < 4; ++k) h = mix(mix(h, last.sum_[k]), last.sums_[k]);
  return h ^ (h >> 31);
}

std::uint64_t digest_bytes(const std::byte* data, std::size_t bytes) {
  Digest digest;
  digest.update(data, bytes);
  return digest.finish();
}

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

  // A chunk of a round's pack or assemble: its program, and the pieces of segments it covers (buffer
  // ranges, in buffer order; a segment larger than a chunk is cut by rows into several pieces).
  struct Piece {
    std::int64_t segment = 0, offset = 0, bytes = 0;
    bool last = false;  // the segment's last piece: its digest is complete after it
  };
  struct Chunk {
    CopyProgram program;
    std::vector<Piece> pieces;
  };

  const RoundSchedule& schedule;
  MPI_Comm comm;
  int tag;
  Table send, receive;
  std::vector<std::vector<Chunk>> pack_chunks, assemble_chunks;  // per round (empty without the sizes)
  std::vector<Digest> partial;                                    // per segment of the table being digested
  std::vector<std::uint64_t> packed, arrived, expected;  // per segment: own digest (send, receive), expected (receive)
  std::vector<std::uint64_t> known;                      // per receive segment: the update its expected digest is from
  std::uint64_t update = 0;
  std::vector<Link> outgoing, incoming;

  // Cuts `copy` into pieces of at most about kChunkBytes of the buffer, by rows of its outermost axis (the
  // buffer holds the box row-major, so each piece is contiguous there too).
  static void cut(const BufferCopy& copy, std::vector<BufferCopy>& out) {
    const std::int64_t bytes = copy.bytes();
    const Box& box = copy.copy.box;
    if (bytes <= kChunkBytes || box.extent.empty() || box.extent[0] < 2) {
      out.push_back(copy);
      return;
    }
    const std::int64_t row = bytes / box.extent[0];
    const std::int64_t rows = std::max<std::int64_t>(1, kChunkBytes / std::max<std::int64_t>(row, 1));
    for (std::int64_t r = 0; r < box.extent[0]; r += rows) {
      BufferCopy piece = copy;
      piece.copy.box.offset[0] += r;
      piece.copy.box.extent[0] = std::min(rows, box.extent[0] - r);
      piece.copy.offset += r * copy.copy.strides[0];
      piece.buffer_offset += r * row;
      out.push_back(piece);
    }
  }

  // The chunks of one round's copies (`pack`: into the send buffer; else out of the receive buffer).
  std::vector<Chunk> chunks(const std::vector<BufferCopy>& copies, const Table& table, int round, bool pack,
                            std::span<const std::int64_t> parameter_bytes, std::int64_t slot_bytes) {
    std::vector<BufferCopy> pieces;
    for (const BufferCopy& copy : copies) cut(copy, pieces);
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const BufferCopy& a, const BufferCopy& b) { return a.buffer_offset < b.buffer_offset; });
    std::vector<Chunk> out;
    std::vector<BufferCopy> group;
    std::int64_t group_bytes = 0;
    const auto close = [&] {
      if (group.empty()) return;
      Chunk chunk;
      CopyProgramOptions options;
      // A pack chunk is digested right after it is written, from cache; an assemble chunk writes parameters
      // nobody reads soon, as the whole round's program would (streaming stores).
      options.stores = pack ? StoreHint::kCached : StoreHint::kStreaming;
      chunk.program = CopyProgram(pack ? CopyDirection::kPack : CopyDirection::kAssemble, group, parameter_bytes,
                                  slot_bytes, options);
      // Distinct buffer ranges of the group, each inside one segment.
      for (const BufferCopy& c : group) {
        if (!chunk.pieces.empty() && chunk.pieces.back().offset == c.buffer_offset) continue;  // another copy of it
        const auto r = static_cast<std::size_t>(round);
        auto it = std::upper_bound(table.offset.begin() + table.base[r], table.offset.begin() + table.base[r + 1], c.buffer_offset);
        const std::int64_t segment = (it - table.offset.begin()) - 1;
        const std::int64_t end = table.offset[static_cast<std::size_t>(segment)] + table.bytes[static_cast<std::size_t>(segment)];
        chunk.pieces.push_back({segment, c.buffer_offset, c.bytes(), c.buffer_offset + c.bytes() == end});
      }
      out.push_back(std::move(chunk));
      group.clear();
      group_bytes = 0;
    };
    for (const BufferCopy& c : pieces) {
      const bool new_range = group.empty() || group.back().buffer_offset != c.buffer_offset;
      // A new range starts a new chunk once this one is full (the copies of one range stay together).
      if (new_range && group_bytes >= kChunkBytes) close();
      if (new_range) group_bytes += c.bytes();
      group.push_back(c);
    }
    close();
    return out;
  }

  State(const RoundSchedule& s, MPI_Comm c, int t) : schedule(s), comm(c), tag(t) {
    const auto build = [&](Table& table, bool pack) {
      table.base.push_back(0);
      for (const RoundPlan& round : s.rounds) {
        std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
        for (const BufferCopy& copy : pack ? round.pack : round.assemble) ranges.emplace_back(copy.buffer_offset, copy.bytes());
        std::sort(ranges.begin(), ranges.end());
        ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
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
    partial.resize(std::max(send.offset.size(), receive.offset.size()));
  }
};

Verifier::Verifier(const RoundSchedule& schedule, MPI_Comm comm, int tag, std::span<const std::int64_t> parameter_bytes,
                   std::int64_t send_slot_bytes, std::int64_t receive_slot_bytes)
    : state_(new State(schedule, comm, tag)) {
  State& s = *state_;
  if (parameter_bytes.empty()) return;  // digests only (tests)
  for (int r = 0; r < static_cast<int>(schedule.rounds.size()); ++r) {
    const RoundPlan& round = schedule.rounds[static_cast<std::size_t>(r)];
    s.pack_chunks.push_back(s.chunks(round.pack, s.send, r, true, parameter_bytes, send_slot_bytes));
    s.assemble_chunks.push_back(s.chunks(round.assemble, s.receive, r, false, parameter_bytes, receive_slot_bytes));
  }
}

void Verifier::pack(int round, std::span<std::byte* const> parameters, std::byte* send_slot) {
  State& s = *state_;
  for (const State::Chunk& chunk : s.pack_chunks[static_cast<std::size_t>(round)]) {
    chunk.program.execute(parameters, send_slot);
    for (const State::Piece& piece : chunk.pieces) {
      Digest& digest = s.partial[static_cast<std::size_t>(piece.segment)];
      digest.update(send_slot + piece.offset, static_cast<std::size_t>(piece.bytes));
      if (!piece.last) continue;
      s.packed[static_cast<std::size_t>(piece.segment)] = digest.finish();
      digest = Digest{};
    }
  }
}

void Verifier::assemble(int round, std::span<std::byte* const> parameters, std::byte* receive_slot) {
  State& s = *state_;
  for (const State::Chunk& chunk : s.assemble_chunks[static_cast<std::size_t>(round)]) {
    for (const State::Piece& piece : chunk.pieces) {
      Digest& digest = s.partial[static_cast<std::size_t>(piece.segment)];
      digest.update(receive_slot + piece.offset, static_cast<std::size_t>(piece.bytes));
      if (!piece.last) continue;
      s.arrived[static_cast<std::size_t>(piece.segment)] = digest.finish();
      digest = Digest{};
    }
    chunk.program.execute(parameters, receive_slot);
  }
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
                          const std::function<std::string(std::uint32_t, std::int64_t)>& describe_element) {
  State& s = *state_;
  const std::uint64_t update = s.update;
  for (State::Link& l : s.outgoing) l.done = false;
  for (State::Link& l : s.incoming) l.done = false;
  const auto stage_text = [](Stage stage) { return std::string(stage_name(stage)); };
  auto last_progress = std::chrono::steady_clock::now();
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
    std::this_thread::yield();
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
