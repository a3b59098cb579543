// Round schedules in compact binary form, and their delivery from the planning rank with MPI_Scatterv.
// (RoundScheduleBuilder, which makes them, lives in schedule_builder.cpp.)
//
// The form, every integer a varint (signed ones zig-zag; see core/byte_codec.hpp):
//
//   header   magic "WBRS", version, rank, side, pipeline_depth, send_slot_bytes, receive_slot_bytes,
//            peer count, peers (the first, then each one's distance to the previous minus 1: ascending by
//            construction), round count
//   round    a mask of its non-empty lists (1 pack, 2 writes, 4 arrivals, 8 assemble), then for each
//            list in the mask, in that order: its length and its entries. An empty round is one byte.
//   BufferCopy (pack, assemble): a flags byte, then only what the flags say differs from the previous
//            entry of the same list (the first entry's "previous" is all zeros):
//              kTensor, kParameter   signed deltas of the indices
//              kShape                ndim and the box extents (else the previous ones)
//              kStrides              the strides, signed (else the previous ones)
//              kElementBytes         the element size (else the previous one)
//            then always the box offsets as signed deltas against the previous box's (0 for new axes), then
//              kOffset               the parameter offset, as a signed delta against the offset the
//                                    previous entry's affine map predicts for this box (offset +
//                                    Σ Δbox_offset·stride): 0 when both are pieces of one slice copy
//              kBufferGap            buffer_offset minus the previous entry's end (else it is that end).
//            A box that continues the previous one takes 1 flags byte + one byte or two per axis.
//   Write    head (stage in bits 0-1, bit 2: local offset does not continue the previous write's, bit 3:
//            a relay, lag 1), index of the peer in the peer list, [local offset − previous end, signed],
//            remote offset, bytes
//   Arrival  head (stage in bits 0-1, bit 2: offset does not continue the previous arrival's), peer
//            index, [offset − previous end, signed], bytes
//
// Both directions check the same invariants, so whatever serializes deserializes: indices and sizes in
// range, stages in order, every write and arrival to a listed peer, every buffer range inside its
// pipeline slot. Deserialization never allocates more than the input's size justifies.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "core/byte_codec.hpp"
#include "core/checks.hpp"
#include "plan/round_schedule.hpp"

