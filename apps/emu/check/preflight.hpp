// wb-replay's check before any transfer: every worker's version 0, loaded through its own load_weights,
// against the checkpoint read directly, and the coverage of every tensor by the trainers and by each engine.
#pragma once

#include <nlohmann/json.hpp>

#include "emu/frameworks/worker_parameters.hpp"
#include "emu/setup/run_setup.hpp"

namespace wb::emu {

/// Collective over MPI_COMM_WORLD: loads version 0 into `stored` with the worker's load_weights, checks it
/// against the file (an FP8 engine against its FP8 form), and rank 0 checks that the trainers together and
/// every engine hold every element. Returns the job's verdict (every rank the same); rank 0 fills `report`
/// (verified, failed_ranks, coverage_gaps, bytes_verified, pieces, padding_bytes, load_seconds_max).
bool preflight(const RunSetup& setup, const EmulatedWorker& worker, const WorkerParameters& stored, nlohmann::json& report);

}  // namespace wb::emu
