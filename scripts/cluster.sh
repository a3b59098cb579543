#!/usr/bin/env bash
# An emulated cluster on one machine, for running WeightBridge across "hosts" without hardware:
# N hosts, each a network namespace whose processes also get a UTS namespace of their own (so MPI and
# WeightBridge see a different host name per host), joined by a Linux bridge that lives in a namespace of
# its own. Nothing is changed in the machine's own network namespace. Each host's link can be shaped in
# both directions with tc (tbf), so that the network, not the CPU, bounds a transfer. Needs root
# (or CAP_SYS_ADMIN + CAP_NET_ADMIN), iproute2 and util-linux.
#
#   cluster.sh up N [--rate RATE] [--mtu BYTES]
#                                    create hosts 1..N (an earlier cluster of the same name is removed
#                                    first); RATE as tc writes it, e.g. 1gbit, 500mbit (default: unshaped);
#                                    BYTES the links' MTU (default 1500; see "Framing" below)
#   cluster.sh down                  remove the cluster (its namespaces, bridge, links)
#   cluster.sh status                list the hosts and their shaping
#   cluster.sh hostfile SLOTS        an Open MPI hostfile: every host with SLOTS slots
#   cluster.sh mpirun ARGS...        mpirun started on host 1, ranks placed over the hosts through an rsh
#                                    agent that enters the right namespaces (no ssh); ARGS as for mpirun
#                                    (give --hostfile, or WB_CLUSTER_SLOTS for every host's slots)
#   cluster.sh exec I CMD...         CMD on host I, under its host name
#   cluster.sh agent HOST CMD...     the rsh agent mpirun calls (HOST: a host's address)
#
# Framing: tc shapes whole frames, so TCP's headers take their share of RATE. At 1gbit with the default MTU
# of 1500 a TCP stream carries 119.6 MB/s of payload (95.7 % of 125 MB/s), at MTU 4096 about 123 MB/s
# (98.4 %, what RoCEv2 keeps of a link with its 4096-byte MTU), at 9000 124.4 MB/s (99.5 %).
#
# Environment: WB_CLUSTER_NAME (default wbc): namespaces NAME-sw, NAME-h1..NAME-hN, host names
# NAME-node1..; WB_CLUSTER_SUBNET (default 10.211.0): host i has address SUBNET.(10+i)/24. The subnet
# exists only inside these namespaces, so it cannot clash with the machine's networks.
set -euo pipefail

name=${WB_CLUSTER_NAME:-wbc}
subnet=${WB_CLUSTER_SUBNET:-10.211.0}
script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
switch="$name-sw"

