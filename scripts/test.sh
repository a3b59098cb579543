#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs the whole suite through ctest.
# Extra arguments go to ctest (e.g. -L mpi, -R Hdf5). Tests that need a GPU or an RDMA device are
# labelled gpu / ibverbs and report themselves skipped on machines without one.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
# Open MPI refuses to run as root without these (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$build"
ctest --output-on-failure --timeout 900 -j "${WB_TEST_JOBS:-2}" "$@"
