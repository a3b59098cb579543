// wb-hdf5-check FILE: the HDF5 checker (io/hdf5_check.hpp). Walks FILE's metadata as opening it does,
// writing "d NAME" for each dataset it turns to on standard output; exits 0 when the walk got through,
// kCheckerFoundError after a line "e CODE MESSAGE" when it threw wb::Error, and otherwise however libhdf5
// made it end. Started by the library, not by users.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/hdf5_check.hpp"
#include "weightbridge/status.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wb-hdf5-check FILE\n");
    return 2;
  }
  // A crash is the finding: it must end the checker with its signal, whatever handler a library installed.
  for (const int signal : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) std::signal(signal, SIG_DFL);
  try {
    wb::io::walk_hdf5_metadata(argv[1], STDOUT_FILENO);
  } catch (const wb::Error& error) {
    std::string line = "e " + std::to_string(static_cast<int>(error.code())) + " " + std::string(error.status().message());
    for (char& c : line)
      if (c == '\n') c = ' ';
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
    return wb::io::kCheckerFoundError;
  }
  // Returning runs every destructor and atexit handler (libhdf5's H5close among them): a heap that the
  // walk corrupted shows here, as an abort, rather than in the process that opens the file.
  return 0;
}
