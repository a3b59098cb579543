// The trainers' FP8 pack: a trainer holding BF16 (or f16/f32) parameters sends the FP8 form of the
// checkpoint (layout/fp8_form.hpp) to FP8 engines, quantizing its own elements, with no gather.
//
// At connect, from the trainer's source map (in the BF16 checkpoint's coordinates) and the form:
//   - the map in the form's coordinates (form_map): a copy of a converted tensor now lands in a *shadow*
//     parameter (e4m3fn, the shape of the trainer's parameter, one byte per element) appended after the
//     trainer's parameters; every block the trainer touches gives a copy of the scale tensor into a
//     *scale* parameter (f32, the scale tensor's shape). The planner then works in FP8 atoms: bytes by
//     dtype, and the trainers' egress is one copy of the FP8 form;
//   - the blocks it holds only in part (partial_blocks): a block split between trainer ranks (flat shards,
//     a TP split off a multiple of the block) needs its amax from every rank that holds some of it.
// The trainers agree on the union of their partial blocks (shared blocks, set_shared_blocks) once.
//
// Every update, before its rounds (quantize): each rank takes the amax of its elements of every block it
// touches; the shared blocks' amaxes go through one max all-reduce of their |amax| bit patterns (4 bytes
// per shared block, exchange_bytes); then each rank computes every scale it touches by the rule and writes
// the codes of its own elements into the shadow parameters. A block's amax is the maximum over the same
// set of elements as the reference's (quantize_band), and max is exact, so each code and scale equals the
// reference's bit for bit (NaN included: both take the canonical quiet NaN). Host parameters neither
// staged nor verified (cast_in_pack): no shadow; quantize takes only the amaxes and scales the rounds'
// casts cannot take as they read (exec/fp8_cast_program.hpp), and the casts write the codes. Host
// parameters sender-staged (order_by_rounds): only the shared blocks before the rounds (quantize_shared),
// then each round's blocks as the staging is copied, before the round may be packed (quantize_round).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "layout/fp8_form.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/status.hpp"

namespace wb {
struct ParameterMemory;  // exec/round_executor.hpp
}  // namespace wb

namespace wb::exec {

/// A block of a converted tensor: the tensor's index in the source (BF16) list and the block's flat index
/// in its scale tensor (row-major).
struct BlockKey {
  std::uint32_t tensor = 0;
  std::int64_t block = 0;
  auto operator<=>(const BlockKey&) const = default;
};

/// The max all-reduce of the shared blocks' |amax| bit patterns over the trainers (comm::reduce_max).
using AmaxExchange = std::function<Status(std::span<std::uint32_t> amax_bits)>;

/// What the device quantizer (exec/device_quantizer.hpp) needs of a pack: every block of every converted
/// tensor in one array (each tensor's blocks from `first_block`, row-major), the shadows' sizes and the
/// copies to quantize (bf16, 2-D).
struct DeviceQuantizePlan {
  fp8::ScaleRule rule = fp8::ScaleRule::kPerBlockCast;
  std::int64_t block_rows = 128, block_cols = 128;
  struct Tensor {
    std::int64_t first_block = 0, blocks = 0, scale_cols = 0;
  };
  struct Copy {
    std::uint32_t parameter = 0, shadow = 0, tensor = 0;  // tensor: index into `tensors`
    std::int64_t offset = 0, stride0 = 0, stride1 = 1, row0 = 0, col0 = 0, rows = 0, cols = 0;
  };
  std::vector<Tensor> tensors;          // in the order of the pack's scale parameters
  std::vector<std::int64_t> shadow_bytes;
  std::vector<Copy> copies;
  std::vector<std::int64_t> shared;     // the shared blocks' indices in the one array, in exchange order
  std::int64_t blocks = 0;
};

class DeviceQuantizer;

class QuantizedPack {
 public:
  /// `trainer_map` validated against form.source_tensors. Throws kInvalidArgument naming the parameter and
  /// tensor when a converted tensor lands in a parameter of another dtype or of one that cannot be quantized.
  QuantizedPack(const SourceMap& trainer_map, const layout::Fp8Form& form);

  /// The trainer's map in the form's coordinates: its parameters, then the shadow and scale parameters.
  const SourceMap& form_map() const { return form_map_; }
  /// Parameters of the trainer's own (the first ones of form_map().parameters).
  std::size_t own_parameters() const { return own_parameters_; }

