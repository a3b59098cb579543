#!/usr/bin/env bash
# Jobs of their own meet by address (comm/join.hpp): one ompi-server, a trainer job that publishes its port
# in an address file (mode 0600, with a secret), a joiner job of 2 ranks that is admitted, then a joiner
# whose copy of the file carries another secret, refused on every rank before anything reaches it.
# Usage: run_join_port.sh JOIN_PORT_PROGRAM MPIEXEC
set -euo pipefail
program=$1
mpiexec=${2:-mpirun}
dir=$(mktemp -d)
server=
trainer=
cleanup() {
  [[ -n $trainer ]] && kill "$trainer" 2>/dev/null || true
  [[ -n $server ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; } || true
  rm -rf "$dir"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/name_server.sh"
start_name_server
run() { timeout 90 "$mpiexec" --oversubscribe --ompi-server "file:$dir/uri" "$@"; }
run -np 2 "$program" trainer "$dir/address" 1 1 &
trainer=$!
for _ in $(seq 200); do [[ -s $dir/address ]] && break; sleep 0.1; done
[[ -s $dir/address ]] || { echo "the trainer job wrote no address file"; exit 1; }
run -np 2 "$program" joiner "$dir/address" ok
# The same port, another secret: refused.
sed '3s/.*/0000000000000000000000000000000000000000000000000000000000000000/' "$dir/address" > "$dir/forged"
run -np 2 "$program" joiner "$dir/forged" refused
wait "$trainer"
trainer=
echo "join by address: admitted, refused, port closed"
