// A job that dies while two jobs pair up (MPI_Comm_connect / MPI_Comm_accept), in Open MPI 4.1 (issue 31):
// once the two halves met at the name server, each side's runtime fetches the other job's addresses from
// that job's mpirun (a "direct modex" through its own mpirun's PMIx server), inside the TCP transport's
// add_procs and holding that transport's lock. When the other job is gone, nobody answers: the fetch gives
// up only at the PMIx server's own deadline, and with Open MPI's default (pmix_server_max_wait 2) never,
// so the call stays in MPI for good and every later connect or accept of the process waits on that lock
// (measured, and seen under gdb: a joined engine whose leader connected to a joiner that had died could
// meet no joiner again; a trainer job whose port paired with a joiner that died took no join again).
// With `mpirun --mca pmix_server_max_wait 5` the fetch gives up after 5 s, the call fails, and the next
// one completes (measured). What that setting gives is computed here, and a job that joins by address is
// told once when it runs without a value that gives up.
//
// And a job that dies in the middle of an update: a process whose write over Open MPI's TCP transport to a
// process of the killed job fails ("mca_btl_tcp_frag_send: writev failed: Broken pipe") may never return
// from its next MPI call, spinning inside Open MPI 4.1's progress (libevent dispatching, user time rising:
// seen twice 8 s apart in one `MPI_Improbe`); a survivor so stuck is left out of the fleet link's rebuild.
// With `btl_tcp_progress_thread 1` the transport's sockets are served by a thread of its own, outside the
// process's MPI calls (measured on the emulated cluster: README, "Engines as jobs of their own"). A job
// that joins or takes joins is told once when it runs the TCP transport without that thread.
#pragma once

#include <optional>

namespace wb::comm {

/// Seconds after which Open MPI 4.1's PMIx server gives up fetching a dead job's addresses with
/// pmix_server_max_wait = `max_wait` (none: never). Its request budget is 10 s and every `max_wait`
/// seconds it is decremented twice, giving up only when the second decrement reaches 0 or below and the
/// first did not: so 5 gives 5 s, 1 gives 5 s, 3 gives 6 s, and the default 2 (like 4, or 10 and above)
/// never gives up (each measured here, 2026-12-05, Open MPI 4.1.4).
std::optional<double> dead_job_give_up_seconds(int max_wait);

/// Once per process, where this process was started by Open MPI 4's mpirun: a warning when its
/// pmix_server_max_wait (as mpirun passed it on, OMPI_MCA_pmix_server_max_wait) never gives up on a dead
/// job, naming the setting that does. `who`: what joins ("the trainers' join port", "an engine that joins").
void check_dead_job_bound(const char* who);

/// Once per process, under Open MPI 4: a warning when its TCP transport is selected without its progress
/// thread (btl_tcp_progress_thread 0, Open MPI's default; read through MPI_T, so as the process runs,
/// whoever set it), naming the setting. `who` as above.
void check_tcp_progress_thread(const char* who);

}  // namespace wb::comm
