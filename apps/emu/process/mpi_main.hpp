// The main() of the MPI programs (wb-replay, wb-bench): MPI set up for the library, one clear line for a
// set-up failure, and an ending bounded in time whatever the other ranks do (emu/process/bounded_exit.hpp).
#pragma once

#include <functional>

#include "emu/process/bounded_exit.hpp"

namespace wb::emu {

/// MPI_Init_thread with MPI_THREAD_MULTIPLE (the staged modes transfer on a background thread beside the
/// caller's MPI calls) and MPI_ERRORS_RETURN on the world (failing calls return to the check macros, which
/// name the call and the rank); then `run`. An exception from it is one line "<program>: <what>" on stderr
/// and MPI_Abort, since the other ranks may wait in a collective for this one. Then finish_process with the
/// Ending `run` filled in (its program set to `program`). Returns run's exit code.
int run_mpi_program(const char* program, int argc, char** argv,
                    const std::function<int(int argc, char** argv, Ending& ending)>& run);

}  // namespace wb::emu
