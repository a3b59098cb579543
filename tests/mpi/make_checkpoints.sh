#!/usr/bin/env bash
# Writes the checkpoints the wb-replay tests read: tiny Qwen3-30B-A3B (HDF5), tiny Moonlight (sharded
# safetensors) and a truncated copy of the first.
set -euo pipefail
mkckpt=$1
out=$2
rm -rf "$out"
mkdir -p "$out/moonlight-tiny"
"$mkckpt" --model qwen3-30b-a3b --scale tiny --format hdf5 --output "$out/qwen3-30b-a3b-tiny.h5"
"$mkckpt" --model moonlight-16b-a3b --scale tiny --format safetensors --max-shard-mib 1 \
  --output "$out/moonlight-tiny/model.safetensors.index.json"
cp "$out/qwen3-30b-a3b-tiny.h5" "$out/truncated.h5"
truncate -s $(( $(stat -c %s "$out/truncated.h5") / 2 )) "$out/truncated.h5"
