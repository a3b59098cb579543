// The check an HDF5 checkpoint passes before a reader opens it. libhdf5 (1.10 at least) trusts some
// metadata it decodes: a corrupt global heap behind a variable-length string attribute makes it read out of
// bounds and crash, corrupt its own heap so that the process aborts later ("free(): invalid size"), or loop
// forever. So the same walk of the metadata that opening does runs first in a checker process
// (wb-hdf5-check, io/hdf5_checker/), which reports each dataset it turns to; if it dies from a signal,
// exits other than normally, or stops making progress, the file is refused, naming the dataset. A walk that
// fails with wb::Error there is refused here with the same error, so that this process never walks a file
// the checker found bad (its heap is laid out differently: a bad free that the checker survives with an
// error may crash this one).
//
// The checker is a program started with posix_spawn (vfork and exec), not a fork() of this process: a
// forked copy of an MPI process shares its registered memory copy-on-write (with ibverbs, or libfabric's
// verbs and EFA providers, without fork support the NIC then writes into pages the parent no longer has:
// silent corruption; Open MPI warns, EFA aborts), copies the page tables of a process that may hold
// hundreds of GB (and, on recent kernels, every pinned page), and inherits locks other threads hold (an
// application thread inside libhdf5 would hang the walk). A spawned checker shares nothing of that; nor
// this process's heap, so a corruption that shows only with this heap's layout is not seen there (a forked
// copy would see it): the price of a check that is safe beside every transport.
#pragma once

#include <string>

namespace wb::io {

/// Refuses (kCorruptData, naming the file and the dataset) a file whose metadata crashes or hangs the
/// checker, and throws the checker's own error for one its walk refused; returns when the walk got
/// through. When
/// the check is off (WB_HDF5_CHECK_IN_CHILD=0) or the checker cannot be found or started, returns at
/// once (said once in the log): the file is then read unchecked.
void check_hdf5_file(const std::string& path);

/// The checker's side: walks the metadata of `path` as opening it does, writing the name of each dataset
/// it turns to on `progress_fd`, one per line. Throws wb::Error as opening does.
void walk_hdf5_metadata(const std::string& path, int progress_fd);

/// The exit status of a checker whose walk threw wb::Error (the reader's own walk reports it).
inline constexpr int kCheckerFoundError = 86;

}  // namespace wb::io
