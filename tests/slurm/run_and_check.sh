#!/usr/bin/env bash
# Runs a wb-replay command and passes when it exits 0 and its JSON line says "verified":true.
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
[[ $status -eq 0 ]] || { echo "run_and_check: exit $status" >&2; exit 1; }
grep -q '"verified":true' <<<"$output" || { echo "run_and_check: no verified result" >&2; exit 1; }
