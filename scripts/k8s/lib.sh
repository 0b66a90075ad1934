# Shared settings and helpers of scripts/k8s/*.sh (sourced, not run).
#
# The cluster lives in network namespaces named $NSP-* and in the scratch
# directory $CLUSTER_DIR; nothing else on the machine changes.

K8S_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$K8S_SCRIPTS/../.." && pwd)
CLUSTER_DIR=${PODNET_CLUSTER_DIR:-/tmp/podnet-k8s}
NSP=${PODNET_CLUSTER_NETNS:-pnk8s}     # netns prefix: $NSP-cp, $NSP-n1, ...
CP_NS=$NSP-cp
PKI=$CLUSTER_DIR/pki
RUN=$CLUSTER_DIR/run                   # pid files, logs, what to undo
IMG=$CLUSTER_DIR/images
# FAMILY=ipv4|dual|ipv6: the cluster's IP families (`up` records it in
# $RUN/config; commands on a cluster that is up read it from there).
FAMILY=${FAMILY:-}
if [ -z "$FAMILY" ] && [ -f "$RUN/config" ] && [ -e "/run/netns/${NSP}-cp" ]; then
	read -r _ _ FAMILY _ <"$RUN/config" || true
fi
FAMILY=${FAMILY:-ipv4}
UNDERLAY_GW4=172.31.77.1               # br0 in $CP_NS (ipv4, dual)
UNDERLAY_GW6=fd00:31:77::1             # br0 in $CP_NS (dual, ipv6)
case $FAMILY in
ipv4)
	UNDERLAY_GW=$UNDERLAY_GW4          # the API server's address
	CLUSTER_CIDR=10.244.0.0/16         # kubeadm --pod-network-cidr
	SVC_CIDR=10.96.0.0/16
	DNS_IP=10.96.0.10
	;;
dual)
	UNDERLAY_GW=$UNDERLAY_GW4          # the first family is the primary one
	CLUSTER_CIDR=10.244.0.0/16,fd00:10:244::/56
	SVC_CIDR=10.96.0.0/16,fd00:10:96::/112
	DNS_IP=10.96.0.10
	;;
ipv6)
	UNDERLAY_GW=$UNDERLAY_GW6
	CLUSTER_CIDR=fd00:10:244::/56
	SVC_CIDR=fd00:10:96::/112
	DNS_IP=fd00:10:96::a
	;;
*)
	echo "FAMILY=$FAMILY: want ipv4, dual or ipv6" >&2
	exit 2
	;;
esac
has4() { [ "$FAMILY" != ipv6 ]; }
has6() { [ "$FAMILY" != ipv4 ]; }
# urlhost ADDR: ADDR as the host part of a URL ([v6]).
urlhost() { case $1 in *:*) echo "[$1]" ;; *) echo "$1" ;; esac; }
API=https://$(urlhost "$UNDERLAY_GW"):6443
E2E_REGISTRY=localhost/podnet-e2e      # where the e2e images are mapped (KUBE_TEST_REPO_LIST)
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin
export LC_ALL=C.UTF-8

node_ip4() { echo "172.31.77.$((10 + $1))"; }
node_ip6() { echo "fd00:31:77::$((10 + $1))"; }
# node_ip N: node N's primary address (the API server reaches its kubelet
# there); node_ips N: every address, primary first (kubelet --node-ip).
node_ip() { if has4; then node_ip4 "$1"; else node_ip6 "$1"; fi; }
node_ips() {
	case $FAMILY in
	ipv4) node_ip4 "$1" ;;
	dual) echo "$(node_ip4 "$1"),$(node_ip6 "$1")" ;;
	ipv6) node_ip6 "$1" ;;
	esac
}
node_dir() { echo "$CLUSTER_DIR/nodes/node$1"; }
node_ns() { echo "$NSP-n$1"; }
log() { echo "[$(date +%T)] $*" >&2; }
die() { log "error: $*"; exit 1; }

# bins: the cached component directories (built on first use).
bins() {
	KAPI=$("$REPO/scripts/ensure-kapi.sh")
	K8S=$("$REPO/scripts/k8s/ensure-k8s.sh")
	CNI_TOOLS=$("$REPO/scripts/install-cni-tools.sh")
	export KAPI K8S CNI_TOOLS
}

# start_bg NAME CMD...: CMD in the background in its own session, output to
# $RUN/NAME.log, pid to $RUN/NAME.pid.
start_bg() {
	local name=$1
	shift
	mkdir -p "$RUN"
	setsid "$@" >>"$RUN/$name.log" 2>&1 </dev/null &
	echo $! >"$RUN/$name.pid"
}

# wait_for SECONDS WHAT CMD...: polls CMD every 0.5 s until it succeeds.
wait_for() {
	local limit=$1 what=$2
	shift 2
	local end=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $end ]; then
			log "timeout after ${limit}s waiting for $what"
			return 1
		fi
		sleep 0.5
	done
}

# kc ARGS...: kubectl as cluster admin, from the control-plane netns.
kc() {
	nsenter --net="/run/netns/$CP_NS" "$K8S/kubectl" --kubeconfig "$PKI/admin.kubeconfig" "$@"
}

# cluster_alive: whether the cluster of $CLUSTER_DIR is up and answering:
# its control-plane netns, a live kube-apiserver process and /readyz. A
# netns alone is not enough: a run killed mid-way (a CI job cancelled, a
# session ended) leaves the netns and pid files of processes long gone.
cluster_alive() {
	[ -e "/run/netns/$CP_NS" ] && [ -f "$RUN/kube-apiserver.pid" ] || return 1
	kill -0 "$(cat "$RUN/kube-apiserver.pid")" 2>/dev/null || return 1
	nsenter --net="/run/netns/$CP_NS" curl -sf -m 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" \
		--key "$PKI/admin.key" https://127.0.0.1:6443/readyz >/dev/null 2>&1
}

# clear_leftovers: removes a dead cluster's leftovers (cluster_alive says
# no, but its netns are still there) so that `up` can start afresh.
clear_leftovers() {
	[ -e "/run/netns/$CP_NS" ] || return 0
	cluster_alive && return 0
	log "a cluster's leftovers under $CLUSTER_DIR without a live API server (a run killed mid-way): removing them"
	"$K8S_SCRIPTS/cluster.sh" down || log "the leftovers' teardown reported a difference (above); going on"
	local ns
	for ns in "$CP_NS" "$NSP"-n1 "$NSP"-n2 "$NSP"-n3; do
		[ -e "/run/netns/$ns" ] && ip netns del "$ns" 2>/dev/null
	done
	return 0
}

# on_node N CMD...: CMD in node N's network, mount and UTS namespaces.
on_node() {
	local n=$1
	shift
	nsenter -t "$(cat "$RUN/node$n.pid")" -n -m -u -- "$@"
}

# killpid PID: TERM, then KILL after 5 s.
killpid() {
	local p=$1 i
	[ -n "$p" ] && kill -0 "$p" 2>/dev/null || return 0
	kill -TERM "$p" 2>/dev/null
	for i in $(seq 50); do
		kill -0 "$p" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$p" 2>/dev/null
	sleep 0.2
}