namespace wb {
namespace {

constexpr std::uint64_t kMagic = 0x53524257;  // "WBRS"
constexpr std::uint64_t kVersion = 1;
constexpr std::size_t kMaxDims = 16;
// Offsets, extents, strides and byte counts stay below 2^62, so sums of two never overflow.
constexpr std::int64_t kMaxValue = (std::int64_t{1} << 62) - 1;
constexpr std::int64_t kMaxBoxExtent = std::int64_t{1} << 48;

// Round mask bits.
constexpr std::uint64_t kHasPack = 1, kHasWrites = 2, kHasArrivals = 4, kHasAssemble = 8;
// BufferCopy flags.
constexpr std::uint64_t kTensor = 1, kParameter = 2, kShape = 4, kStrides = 8, kElementBytes = 16, kOffset = 32,
                        kBufferGap = 64, kAllCopyFlags = 127;
// Write / Arrival head: stage in bits 0-1, then (kLag: writes only):
constexpr std::uint64_t kStageMask = 3, kGap = 4, kAllHeadBits = 7, kLag = 8, kAllWriteHeadBits = 15;

// Minimum encoded size of one entry, to bound counts by the bytes left.
constexpr std::size_t kMinCopyBytes = 1, kMinWriteBytes = 4, kMinArrivalBytes = 3;

std::string stage_text(Stage stage) {
  const auto value = static_cast<int>(stage);
  return value < kStageCount ? std::string(stage_name(stage)) : "stage " + std::to_string(value);
}

// --- invariants, shared by both directions (empty string: fine) ---------------------------------------

std::string problem_of_copy(const BufferCopy& b, std::int64_t slot_bytes, const char* slot) {
  const SliceCopy& c = b.copy;
  const std::size_t ndim = c.box.extent.size();
  if (ndim > kMaxDims) return std::to_string(ndim) + " axes, at most " + std::to_string(kMaxDims) + " supported";
  if (c.box.offset.size() != ndim || c.strides.size() != ndim)
    return "box offsets, extents and strides have " + std::to_string(c.box.offset.size()) + ", " +
           std::to_string(ndim) + " and " + std::to_string(c.strides.size()) + " axes";
  for (std::size_t a = 0; a < ndim; ++a) {
    if (c.box.offset[a] < 0 || c.box.offset[a] > kMaxBoxExtent || c.box.extent[a] < 0 || c.box.extent[a] > kMaxBoxExtent)
      return "box " + c.box.to_string() + " out of range";
    if (c.strides[a] < -kMaxValue || c.strides[a] > kMaxValue)
      return "stride " + std::to_string(c.strides[a]) + " out of range";
  }
  if (c.offset < 0 || c.offset > kMaxValue) return "parameter offset " + std::to_string(c.offset) + " out of range";
  if (b.element_bytes == 0) return "element size 0";
  std::int64_t bytes = b.element_bytes;
  for (std::size_t a = 0; a < ndim; ++a)
    if (__builtin_mul_overflow(bytes, c.box.extent[a], &bytes) || bytes > kMaxValue)
      return "box " + c.box.to_string() + " of " + std::to_string(b.element_bytes) + "-byte elements is too large";
  if (b.buffer_offset < 0 || b.buffer_offset > kMaxValue || b.buffer_offset + bytes > slot_bytes)
    return "buffer bytes [" + std::to_string(b.buffer_offset) + ", " + std::to_string(b.buffer_offset + bytes) +
           ") outside the " + slot + " slot of " + std::to_string(slot_bytes) + " bytes";
  return {};
}

// A byte range [offset, offset + bytes) inside [0, limit).
std::string problem_of_range(const char* what, std::int64_t offset, std::int64_t bytes, std::int64_t limit,
                             const std::string& buffer) {
  if (bytes < 0 || bytes > kMaxValue) return "size " + std::to_string(bytes) + " out of range";
  if (offset < 0 || offset > kMaxValue || offset + bytes > limit)
    return std::string(what) + " bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
           ") outside the " + buffer + " of " + std::to_string(limit) + " bytes";
  return {};
}

std::string problem_of_stage(Stage stage, Stage previous) {
  if (static_cast<int>(stage) >= kStageCount) return "stage value " + std::to_string(static_cast<int>(stage)) + " out of range";
  if (stage < previous) return stage_text(stage) + " after " + stage_text(previous) + " (not in stage order)";
  return {};
}

std::string problem_of_write(const Write& w, Stage previous, const RoundSchedule& s, std::size_t round) {
  std::string problem = problem_of_stage(w.stage, previous);
  if (problem.empty() && w.lag > 1) problem = "lag " + std::to_string(w.lag) + " out of range (0 or 1)";
  if (problem.empty() && w.lag == 1) {
    // A relay reads the slot of the round before: there must be one, distinct from this round's.
    if (w.stage != Stage::kExternalExchange) problem = "a relay (lag 1) in the " + stage_text(w.stage) + " stage";
    else if (round == 0) problem = "a relay (lag 1) in the first round";
    else if (s.pipeline_depth < 2) problem = "a relay (lag 1) with a pipeline depth of 1";
  }
  if (problem.empty()) {
    const bool packs = w.stage == Stage::kReceive;
    problem = problem_of_range("local", w.local_offset, w.bytes, packs ? s.send_slot_bytes : s.receive_slot_bytes,
                               packs ? "send slot" : "receive slot");
  }
  if (problem.empty()) problem = problem_of_range("remote", w.remote_offset, w.bytes, kMaxValue, "address range");
  return problem;
}

std::string problem_of_arrival(const Arrival& a, Stage previous, const RoundSchedule& s) {
  std::string problem = problem_of_stage(a.stage, previous);
  if (problem.empty()) problem = problem_of_range("received", a.offset, a.bytes, s.receive_slot_bytes, "receive slot");
  return problem;
}

std::string problem_of_header(const RoundSchedule& s) {
  if (s.rank < 0) return "rank " + std::to_string(s.rank) + " out of range";
  if (s.side != Side::kTrainer && s.side != Side::kRollout)
    return "side value " + std::to_string(static_cast<int>(s.side)) + " out of range";
  if (s.pipeline_depth < 1) return "pipeline depth " + std::to_string(s.pipeline_depth) + " out of range";
  if (s.send_slot_bytes < 0 || s.send_slot_bytes > kMaxValue)
    return "send slot of " + std::to_string(s.send_slot_bytes) + " bytes out of range";
  if (s.receive_slot_bytes < 0 || s.receive_slot_bytes > kMaxValue)
    return "receive slot of " + std::to_string(s.receive_slot_bytes) + " bytes out of range";
  for (std::size_t i = 0; i < s.peers.size(); ++i) {
    if (s.peers[i] < 0) return "peer rank " + std::to_string(s.peers[i]) + " out of range";
    if (i > 0 && s.peers[i] <= s.peers[i - 1]) return "peers not strictly ascending";
  }
  return {};
}

// Where in the schedule the coder is, for error messages.
struct Location {
  std::size_t round = SIZE_MAX;  // SIZE_MAX: the header
  const char* list = nullptr;
  std::size_t entry = 0;

