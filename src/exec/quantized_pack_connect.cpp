// The connect half of the trainers' FP8 pack (exec/quantized_pack.hpp): the map in the form's
// coordinates, the shadow and scale buffers, the blocks held in part.
#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "exec/device_quantizer.hpp"
#include "exec/quantized_pack.hpp"
#include "exec/round_executor.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

// Elements of block (block_row, block_col) of a tensor of `shape` (edge blocks are smaller).
std::int64_t block_elements(const Shape& shape, const layout::QuantizationConfig& config, std::int64_t block_row,
                            std::int64_t block_col) {
  const std::int64_t rows = std::min(shape[0], (block_row + 1) * config.block_rows) - block_row * config.block_rows;
  const std::int64_t cols = std::min(shape[1], (block_col + 1) * config.block_cols) - block_col * config.block_cols;
  return rows * cols;
}

}  // namespace

QuantizedPack::QuantizedPack(const SourceMap& trainer_map, const layout::Fp8Form& form)
    : config_(form.config), source_tensors_(form.source_tensors), trainer_map_(trainer_map) {
  const std::size_t n = source_tensors_.size();
  std::vector<std::uint32_t> form_of(n, 0);
  for (std::uint32_t i = 0; i < form.sources.size(); ++i)
    if (form.sources[i].role != layout::FormRole::kScale) form_of[form.sources[i].source] = i;
  const auto converted = [&](std::uint32_t tensor) {
    return form.sources[form_of[tensor]].role == layout::FormRole::kQuantized;
  };
  form_map_.parameters = trainer_map.parameters;
  own_parameters_ = trainer_map.parameters.size();
  blocks_of_.assign(n, -1);
  std::vector<std::int32_t> shadow_of(own_parameters_, -1);
  std::vector<std::vector<std::int64_t>> counts;  // per blocks_ entry, per block: elements held here
  std::vector<TensorInfo> shadow_parameters;
  for (std::uint32_t k = 0; k < trainer_map.copies.size(); ++k) {
    const SliceCopy& copy = trainer_map.copies[k];
    SliceCopy moved = copy;
    moved.tensor = form_of.at(copy.tensor);
    if (!converted(copy.tensor)) {
      form_map_.copies.push_back(moved);
      continue;
    }
    const TensorInfo& tensor = source_tensors_[copy.tensor];
    const TensorInfo& parameter = trainer_map.parameters.at(copy.parameter);
    if (parameter.dtype != tensor.dtype || !fp8::quantizable(parameter.dtype))
      throw Error(ErrorCode::kInvalidArgument, "FP8 pack: tensor " + tensor.name + " (" + std::string(dtype_name(tensor.dtype)) +
                                                   ") lands in parameter " + parameter.name + " of dtype " +
                                                   std::string(dtype_name(parameter.dtype)) + ", which cannot be quantized");
    if (shadow_of[copy.parameter] < 0) {
      shadow_of[copy.parameter] = static_cast<std::int32_t>(shadow_parameters.size());
      shadow_parameters.push_back({parameter.name + " (fp8)", DType::kF8E4M3, parameter.shape});
    }
    moved.parameter = static_cast<std::uint32_t>(own_parameters_ + static_cast<std::size_t>(shadow_of[copy.parameter]));
    form_map_.copies.push_back(moved);
    quantized_.push_back({k, static_cast<std::uint32_t>(shadow_of[copy.parameter])});
    if (blocks_of_[copy.tensor] < 0) {
      blocks_of_[copy.tensor] = static_cast<std::int32_t>(blocks_.size());
      const Shape scales = layout::scale_shape(tensor.shape, config_);
      TensorBlocks blocks;
      blocks.tensor = copy.tensor;
      blocks.scale_rows = scales[0];
      blocks.scale_cols = scales[1];
      blocks.amax.assign(static_cast<std::size_t>(scales[0] * scales[1]), 0.0f);
      blocks.touched.assign(blocks.amax.size(), 0);
      blocks.scale.assign(blocks.amax.size(), {});
      blocks.amax_first.assign(blocks.amax.size(), 0);
      blocks.shared.assign(blocks.amax.size(), 0);
      blocks.first_round.assign(blocks.amax.size(), -1);
      blocks_.push_back(std::move(blocks));
      counts.emplace_back(blocks_.back().amax.size(), 0);
    }
    // Elements of each block this copy holds: the overlap of its box with the block.
    TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    std::vector<std::int64_t>& count = counts[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    const std::int64_t r0 = copy.box.offset[0], r1 = r0 + copy.box.extent[0];
    const std::int64_t c0 = copy.box.offset[1], c1 = c0 + copy.box.extent[1];
    if (r1 <= r0 || c1 <= c0) continue;
    for (std::int64_t br = r0 / config_.block_rows; br * config_.block_rows < r1; ++br)
      for (std::int64_t bc = c0 / config_.block_cols; bc * config_.block_cols < c1; ++bc) {
        const std::int64_t rows = std::min(r1, (br + 1) * config_.block_rows) - std::max(r0, br * config_.block_rows);
        const std::int64_t cols = std::min(c1, (bc + 1) * config_.block_cols) - std::max(c0, bc * config_.block_cols);
        count[static_cast<std::size_t>(br * blocks.scale_cols + bc)] += rows * cols;
      }
  }
  shadow_count_ = shadow_parameters.size();
  for (TensorInfo& shadow : shadow_parameters) form_map_.parameters.push_back(std::move(shadow));
  // The scale parameters and the copies of the scale tensors: per block row, each run of touched blocks.
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    TensorBlocks& blocks = blocks_[b];
    const TensorInfo& tensor = source_tensors_[blocks.tensor];
    blocks.scale_buffer = static_cast<std::uint32_t>(b);
    const auto scale_parameter = static_cast<std::uint32_t>(form_map_.parameters.size());
    form_map_.parameters.push_back({tensor.name + config_.scale_suffix + " (scales)", DType::kF32,
                                    {blocks.scale_rows, blocks.scale_cols}});
    for (std::int64_t br = 0; br < blocks.scale_rows; ++br)
      for (std::int64_t bc = 0; bc < blocks.scale_cols;) {
        const auto at = static_cast<std::size_t>(br * blocks.scale_cols + bc);
        if (counts[b][at] == 0) {
          ++bc;
          continue;
        }
        std::int64_t end = bc;
        for (; end < blocks.scale_cols && counts[b][static_cast<std::size_t>(br * blocks.scale_cols + end)] > 0; ++end) {
          const auto block = static_cast<std::size_t>(br * blocks.scale_cols + end);
          blocks.touched[block] = 1;
          // A rank that holds an element twice counts it twice: more than the block has is "in part" too.
          if (counts[b][block] != block_elements(tensor.shape, config_, br, end))
            partial_.push_back({blocks.tensor, static_cast<std::int64_t>(block)});
        }
        form_map_.copies.push_back({form_of[blocks.tensor] + 1, scale_parameter, Box{{br, bc}, {1, end - bc}},
                                    br * blocks.scale_cols + bc, {blocks.scale_cols, 1}});
        bc = end;
      }
  }
  std::sort(partial_.begin(), partial_.end());
  for (Quantized& q : quantized_) {
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    if (trainer_map_.parameters[copy.parameter].dtype != DType::kBF16 || copy.strides[1] != 1) continue;
    const auto b = static_cast<std::size_t>(blocks_of_[copy.tensor]);
    const TensorInfo& tensor = source_tensors_[copy.tensor];
    const std::int64_t r0 = copy.box.offset[0], r1 = r0 + copy.box.extent[0];
    const std::int64_t c0 = copy.box.offset[1], c1 = c0 + copy.box.extent[1];
    bool alone = r1 > r0 && c1 > c0;
    for (std::int64_t br = r0 / config_.block_rows; alone && br * config_.block_rows < r1; ++br)
      for (std::int64_t bc = c0 / config_.block_cols; alone && bc * config_.block_cols < c1; ++bc) {
        const std::int64_t rows = std::min(r1, (br + 1) * config_.block_rows) - std::max(r0, br * config_.block_rows);
        const std::int64_t cols = std::min(c1, (bc + 1) * config_.block_cols) - std::max(c0, bc * config_.block_cols);
        const std::int64_t held = counts[b][static_cast<std::size_t>(br * blocks_[b].scale_cols + bc)];
        alone = held == rows * cols && held == block_elements(tensor.shape, config_, br, bc);
      }
    q.fused = alone;
  }
  validate_source_map(form_map_, form.tensors);
}

