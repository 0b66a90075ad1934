#!/usr/bin/env bash
# `make demo` and `make demo-down`: builds test/cluster/cmd/podnet-demo and
# runs it. The demo brings up a podnet cluster in network namespaces on
# this machine (a real kube-apiserver + etcd, NODES nodes running
# podnet-routed, pods attached by the CNI plugins through libcni), prints
# nodes, pods, routes and a connectivity matrix, and removes everything.
#
#   scripts/demo.sh            MODE=auto|none|vxlan|ipip  FAMILY=ipv4|dual|ipv6  KEEP=1  NODES=3
#   scripts/demo.sh down       remove a cluster left up by KEEP=1
#
# FAMILY (default ipv4): dual gives every node and pod an IPv4 and an
# IPv6 address (PodCIDRs also from fd00:10:244::/56) and runs every check
# over both; ipv6 is IPv6 only, the underlay (fd00:172:30::/64) and the
# API server ([fd00:172:30::fa]:6443) included, MODE=auto meaning vxlan.
#
# MODE=ipip on a kernel without the ipip module runs the IPIP end-to-end
# test in a QEMU VM instead (`make ipipvm`, test/ipipvm).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

if [ "$(id -u)" -ne 0 ]; then
	echo "the demo creates network namespaces: run it as root (sudo make demo)" >&2
	exit 2
fi
demo=bin/.podnet-demo
CGO_ENABLED=0 "$GO" build -trimpath -o "$demo" ./test/cluster/cmd/podnet-demo

if [ "${1:-}" = down ]; then
	exec "$demo" -down
fi

# kube-apiserver + etcd: cached; built once (minutes, with progress) on a
# fresh machine.
PODNET_KAPI_DIR=$(scripts/ensure-kapi.sh)
export PODNET_KAPI_DIR

rc=0
"$demo" "$@" || rc=$?
if [ "$rc" -eq 3 ]; then
	echo
	echo "==> make ipipvm"
	exec make --no-print-directory ipipvm
fi
exit "$rc"