  std::string to_string() const {
    if (round == SIZE_MAX) return "header";  // "... (header)", "... (round 3, pack entry 7)"
    std::string text = "round " + std::to_string(round);
    if (list != nullptr) text += ", " + std::string(list) + " entry " + std::to_string(entry);
    return text;
  }
};

// Box offset of `previous` along `axis` (0 past its axes).
std::int64_t previous_box_offset(const SliceCopy& previous, std::size_t axis) {
  return axis < previous.box.offset.size() ? previous.box.offset[axis] : 0;
}

// The parameter offset that `previous`'s affine map gives the box of `next` (with next's strides).
std::int64_t predicted_offset(const SliceCopy& previous, const SliceCopy& next) {
  std::int64_t offset = previous.offset;
  for (std::size_t a = 0; a < next.box.offset.size(); ++a)
    offset = codec::wrapping_add(
        offset, codec::wrapping_mul(codec::wrapping_sub(next.box.offset[a], previous_box_offset(previous, a)), next.strides[a]));
  return offset;
}

// Index of `peer` in the ascending peer list, or -1.
std::int64_t peer_index(const std::vector<int>& peers, int peer) {
  const auto it = std::lower_bound(peers.begin(), peers.end(), peer);
  return it != peers.end() && *it == peer ? it - peers.begin() : -1;
}

// --- writing -------------------------------------------------------------------------------------------

class ScheduleWriter {
 public:
  explicit ScheduleWriter(const RoundSchedule& s) : s_(s) {}

  std::vector<std::byte> write() {
    check(problem_of_header(s_));
    out_.varint(kMagic);
    out_.varint(kVersion);
    out_.varint(static_cast<std::uint64_t>(s_.rank));
    out_.varint(static_cast<std::uint64_t>(s_.side));
    out_.varint(static_cast<std::uint64_t>(s_.pipeline_depth));
    out_.varint(static_cast<std::uint64_t>(s_.send_slot_bytes));
    out_.varint(static_cast<std::uint64_t>(s_.receive_slot_bytes));
    out_.varint(s_.peers.size());
    for (std::size_t i = 0; i < s_.peers.size(); ++i)
      out_.varint(static_cast<std::uint64_t>(i == 0 ? s_.peers[0] : s_.peers[i] - s_.peers[i - 1] - 1));
    out_.varint(s_.rounds.size());
    for (where_.round = 0; where_.round < s_.rounds.size(); ++where_.round) {
      const RoundPlan& r = s_.rounds[where_.round];
      out_.varint((r.pack.empty() ? 0 : kHasPack) | (r.writes.empty() ? 0 : kHasWrites) |
                  (r.arrivals.empty() ? 0 : kHasArrivals) | (r.assemble.empty() ? 0 : kHasAssemble));
      copies(r.pack, "pack", s_.send_slot_bytes, "send");
      writes(r.writes);
      arrivals(r.arrivals);
      copies(r.assemble, "assemble", s_.receive_slot_bytes, "receive");
      where_.list = nullptr;
    }
    return out_.take();
  }

 private:
  void check(const std::string& problem) const {
    if (!problem.empty())
      throw Error(ErrorCode::kInvalidArgument, "serialize_round_schedule: schedule of rank " + std::to_string(s_.rank) +
                                                   " (" + where_.to_string() + "): " + problem);
  }

