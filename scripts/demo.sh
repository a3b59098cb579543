#!/usr/bin/env bash
# The demo: installs what is missing, builds, writes small synthetic checkpoints of real architectures
# (Qwen3-30B-A3B and Moonlight, scaled down) and runs wb-replay under mpirun on several trainer/rollout
# layouts. Each rank loads its parameters through its emulated engine's load_weights and verifies them
# against the file; the trainers together and every rollout engine must hold every checkpoint element.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${WB_BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh" --target wb-mkckpt wb-replay
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader,tcp

data=${WB_DEMO_DIR:-$build/demo}
mkdir -p "$data"
echo "== writing synthetic checkpoints into $data"
"$build/apps/wb-mkckpt" --model qwen3-30b-a3b --scale tiny --format hdf5 --output "$data/qwen3-30b-a3b-tiny.h5"
"$build/apps/wb-mkckpt" --model moonlight-16b-a3b --scale tiny --format safetensors \
  --output "$data/moonlight-16b-a3b-tiny.safetensors"

failed=0
replay() {
  local ranks=$1
  shift
  echo "== mpirun -np $ranks wb-replay $*"
  if ! mpirun -np "$ranks" "$build/apps/wb-replay" "$@"; then
    failed=1
  fi
}
replay 8 --checkpoint "$data/qwen3-30b-a3b-tiny.h5" --model qwen3-30b-a3b --scale tiny \
  --trainer tp=2,ep=2,dp=2 --rollout engines=2,tp=2,ep=2 --gpus-per-node 4
replay 8 --checkpoint "$data/moonlight-16b-a3b-tiny.safetensors" --model moonlight-16b-a3b --scale tiny \
  --trainer tp=2,pp=2 --rollout engines=1,tp=4,ep=4,dp_attn=2,transpose=experts --gpus-per-node 4
replay 16 --preset moonlight-16b-a3b --scale tiny

if [[ $failed -ne 0 ]]; then
  echo "demo: FAILED (see the errors above)"
  exit 1
fi
echo "demo: every rank of every layout verified its parameters"