  /// The blocks this rank holds some but not all elements of, ascending.
  const std::vector<BlockKey>& partial_blocks() const { return partial_; }
  /// The union over the trainers of their partial blocks, ascending (the same on every trainer).
  void set_shared_blocks(std::vector<BlockKey> shared);
  const std::vector<BlockKey>& shared_blocks() const { return shared_; }
  /// Control bytes each trainer contributes to the amax exchange per update.
  std::int64_t exchange_bytes() const { return static_cast<std::int64_t>(shared_.size() * sizeof(std::uint32_t)); }

  /// Quantizes this rank's elements: `parameters[p]` is trainer parameter p's base address (host memory,
  /// read only). Writes the shadow and scale parameters (shadow_memory). Calls `exchange` once when some
  /// block is shared, with this rank's partial amaxes, and expects the maxima back.
  Status quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange);

  /// Base address of every parameter of form_map(): the trainer's (as given) then the shadow and scale
  /// buffers this object owns (in device memory after use_device; the shadows null after cast_in_pack).
  std::vector<std::byte*> form_memory(std::span<std::byte* const> parameters);

  /// The executor's memory for the form map: `memory` (the trainer's parameters, or their staging) then the
  /// shadow and scale buffers (form_memory); casting in the pack, fp8_casts set to this pack.
  void extend_memory(ParameterMemory& memory);

  /// Host parameters the rounds read as they are (no sender staging, not verifying): the rounds' packs cast
  /// the codes from the trainer's parameters straight into the send buffer (exec/fp8_cast_program.hpp),
  /// and quantize takes only the amaxes the casts cannot take themselves, and the scales. No shadow is ever
  /// allocated. Set-up, before form_memory.
  void cast_in_pack();
  bool casts_in_pack() const { return cast_in_pack_; }

  /// Where a pack copy of a shadow parameter (form_map() coordinates) reads its elements: the trainer's
  /// parameter and dtype, the copy of the trainer's map it lies in, and its tensor's blocks.
  struct CastSource {
    std::uint32_t parameter = 0;  // the trainer's
    DType dtype = DType::kBF16;
    std::uint32_t tensor_blocks = 0;  // the tensor's entry for block_scales, scale_memory, ...
  };
  /// nullopt when `copy` is not of a shadow; throws kInternal when it lies in no copy of the trainer's map.
  std::optional<CastSource> cast_source(const SliceCopy& copy) const;
  /// Every copy of the trainer's map of a converted tensor, as the elements quantize may read: a staging
  /// copied at once (CUDA parameters) holds them, so that quantize reads the host copy.
  std::vector<BufferCopy> converted_reads() const;
  /// The tensor's entry of a scale parameter of form_map(); nullopt for any other parameter.
  std::optional<std::uint32_t> scale_parameter(std::uint32_t parameter) const;
  const layout::QuantizationConfig& config() const { return config_; }
  /// Per block of tensor_blocks entry `at`: this update's scale (valid after quantize for the blocks quantize
  /// scales), the scale tensor's row length, the f32 scales the scale parameter holds.
  fp8::BlockScale* block_scales(std::uint32_t at) { return blocks_[at].scale.data(); }
  std::int64_t scale_cols(std::uint32_t at) const { return blocks_[at].scale_cols; }
  const Shape& tensor_shape(std::uint32_t at) const { return source_tensors_[blocks_[at].tensor].shape; }
  float* scale_memory(std::uint32_t at);
  /// Whether this rank holds every element of the block (once) and shares none: whoever reads them all has
  /// its amax.
  bool whole_block(std::uint32_t at, std::int64_t block) const;
  /// A cast program that cannot take block `block`'s amax itself (it casts only part of it, or packs its scale
  /// without casting all of it first): quantize takes it before the rounds.
  void need_amax(std::uint32_t at, std::int64_t block) { blocks_[at].amax_first[static_cast<std::size_t>(block)] = 1; }

  /// Sender staging of host parameters (shadows): quantize by rounds while the staging is copied by rounds,
  /// each round's blocks before the round is published to run_update's gate (coord/staging.hpp), so that
  /// the transfer starts once the first round's are final. `rounds[r]`: the pack copies of round r
  /// (form_map() coordinates). A block is quantized in the first round that packs its codes or its scale
  /// (every element this rank holds of it then); one that no round packs, never (another trainer sends it).
  void order_by_rounds(std::span<const std::span<const BufferCopy>> rounds);
  bool quantizes_by_round() const { return !round_blocks_.empty(); }
  /// Before the rounds: the shared blocks' amaxes, their exchange (`exchange` called once when some block is
  /// shared) and their scales.
  Status quantize_shared(std::span<std::byte* const> parameters, const AmaxExchange& exchange);
  /// After quantize_shared, in round order: round `round`'s blocks, amaxes (a shared one's exchanged), scales
  /// and codes into the shadows. A round past the schedule's: nothing.
  void quantize_round(std::span<std::byte* const> parameters, std::size_t round);