  void copies(const std::vector<BufferCopy>& list, const char* name, std::int64_t slot_bytes, const char* slot) {
    if (list.empty()) return;
    where_.list = name;
    out_.varint(list.size());
    static const BufferCopy kZero{};
    const BufferCopy* previous = &kZero;
    std::int64_t end = 0;
    for (where_.entry = 0; where_.entry < list.size(); ++where_.entry) {
      const BufferCopy& b = list[where_.entry];
      check(problem_of_copy(b, slot_bytes, slot));
      const SliceCopy &c = b.copy, &p = previous->copy;
      const std::int64_t predicted = predicted_offset(p, c);
      std::uint64_t flags = 0;
      if (c.tensor != p.tensor) flags |= kTensor;
      if (c.parameter != p.parameter) flags |= kParameter;
      if (c.box.extent != p.box.extent) flags |= kShape;
      if (c.strides != p.strides) flags |= kStrides;
      if (b.element_bytes != previous->element_bytes) flags |= kElementBytes;
      if (c.offset != predicted) flags |= kOffset;
      if (b.buffer_offset != end) flags |= kBufferGap;
      out_.varint(flags);
      if (flags & kTensor) out_.signed_varint(static_cast<std::int64_t>(c.tensor) - static_cast<std::int64_t>(p.tensor));
      if (flags & kParameter)
        out_.signed_varint(static_cast<std::int64_t>(c.parameter) - static_cast<std::int64_t>(p.parameter));
      if (flags & kShape) {
        out_.varint(c.box.extent.size());
        for (std::int64_t e : c.box.extent) out_.varint(static_cast<std::uint64_t>(e));
      }
      if (flags & kStrides)
        for (std::int64_t stride : c.strides) out_.signed_varint(stride);
      if (flags & kElementBytes) out_.varint(b.element_bytes);
      for (std::size_t a = 0; a < c.box.offset.size(); ++a) out_.signed_varint(c.box.offset[a] - previous_box_offset(p, a));
      if (flags & kOffset) out_.signed_varint(codec::wrapping_sub(c.offset, predicted));
      if (flags & kBufferGap) out_.signed_varint(b.buffer_offset - end);
      end = b.buffer_offset + b.bytes();
      previous = &b;
    }
  }

  std::uint64_t peer(int rank) const {
    const std::int64_t index = peer_index(s_.peers, rank);
    if (index < 0) check("peer " + std::to_string(rank) + " is not in the peer list");
    return static_cast<std::uint64_t>(index);
  }

  void writes(const std::vector<Write>& list) {
    if (list.empty()) return;
    where_.list = "write";
    out_.varint(list.size());
    Stage stage = Stage::kReceive;
    std::int64_t end = 0;
    for (where_.entry = 0; where_.entry < list.size(); ++where_.entry) {
      const Write& w = list[where_.entry];
      check(problem_of_write(w, stage, s_, where_.round));
      const std::uint64_t index = peer(w.peer);
      const bool gap = w.local_offset != end;
      out_.varint(static_cast<std::uint64_t>(w.stage) | (gap ? kGap : 0) | (w.lag != 0 ? kLag : 0));
      out_.varint(index);
      if (gap) out_.signed_varint(w.local_offset - end);
      out_.varint(static_cast<std::uint64_t>(w.remote_offset));
      out_.varint(static_cast<std::uint64_t>(w.bytes));
      stage = w.stage;
      end = w.local_offset + w.bytes;
    }
  }

  void arrivals(const std::vector<Arrival>& list) {
    if (list.empty()) return;
    where_.list = "arrival";
    out_.varint(list.size());
    Stage stage = Stage::kReceive;
    std::int64_t end = 0;
    for (where_.entry = 0; where_.entry < list.size(); ++where_.entry) {
      const Arrival& a = list[where_.entry];
      check(problem_of_arrival(a, stage, s_));
      const std::uint64_t index = peer(a.peer);
      const bool gap = a.offset != end;
      out_.varint(static_cast<std::uint64_t>(a.stage) | (gap ? kGap : 0));
      out_.varint(index);
      if (gap) out_.signed_varint(a.offset - end);
      out_.varint(static_cast<std::uint64_t>(a.bytes));
      stage = a.stage;
      end = a.offset + a.bytes;
    }
  }