void QuantizedPack::set_shared_blocks(std::vector<BlockKey> shared) {
  std::sort(shared.begin(), shared.end());
  shared.erase(std::unique(shared.begin(), shared.end()), shared.end());
  for (const BlockKey& key : shared)
    if (key.tensor >= source_tensors_.size() || key.block < 0)
      throw Error(ErrorCode::kInvalidArgument, "FP8 pack: a shared block names tensor " + std::to_string(key.tensor) +
                                                   " block " + std::to_string(key.block) + ", which does not exist");
  shared_ = std::move(shared);
  exchanged_.assign(shared_.size(), 0);
  // Every rank that holds some of a shared block brings its amax to the exchange, whoever sends it.
  for (const BlockKey& key : shared_)
    if (const std::int32_t at = blocks_of_[key.tensor]; at >= 0) {
      need_amax(static_cast<std::uint32_t>(at), key.block);
      blocks_[static_cast<std::size_t>(at)].shared.at(static_cast<std::size_t>(key.block)) = 1;
    }
  // A copy with a shared block waits for the exchange like the others.
  for (Quantized& q : quantized_) {
    if (!q.fused) continue;
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    const std::int64_t scale_cols = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])].scale_cols;
    for (std::int64_t br = copy.box.offset[0] / config_.block_rows;
         q.fused && br * config_.block_rows < copy.box.offset[0] + copy.box.extent[0]; ++br)
      for (std::int64_t bc = copy.box.offset[1] / config_.block_cols;
           q.fused && bc * config_.block_cols < copy.box.offset[1] + copy.box.extent[1]; ++bc)
        q.fused = !std::binary_search(shared_.begin(), shared_.end(), BlockKey{copy.tensor, br * scale_cols + bc});
  }
}

