// Staging: the ranges a side stages, their host copies, and the copies in and out (see staging.hpp).
#include "coord/staging.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "core/checks.hpp"
#include "core/host_pages.hpp"
#include "exec/cpu_copy_kernels.hpp"
#include "exec/quantized_pack.hpp"

namespace wb::coord {

std::vector<ByteRanges> touched_ranges(std::span<const BufferCopy> copies, std::size_t parameters) {
  std::vector<ByteRanges> ranges(parameters);
  struct Axis {
    std::int64_t extent, stride;
  };
  std::vector<Axis> axes;
  for (const BufferCopy& c : copies) {
    if (c.copy.parameter >= parameters || c.copy.box.numel() == 0) continue;
    // The elements a copy touches do not depend on the order of its axes: outermost (largest stride)
    // first, merged where one axis continues the next, leaves contiguous runs along the innermost.
    axes.clear();
    for (std::size_t a = 0; a < c.copy.box.extent.size(); ++a)
      if (c.copy.box.extent[a] > 1) axes.push_back({c.copy.box.extent[a], c.copy.strides[a]});
    std::sort(axes.begin(), axes.end(), [](const Axis& x, const Axis& y) { return x.stride > y.stride; });
    for (std::size_t a = axes.size(); a-- > 1;)
      if (axes[a - 1].stride == axes[a].stride * axes[a].extent) {
        axes[a - 1] = {axes[a - 1].extent * axes[a].extent, axes[a].stride};
        axes.erase(axes.begin() + static_cast<std::ptrdiff_t>(a));
      }
    std::int64_t run = 1;
    if (!axes.empty() && axes.back().stride == 1) {
      run = axes.back().extent;
      axes.pop_back();
    }
    const std::int64_t element = c.element_bytes;
    ByteRanges& out = ranges[c.copy.parameter];
    std::vector<std::int64_t> index(axes.size(), 0);
    for (;;) {
      std::int64_t at = c.copy.offset;
      for (std::size_t a = 0; a < axes.size(); ++a) at += index[a] * axes[a].stride;
      out.emplace_back(at * element, (at + run) * element);
      std::size_t a = axes.size();
      for (; a-- > 0;) {
        if (++index[a] < axes[a].extent) break;
        index[a] = 0;
      }
      if (a == static_cast<std::size_t>(-1)) break;
    }
  }
  for (ByteRanges& list : ranges) {
    std::sort(list.begin(), list.end());
    std::size_t kept = 0;
    for (const auto& range : list) {
      if (kept > 0 && range.first <= list[kept - 1].second)
        list[kept - 1].second = std::max(list[kept - 1].second, range.second);
      else
        list[kept++] = range;
    }
    list.resize(kept);
  }
  return ranges;
}

ByteRanges close_gaps(const ByteRanges& ranges, std::int64_t gap) {
  ByteRanges out;
  for (const auto& range : ranges) {
    if (!out.empty() && range.first - out.back().second <= gap)
      out.back().second = std::max(out.back().second, range.second);
    else
      out.push_back(range);
  }
  return out;
}

ByteRanges page_spans(const ByteRanges& ranges, std::int64_t page) {
  ByteRanges out;
  for (const auto& [first, last] : ranges) {
    const std::int64_t begin = first / page * page, end = (last + page - 1) / page * page;
    if (!out.empty() && begin <= out.back().second)
      out.back().second = std::max(out.back().second, end);
    else
      out.emplace_back(begin, end);
  }
  return out;
}

Staging::Arena::~Arena() {
  if (data != nullptr) ::munmap(data, mapped);
}

Staging::Staging(const ParameterSet& params, std::vector<ByteRanges> ranges, const Staging* share) : active_(true) {
  copies_.resize(params.size());
  const bool device = !params.empty() && params[0].view.memory == MemoryKind::kCuda;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // One reservation for every parameter, each from a page boundary of its own: the ranges' whole 2 MiB
  // blocks then come as huge pages (core/host_pages.hpp), across parameters too (an MoE's experts of
  // 512 KiB each are served as well as one tensor of 1 GiB), and every staging over the same parameters
  // has the same layout, whatever its ranges (what `share` needs). Pages no range touches cost nothing.
  std::vector<std::size_t> offsets(params.size(), 0);
  std::size_t total = 0;
  bool any = false;
  for (std::size_t p = 0; p < params.size(); ++p) {
    offsets[p] = total;
    total += (params[p].view.nbytes() + page - 1) / page * page;
    any = any || (p < ranges.size() && !ranges[p].empty());
  }
  if (!any) return;
  if (share != nullptr && share->arena_ && share->arena_->offsets == offsets && !device) {
    arena_ = share->arena_;
  } else {
    auto arena = std::make_shared<Arena>();
    arena->data = map_host_pages(total, arena->mapped);
    if (arena->data == nullptr)
      throw Error(ErrorCode::kSystem, "cannot reserve " + std::to_string(total) + " bytes of staging for " +
                                          std::to_string(params.size()) + " parameters: " + std::strerror(errno));
    arena->offsets = offsets;
    arena_ = std::move(arena);
  }
  std::byte* const base = arena_->data;
  try {
    if (device) stream_ = DeviceCopyStream(params[0].view.device);
    ByteRanges spans;  // the ranges in the reservation, adjacent ones merged
    for (std::size_t p = 0; p < params.size() && p < ranges.size(); ++p) {
      if (ranges[p].empty()) continue;
      Copy& copy = copies_[p];
      copy.data = base + offsets[p];
      for (const auto& [first, last] : ranges[p]) bytes_ += last - first;
      copy.ranges = device ? close_gaps(ranges[p], kDeviceCopyGap) : std::move(ranges[p]);
      for (const auto& [first, last] : copy.ranges) {
        const auto at = static_cast<std::int64_t>(offsets[p]);
        if (!spans.empty() && at + first <= spans.back().second) spans.back().second = std::max(spans.back().second, at + last);
        else spans.emplace_back(at + first, at + last);
      }
      if (device)
        for (const auto& [first, last] : page_spans(copy.ranges, static_cast<std::int64_t>(page)))
          pinned_.emplace_back(copy.data + first, static_cast<std::size_t>(last - first));
    }
    for (const auto& [first, last] : spans) advise_huge_pages(base + first, base + last);
  } catch (...) {
    release();
    throw;
  }
}

Staging::~Staging() { release(); }

Staging::Staging(Staging&& other) noexcept
    : copies_(std::move(other.copies_)), arena_(std::move(other.arena_)), round_pieces_(std::move(other.round_pieces_)),
      bytes_(other.bytes_), active_(other.active_), stream_(std::move(other.stream_)), pinned_(std::move(other.pinned_)) {
  other.copies_.clear();
  other.round_pieces_.clear();
  other.pinned_.clear();
  other.bytes_ = 0;
  other.active_ = false;
}

Staging& Staging::operator=(Staging&& other) noexcept {
  if (this != &other) {
    release();
    copies_ = std::move(other.copies_);
    arena_ = std::move(other.arena_);
    round_pieces_ = std::move(other.round_pieces_);
    bytes_ = other.bytes_;
    active_ = other.active_;
    stream_ = std::move(other.stream_);
    pinned_ = std::move(other.pinned_);
    other.copies_.clear();
    other.round_pieces_.clear();
    other.pinned_.clear();
    other.bytes_ = 0;
    other.active_ = false;
  }
  return *this;
}

void Staging::release() {
  (void)stream_.wait();
  pinned_.clear();  // unpinned before unmapped
  stream_ = DeviceCopyStream();
  arena_.reset();  // unmapped with the last staging that shares it
  copies_.clear();
  round_pieces_.clear();
  bytes_ = 0;
  active_ = false;
}

void Staging::prefault() {
  if (stream_.valid()) return;
  const auto page = static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
  for (const Copy& copy : copies_)
    for (const auto& [first, last] : page_spans(copy.ranges, page))
      if (!populate_host_pages(copy.data + first, static_cast<std::size_t>(last - first)))
        throw Error(ErrorCode::kSystem, "cannot fault in " + std::to_string(last - first) + " bytes of staging: " + std::strerror(errno));
}

void Staging::touch_at_connect(const ParameterSet& params, const Staging* share) {
  if (share != nullptr && shares_memory_with(*share)) prefault();
  else throw_if_error(copy_from(params));
}

Status Staging::copy(const ParameterSet& params, bool to_staging, void* after_stream) {
  const auto at = [&](std::size_t p, std::int64_t offset) { return static_cast<std::byte*>(params[p].view.data) + offset; };
  if (!stream_.valid()) {
    // Host memory: a version is far larger than the caches and is not read again before the next step,
    // so ranges of kStreamingBytes and more go with streaming stores (memcpy's ordinary stores read every
    // destination line first: four engine workers installing 36 MB each at once on this 2-core machine
    // took 10.5 ms each with memcpy, 6.5 ms streamed).
    constexpr std::size_t kStreamingBytes = 64 << 10;
    bool streamed = false;
    for (std::size_t p = 0; p < copies_.size(); ++p)
      for (const auto& [first, last] : copies_[p].ranges) {
        const auto n = static_cast<std::size_t>(last - first);
        std::byte* const dst = to_staging ? copies_[p].data + first : at(p, first);
        const std::byte* const src = to_staging ? at(p, first) : copies_[p].data + first;
        if (dst == src) continue;  // parameters that are views of this staging (a resend from shared memory)
        if (n >= kStreamingBytes) {
          exec::cpu::copy_streaming(dst, src, n);
          streamed = true;
        } else {
          std::memcpy(dst, src, n);
        }
      }
    if (streamed) exec::cpu::fence_streaming_stores();
    return Status::ok();
  }
  WB_RETURN_IF_ERROR(stream_.after(after_stream));
  for (std::size_t p = 0; p < copies_.size(); ++p)
    for (const auto& [first, last] : copies_[p].ranges) {
      const auto n = static_cast<std::size_t>(last - first);
      WB_RETURN_IF_ERROR(to_staging ? stream_.copy(copies_[p].data + first, at(p, first), n)
                                    : stream_.copy(at(p, first), copies_[p].data + first, n));
    }
  return stream_.wait();
}

Status Staging::copy_from(const ParameterSet& params, void* after_stream) { return copy(params, true, after_stream); }

namespace {

// `ranges` less `covered` (both sorted and disjoint), appended to `out` as pieces of `parameter`.
template <typename Piece>
void append_uncovered(std::size_t parameter, const ByteRanges& ranges, const ByteRanges& covered, std::vector<Piece>& out) {
  auto c = covered.begin();
  for (auto [first, last] : ranges) {
    while (c != covered.end() && c->second <= first) ++c;
    for (auto d = c; d != covered.end() && d->first < last; ++d) {
      if (d->first > first) out.push_back({parameter, first, d->first});
      first = std::max(first, d->second);
    }
    if (first < last) out.push_back({parameter, first, last});
  }
}

// `a` and `b` (sorted, disjoint) merged into one such list.
ByteRanges merged(const ByteRanges& a, const ByteRanges& b) {
  ByteRanges all;
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(all));
  ByteRanges out;
  for (const auto& range : all) {
    if (!out.empty() && range.first <= out.back().second)
      out.back().second = std::max(out.back().second, range.second);
    else
      out.push_back(range);
  }
  return out;
}

}  // namespace

