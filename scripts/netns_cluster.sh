#!/usr/bin/env bash
# A cluster of N "nodes" on one machine: N network namespaces, each with one veth pair whose
# outer end is a port of a private bridge, so that MPI between them goes over real TCP sockets
# through the kernel's network stack (and, with --rate, through a bandwidth-shaped link).
#
#   scripts/netns_cluster.sh up 2 [--name trellis] [--rate 1gbit] [--slots 2]
#   scripts/netns_cluster.sh run [--name trellis] [--timeout 600] -- -np 4 build/trellis train --dp 4 ...
#   scripts/netns_cluster.sh stats [--name trellis]    # bytes through each node's veth so far
#   scripts/netns_cluster.sh shape [--name trellis] --rate 10gbit | --rate none
#   scripts/netns_cluster.sh down [--name trellis]
#   scripts/netns_cluster.sh reap                       # down every cluster whose owner died
#
# Layout of cluster NAME (NAME: at most 10 characters, interface names are limited to 15):
#   namespaces NAMEn1..NAMEnN, each with lo and eth0 = 10.213.0.i/24 (IPv6 off)
#   host side: veths NAMEv1..NAMEvN, ports of bridge NAMEbr; the host gets no address, so the
#   subnet is reachable only from inside the namespaces.
#   state: /run/trellis-netns/NAME/{nodes,owner,slots,tmp/NAMEnI}; nodes holds "ip namespace
#   host-veth" lines; tmp/NAMEnI is node i's TMPDIR. Every node has the host's name, so OpenMPI
#   names every node's session directory alike (TMPDIR/ompi.HOST.UID/jf.JOBFAMILY): in one /tmp
#   the daemons of one job, starting together in it, now and then lost one of their number,
#   which had daemonized, so mpirun waited for it for ever (6 launches in 120 on 8 nodes). A
#   TMPDIR per node, as real nodes each have their own /tmp, ended that (0 in 120).
#
# `run` starts mpirun inside node 1 (the "login node" is a compute node, as no address exists
# outside the namespaces) with -H ip1:S,...,ipN:S, the TCP transport only (--mca btl tcp,self;
# OOB and BTL restricted to the subnet, so neither can use loopback or shared memory between
# namespaces) and scripts/netns_rsh.sh as the rsh agent, which enters a node's namespace in
# place of ssh, without binding ranks to cores (every node's daemon would bind its first rank to
# core 0 of the one machine they share), and with the daemons left attached to their agent
# (--leave-session-attached): a daemon that dies while starting then ends the job at once with
# OpenMPI's message, where a daemonized one's death reached no one and mpirun waited for it until
# the timeout. Arguments after -- go to mpirun after those options.
# The job is bounded by --timeout seconds (SIGTERM, then SIGKILL 10 s later). Needs root
# (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; --rate needs tc's tbf qdisc, --delay tc's netem.
#
# `--rate R` shapes each link in both directions with a token bucket (tc tbf; R as tc writes
# rates: 1gbit, 10gbit, 500mbit): the namespace's eth0 egress (node -> switch) and the host
# veth's egress (switch -> node). `--delay D` adds netem delay D (e.g. 0.1ms) when the kernel
# has sch_netem.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_ROOT=/run/trellis-netns
SUBNET_PREFIX=10.213.0
NAME=trellis

die() { echo "netns_cluster: $*" >&2; exit 2; }

need_tools() {
  command -v ip >/dev/null || die "iproute2 ('ip') is missing: apt-get install iproute2"
  [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
}

state() { echo "$STATE_ROOT/$NAME"; }

nodes_file() {
  local f
  f="$(state)/nodes"
  [[ -f $f ]] || die "no cluster '$NAME' (run: $0 up N --name $NAME)"
  echo "$f"
}

# tc shaping of one device (optionally inside a namespace): token bucket at rate, burst 1 ms of
# the rate (at least 64 KiB, so GSO super-packets pass), a queue of 20 ms of the rate (at least
# 1 MiB: with tbf's default of 100 ms latency at 5 Mbit/s the veth's 64 KiB GSO packets were
# dropped by the thousand and TCP crawled), optional netem delay in front.
shape_dev() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  local tc=(tc)
  [[ -n $ns ]] && tc=(ip netns exec "$ns" tc)
  "${tc[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  [[ $rate == none && -z $delay ]] && return 0
  local bits burst limit parent=root
  if [[ -n $delay ]]; then
    "${tc[@]}" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000 ||
      die "tc netem failed (no sch_netem in this kernel?): --delay needs it"
    parent="parent 1:1"
  fi
  [[ $rate == none ]] && return 0
  bits=$(rate_bits "$rate")
  burst=$((bits / 8 / 1000)) limit=$((bits / 8 / 50))
  ((burst < 65536)) && burst=65536
  ((limit < 1048576)) && limit=1048576
  # shellcheck disable=SC2086
  "${tc[@]}" qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst "$burst" limit "$limit" ||
    die "tc tbf failed on $dev"
}

rate_bits() {
  local r=${1,,}
  case $r in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *bit) echo "${r%bit}" ;;
    *) die "rate '$1': write it as tc does (10gbit, 500mbit)" ;;
  esac
}

