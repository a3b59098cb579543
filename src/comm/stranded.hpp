// Blocking MPI calls given up on whose threads are still inside MPI (comm/join.hpp: a merge or widening
// with a job that died in it; MPI cannot cancel a call that makes a communicator). The process goes on
// without them, but MPI_Finalize then runs with such a thread inside MPI: Open MPI 4.1 tore its
// shared-memory transport down under that thread's progress (SIGSEGV in mca_btl_vader, 3 of 10 runs of the
// ghost joiner, measured). So that the end is loud and bounded, a process that strands a call has a hook
// at the start of MPI_Finalize: it names every call still stranded on stderr; a stranded thread that then
// faults (SIGSEGV, SIGBUS: MPI's memory torn down under it) is stopped where it is, said once, and
// MPI_Finalize goes on (its call was given up on, its result abandoned: nothing waits for it); a fault of
// any other thread names the stranded calls and crashes as before; and the process ends (exit status 1)
// if MPI_Finalize has not returned within WB_TIMEOUT_SECONDS.
#pragma once

#include <string>
#include <vector>

namespace wb::comm {

/// `call` (what it was, "trainer 0: taking a joining engine") is given up on while its thread is still in
/// MPI on the thread whose kernel id is `thread` (gettid; 0: unknown); `key` names it until unstrand(key)
/// (the call returned after all). The first one installs the MPI_Finalize hook (MPI must be initialized).
void strand(const void* key, std::string call, long thread);

/// This thread's kernel id (what strand() takes).
long kernel_thread_id();
void unstrand(const void* key);

/// The calls stranded now, as strand() named them.
std::vector<std::string> stranded_calls();

}  // namespace wb::comm
