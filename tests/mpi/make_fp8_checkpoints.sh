#!/usr/bin/env bash
# Writes the checkpoints the FP8 wb-replay tests read: a small Qwen3-30B-A3B (hidden 576, so every weight
# has edge blocks of 128 x 128; heads of 64 and experts of 128 rows, so that TP 2 shards tile in blocks) in
# BF16, and the FP8 form of its versions 0..2 (wb-mkckpt --fp8 --version K), each with its config.json.
set -euo pipefail
mkckpt=$1
out=$2
shift 2
model=("$@")  # the model flags, as the tests give them to wb-replay
rm -rf "$out"
mkdir -p "$out"
"$mkckpt" "${model[@]}" --output "$out/bf16.safetensors"
for version in 0 1 2; do
  mkdir -p "$out/fp8-v$version"
  "$mkckpt" "${model[@]}" --fp8 128x128 --fp8-rule per-block-cast --version "$version" \
    --output "$out/fp8-v$version/model.safetensors"
done