  /// Trainers' parameters in CUDA memory on `device`: the shadows and scales live there and quantize runs
  /// the device kernels on `cuda_stream` (exec/device_quantizer.hpp). Set-up: throws kUnsupported for a
  /// converted tensor held other than in bf16, kUnsupported in a build without CUDA, kCuda.
  void use_device(int device);
  Status quantize(std::span<std::byte* const> parameters, const AmaxExchange& exchange, void* cuda_stream);
  ~QuantizedPack();
  QuantizedPack(QuantizedPack&&) noexcept;

 private:
  struct Quantized {          // one copy of a converted tensor
    std::uint32_t copy = 0;   // in the trainer's map
    std::uint32_t shadow = 0; // index into shadows_
    // Contiguous bf16 rows whose blocks this copy alone holds, none shared: quantized a block row at a time,
    // amax then codes while the rows are still in cache.
    bool fused = false;
  };
  struct TensorBlocks {       // a converted tensor this rank touches
    std::uint32_t tensor = 0; // in the source list
    std::int64_t scale_rows = 0, scale_cols = 0;
    std::vector<float> amax;            // per block
    std::vector<std::uint8_t> touched;  // per block
    std::vector<fp8::BlockScale> scale; // per block, this update's
    std::vector<std::uint8_t> amax_first;  // per block, casting in the pack: quantize takes its amax
    std::vector<std::uint8_t> shared;   // per block: in shared_
    std::vector<std::int32_t> first_round;  // per block, by rounds: the first round that packs it, or -1
    std::uint32_t scale_buffer = 0;     // index into scales_ (its own index in blocks_)
  };
  // One update's steps: amaxes of a copy's wanted blocks (wanted(blocks, block)), the shared blocks' exchange,
  // a block's scale, the codes of a copy's wanted blocks into its shadow.
  bool any_block(const SliceCopy& copy, const std::function<bool(std::int64_t)>& in) const;
  template <typename Wanted>
  void take_amaxes(std::span<std::byte* const> parameters, const SliceCopy& copy, const Wanted& wanted);
  Status exchange_amaxes(const AmaxExchange& exchange);
  void take_scale(TensorBlocks& blocks, std::size_t block);
  template <typename Wanted>
  void write_codes(std::span<std::byte* const> parameters, const SliceCopy& copy, std::uint32_t shadow, const Wanted& wanted);
  const layout::QuantizationConfig config_;
  std::vector<TensorInfo> source_tensors_;
  SourceMap trainer_map_;
  SourceMap form_map_;
  std::size_t own_parameters_ = 0;
  std::vector<Quantized> quantized_;
  std::vector<TensorBlocks> blocks_;        // by tensor
  std::vector<std::int32_t> blocks_of_;     // source tensor -> index into blocks_, -1
  // The shadow and scale buffers, allocated when first used: a planner that wants only form_map() (wb-plan,
  // every trainer of a large job in one process) never holds them.
  void allocate();
  DeviceQuantizePlan device_plan() const;
  std::unique_ptr<DeviceQuantizer> device_;
  bool allocated_ = false;
  bool cast_in_pack_ = false;
  std::size_t shadow_count_ = 0;
  std::vector<std::vector<std::uint8_t>> shadows_;
  std::vector<std::vector<float>> scales_;  // by blocks_ entry
  std::vector<BlockKey> partial_, shared_;
  std::vector<std::uint32_t> exchanged_;    // per shared block
  std::vector<std::vector<std::pair<std::uint32_t, std::int64_t>>> round_blocks_;  // per round: (blocks_ entry, block) first packed in it
  struct RoundCopy {  // a quantized_ entry holding some of a round's blocks, in block rows [first, last]
    std::uint32_t quantized = 0;
    std::int64_t first_block_row = 0, last_block_row = 0;
  };
  std::vector<std::vector<RoundCopy>> round_copies_;  // per round
};

}  // namespace wb::exec
