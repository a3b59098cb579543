#!/usr/bin/env bash
# run_sbatch.sh SCRIPT WORKDIR [PREFIX]: submits SCRIPT with sbatch from WORKDIR, waits for the job and checks
# that it succeeded and wrote a verified JSON result (PREFIX-*.json beside its PREFIX-*.out log; default
# wb-smoke). The job's state is polled every 0.2 s: sbatch --wait's own poll interval grows to 10 s, which was
# most of these tests' time (10 s for a job of 2).
set -uo pipefail
script=$1
workdir=$2
prefix=${3:-wb-smoke}
limit=170  # below the test's ctest timeout (180 s)
rm -rf "$workdir" && mkdir -p "$workdir" && cd "$workdir" || exit 1
job=$(sbatch --parsable --time=5 --export=ALL "$script") || { echo "run_sbatch: sbatch refused $script" >&2; exit 1; }
job=${job%%;*}
state=
while :; do
  info=$(scontrol show job -o "$job" 2>&1)
  state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
  case $state in
    PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | RESIZING | REQUEUED) ;;
    "") echo "run_sbatch: scontrol show job $job: $info" >&2 ;;
    *) break ;;
  esac
  if ((SECONDS > limit)); then
    echo "run_sbatch: job $job is still ${state:-unknown} after $limit s; cancelled" >&2
    scancel "$job" 2>/dev/null
    cat "$prefix"-*.out >&2 2>/dev/null
    exit 1
  fi
  sleep 0.2
done
exit_code=$(sed -n 's/.* ExitCode=\([0-9]*:[0-9]*\).*/\1/p' <<<"$info")
if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
  echo "run_sbatch: job $job failed: $state, exit code $exit_code" >&2
  cat "$prefix"-*.out >&2 2>/dev/null
  exit 1
fi
cat "$prefix"-*.out
grep -q '"verified": true' "$prefix"-*.json || { echo "run_sbatch: no verified result" >&2; exit 1; }
