#include "emu/process/mpi_main.hpp"

#include <mpi.h>

#include <cstdio>
#include <exception>

namespace wb::emu {

int run_mpi_program(const char* program, int argc, char** argv,
                    const std::function<int(int argc, char** argv, Ending& ending)>& run) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int exit_code = 1;
  Ending ending;
  ending.program = program;
  try {
    exit_code = run(argc, argv, ending);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return finish_process(ending, exit_code);
}

}  // namespace wb::emu