  const RoundSchedule& s_;
  codec::ByteWriter out_;
  Location where_;
};

// --- reading -------------------------------------------------------------------------------------------

class ScheduleReader {
 public:
  explicit ScheduleReader(std::span<const std::byte> bytes) : in_(bytes, "round schedule") {}

  RoundSchedule read() {
    try {
      return read_all();
    } catch (const Error& e) {
      throw Error(ErrorCode::kCorruptData, e.status().message() + " (" + where_.to_string() + ")");
    }
  }

 private:
  void check(const std::string& problem) const {
    if (!problem.empty()) in_.fail(problem);
  }

  RoundSchedule read_all() {
    if (in_.varint() != kMagic) in_.fail("not a round schedule (bad magic)");
    if (const auto version = in_.varint(); version != kVersion) in_.fail("unsupported version " + std::to_string(version));
    RoundSchedule& s = s_;
    s.rank = static_cast<int>(in_.bounded(INT_MAX, "rank"));
    s.side = static_cast<Side>(in_.bounded(1, "side value"));
    s.pipeline_depth = static_cast<int>(in_.bounded(INT_MAX, "pipeline depth"));
    s.send_slot_bytes = static_cast<std::int64_t>(in_.bounded(kMaxValue, "send slot bytes"));
    s.receive_slot_bytes = static_cast<std::int64_t>(in_.bounded(kMaxValue, "receive slot bytes"));
    s.peers.resize(in_.count(1, "peer count"));
    for (std::size_t i = 0; i < s.peers.size(); ++i) {
      const std::int64_t base = i == 0 ? 0 : std::int64_t{s.peers[i - 1]} + 1;
      if (base > INT_MAX) in_.fail("peer ranks past " + std::to_string(INT_MAX));
      s.peers[i] = static_cast<int>(base + static_cast<std::int64_t>(in_.bounded(static_cast<std::uint64_t>(INT_MAX - base), "peer rank")));
    }
    check(problem_of_header(s));
    s.rounds.resize(in_.count(1, "round count"));
    for (where_.round = 0; where_.round < s.rounds.size(); ++where_.round) {
      where_.list = nullptr;
      RoundPlan& r = s.rounds[where_.round];
      const std::uint64_t mask = in_.bounded(kHasPack | kHasWrites | kHasArrivals | kHasAssemble, "list mask");
      if (mask & kHasPack) copies(r.pack, "pack", "pack entry count", s.send_slot_bytes, "send");
      if (mask & kHasWrites) writes(r.writes);
      if (mask & kHasArrivals) arrivals(r.arrivals);
      if (mask & kHasAssemble) copies(r.assemble, "assemble", "assemble entry count", s.receive_slot_bytes, "receive");
    }
    where_.list = nullptr;
    in_.expect_done();
    return std::move(s_);
  }

  void copies(std::vector<BufferCopy>& list, const char* name, const char* count_name, std::int64_t slot_bytes,
              const char* slot) {
    where_.list = nullptr;
    list.resize(in_.count(kMinCopyBytes, count_name));
    where_.list = name;
    static const BufferCopy kZero{};
    const BufferCopy* previous = &kZero;
    std::int64_t end = 0;
    for (where_.entry = 0; where_.entry < list.size(); ++where_.entry) {
      BufferCopy& b = list[where_.entry];
      SliceCopy& c = b.copy;
      const SliceCopy& p = previous->copy;
      const std::uint64_t flags = in_.bounded(kAllCopyFlags, "entry flags");
      const std::int64_t tensor = flags & kTensor ? in_.bounded_signed(-std::int64_t{p.tensor}, std::int64_t{UINT32_MAX} - p.tensor, "tensor delta") : 0;
      c.tensor = static_cast<std::uint32_t>(std::int64_t{p.tensor} + tensor);
      const std::int64_t parameter =
          flags & kParameter ? in_.bounded_signed(-std::int64_t{p.parameter}, std::int64_t{UINT32_MAX} - p.parameter, "parameter delta") : 0;
      c.parameter = static_cast<std::uint32_t>(std::int64_t{p.parameter} + parameter);
      if (flags & kShape) {
        c.box.extent.resize(in_.bounded(kMaxDims, "number of axes"));
        for (std::int64_t& e : c.box.extent) e = static_cast<std::int64_t>(in_.bounded(kMaxBoxExtent, "box extent"));
      } else {
        c.box.extent = p.box.extent;
      }
      const std::size_t ndim = c.box.extent.size();
      if (flags & kStrides) {
        c.strides.resize(ndim);
        for (std::int64_t& stride : c.strides) stride = in_.bounded_signed(-kMaxValue, kMaxValue, "stride");
      } else {
        if (p.strides.size() != ndim) in_.fail("strides of the previous entry have the wrong number of axes");
        c.strides = p.strides;
      }
      if (flags & kElementBytes) b.element_bytes = static_cast<std::uint8_t>(in_.bounded(UINT8_MAX, "element size"));
      else b.element_bytes = previous->element_bytes;
      c.box.offset.resize(ndim);
      for (std::size_t a = 0; a < ndim; ++a)
        c.box.offset[a] = previous_box_offset(p, a) + in_.bounded_signed(-kMaxBoxExtent, kMaxBoxExtent, "box offset delta");
      c.offset = predicted_offset(p, c);
      if (flags & kOffset) c.offset = codec::wrapping_add(c.offset, in_.signed_varint());
      b.buffer_offset = end;
      if (flags & kBufferGap) b.buffer_offset = end + in_.bounded_signed(-kMaxValue, kMaxValue, "buffer offset delta");
      check(problem_of_copy(b, slot_bytes, slot));
      end = b.buffer_offset + b.bytes();
      previous = &b;
    }
  }