void QuantizedPack::allocate() {
  if (allocated_) return;
  if (!cast_in_pack_)
    for (std::size_t s = 0; s < shadow_count_; ++s)
      shadows_.emplace_back(static_cast<std::size_t>(form_map_.parameters[own_parameters_ + s].numel()), std::uint8_t{0});
  for (const TensorBlocks& blocks : blocks_) scales_.emplace_back(blocks.amax.size(), 1.0f);
  allocated_ = true;
}

QuantizedPack::~QuantizedPack() = default;
QuantizedPack::QuantizedPack(QuantizedPack&&) noexcept = default;

DeviceQuantizePlan QuantizedPack::device_plan() const {
  DeviceQuantizePlan plan;
  plan.rule = config_.rule;
  plan.block_rows = config_.block_rows;
  plan.block_cols = config_.block_cols;
  for (const TensorBlocks& blocks : blocks_) {
    plan.tensors.push_back({plan.blocks, static_cast<std::int64_t>(blocks.amax.size()), blocks.scale_cols});
    plan.blocks += static_cast<std::int64_t>(blocks.amax.size());
  }
  for (std::size_t s = 0; s < shadow_count_; ++s)
    plan.shadow_bytes.push_back(static_cast<std::int64_t>(form_map_.parameters[own_parameters_ + s].nbytes()));
  for (const Quantized& q : quantized_) {
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    const TensorInfo& parameter = trainer_map_.parameters[copy.parameter];
    if (parameter.dtype != DType::kBF16)
      throw Error(ErrorCode::kUnsupported, "FP8 pack of CUDA parameters: " + source_tensors_[copy.tensor].name +
                                               " is held in parameter " + parameter.name + " as " +
                                               std::string(dtype_name(parameter.dtype)) + "; the device kernels take bf16");
    plan.copies.push_back({copy.parameter, q.shadow, static_cast<std::uint32_t>(blocks_of_[copy.tensor]), copy.offset,
                           copy.strides[0], copy.strides[1], copy.box.offset[0], copy.box.offset[1], copy.box.extent[0],
                           copy.box.extent[1]});
  }
  for (const BlockKey& key : shared_) {
    const std::int32_t at = blocks_of_[key.tensor];
    plan.shared.push_back(at < 0 ? -1 : plan.tensors[static_cast<std::size_t>(at)].first_block + key.block);
  }
  return plan;
}

