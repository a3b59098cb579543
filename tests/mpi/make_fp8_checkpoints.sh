#!/usr/bin/env bash
# Writes the checkpoints the FP8 wb-replay tests read: a tiny model (the flags after BLOCKS, as the tests
# give them to wb-replay) in BF16, and the FP8 form of its versions 0..2 (wb-mkckpt --fp8 --version K) in
# blocks of the first shape of BLOCKS (fp8-vK/model.safetensors), each with its config.json; version 0 in
# blocks of every other shape of BLOCKS too (fp8-SHAPE/model.safetensors) but with the config.json of the
# first: scale tensors whose shape does not match their weights under the block shape the config gives.
set -euo pipefail
mkckpt=$1
out=$2
IFS=, read -r -a blocks <<< "$3"
shift 3
model=("$@")
rm -rf "$out"
mkdir -p "$out"
"$mkckpt" "${model[@]}" --output "$out/bf16.safetensors"
for version in 0 1 2; do
  mkdir -p "$out/fp8-v$version"
  "$mkckpt" "${model[@]}" --fp8 "${blocks[0]}" --fp8-rule per-block-cast --version "$version" \
    --output "$out/fp8-v$version/model.safetensors"
done
for block in "${blocks[@]:1}"; do
  mkdir -p "$out/fp8-$block"
  "$mkckpt" "${model[@]}" --fp8 "$block" --fp8-rule per-block-cast --output "$out/fp8-$block/model.safetensors"
  cp "$out/fp8-v0/config.json" "$out/fp8-$block/config.json"
done
