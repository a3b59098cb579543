// Padded segments in the transfer buffers the kernels read and write. A plan lays a round's segments back
// to back in each slot, so one odd-sized segment (a 4-byte scale) would leave every later one misaligned
// against its parameter, and the copy kernel would fall back to 1-4-byte accesses for the rest of the
// round. A rank with CUDA parameters therefore moves every piece of its slots to an aligned offset (256
// bytes for pieces of 4 KiB and more, 16 below, so that small pieces waste little); its peers are told at
// connect where the pieces of the regions they write went, and split and move their writes to match.
// Nothing else changes: the same bytes cross the network, in more writes where the padding separates them.
//
// Plain functions of round schedules: no device, no MPI (tests/unit/test_segment_padding.cpp replays
// padded schedules against unpadded ones).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "plan/round_schedule.hpp"

namespace wb::exec {

/// Alignment of a piece of `bytes` in a padded slot.
std::int64_t piece_alignment(std::int64_t bytes);

/// Where the pieces of one slot of a rank go, per round: [from, from + bytes) moves to [to, to + bytes).
/// Pieces are sorted and disjoint; an empty layout moves nothing.
struct SlotLayout {
  struct Piece {
    std::int64_t from = 0, bytes = 0, to = 0;
    bool operator==(const Piece&) const = default;
  };
  std::vector<std::vector<Piece>> rounds;
  std::int64_t slot_bytes = 0;  // the largest padded round

  bool empty() const { return rounds.empty(); }
  /// The piece of round `round` holding byte `offset`; nullptr when none (or the layout is empty).
  const Piece* find(std::size_t round, std::int64_t offset) const;
  bool operator==(const SlotLayout&) const = default;
};

/// The padded layout of `schedule`'s send slot (pieces: what it packs, and what it writes from there) and
/// of its receive slot (pieces: what it assembles, the regions it receives, what it forwards).
SlotLayout pad_send_slot(const RoundSchedule& schedule);
SlotLayout pad_receive_slot(const RoundSchedule& schedule);

/// What `peer` must know of `receive` (this rank's receive layout): the pieces of the regions `peer`
/// fills, per round. Byte codec. An empty layout stays empty.
std::vector<std::byte> encode_layout_for(const SlotLayout& receive, const RoundSchedule& schedule, int peer);
/// Throws wb::Error (kCorruptData) naming `peer` for malformed bytes or more than `rounds` rounds.
SlotLayout decode_layout(std::span<const std::byte> bytes, int peer, int rounds);

/// `schedule` laid out by `send` and `receive` (its own slots) and by `peers` (the receive layouts of the
/// peers it writes to, as they sent them; a peer without one keeps its offsets): pack and assemble
/// offsets and arrival regions moved, every write split where a piece on either side ends and moved (and
/// neighbours that still continue one another joined again), slot sizes padded. Throws wb::Error
/// (kInternal) for a write or copy that does not fall on whole pieces.
RoundSchedule apply_layouts(const RoundSchedule& schedule, const SlotLayout& send, const SlotLayout& receive,
                            const std::map<int, SlotLayout>& peers);

}  // namespace wb::exec
