#!/usr/bin/env bash
# cluster.sh up --mtu: every host's link and its switch port take the MTU, a TCP connection between two
# hosts uses segments of it, and an MTU out of range is refused. Skips (77) where namespaces cannot be made.
set -uo pipefail
cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/cluster.sh
export WB_CLUSTER_NAME=${WB_CLUSTER_NAME:-wbc}m WB_CLUSTER_SUBNET=10.219.0
[[ $(id -u) -eq 0 ]] || { echo "multinode: skipped: the emulated cluster needs root"; exit 77; }
trap 'bash "$cluster" down' EXIT
if ! bash "$cluster" up 2 --rate 1gbit --mtu 4096; then
  ip netns add "$WB_CLUSTER_NAME-probe" 2>/dev/null || { echo "multinode: skipped: no network namespaces here"; exit 77; }
  ip netns del "$WB_CLUSTER_NAME-probe"
  exit 1
fi
fail() { echo "cluster_mtu: FAILED: $*"; exit 1; }
for i in 1 2; do
  mtu=$(ip netns exec "$WB_CLUSTER_NAME-h$i" cat /sys/class/net/eth0/mtu)
  [[ $mtu == 4096 ]] || fail "host $i's eth0 has MTU $mtu, not 4096"
  port=$(ip netns exec "$WB_CLUSTER_NAME-sw" cat /sys/class/net/h$i/mtu)
  [[ $port == 4096 ]] || fail "switch port h$i has MTU $port, not 4096"
done
# A TCP connection from host 1 to host 2 negotiates its segment size from the MTU: 4096 - 40 (IP, TCP).
ip netns exec "$WB_CLUSTER_NAME-h2" python3 -c '
import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.219.0.12", 5998)); s.listen(1); s.settimeout(10); s.accept()[0].recv(1)' &
server=$!
sleep 0.5
mss=$(ip netns exec "$WB_CLUSTER_NAME-h1" python3 -c '
import socket; c = socket.create_connection(("10.219.0.12", 5998), timeout=10)
print(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)); c.send(b"x")')
wait "$server"
[[ $mss -ge 4000 && $mss -le 4056 ]] || fail "TCP between the hosts has segments of ${mss:-?} bytes, not ~4056 (MTU 4096)"
if bash "$cluster" up 2 --mtu 100 2>/dev/null; then fail "--mtu 100 was taken"; fi
echo "cluster_mtu: passed"
