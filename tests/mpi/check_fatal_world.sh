#!/usr/bin/env bash
# Runs test_fatal_world (4 ranks, world rank 3 killed at version 2, the world's error handler left at
# MPI_ERRORS_ARE_FATAL) with a launcher that keeps the job going, and checks that each survivor printed a
# Status naming world rank 3, and that nothing aborted.
#   check_fatal_world.sh MPIEXEC BINARY
set -uo pipefail
mpiexec=$1 binary=$2
output=$(timeout 120 "$mpiexec" -np 4 --enable-recovery --mca orte_abort_on_non_zero_status 0 "$binary" 2>&1)
echo "$output" | grep -v '^\[' | cut -c1-400
failed=0
for rank in 0 1 2; do
  line=$(echo "$output" | grep "^fatal_world: world rank $rank: ")
  if [[ -z $line ]]; then
    echo "check_fatal_world: world rank $rank printed no status (it aborted, hung or was killed)"; failed=1
  elif [[ $line != *"world rank 3)"* ]]; then
    echo "check_fatal_world: world rank $rank's status does not name world rank 3"; failed=1
  elif [[ $line == *"without a failure"* ]]; then
    echo "check_fatal_world: world rank $rank saw no failure"; failed=1
  fi
done
if echo "$output" | grep -q "MPI_ERRORS_ARE_FATAL\|MPI_ABORT was invoked"; then
  echo "check_fatal_world: an MPI error handler aborted"; failed=1
fi
[[ $failed == 0 ]] && echo "check_fatal_world: OK: every survivor got a Status"
exit $failed
