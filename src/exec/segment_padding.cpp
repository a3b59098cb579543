// Padded segments (see segment_padding.hpp).
#include "exec/segment_padding.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "core/byte_codec.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

using i64 = std::int64_t;
using Piece = SlotLayout::Piece;

constexpr std::uint64_t kMagic = 0x5742534c;  // "WBSL"
constexpr i64 kMaxOffset = i64{1} << 56;

// The pieces of one round's slot: the byte ranges the copies address, those that overlap merged (two
// assemble entries of one segment into two parameters), laid out in order at aligned offsets from `cursor`
// on. Returns the end of the last.
i64 lay_out(std::vector<std::pair<i64, i64>> ranges, std::vector<Piece>& pieces) {
  std::sort(ranges.begin(), ranges.end());
  for (const auto& [begin, end] : ranges) {
    if (begin >= end) continue;
    if (!pieces.empty() && begin < pieces.back().from + pieces.back().bytes) {
      pieces.back().bytes = std::max(pieces.back().bytes, end - pieces.back().from);
      continue;
    }
    pieces.push_back({begin, end - begin, 0});
  }
  i64 cursor = 0;
  for (Piece& p : pieces) {
    const i64 alignment = piece_alignment(p.bytes);
    p.to = (cursor + alignment - 1) / alignment * alignment;
    cursor = p.to + p.bytes;
  }
  return cursor;
}

template <class Ranges>
SlotLayout pad(const RoundSchedule& schedule, Ranges&& ranges_of) {
  SlotLayout layout;
  layout.rounds.resize(schedule.rounds.size());
  for (std::size_t r = 0; r < schedule.rounds.size(); ++r)
    layout.slot_bytes = std::max(layout.slot_bytes, lay_out(ranges_of(schedule.rounds[r]), layout.rounds[r]));
  return layout;
}

[[noreturn]] void not_on_pieces(const std::string& what, std::size_t round, i64 offset) {
  throw Error(ErrorCode::kInternal, "padded transfer buffers: " + what + " of round " + std::to_string(round) +
                                        " reaches byte " + std::to_string(offset) + ", which no copy of the slot holds");
}

// Where byte `offset` of round `round` goes; identity for an empty layout. `available`: bytes from there
// to the end of its piece.
i64 map_offset(const SlotLayout& layout, std::size_t round, i64 offset, i64& available, const char* what) {
  if (layout.empty()) {
    available = std::numeric_limits<i64>::max();
    return offset;
  }
  const Piece* piece = layout.find(round, offset);
  if (piece == nullptr) not_on_pieces(what, round, offset);
  available = piece->from + piece->bytes - offset;
  return piece->to + (offset - piece->from);
}

}  // namespace

std::int64_t piece_alignment(std::int64_t bytes) { return bytes >= 4096 ? 256 : 16; }

const SlotLayout::Piece* SlotLayout::find(std::size_t round, std::int64_t offset) const {
  if (round >= rounds.size()) return nullptr;
  const std::vector<Piece>& pieces = rounds[round];
  auto it = std::upper_bound(pieces.begin(), pieces.end(), offset, [](i64 o, const Piece& p) { return o < p.from; });
  if (it == pieces.begin()) return nullptr;
  --it;
  return offset < it->from + it->bytes ? &*it : nullptr;
}

SlotLayout pad_send_slot(const RoundSchedule& schedule) {
  return pad(schedule, [](const RoundPlan& plan) {
    std::vector<std::pair<i64, i64>> ranges;
    for (const BufferCopy& c : plan.pack) ranges.emplace_back(c.buffer_offset, c.buffer_offset + c.bytes());
    return ranges;
  });
}

SlotLayout pad_receive_slot(const RoundSchedule& schedule) {
  return pad(schedule, [](const RoundPlan& plan) {
    std::vector<std::pair<i64, i64>> ranges;
    for (const BufferCopy& c : plan.assemble) ranges.emplace_back(c.buffer_offset, c.buffer_offset + c.bytes());
    return ranges;
  });
}

