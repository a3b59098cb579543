#include "emu/check/preflight.hpp"

#include <mpi.h>

#include <chrono>
#include <iostream>
#include <map>
#include <string_view>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "emu/check/checkpoint_check.hpp"

namespace wb::emu {

namespace {

// Flattened (tensor index, offset..., extent...) records of the boxes a worker holds, for rank 0.
std::vector<std::int64_t> encode_boxes(const std::vector<CheckpointPiece>& pieces, const CheckpointReader& checkpoint) {
  std::map<std::string_view, std::int64_t> index;
  const auto& tensors = checkpoint.tensors();
  for (std::size_t t = 0; t < tensors.size(); ++t) index[tensors[t].name] = static_cast<std::int64_t>(t);
  std::vector<std::int64_t> out;
  for (const CheckpointPiece& piece : pieces) {
    out.push_back(index.at(piece.tensor));
    out.push_back(piece.box.ndim());
    out.insert(out.end(), piece.box.offset.begin(), piece.box.offset.end());
    out.insert(out.end(), piece.box.extent.begin(), piece.box.extent.end());
  }
  return out;
}


}  // namespace

// Version 0 loaded through load_weights and checked against the file; coverage checked on rank 0.
// Returns this rank's verdict; rank 0 fills `report`.
bool preflight(const RunSetup& setup, const EmulatedWorker& worker, const WorkerParameters& stored, nlohmann::json& report) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const Deployment& deployment = setup.deployment;
  // What this worker loads: the checkpoint, or (an FP8 engine) its FP8 form.
  const EngineVersion engine_version(setup, 0, worker.loads_fp8_form());
  const CheckpointReader& own = deployment.is_trainer(rank) ? *setup.checkpoint : engine_version.reader();
  const auto load_start = std::chrono::steady_clock::now();
  stored.load(worker, own);
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const ParameterSet& params = stored.read();
  const CheckpointCheck checked = check_against_checkpoint(worker, params, own);
  for (const std::string& failure : checked.failures) WB_LOG(kError) << failure;
  WB_LOG(kInfo) << worker.describe() << ": " << params.total_bytes() << " parameter bytes, " << checked.pieces
                << " pieces verified in " << load_seconds << " s load";

  // Coverage: rank 0 gathers every worker's boxes. Group 0 = trainers, group 1 + e = rollout engine e.
  const std::vector<std::int64_t> boxes = encode_boxes(worker.export_weights(params), own);
  const int count = static_cast<int>(boxes.size());
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  WB_CHECK_MPI(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<std::int64_t> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < world; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  WB_CHECK_MPI(MPI_Gatherv(boxes.data(), count, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, 0,
                           MPI_COMM_WORLD));
  struct Totals {
    std::int64_t failed_ranks, bytes, pieces, unsourced;
  } mine{checked.ok() ? 0 : 1, static_cast<std::int64_t>(checked.bytes_compared),
         static_cast<std::int64_t>(checked.pieces), static_cast<std::int64_t>(checked.unsourced_bytes)},
      sum{};
  WB_CHECK_MPI(MPI_Reduce(&mine, &sum, 4, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD));
  double max_load = 0;
  WB_CHECK_MPI(MPI_Reduce(&load_seconds, &max_load, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
  int ok = checked.ok() ? 1 : 0;
  if (rank == 0) {
    const int groups = 1 + deployment.rollout.engines;
    const auto tensors_of = [&](int group) -> const std::vector<TensorInfo>& {
      return group == 0 ? setup.checkpoint->tensors() : setup.engine_tensors(group - 1);
    };
    std::vector<std::vector<std::vector<Box>>> group_boxes;
    for (int g = 0; g < groups; ++g) group_boxes.emplace_back(tensors_of(g).size());
    for (int r = 0; r < world; ++r) {
      const int group = deployment.is_trainer(r) ? 0 : 1 + (r - deployment.trainer.world_size()) / deployment.rollout.tp;
      std::size_t at = static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]);
      const std::size_t end = at + static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
      while (at < end) {
        const auto tensor = static_cast<std::size_t>(all[at]);
        const auto ndim = static_cast<std::size_t>(all[at + 1]);
        Box box{Shape(all.begin() + static_cast<std::ptrdiff_t>(at + 2), all.begin() + static_cast<std::ptrdiff_t>(at + 2 + ndim)),
                Shape(all.begin() + static_cast<std::ptrdiff_t>(at + 2 + ndim), all.begin() + static_cast<std::ptrdiff_t>(at + 2 + 2 * ndim))};
        group_boxes[static_cast<std::size_t>(group)][tensor].push_back(std::move(box));
        at += 2 + 2 * ndim;
      }
    }
    std::vector<std::string> gaps;
    for (int g = 0; g < groups; ++g) {
      const std::string name = g == 0 ? "the trainers" : "rollout engine " + std::to_string(g - 1);
      for (std::string& gap : coverage_gaps(tensors_of(g), group_boxes[static_cast<std::size_t>(g)], name)) gaps.push_back(std::move(gap));
    }
    for (std::size_t i = 0; i < gaps.size() && i < 10; ++i) std::cerr << "wb-replay: " << gaps[i] << '\n';
    ok = sum.failed_ranks == 0 && gaps.empty() ? 1 : 0;
    report = {{"verified", ok != 0},
              {"failed_ranks", sum.failed_ranks},
              {"coverage_gaps", gaps.size()},
              {"bytes_verified", sum.bytes},
              {"pieces", sum.pieces},
              {"padding_bytes", sum.unsourced},
              {"load_seconds_max", max_load}};
  }
  WB_CHECK_MPI(MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return ok != 0;
}

}  // namespace wb::emu