void Staging::order_by_rounds(std::span<const std::span<const BufferCopy>> rounds) {
  round_pieces_.assign(rounds.size(), {});
  std::vector<ByteRanges> covered(copies_.size());
  for (std::size_t r = 0; r < rounds.size(); ++r) {
    const std::vector<ByteRanges> packed = touched_ranges(rounds[r], copies_.size());
    for (std::size_t p = 0; p < packed.size(); ++p) {
      if (packed[p].empty() || copies_[p].data == nullptr) continue;
      append_uncovered(p, packed[p], covered[p], round_pieces_[r]);
      covered[p] = merged(covered[p], packed[p]);
    }
  }
  // What the staging holds beyond the rounds' ranges (none when both come from one schedule) goes last.
  std::vector<Piece> rest;
  for (std::size_t p = 0; p < copies_.size(); ++p) append_uncovered(p, copies_[p].ranges, covered[p], rest);
  if (!rest.empty()) round_pieces_.push_back(std::move(rest));
}

Status Staging::copy_from_by_round(const ParameterSet& params, std::atomic<int>& staged, void* after_stream,
                                   const std::function<void(std::size_t round)>& also) {
  if (!stages_by_round()) {
    const Status status = copy_from(params, after_stream);
    staged.store(status ? kAllRoundsStaged : -1, std::memory_order_release);
    return status;
  }
  for (std::size_t r = 0; r < round_pieces_.size(); ++r) {
    for (const Piece& piece : round_pieces_[r]) {
      std::byte* const dst = copies_[piece.parameter].data + piece.first;
      const std::byte* const src = static_cast<const std::byte*>(params[piece.parameter].view.data) + piece.first;
      if (dst != src) std::memcpy(dst, src, static_cast<std::size_t>(piece.last - piece.first));  // as in copy()
    }
    if (also) also(r);
    staged.store(static_cast<int>(r + 1), std::memory_order_release);
  }
  staged.store(kAllRoundsStaged, std::memory_order_release);
  return Status::ok();
}

