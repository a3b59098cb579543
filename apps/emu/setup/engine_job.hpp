// A program's --engine-job (wb-replay, wb-bench): the MPI job is one rollout engine of the deployment's
// layout that joins the trainers by address (emu/setup/joined_engine) and verifies every version it
// installs, bit for bit, until they shut down. Rank 0 writes the job's JSON (--json): the versions, the
// join's timings with the probe apart, the link's T_min and the stalls on trainer rank 0's clock; the job
// ends as the programs do (emu/process/bounded_exit).
#pragma once

#include <string>

#include "emu/faults/fault_injection.hpp"
#include "emu/options/run_options.hpp"
#include "emu/process/bounded_exit.hpp"
#include "emu/setup/run_setup.hpp"

namespace wb::emu {

struct EngineJob {
  std::string program;       // "wb-replay"
  std::string name;          // the engine's name in what it prints and in its JSON
  SyncMode mode;             // its receiver staging
  double step_ms = 2;        // its inference step between two polls
  Fault fault;               // at the trainers' versions, in before_update_hook
  std::string join_address;  // the trainers' address file
  // A bench's knobs (emu/setup/update_mark): the trainers' update mark, where the join starts in their
  // update (-1: when the job is up), and a fault placed in their update (Fault::at_ms) reads it.
  std::string update_mark;
  double knock_at_ms = -1;
};

/// The job's exit code. The rollout spec must be one engine over the job's ranks (engines=1,tp=<ranks>),
/// and a knock or fault placed in the trainers' update needs their update_mark; throws kInvalidArgument
/// otherwise.
int run_engine_job(const RunOptions& options, const RunSetup& setup, const EngineJob& job, Ending& ending);

}  // namespace wb::emu
