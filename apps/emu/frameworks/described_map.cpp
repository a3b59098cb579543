#include "emu/frameworks/described_map.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "core/parallel.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "exec/quantized_pack.hpp"
#include "layout/form_union.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

// Checkpoint tensor names to their indices: built once per deployment, not per worker (a Kimi-K2 checkpoint
// has about 70,000 tensors and its trainer 256 workers).
using TensorIndex = std::unordered_map<std::string_view, std::uint32_t>;

TensorIndex index_tensors(const std::vector<TensorInfo>& checkpoint_tensors) {
  TensorIndex index;
  index.reserve(checkpoint_tensors.size());
  for (std::size_t t = 0; t < checkpoint_tensors.size(); ++t)
    index.emplace(checkpoint_tensors[t].name, static_cast<std::uint32_t>(t));
  return index;
}

SourceMap describe_worker(const EmulatedWorker& worker, const std::vector<TensorInfo>& checkpoint_tensors,
                          const TensorIndex& tensor_index) {
  SourceMap map;
  map.parameters = worker.parameter_infos();
  // Each parameter gets a disjoint range of a fake address space: export_weights only computes views,
  // so offsets and strides come out right without memory behind them.
  ParameterSet fake;
  std::vector<std::uintptr_t> base(map.parameters.size());
  std::uintptr_t next = 4096;
  for (std::size_t i = 0; i < map.parameters.size(); ++i) {
    const TensorInfo& info = map.parameters[i];
    base[i] = next;
    next += (info.nbytes() + 4095) / 4096 * 4096 + 4096;
    fake.add(info.name, TensorView::contiguous(reinterpret_cast<void*>(base[i]), info.dtype, info.shape));
  }
  for (const CheckpointPiece& piece : worker.export_weights(fake)) {
    const auto address = reinterpret_cast<std::uintptr_t>(piece.view.data);
    // The owning parameter: the last base at or below the address.
    const auto it = std::upper_bound(base.begin(), base.end(), address);
    if (it == base.begin())
      throw Error(ErrorCode::kInternal, worker.describe() + ": piece of " + piece.tensor + " outside its parameters");
    const auto parameter = static_cast<std::size_t>(it - base.begin() - 1);
    const auto found = tensor_index.find(piece.tensor);
    if (found == tensor_index.end())
      throw Error(ErrorCode::kNotFound, worker.describe() + ": holds " + piece.tensor + ", not in the checkpoint");
    SliceCopy copy;
    copy.tensor = found->second;
    copy.parameter = static_cast<std::uint32_t>(parameter);
    copy.box = piece.box;
    copy.offset = static_cast<std::int64_t>(address - base[parameter]) /
                  static_cast<std::int64_t>(dtype_size(map.parameters[parameter].dtype));
    copy.strides = piece.view.strides;
    map.copies.push_back(std::move(copy));
  }
  validate_source_map(map, checkpoint_tensors);
  return normalize_source_map(std::move(map));
}

}  // namespace

SourceMap described_source_map(const EmulatedWorker& worker, const std::vector<TensorInfo>& checkpoint_tensors) {
  return describe_worker(worker, checkpoint_tensors, index_tensors(checkpoint_tensors));
}

std::vector<SourceMap> describe_rollout_engine(const ModelConfig& model, const RolloutSpec& spec,
                                               const std::vector<TensorInfo>& checkpoint_tensors) {
  const std::vector<TensorInfo> tensors = spec.fp8_engine(0) ? engine_form(model, spec).tensors : checkpoint_tensors;
  const TensorIndex index = index_tensors(tensors);
  std::vector<SourceMap> maps;
  for (int rank = 0; rank < spec.tp; ++rank) maps.push_back(describe_worker(*make_rollout_worker(model, spec, rank), tensors, index));
  return maps;
}

DescribedDeployment describe_deployment(const ModelConfig& model, const Deployment& deployment,
                                        const std::vector<TensorInfo>& checkpoint_tensors) {
  DescribedDeployment result;
  const RolloutSpec& rollout = deployment.rollout;
  const TensorIndex tensor_index = index_tensors(checkpoint_tensors);
  std::optional<layout::Fp8Form> form;
  if (rollout.fp8()) form = engine_form(model, rollout);
  // A mixed fleet plans in the union of both forms, as connect does (layout/form_union.hpp).
  std::optional<layout::FormUnion> united;
  if (rollout.mixed()) united = layout::unite_forms(*form);
  result.tensors = united ? united->tensors : form ? form->tensors : checkpoint_tensors;
  const TensorIndex form_index = form ? index_tensors(form->tensors) : TensorIndex{};
  const auto world = static_cast<std::size_t>(deployment.world_size());
  const auto trainers = static_cast<std::size_t>(deployment.trainer.world_size());
  const auto tp = static_cast<std::size_t>(rollout.tp);
  // Engines of one form are identical: the first engine of each form is described, the others copy its maps.
  const auto first_of_form = [&](std::size_t engine) -> std::size_t {
    return rollout.fp8_engine(static_cast<int>(engine)) ? static_cast<std::size_t>(rollout.bf16_engines) : 0;
  };
  std::vector<std::size_t> described;
  for (std::size_t rank = 0; rank < world; ++rank)
    if (rank < trainers || (rank - trainers) / tp == first_of_form((rank - trainers) / tp)) described.push_back(rank);
  result.maps.resize(world);
  std::vector<std::vector<exec::BlockKey>> partial(trainers);
  // Every worker on its own, on the machine's cores (a Kimi-K2 trainer has 256 workers).
  for_each_index(described.size(), 4, [&](std::size_t i) {
    const std::size_t rank = described[i];
    if (rank >= trainers) {
      const auto worker = make_rollout_worker(model, rollout, static_cast<int>(rank - trainers));
      if (!worker->loads_fp8_form()) {
        result.maps[rank] = describe_worker(*worker, checkpoint_tensors, tensor_index);
        return;
      }
      SourceMap map = describe_worker(*worker, form->tensors, form_index);
      result.maps[rank] = united ? layout::fp8_map_in_union(std::move(map), *united) : std::move(map);
      return;
    }
    SourceMap map = describe_worker(*make_trainer_worker(model, deployment.trainer, static_cast<int>(rank)), checkpoint_tensors, tensor_index);
    if (form) {  // as connect makes it: the map of the trainer's quantizing pack (and its own, in a mixed fleet)
      const exec::QuantizedPack pack(map, *form);
      partial[rank] = pack.partial_blocks();
      map = normalize_source_map(united ? layout::trainer_map_in_union(map, pack.form_map(), *form, *united) : pack.form_map());
    }
    result.maps[rank] = std::move(map);
  });
  for_each_index(world - trainers, 4, [&](std::size_t i) {
    const std::size_t engine = i / tp, first = first_of_form(engine);
    if (engine != first) result.maps[trainers + i] = result.maps[trainers + first * tp + i % tp];
  });
  std::set<exec::BlockKey> shared;
  for (const std::vector<exec::BlockKey>& blocks : partial) shared.insert(blocks.begin(), blocks.end());
  for (std::size_t rank = 0; rank < world; ++rank) {
    const bool trainer = rank < trainers;
    result.sides.push_back(trainer ? Side::kTrainer : Side::kRollout);
    result.engine_of_worker.push_back(trainer ? -1 : static_cast<int>((rank - trainers) / tp));
    result.copies += result.maps[rank].copies.size();
  }
  result.fp8_shared_blocks = static_cast<std::int64_t>(shared.size());
  return result;
}

}  // namespace wb::emu