Staging stage_for_sending(const ParameterSet& params, const RoundSchedule& schedule, exec::QuantizedPack* quantized, bool whole,
                          const Staging* share) {
  const std::size_t parameters = params.size();
  const bool device = !params.empty() && params[0].view.memory == MemoryKind::kCuda;
  std::vector<BufferCopy> copies;
  std::vector<std::size_t> round_ends;
  std::vector<std::span<const BufferCopy>> packs;
  for (const RoundPlan& round : schedule.rounds) {
    for (const BufferCopy& copy : round.pack)
      if (copy.copy.parameter < parameters) copies.push_back(copy);  // not the FP8 pack's own buffers
    round_ends.push_back(copies.size());
    packs.emplace_back(round.pack);
  }
  if (quantized != nullptr && device)
    for (const BufferCopy& read : quantized->converted_reads()) copies.push_back(read);  // after every round
  else if (quantized != nullptr)
    quantized->order_by_rounds(packs);
  std::vector<ByteRanges> ranges(parameters);
  if (whole)
    for (std::size_t p = 0; p < parameters; ++p) ranges[p] = {{0, static_cast<std::int64_t>(params[p].view.nbytes())}};
  else
    ranges = touched_ranges(copies, parameters);
  Staging staging(params, std::move(ranges), share);
  // Staged in the order the rounds read it, so that an update's transfer starts with its first round's bytes.
  std::vector<std::span<const BufferCopy>> by_round;
  for (std::size_t r = 0, first = 0; r < round_ends.size(); first = round_ends[r++])
    by_round.push_back(std::span<const BufferCopy>(copies).subspan(first, round_ends[r] - first));
  staging.order_by_rounds(by_round);
  staging.touch_at_connect(params, share);
  return staging;
}

