// The job's common clock: the offset of this rank's steady clock to world rank 0's, measured once with a few
// ping-pongs (Cristian's method), so that stall intervals and timelines of all ranks share one time axis.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

#include "coord/roles.hpp"

namespace wb::coord {

/// Collective over `world`: the offset to add to local_seconds() to read world rank 0's clock, from the
/// fastest of a few ping-pongs with rank 0 (Cristian's method; error below half that round trip).
double measure_clock_offset(MPI_Comm world, const Roles& roles, double timeout);
/// The same for any communicator, `name` naming a rank in errors.
double measure_clock_offset(MPI_Comm world, double timeout, const std::function<std::string(int)>& name);

}  // namespace wb::coord
