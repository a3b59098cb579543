#include "emu/mpi_main.hpp"

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

namespace wb::emu {

int run_mpi_program(const char* program, int argc, char** argv,
                    const std::function<int(int argc, char** argv, Ending& ending)>& run) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int exit_code = 1;
  Ending ending;
  try {
    exit_code = run(argc, argv, ending);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  if (!ending.finalize) std::_Exit(exit_code != 0 ? exit_code : 1);
  if (std::isfinite(ending.timeout)) {
    // A rank of a run that succeeded missed the verdict (later than the timeout) and left without
    // MPI_Finalize: this one would wait for it for good. Like every other wait, this one has a deadline.
    std::thread([program, seconds = ending.timeout, who = ending.who] {
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::fprintf(stderr, "%s: exit: %s exits with 1 at t=%.3f: MPI_Finalize did not return within %g s (a rank left "
                   "without it)\n", program, who.c_str(), now, seconds);
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
  }
  MPI_Finalize();
  return exit_code;
}

}  // namespace wb::emu