Status Staging::copy_to(const ParameterSet& params, void* after_stream) { return copy(params, false, after_stream); }

std::size_t Staging::copies_per_version() const {
  std::size_t n = 0;
  for (const Copy& copy : copies_) n += copy.ranges.size();
  return n;
}

bool Staging::covers(const Staging& other) const {
  if (!active_ || !other.active_) return false;
  for (std::size_t p = 0; p < other.copies_.size(); ++p) {
    if (other.copies_[p].ranges.empty()) continue;
    if (p >= copies_.size() || copies_[p].data == nullptr) return false;
    const ByteRanges& mine = copies_[p].ranges;  // sorted, disjoint, adjacent ones merged
    for (const auto& [first, last] : other.copies_[p].ranges) {
      const auto in = std::upper_bound(mine.begin(), mine.end(), std::make_pair(first, std::numeric_limits<std::int64_t>::max()));
      if (in == mine.begin() || std::prev(in)->second < last) return false;
    }
  }
  return true;
}

ParameterMemory Staging::memory(const ParameterSet& params) const {
  ParameterMemory memory;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const bool staged = p < copies_.size() && copies_[p].data != nullptr;
    memory.data.push_back(staged ? copies_[p].data : static_cast<std::byte*>(params[p].view.data));
    memory.bytes.push_back(params[p].view.nbytes());
  }
  if (!active_ && !params.empty()) {
    memory.memory = params[0].view.memory;
    memory.device = params[0].view.device;
  }
  return memory;
}

}  // namespace wb::coord