die() { echo "cluster.sh: $*" >&2; exit 1; }
host_ns() { echo "$name-h$1"; }
host_name() { echo "$name-node$1"; }
host_address() { echo "$subnet.$((10 + $1))"; }
hosts() { ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$name-h\([0-9][0-9]*\)\$/\1/p" | sort -n; }

require_tools() {
  command -v ip >/dev/null || die "ip (iproute2) is not installed"
  command -v unshare >/dev/null || die "unshare (util-linux) is not installed"
  command -v tc >/dev/null || die "tc (iproute2) is not installed"
}

down() {
  local i
  for i in $(hosts); do ip netns del "$(host_ns "$i")" 2>/dev/null || true; done
  ip netns del "$switch" 2>/dev/null || true
}

shape() {  # NAMESPACE DEVICE RATE: tbf on what leaves through DEVICE
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 256kb latency 50ms
}

up() {
  local count=$1 rate=$2 mtu=${3:-1500} i ns peer
  [[ $count =~ ^[0-9]+$ && $count -ge 1 && $count -le 200 ]] || die "up: host count '$count' is not in 1..200"
  require_tools
  down  # a cluster left by a crash, or an earlier one of this name
  ip netns add "$switch"
  ip netns exec "$switch" ip link set lo up
  ip netns exec "$switch" ip link add br0 mtu "$mtu" type bridge
  ip netns exec "$switch" ip link set br0 up
  for ((i = 1; i <= count; ++i)); do
    ns=$(host_ns "$i")
    peer="h$i"
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    # The pair is made in the switch namespace; one end moves to the host and becomes its eth0.
    ip netns exec "$switch" ip link add "$peer" mtu "$mtu" type veth peer name "tmp$i" mtu "$mtu"
    ip netns exec "$switch" ip link set "tmp$i" netns "$ns"
    ip netns exec "$ns" ip link set "tmp$i" name eth0
    ip netns exec "$ns" ip addr add "$(host_address "$i")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$switch" ip link set "$peer" master br0
    ip netns exec "$switch" ip link set "$peer" up
    if [[ -n $rate ]]; then
      shape "$ns" eth0 "$rate"        # the host's egress
      shape "$switch" "$peer" "$rate"  # its ingress: what the switch sends it
    fi
  done
  echo "cluster.sh: $count hosts up ($name-node1..$count at $(host_address 1)..$(host_address "$count"), links ${rate:-unshaped}, MTU $mtu)"
}

status() {
  local i
  for i in $(hosts); do
    local qdisc
    qdisc=$(ip netns exec "$(host_ns "$i")" tc qdisc show dev eth0 2>/dev/null | grep -o 'rate [^ ]*' || true)
    echo "$(host_name "$i") $(host_address "$i") ${qdisc:-unshaped}"
  done
}

hostfile() {
  local slots=$1 i
  [[ $slots =~ ^[0-9]+$ && $slots -ge 1 ]] || die "hostfile: slots '$slots' is not a positive number"
  for i in $(hosts); do echo "$(host_address "$i") slots=$slots"; done
}

in_host() {  # I CMD...: CMD in host I's network namespace, with a UTS namespace of its own named after it
  local i=$1
  shift
  ip netns exec "$(host_ns "$i")" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$(host_name "$i")" "$@"
}

agent() {
  # Open MPI calls: AGENT [options] HOST COMMAND... and, like ssh, expects COMMAND run by a shell.
  while [[ $# -gt 0 && $1 == -* ]]; do shift; done
  [[ $# -ge 2 ]] || die "agent: expected HOST COMMAND"
  local host=$1 i
  shift
  for i in $(hosts); do
    if [[ $host == "$(host_address "$i")" || $host == "$(host_name "$i")" ]]; then
      in_host "$i" bash -c "$*"
      return
    fi
  done
  die "agent: $host is not a host of cluster $name"
}

run_mpirun() {
  local first
  first=$(hosts | head -n 1)
  [[ -n $first ]] || die "mpirun: cluster $name is not up (cluster.sh up N)"
  local args=("$@") hostfile_given=0 a
  for a in "${args[@]}"; do [[ $a == --hostfile || $a == -hostfile || $a == --machinefile ]] && hostfile_given=1; done
  local generated=""
  if [[ $hostfile_given == 0 ]]; then
    generated=$(mktemp /tmp/wb-cluster-hosts.XXXXXX)
    hostfile "${WB_CLUSTER_SLOTS:-1}" >"$generated"
    args=(--hostfile "$generated" "${args[@]}")
  fi
  local agent_script
  agent_script=$(mktemp /tmp/wb-cluster-agent.XXXXXX)
  printf '#!/bin/sh\nWB_CLUSTER_NAME=%q WB_CLUSTER_SUBNET=%q exec bash %q agent "$@"\n' "$name" "$subnet" "$script" >"$agent_script"
  chmod +x "$agent_script"
  local rc=0
  in_host "$first" mpirun --mca plm_rsh_agent "$agent_script" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self,vader --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    "${args[@]}" || rc=$?
  rm -f "$agent_script" ${generated:+"$generated"}
  return $rc
}

command=${1:-}
[[ -n $command ]] || die "usage: cluster.sh up N [--rate RATE] [--mtu BYTES] | down | status | hostfile SLOTS | mpirun ARGS... | exec I CMD... | agent HOST CMD..."
shift
case $command in
  up)
    count=${1:-}
    [[ -n $count ]] || die "up: how many hosts?"
    shift
    rate="" mtu=1500
    while [[ $# -gt 0 ]]; do
      case $1 in
        --rate) rate=${2:-}; [[ -n $rate ]] || die "up: --rate needs a value (e.g. 1gbit)"; shift 2 ;;
        --mtu)
          mtu=${2:-}
          [[ $mtu =~ ^[0-9]+$ && $mtu -ge 576 && $mtu -le 65535 ]] || die "up: --mtu needs a size in 576..65535 bytes"
          shift 2 ;;
        *) die "up: unknown option $1" ;;
      esac
    done
    up "$count" "$rate" "$mtu"
    ;;
  down) down ;;
  status) status ;;
  hostfile) hostfile "${1:-1}" ;;
  mpirun) run_mpirun "$@" ;;
  exec)
    [[ $# -ge 2 ]] || die "exec: expected I CMD..."
    in_host "$@"
    ;;
  agent) agent "$@" ;;
  *) die "unknown command '$command'" ;;
esac