cmd_up() {
  local n=$1 rate=none delay="" slots=2
  shift
  while (($#)); do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      *) die "up: unknown option $1" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || die "up: N must be 1..250"
  need_tools
  [[ -e $(state) ]] && die "cluster '$NAME' already exists (down it first: $0 down --name $NAME)"
  mkdir -p "$(state)"
  echo "${OWNER_PID:-$PPID}" > "$(state)/owner"
  echo "$slots" > "$(state)/slots"
  : > "$(state)/nodes"
  mkdir -p "$(state)/tmp"
  # Whatever fails half-way (a command under set -e, a die), leave nothing behind.
  trap 'echo "netns_cluster: up failed, removing the partial cluster" >&2; cmd_down' EXIT
  ip link add "${NAME}br" type bridge
  ip link set "${NAME}br" up
  local i ns veth ip
  for ((i = 1; i <= n; i++)); do
    ns="${NAME}n$i" veth="${NAME}v$i" ip="$SUBNET_PREFIX.$i"
    ip netns add "$ns"
    mkdir -m 700 "$(state)/tmp/$ns"
    echo "$ip $ns $veth" >> "$(state)/nodes"
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "${NAME}br" up
    ip -n "$ns" addr add "$ip/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape_dev "$ns" eth0 "$rate" "$delay"
    shape_dev "" "$veth" "$rate" "$delay"
  done
  # Wait until node 1 reaches the last node (no ping here: a TCP connect to a closed port that is
  # refused proves the round trip).
  local last="$SUBNET_PREFIX.$n" k
  for k in $(seq 50); do
    [[ $(ip netns exec "${NAME}n1" timeout 1 bash -c "exec 3<>/dev/tcp/$last/9" 2>&1) == *refused* ]] &&
      break
    ((k == 50)) && die "up: node 1 cannot reach $last"
    sleep 0.1
  done
  trap - EXIT
  echo "netns_cluster: '$NAME' up: $n nodes $SUBNET_PREFIX.1-$n, rate $rate${delay:+, delay $delay}"
}

cmd_shape() {
  local rate=none delay=""
  while (($#)); do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      *) die "shape: unknown option $1" ;;
    esac
  done
  local ip ns veth
  while read -r ip ns veth; do
    shape_dev "$ns" eth0 "$rate" "$delay"
    shape_dev "" "$veth" "$rate" "$delay"
  done < "$(nodes_file)"
}

# Removes everything named NAME*, listed or not (a crash half-way through `up` may have left
# pieces the nodes file does not name). Processes still inside the namespaces (ranks, orteds,
# all started through this cluster) are killed first.
cmd_down() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NAME}n[0-9]+$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  local dev
  for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
               grep -E "^${NAME}(v[0-9]+|br)$" || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  rm -rf "$(state)"
}

cmd_reap() {
  local d owner
  for d in "$STATE_ROOT"/*/; do
    [[ -d $d ]] || continue
    owner=$(cat "$d/owner" 2>/dev/null || echo 0)
    if ! kill -0 "$owner" 2>/dev/null; then
      NAME=$(basename "$d") cmd_down_named
    fi
  done
}
cmd_down_named() { cmd_down; echo "netns_cluster: reaped '$NAME' (owner gone)"; }

cmd_stats() {
  local ip ns veth
  while read -r ip ns veth; do
    echo "$ns $ip $veth rx_bytes=$(cat /sys/class/net/$veth/statistics/rx_bytes)" \
         "tx_bytes=$(cat /sys/class/net/$veth/statistics/tx_bytes)"
  done < "$(nodes_file)"
}

cmd_run() {
  local timeout=600
  while (($#)); do
    case $1 in
      --timeout) timeout=$2; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option $1 (mpirun's options go after --)" ;;
    esac
  done
  local f slots hosts="" first="" ip ns veth
  f=$(nodes_file)
  slots=$(cat "$(state)/slots")
  while read -r ip ns veth; do
    hosts+="${hosts:+,}$ip:$slots"
    [[ -z $first ]] && first=$ns
  done < "$f"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR="$(state)/tmp/$first"
  exec ip netns exec "$first" timeout -k 10 "$timeout" mpirun \
    --mca plm_rsh_agent "$HERE/netns_rsh.sh $NAME" \
    --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self \
    --mca oob_tcp_if_include "$SUBNET_PREFIX.0/24" \
    --mca btl_tcp_if_include "$SUBNET_PREFIX.0/24" \
    --mca mpi_yield_when_idle 1 \
    --bind-to none \
    --leave-session-attached \
    -H "$hosts" "$@"
}

cmd=${1:-}
[[ -n $cmd ]] || die "usage: $0 up N | run -- ... | stats | shape | down | reap  [--name NAME]"
shift
args=()
while (($#)); do
  case $1 in
    --name) NAME=$2; shift 2 ;;
    --) args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ $NAME =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "--name: 1-10 lowercase letters/digits, starting with a letter"
set -- "${args[@]+"${args[@]}"}"
case $cmd in
  up) (($#)) || die "up: how many nodes?"; cmd_up "$@" ;;
  down) need_tools; cmd_down ;;
  reap) need_tools; cmd_reap ;;
  shape) need_tools; cmd_shape "$@" ;;
  stats) cmd_stats ;;
  run) cmd_run "$@" ;;
  *) die "unknown command '$cmd'" ;;
esac