void QuantizedPack::use_device(int device) { device_ = make_device_quantizer(device_plan(), device); }

std::vector<std::byte*> QuantizedPack::form_memory(std::span<std::byte* const> parameters) {
  std::vector<std::byte*> memory(parameters.begin(), parameters.end());
  memory.resize(own_parameters_, nullptr);
  if (device_) {
    for (std::byte* buffer : device_->buffers()) memory.push_back(buffer);
    return memory;
  }
  allocate();
  for (std::vector<std::uint8_t>& shadow : shadows_) memory.push_back(reinterpret_cast<std::byte*>(shadow.data()));
  if (cast_in_pack_) memory.resize(own_parameters_ + shadow_count_, nullptr);  // no pack reads a shadow
  for (std::vector<float>& scales : scales_) memory.push_back(reinterpret_cast<std::byte*>(scales.data()));
  return memory;
}

void QuantizedPack::order_by_rounds(std::span<const std::span<const BufferCopy>> rounds) {
  round_blocks_.assign(rounds.size(), {});
  round_copies_.assign(rounds.size(), {});
  for (TensorBlocks& blocks : blocks_) std::fill(blocks.first_round.begin(), blocks.first_round.end(), -1);
  const auto first_packed = [&](std::uint32_t at, std::int64_t block, std::size_t r) {
    std::int32_t& first = blocks_[at].first_round[static_cast<std::size_t>(block)];
    if (first >= 0) return;
    first = static_cast<std::int32_t>(r);
    round_blocks_[r].emplace_back(at, block);
  };
  for (std::size_t r = 0; r < rounds.size(); ++r)
    for (const BufferCopy& c : rounds[r]) {
      const Box& box = c.copy.box;
      if (c.copy.numel() == 0) continue;
      if (const std::optional<std::uint32_t> at = scale_parameter(c.copy.parameter)) {  // a piece of the scales
        for (std::int64_t i = 0; i < box.extent[0]; ++i)
          for (std::int64_t j = 0; j < box.extent[1]; ++j) first_packed(*at, (box.offset[0] + i) * blocks_[*at].scale_cols + box.offset[1] + j, r);
      } else if (const std::optional<CastSource> source = cast_source(c.copy)) {  // a piece of a shadow: its codes
        const std::uint32_t at = source->tensor_blocks;
        for (std::int64_t br = box.offset[0] / config_.block_rows; br * config_.block_rows < box.offset[0] + box.extent[0]; ++br)
          for (std::int64_t bc = box.offset[1] / config_.block_cols; bc * config_.block_cols < box.offset[1] + box.extent[1]; ++bc)
            first_packed(at, br * blocks_[at].scale_cols + bc, r);
      }
    }
  // Each round's copies: those holding some of the blocks first packed in it, and in which block rows.
  for (std::uint32_t k = 0; k < quantized_.size(); ++k) {
    const SliceCopy& copy = trainer_map_.copies[quantized_[k].copy];
    const TensorBlocks& blocks = blocks_[static_cast<std::size_t>(blocks_of_[copy.tensor])];
    std::vector<std::size_t> at(rounds.size(), SIZE_MAX);  // round -> index into round_copies_[round]
    (void)any_block(copy, [&](std::int64_t block) {
      const std::int32_t r = blocks.first_round[static_cast<std::size_t>(block)];
      if (r < 0) return false;
      std::vector<RoundCopy>& list = round_copies_[static_cast<std::size_t>(r)];
      const std::int64_t row = block / blocks.scale_cols;
      std::size_t& mine = at[static_cast<std::size_t>(r)];
      if (mine == SIZE_MAX) {
        mine = list.size();
        list.push_back({k, row, row});
      }
      list[mine].first_block_row = std::min(list[mine].first_block_row, row);
      list[mine].last_block_row = std::max(list[mine].last_block_row, row);
      return false;
    });
  }
}