std::vector<std::byte> encode_layout_for(const SlotLayout& receive, const RoundSchedule& schedule, int peer) {
  codec::ByteWriter out;
  out.varint(kMagic);
  out.varint(receive.empty() ? 0 : receive.rounds.size());
  for (std::size_t r = 0; r < receive.rounds.size(); ++r) {
    // The pieces inside the regions `peer` fills this round.
    std::vector<const Piece*> pieces;
    for (const Arrival& a : schedule.rounds[r].arrivals) {
      if (a.peer != peer) continue;
      const std::vector<Piece>& all = receive.rounds[r];
      auto it = std::lower_bound(all.begin(), all.end(), a.offset, [](const Piece& p, i64 o) { return p.from + p.bytes <= o; });
      for (; it != all.end() && it->from < a.offset + a.bytes; ++it) pieces.push_back(&*it);
    }
    std::sort(pieces.begin(), pieces.end(), [](const Piece* a, const Piece* b) { return a->from < b->from; });
    pieces.erase(std::unique(pieces.begin(), pieces.end()), pieces.end());
    out.varint(pieces.size());
    i64 previous = 0;
    for (const Piece* p : pieces) {
      out.varint(static_cast<std::uint64_t>(p->from - previous));  // sorted: deltas stay small
      out.varint(static_cast<std::uint64_t>(p->bytes));
      out.signed_varint(p->to - p->from);
      previous = p->from + p->bytes;
    }
  }
  return out.take();
}

SlotLayout decode_layout(std::span<const std::byte> bytes, int peer, int rounds) {
  codec::ByteReader in(bytes, "transfer-buffer layout from rank " + std::to_string(peer));
  if (in.varint() != kMagic) in.fail("not a transfer-buffer layout");
  SlotLayout layout;
  layout.rounds.resize(static_cast<std::size_t>(in.bounded(static_cast<std::uint64_t>(rounds), "rounds")));
  for (std::vector<Piece>& pieces : layout.rounds) {
    pieces.resize(in.count(3, "pieces"));
    i64 previous = 0;
    for (Piece& p : pieces) {
      p.from = previous + static_cast<i64>(in.bounded(kMaxOffset, "piece offset"));
      p.bytes = static_cast<i64>(in.bounded(kMaxOffset, "piece size"));
      p.to = p.from + in.bounded_signed(-kMaxOffset, kMaxOffset, "piece move");
      if (p.bytes == 0 || p.from > kMaxOffset || p.to < 0 || p.to > kMaxOffset) in.fail("piece out of range");
      previous = p.from + p.bytes;
    }
  }
  in.expect_done();
  return layout;
}

RoundSchedule apply_layouts(const RoundSchedule& schedule, const SlotLayout& send, const SlotLayout& receive,
                            const std::map<int, SlotLayout>& peers) {
  RoundSchedule out = schedule;
  if (!send.empty()) out.send_slot_bytes = send.slot_bytes;
  if (!receive.empty()) out.receive_slot_bytes = receive.slot_bytes;
  static const SlotLayout kIdentity;
  for (std::size_t r = 0; r < out.rounds.size(); ++r) {
    RoundPlan& plan = out.rounds[r];
    i64 available = 0;
    // A copy's buffer range lies in one piece (pieces are made of the copies' ranges).
    for (BufferCopy& c : plan.pack) c.buffer_offset = map_offset(send, r, c.buffer_offset, available, "a pack");
    for (BufferCopy& c : plan.assemble) c.buffer_offset = map_offset(receive, r, c.buffer_offset, available, "an assemble");
    for (Arrival& a : plan.arrivals) {
      if (a.bytes == 0) continue;
      i64 last_available = 0;
      const i64 first = map_offset(receive, r, a.offset, available, "an arrival region");
      const i64 last = map_offset(receive, r, a.offset + a.bytes - 1, last_available, "an arrival region");
      a.offset = first;
      a.bytes = last + 1 - first;
    }
    // Writes, split where a piece ends on either side. A relay (lag 1) reads the slot of the round before.
    std::vector<Write> writes;
    writes.reserve(plan.writes.size());
    for (const Write& w : plan.writes) {
      const SlotLayout& local = w.stage == Stage::kReceive ? send : receive;
      const std::size_t local_round = r - std::min<std::size_t>(r, w.lag);
      const auto found = peers.find(w.peer);
      const SlotLayout& remote = found == peers.end() ? kIdentity : found->second;
      for (i64 done = 0; done < w.bytes;) {
        i64 local_available = 0, remote_available = 0;
        const i64 from = map_offset(local, local_round, w.local_offset + done, local_available, "a write");
        const i64 to = map_offset(remote, r, w.remote_offset + done, remote_available, "a write to a peer");
        const i64 bytes = std::min({local_available, remote_available, w.bytes - done});
        if (!writes.empty()) {
          Write& last = writes.back();
          if (last.peer == w.peer && last.stage == w.stage && last.lag == w.lag && last.local_offset + last.bytes == from &&
              last.remote_offset + last.bytes == to) {
            last.bytes += bytes;
            done += bytes;
            continue;
          }
        }
        writes.push_back({w.peer, w.stage, from, to, bytes, w.lag});
        done += bytes;
      }
      if (w.bytes == 0) writes.push_back(w);
    }
    plan.writes = std::move(writes);
  }
  return out;
}

}  // namespace wb::exec
