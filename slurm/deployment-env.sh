# Sourced by the deployment scripts in slurm/: what every multi-node WeightBridge job sets up.
# Expects: submission from the repository root after scripts/build.sh (or WB_BUILD_DIR), one task per GPU.
build=${WB_BUILD_DIR:-$SLURM_SUBMIT_DIR/build}
out=${WB_OUT_DIR:-$SLURM_SUBMIT_DIR}
# InfiniBand / RoCE: ibverbs is chosen between nodes where an HCA is present; these are the settings a
# cluster usually needs (see the README's ibverbs table). Override any in the environment.
export WB_NODE_GBPS=${WB_NODE_GBPS:-400}          # the paper's testbed: 8 x 400 Gbit/s NICs per node
export WB_IB_NIC_LOCALITY=${WB_IB_NIC_LOCALITY:-auto}
export WB_IB_FORK_SAFE=${WB_IB_FORK_SAFE:-1}
export WB_TIMEOUT_SECONDS=${WB_TIMEOUT_SECONDS:-300}
export WB_LOG_LEVEL=${WB_LOG_LEVEL:-info}
# Without an HCA (EFA, Slingshot, Ethernet) libfabric is chosen; WB_FI_PROVIDER / WB_FI_DOMAIN pick it.
# The checkpoint: WB_CHECKPOINT=/path/model.safetensors.index.json (converted to the model's tensors),
# else weights generated in memory.
checkpoint_args=()
if [[ -n ${WB_CHECKPOINT:-} ]]; then checkpoint_args=(--checkpoint "$WB_CHECKPOINT"); fi

# wb_run PRESET: wb-bench on the preset, WeightBridge in two modes and both baselines, JSON beside the log.
wb_run() {
  local preset=$1
  srun --mpi=pmix --cpu-bind=cores --gpu-bind=closest "$build/apps/wb-bench" --preset "$preset" --scale full \
    "${checkpoint_args[@]}" --modes "${WB_MODES:-sync,async}" --reps "${WB_REPS:-5}" --warmup 1 \
    --json "$out/wb-$preset-${SLURM_JOB_ID}.json" --csv "$out/wb-$preset-${SLURM_JOB_ID}.csv"
}
