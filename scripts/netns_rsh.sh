#!/bin/sh
# The rsh agent of scripts/netns_cluster.sh: OpenMPI calls `netns_rsh.sh CLUSTER HOST CMD...` in
# place of `ssh HOST CMD...` (CLUSTER comes from plm_rsh_agent). HOST is a node's address; this
# runs CMD (a shell command line, as ssh would hand it to the remote shell) inside that node's
# network namespace. Same machine, so the environment and the working directory carry over.
set -eu
cluster=$1 host=$2
shift 2
nodes=/run/trellis-netns/$cluster/nodes
ns=$(awk -v h="$host" '$1 == h || $2 == h {print $2}' "$nodes")
if [ -z "$ns" ]; then
  echo "netns_rsh: host '$host' is not a node of cluster '$cluster' ($nodes)" >&2
  exit 255
fi
# Each node has its own TMPDIR (OpenMPI's session directories; see netns_cluster.sh).
export TMPDIR=/run/trellis-netns/$cluster/tmp/$ns
exec ip netns exec "$ns" sh -c "$*"