void QuantizedPack::extend_memory(ParameterMemory& memory) {
  if (cast_in_pack_) memory.fp8_casts = this;
  memory.data = form_memory(memory.data);
  for (std::size_t p = own_parameters_; p < form_map_.parameters.size(); ++p) memory.bytes.push_back(form_map_.parameters[p].nbytes());
}

void QuantizedPack::cast_in_pack() {
  if (device_ || allocated_) throw Error(ErrorCode::kInternal, "FP8 pack: cast_in_pack after use_device or form_memory");
  cast_in_pack_ = true;
}

float* QuantizedPack::scale_memory(std::uint32_t at) {
  allocate();
  return scales_[blocks_[at].scale_buffer].data();
}

std::optional<std::uint32_t> QuantizedPack::scale_parameter(std::uint32_t parameter) const {
  const std::size_t first = own_parameters_ + shadow_count_;
  if (parameter < first || parameter >= first + blocks_.size()) return std::nullopt;
  return static_cast<std::uint32_t>(parameter - first);
}

bool QuantizedPack::whole_block(std::uint32_t at, std::int64_t block) const {
  const BlockKey key{blocks_[at].tensor, block};
  return !std::binary_search(partial_.begin(), partial_.end(), key) && !std::binary_search(shared_.begin(), shared_.end(), key);
}

std::vector<BufferCopy> QuantizedPack::converted_reads() const {
  std::vector<BufferCopy> reads;
  for (const Quantized& q : quantized_) {
    const SliceCopy& copy = trainer_map_.copies[q.copy];
    reads.push_back({copy, 0, static_cast<std::uint8_t>(dtype_size(trainer_map_.parameters[copy.parameter].dtype))});
  }
  return reads;
}

std::optional<QuantizedPack::CastSource> QuantizedPack::cast_source(const SliceCopy& copy) const {
  if (copy.parameter < own_parameters_ || copy.parameter >= own_parameters_ + shadow_count_) return std::nullopt;
  const auto shadow = static_cast<std::uint32_t>(copy.parameter - own_parameters_);
  // The copy of the trainer's map whose box holds the piece's and puts its elements where the piece does.
  for (const Quantized& q : quantized_) {
    if (q.shadow != shadow) continue;
    const SliceCopy& held = trainer_map_.copies[q.copy];
    if (held.strides != copy.strides || held.box.ndim() != copy.box.ndim()) continue;
    bool inside = true;
    std::int64_t offset = held.offset;
    for (int k = 0; k < copy.box.ndim() && inside; ++k) {
      const auto a = static_cast<std::size_t>(k);
      inside = copy.box.offset[a] >= held.box.offset[a] &&
               copy.box.offset[a] + copy.box.extent[a] <= held.box.offset[a] + held.box.extent[a];
      offset += (copy.box.offset[a] - held.box.offset[a]) * held.strides[a];
    }
    if (!inside || offset != copy.offset) continue;
    return CastSource{held.parameter, trainer_map_.parameters[held.parameter].dtype,
                      static_cast<std::uint32_t>(blocks_of_[held.tensor])};
  }
  throw Error(ErrorCode::kInternal, "FP8 pack: a piece of " + form_map_.parameters[copy.parameter].name + " at element " +
                                        std::to_string(copy.offset) + " lies in no copy of the trainer's map");
}

}  // namespace wb::exec
