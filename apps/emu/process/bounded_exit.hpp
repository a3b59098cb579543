// How wb-replay and wb-bench end after their transfers, within a bounded time whatever the other ranks do:
// a rank that stopped, died or failed must not hold the others, whether or not the launcher tears the job
// down (mpirun --enable-recovery does not).
//
//   gather_reports    every rank's report reaches world rank 0 point to point, within the timeout of rank 0
//                     starting to wait for them (a collective would wait for a stopped rank for good);
//   exchange_verdict  rank 0 tells every rank the job's exit code, whether to call MPI_Finalize and, after a
//                     failure, the first one it knows of; a rank that does not hear it within the timeout
//                     exits non-zero and says so;
//   finish_process    MPI_Finalize only after a run that succeeded on every rank, and with the timeout as its
//                     deadline; after any failure no rank calls it: MPI_Finalize waits for every process of
//                     the job (Open MPI 4.1: a PMIx fence), and under a launcher that leaves the job up its
//                     fence does not end, in most runs, once another process exited without it.
//
// Every wait here is an operation of the library's control plane (comm/operation.hpp) polled against a
// deadline; one given up on is kept, with its buffers, until MPI completes it. The unit uses
// MPI_COMM_WORLD's tags 0x7e01 (reports) and 0x7e02 (verdicts).
#pragma once

#include <mpi.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/operation.hpp"

namespace wb::emu {

/// Seconds of the system clock: the t= of the programs' fault and exit lines, comparable between processes.
double wall_seconds();

/// The adapters' timeout (WB_TIMEOUT_SECONDS, --timeout-seconds) in seconds, infinity when it is none: the
/// programs' own waits end within it too.
double job_timeout();

/// Waits for `op` (comm::wait_for) until it completes (true) or `seconds` have passed (false: `op` is then
/// kept until MPI completes it). `idle`, when given, runs between polls (a rollout keeps serving while it
/// waits); when it returns false, the wait ends there too (false).
bool wait_within(const comm::OperationPtr& op, double seconds, const std::function<bool()>& idle = {});

/// Every rank's report, on world rank 0 (one per rank, null where none arrived within `seconds` of rank 0
/// starting to wait); an empty vector elsewhere, where the report is sent and not waited for (a report
/// larger than an eager message completes only when rank 0 takes it, and rank 0 may be gone).
std::vector<nlohmann::json> gather_reports(const nlohmann::json& mine, double seconds);

/// Rank 0's account of the first failure among `reports` (gather_reports): the one with the earliest
/// "failed_at" of those whose "failure" is not empty, as "world rank R: failure", else the first rank that
/// did not report. Empty when every rank reported success.
std::string first_failure(const std::vector<nlohmann::json>& reports, double seconds);

/// What rank 0 decided, as a rank takes it.
struct Verdict {
  int exit_code = 1;
  bool finalize = false;  // the run succeeded on every rank: call MPI_Finalize (finish_process)
  bool heard = true;      // false: rank 0's verdict did not arrive within the timeout
  std::string failure;    // after a failure, rank 0's account of the first one (may be empty)
};

/// Rank 0 sends every rank `exit_code`, whether to finalize (`everyone` reported and `exit_code` is 0) and
/// `failure` (first_failure); the other ranks pass their own exit code and wait for it up to `seconds`. A
/// rank that failed itself keeps its non-zero code and never finalizes, whatever it hears.
Verdict exchange_verdict(int exit_code, bool everyone, const std::string& failure, double seconds);

/// How a rank ends (finish_process), and how its exit line names it.
struct Ending {
  std::string program;  // "wb-replay": the prefix of the exit lines
  std::string who;      // "engine 1 worker 0 (world rank 4)"
  bool finalize = true;  // MPI_Finalize (a run that succeeded everywhere, or one that ended before any transfer)
  double timeout = std::numeric_limits<double>::infinity();  // the deadline on MPI_Finalize
};

/// What a rank that failed nowhere itself says of a run that failed: rank 0's account of the first failure
/// or, when rank 0's verdict did not come, that it did not and what this rank's own part did
/// (`own_outcome`, "verified 3 of 3 versions").
std::string verdict_text(const Verdict& verdict, double seconds, const std::string& own_outcome);

/// The line a rank prints when it does not succeed, for whoever reads the job's output (and the fault
/// tests): "PROGRAM: exit: WHO exits with CODE at t=NOW (failed at t=FAILED_AT): WHY".
void print_exit_line(const Ending& ending, int code, double failed_at, const std::string& why);

/// Ends the process. After a failure (`ending.finalize` false): _Exit with `exit_code` (1 if it is 0), no
/// MPI_Finalize. Otherwise MPI_Finalize, bounded by `ending.timeout` (past it an exit line and _Exit(1):
/// a rank that missed the verdict left without it), and returns `exit_code` for main to return.
int finish_process(const Ending& ending, int exit_code);

}  // namespace wb::emu
