#!/usr/bin/env bash
# checkpoint_tools.sh CHECK WB_MKCKPT WORKDIR [WB_REPLAY MPIEXEC]: what wb-mkckpt and wb-replay do with
# checkpoint files, as a user sees it.
#   names      wb-mkckpt refuses an output name under which it could not read the checkpoint back, before
#              writing anything
#   interrupt  SIGINT and SIGTERM during a write remove the partial files; the process ends by the signal
#   filesize   a file size limit (ulimit -f) fails the write with EFBIG, not SIGXFSZ: one error naming the
#              file and the cause, exit 1, nothing left in the output folder
#   unused     a checkpoint holding more than the model (a multi-token-prediction layer) loads: wb-replay
#              names the extra tensors in one warning and verifies the transfer
set -uo pipefail
check=$1
mkckpt=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

case "$check" in
names)
  # name, extra options, the message's cause
  while IFS='|' read -r output options cause; do
    # shellcheck disable=SC2086  # options are separate words
    message=$("$mkckpt" --model qwen3-30b-a3b --scale tiny $options --output "$output" 2>&1)
    status=$?
    echo "$message"
    [[ $status -ne 0 ]] || fail "--output $output $options was accepted"
    grep -qF -- "--output $output: $cause" <<<"$message" || fail "no \"$cause\" for $output"
    [[ -z $(ls -A) ]] || fail "$output: files left behind: $(ls -A)"
  done <<'EOF'
x.safetensors|--max-shard-mib 1|with --max-shard-mib the output is an index file beside its shards
model.json||a single safetensors file must be named *.safetensors
x.safetensors|--format hdf5|an HDF5 checkpoint must be named *.h5 or *.hdf5
x.h5|--format safetensors|a single safetensors file must be named *.safetensors
EOF
  # The names it accepts read back.
  "$mkckpt" --model qwen3-30b-a3b --scale tiny --max-shard-mib 1 --output sharded/model.safetensors.index.json >/dev/null ||
    fail "a sharded checkpoint under an index name"
  "$mkckpt" --model qwen3-30b-a3b --scale tiny --output MODEL.H5 >/dev/null || fail "an upper-case .H5 name"
  ;;

interrupt)
  # A tiny model with a 2 M-token vocabulary: two 256 MiB tensors, seconds to write, so the signal lands
  # mid-write; the partial file appears as the writer starts.
  for signal in INT TERM; do
    for output in big.safetensors big.h5 sharded/model.safetensors.index.json; do
      mkdir -p sharded
      shard=()
      [[ $output == sharded/* ]] && shard=(--max-shard-mib 100)
      "$mkckpt" --model qwen3-30b-a3b --scale tiny --vocab 2000000 "${shard[@]}" --output "$output" 2>stderr.txt &
      pid=$!
      for _ in $(seq 500); do
        compgen -G "*.partial-*" >/dev/null || compgen -G "sharded/*.partial-*" >/dev/null && break
        sleep 0.01
      done
      kill -s "$signal" "$pid"
      wait "$pid"
      status=$?
      cat stderr.txt
      [[ $status -ne 0 ]] || fail "SIG$signal: the write of $output finished before the signal; nothing was tested"
      number=$(kill -l "$signal")
      [[ $status -eq $((128 + number)) ]] || fail "SIG$signal: exit status $status, expected $((128 + number))"
      grep -q "removed the partial checkpoint" stderr.txt || fail "SIG$signal: no message"
      left=$(find . -name '*partial*' -o -name 'big.*' -o -name 'model*' | tr '\n' ' ')
      [[ -z $left ]] || fail "SIG$signal while writing $output left: $left"
      rm -rf sharded stderr.txt
    done
  done
  ;;

filesize)
  # 64 KiB: the header write fails; 512 KiB: the size set up front (ftruncate) fails. HDF5: refused before
  # anything is written (libhdf5 1.10 crashes at exit after a file close that failed).
  for limit in 64 512; do
    for output in m.safetensors sharded/model.safetensors.index.json m.h5; do
      mkdir -p sharded
      shard=()
      [[ $output == sharded/* ]] && shard=(--max-shard-mib 1)
      (ulimit -f "$limit"; exec "$mkckpt" --model qwen3-30b-a3b --scale tiny "${shard[@]}" --output "$output") 2>stderr.txt
      status=$?
      cat stderr.txt
      [[ $status -eq 1 ]] || fail "ulimit -f $limit, $output: exit status $status, expected 1 (153 is SIGXFSZ)"
      grep -qE "checkpoint [^ ]+\.(safetensors|h5): .*File too large" stderr.txt || fail "ulimit -f $limit, $output: no message naming the file and EFBIG"
      left=$(find . -name '*partial*' -o -name 'm.*' -o -name 'model*' -o -name '*.btr' | tr '\n' ' ')
      [[ -z $left ]] || fail "ulimit -f $limit, $output left: $left"
      rm -rf sharded stderr.txt
    done
  done
  ;;

unused)
  replay=$4
  mpiexec=$5
  # The shipped Moonlight config with one multi-token-prediction layer, as DeepSeek-V3 has.
  config_dir=$("$mkckpt" --help | sed -n 's/^shipped configs: //p')
  sed 's/"num_nextn_predict_layers":0/"num_nextn_predict_layers":1/' "$config_dir/moonlight-16b-a3b.json" >mtp.json
  grep -q '"num_nextn_predict_layers":1' mtp.json || fail "could not make mtp.json"
  line=$("$mkckpt" --model mtp.json --scale tiny --layers 2 --output mtp.safetensors) || fail "wb-mkckpt"
  echo "$line"
  output=$("$mpiexec" -n 2 "$replay" --checkpoint mtp.safetensors --model mtp.json --scale tiny --layers 2 \
    --trainer tp=1 --rollout engines=1,tp=1 --gpus-per-node 1 --steps 1 2>&1)
  status=$?
  echo "$output"
  [[ $status -eq 0 ]] || fail "wb-replay exit $status"
  warning="holds 210 tensor(s) that Moonlight-16B-A3B-tiny does not use; no worker loads them: "
  [[ $(grep -cF "$warning" <<<"$output") -eq 1 ]] || fail "not exactly one warning naming the unused tensors"
  grep -qF "model.layers.2.mlp.experts.{0..63}.down_proj.weight" <<<"$output" || fail "the warning does not name the experts"
  grep -qF "model.layers.2.eh_proj.weight" <<<"$output" || fail "the warning does not name eh_proj"
  ;;

*)
  fail "unknown check $check"
  ;;
esac
echo "checkpoint_tools.sh $check: passed"
