// The main() of the MPI programs (wb-replay, wb-bench): MPI set up for the library, one clear line for a
// set-up failure, and no MPI_Finalize when a rank may never get there.
#pragma once

#include <functional>
#include <limits>
#include <string>

namespace wb::emu {

/// How a rank ends, besides its exit code: what `run` tells run_mpi_program.
struct Ending {
  /// MPI_Finalize only after a run that succeeded on every rank. MPI_Finalize waits for every process of
  /// the job (Open MPI 4.1: a PMIx fence), and under a launcher that does not tear the job down that fence
  /// does not end, in most runs, once another process exited without it.
  bool finalize = true;
  /// The bound on MPI_Finalize (a rank of a successful run may still have missed the verdict and left).
  double timeout = std::numeric_limits<double>::infinity();
  std::string who;  // this rank, as the exit lines name it
};

/// MPI_Init_thread with MPI_THREAD_MULTIPLE (the staged modes transfer on a background thread beside the
/// caller's MPI calls) and MPI_ERRORS_RETURN on the world (failing calls return to the check macros, which
/// name the call and the rank); then `run`. An exception from it is one line "<program>: <what>" on stderr
/// and MPI_Abort, since the other ranks may wait in a collective for this one. When `run` clears
/// `ending.finalize` the process exits without MPI_Finalize; otherwise MPI_Finalize runs with
/// `ending.timeout` as its deadline. Returns run's exit code.
int run_mpi_program(const char* program, int argc, char** argv,
                    const std::function<int(int argc, char** argv, Ending& ending)>& run);

}  // namespace wb::emu
