#!/usr/bin/env bash
# The demo: installs what is missing, builds, writes a small MoE checkpoint of a real architecture
# (Qwen3-30B-A3B, scaled down) and moves it from 4 trainers to 2 rollout engines of 2 workers each with
# wb-replay, in each of the four synchronization modes. Every step the trainers load a new version of the
# checkpoint and send it; every rollout worker checks what it installed against its own load_weights of
# that version, bit for bit. Prints one table (per mode: verified, mean EWTT and AGST, bytes moved per
# version, the transports used) and keeps each run's output and JSON in files.
#   WB_BUILD_DIR        the build (default: build/)
#   WB_DEMO_DIR         where the checkpoint, logs and JSON go (default: $WB_BUILD_DIR/demo)
#   WB_DEMO_STEPS       versions sent per mode (default 5)
#   WB_DEMO_SKIP_BUILD  1: run the programs already built in WB_BUILD_DIR, install and build nothing (its test)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
steps=${WB_DEMO_STEPS:-5}
if [[ "${WB_DEMO_SKIP_BUILD:-0}" != "1" ]]; then
  bash "$root/scripts/install-deps.sh"
  bash "$root/scripts/build.sh" --target wb-mkckpt wb-replay
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader,tcp

data=${WB_DEMO_DIR:-$build/demo}
mkdir -p "$data"
checkpoint=$data/qwen3-30b-a3b-tiny.h5
echo "== writing a synthetic Qwen3-30B-A3B checkpoint (tiny) into $checkpoint"
"$build/apps/wb-mkckpt" --model qwen3-30b-a3b --scale tiny --format hdf5 --output "$checkpoint" >"$data/mkckpt.json"

failed=0
results=()
for mode in sync sender-staged receiver-staged async; do
  log=$data/replay-$mode.log
  json=$data/replay-$mode.json
  rm -f "$json"
  printf '== %-16s mpirun -np 8 wb-replay --mode %s ... ' "$mode" "$mode"
  if mpirun -np 8 "$build/apps/wb-replay" --checkpoint "$checkpoint" --model qwen3-30b-a3b --scale tiny \
      --trainer tp=2,ep=2,dp=2 --rollout engines=2,tp=2,ep=2 --gpus-per-node 4 \
      --mode "$mode" --steps "$steps" --json "$json" >"$log" 2>&1; then
    echo "ok"
  else
    echo "FAILED (the last lines of $log:)"
    tail -n 15 "$log" | sed 's/^/   /'
    failed=1
  fi
  results+=("$json")
done

echo
echo "== results: the trainers (tp=2, ep=2, dp=2) to 2 rollout engines of 2 workers, $steps versions each"
python3 "$root/scripts/demo_table.py" "${results[@]}" || failed=1
echo "(each run's whole output: $data/replay-<mode>.log; its JSON: $data/replay-<mode>.json)"
if [[ $failed -ne 0 ]]; then
  echo "demo: FAILED (see above)"
  exit 1
fi
echo "demo: every rollout worker verified every version in all four modes"