  int peer() {
    if (s_.peers.empty()) in_.fail("peer index with an empty peer list");
    return s_.peers[in_.bounded(s_.peers.size() - 1, "peer index")];
  }

  Stage head(bool& gap, std::uint64_t all_bits = kAllHeadBits, bool* lag = nullptr) {
    const std::uint64_t value = in_.bounded(all_bits, "entry head");
    gap = (value & kGap) != 0;
    if (lag != nullptr) *lag = (value & kLag) != 0;
    return static_cast<Stage>(value & kStageMask);  // 3 is caught with the other stage checks
  }

  void writes(std::vector<Write>& list) {
    where_.list = nullptr;
    list.resize(in_.count(kMinWriteBytes, "write count"));
    where_.list = "write";
    Stage stage = Stage::kReceive;
    std::int64_t end = 0;
    for (where_.entry = 0; where_.entry < list.size(); ++where_.entry) {
      Write& w = list[where_.entry];
      bool gap = false, lag = false;
      w.stage = head(gap, kAllWriteHeadBits, &lag);
      w.lag = lag ? 1 : 0;
      check(problem_of_stage(w.stage, stage));
      w.peer = peer();
      w.local_offset = gap ? end + in_.bounded_signed(-kMaxValue, kMaxValue, "local offset delta") : end;
      w.remote_offset = static_cast<std::int64_t>(in_.bounded(kMaxValue, "remote offset"));
      w.bytes = static_cast<std::int64_t>(in_.bounded(kMaxValue, "write size"));
      check(problem_of_write(w, stage, s_, where_.round));
      stage = w.stage;
      end = w.local_offset + w.bytes;
    }
  }

  void arrivals(std::vector<Arrival>& list) {
    where_.list = nullptr;
    list.resize(in_.count(kMinArrivalBytes, "arrival count"));
    where_.list = "arrival";
    Stage stage = Stage::kReceive;
    std::int64_t end = 0;
    for (where_.entry = 0; where_.entry < list.size(); ++where_.entry) {
      Arrival& a = list[where_.entry];
      bool gap = false;
      a.stage = head(gap);
      check(problem_of_stage(a.stage, stage));
      a.peer = peer();
      a.offset = gap ? end + in_.bounded_signed(-kMaxValue, kMaxValue, "offset delta") : end;
      a.bytes = static_cast<std::int64_t>(in_.bounded(kMaxValue, "arrival size"));
      check(problem_of_arrival(a, stage, s_));
      stage = a.stage;
      end = a.offset + a.bytes;
    }
  }

  codec::ByteReader in_;
  RoundSchedule s_;
  Location where_;
};

}  // namespace

std::vector<std::byte> serialize_round_schedule(const RoundSchedule& schedule) {
  return ScheduleWriter(schedule).write();
}

RoundSchedule deserialize_round_schedule(std::span<const std::byte> bytes) { return ScheduleReader(bytes).read(); }

}  // namespace wb
