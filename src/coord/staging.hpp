// Staging, the staged modes' host copies of the parameters (docs/architecture.md, "Synchronization
// modes"): what a trainer's send_weights copies out before it returns (sender staging), what a rollout's
// version arrives in before it is installed at one step (receiver staging). Allocated at connect.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/cuda_device.hpp"
#include "exec/round_executor.hpp"
#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::coord {

/// Byte ranges [first, second) of one parameter.
using ByteRanges = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// The bytes of their parameters that `copies` touch, per parameter: sorted, disjoint, adjacent ranges merged.
std::vector<ByteRanges> touched_ranges(std::span<const BufferCopy> copies, std::size_t parameters);

/// Sorted, disjoint ranges with every gap of at most `gap` bytes closed: the copies of one parameter when
/// a copy costs more to issue than `gap` bytes cost to move (device copies: a launch is worth ~64 KiB).
ByteRanges close_gaps(const ByteRanges& ranges, std::int64_t gap);

/// The page-aligned spans that cover `ranges` (sorted, disjoint), overlapping or touching spans merged:
/// what gets pinned, so that pinning never touches a page no range needs.
ByteRanges page_spans(const ByteRanges& ranges, std::int64_t page);

/// Device copies closer than this are made as one (close_gaps).
inline constexpr std::int64_t kDeviceCopyGap = 64 << 10;

/// Host copies of what one side stages: per parameter, the bytes the schedule reads (sender) or writes
/// (receiver), at their own offsets inside a reservation of the parameter's size (one reservation for all
/// the parameters, the ranges' whole 2 MiB blocks in huge pages). The pages of that reservation the plan
/// never touches are never touched at all, so host memory grows with what is staged, not with the
/// parameters (page granularity). Parameters in CUDA memory (all on one device; the adapters
/// check it): the staged pages are pinned, and the copies run as device copies on a stream of the
/// staging's own, ranges closer than kDeviceCopyGap merged.
class Staging {
 public:
  Staging() = default;
  /// `share`: a staging over the same parameters whose memory this one uses too (host parameters; otherwise,
  /// or with another layout, ignored): a re-link's plan over the old link's pages, already faulted in, and
  /// what they hold kept. The caller sees that two stagings sharing memory never run transfers at once.
  Staging(const ParameterSet& params, std::vector<ByteRanges> ranges, const Staging* share = nullptr);
  ~Staging();
  Staging(Staging&& other) noexcept;
  Staging& operator=(Staging&& other) noexcept;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  /// Parameters -> staging (sender) and staging -> parameters (receiver), the staged ranges only; done when
  /// they return. CUDA parameters: ordered after the work enqueued on `after_stream` so far (a
  /// cudaStream_t; null: the legacy default stream, and with it every blocking stream).
  Status copy_from(const ParameterSet& params, void* after_stream = nullptr);
  Status copy_to(const ParameterSet& params, void* after_stream = nullptr);
  /// Sender staging: `rounds[r]` the copies that round r of the schedule packs (those this staging was made
  /// from); kept as pieces so that copy_from_by_round stages in the order the transfer reads.
  void order_by_rounds(std::span<const std::span<const BufferCopy>> rounds);
  /// Host staging ordered by rounds: copy_from in that order, `staged` set to r + 1 (release) once all that
  /// rounds 0..r pack is staged, so that a transfer started before packs round r as soon as it may. The
  /// staging's other ranges, if any, last. Otherwise (CUDA parameters, no order): copy_from, then `staged`
  /// set to kAllRoundsStaged, or to -1 when the copy failed. `also(r)`, when given, runs once round r is
  /// copied, before it is published (a trainer's FP8 quantize of that round's blocks).
  Status copy_from_by_round(const ParameterSet& params, std::atomic<int>& staged, void* after_stream = nullptr,
                            const std::function<void(std::size_t round)>& also = {});
  static constexpr int kAllRoundsStaged = 1 << 30;
  /// Whether copy_from_by_round stages round by round (a transfer may start before it).
  bool stages_by_round() const { return !stream_.valid() && !round_pieces_.empty(); }
  /// What the executor reads or writes: the host staging for a side that stages (the parameters it does not
  /// stage are never touched), the parameters themselves otherwise.
  ParameterMemory memory(const ParameterSet& params) const;
  /// The staged bytes (the ranges), what the plan needs.
  std::int64_t bytes() const { return bytes_; }
  /// Whether this staging holds every byte `other` stages (a plan made later over the same parameters:
  /// what a resend after a loss on the fleet link reads from the staging of the version it re-sends).
  bool covers(const Staging& other) const;
  /// The copies one copy_from or copy_to makes.
  std::size_t copies_per_version() const;
  /// Whether both use the same memory (the constructor's `share` taken).
  bool shares_memory_with(const Staging& other) const { return arena_ != nullptr && arena_ == other.arena_; }
  /// Faults the staged pages in for writing without changing what they hold. Throws wb::Error (kSystem).
  void prefault();
  /// The first touch, at connect, so that no update takes the page faults: memory shared with `share` (the
  /// constructor's) faulted in and kept as it is (the version a resend after a loss reads, or the widened
  /// link's, should the widening fail); fresh memory by copying the parameters in. Throws wb::Error.
  void touch_at_connect(const ParameterSet& params, const Staging* share);

 private:
  void release();
  Status copy(const ParameterSet& params, bool to_staging, void* after_stream);
  struct Copy {
    std::byte* data = nullptr;  // inside the arena, null when the parameter is not staged
    ByteRanges ranges;
  };
  std::vector<Copy> copies_;
  struct Arena {  // one reservation (core/host_pages.hpp), unmapped with the last staging that uses it
    std::byte* data = nullptr;
    std::size_t mapped = 0;
    std::vector<std::size_t> offsets;  // each parameter's, at a page boundary: the layout
    ~Arena();
  };
  std::shared_ptr<const Arena> arena_;
  struct Piece {
    std::size_t parameter = 0;
    std::int64_t first = 0, last = 0;
  };
  std::vector<std::vector<Piece>> round_pieces_;  // order_by_rounds: each byte in the first round that packs it
  std::int64_t bytes_ = 0;
  bool active_ = false;                 // constructed for a side that stages
  DeviceCopyStream stream_;             // CUDA parameters
  std::vector<HostPinning> pinned_;     // CUDA parameters: the page spans of the ranges
};

/// A trainer's sender staging for its round schedule, as connect makes it: the bytes of its parameters the
/// rounds pack, ordered by rounds, copied once now (so that the pages are touched at connect). Sending FP8
/// (`quantized`, with shadows): host parameters have it quantize by the same rounds
/// (QuantizedPack::order_by_rounds); CUDA parameters (staged at once, quantize reading the host copy)
/// stage every element of a converted tensor the trainer holds too, last. Throws as the constructor and
/// copy_from fail.
/// `whole`: every byte of every parameter is staged, not only what this schedule packs (a trainer on the fleet
/// link: a resend after a loss, planned anew, reads the version from this staging).
/// `share`: as for the constructor (touch_at_connect: memory shared is faulted in, not copied into).
Staging stage_for_sending(const ParameterSet& params, const RoundSchedule& schedule, exec::QuantizedPack* quantized,
                          bool whole = false, const Staging* share = nullptr);

}  // namespace wb::coord
