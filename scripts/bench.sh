#!/usr/bin/env bash
# `make bench`: podnet against the reference plugins, side by side, and
# bench/REPORT.md with its plots (issue 8). Stages, each timed:
#
#   routed    test/bench/routedbench TestRoutedScale: podnet-routed at 100,
#             1,000 and 5,000 Nodes of a real kube-apiserver (sync -> routes,
#             Node change -> route, RSS)             -> bench/results/routed.json
#   datapath  test/bench/routedbench TestDatapath: iperf3 pod<->pod across
#             dual-stack node netns (none, vxlan; IPv4 then IPv6 underlay)
#             vs node<->node, in IPv4 and IPv6, back-to-back pairs (10 s
#             runs, 5 pairs per mode and family: about 16 min), MTU and
#             fragmentation
#                                                     -> bench/results/datapath.json
#   cni       test/bench/cnibench: the plugin stacks through libcni (the
#             four of issue 8, and podnet's while podnet-routed's leak
#             reconcile passes every second), 200 pods sequential and 8
#             concurrent, 1,000 pods on one node (beside an empty control
#             node that takes the machine's drift out), floors, leak checks
#                                                     -> bench/results/cni.json
#   reconcile test/bench/reconcilebench TestReconcileCost: one leak
#             reconcile pass over 250 reservations, alive and dead (issue
#             22): pass time, store lock holds        -> bench/results/reconcile.json
#   policy    test/bench/policybench TestPolicyBench: NetworkPolicy (issue
#             24) on a two-node cluster with 1,000 pods (4 real netns, 996
#             Pod objects), 100 then 1,000 policies: at each count fresh
#             connections, connection rate and throughput with 0 vs that
#             many policies (back-to-back pairs), the table's size,
#             enforcement latency of policy and pod changes, the
#             incremental and the full write (restart); revocation at 100;
#             then the last count again with 100 ClusterNetworkPolicies
#             beside it (issue 33: 0 vs both, Admin Deny enforcement and
#             revocation, attach); at 0 policies and at each count, CNI
#             ADD with the engine on next to ptp + host-local in node 1's
#             netns, 100 pods each sequential and 8 concurrent, and 100
#             pods at once at the last count (issue 34; about 25 min)
#                                                     -> bench/results/policy.json
#   ipam      scripts/bench-ipam.sh: podnet-ipam vs host-local alone
#                                                     -> bench/results/ipam.md
#   report    bench/report (its own module, gonum.org/v1/plot)
#                                                     -> bench/REPORT.md, bench/plots/*.png
#
# The quiet-sensitive stages (routed latency) run first. A stage that fails
# is recorded in the report and makes the script exit non-zero after the
# report is written. Not part of `make test`; needs root (network
# namespaces), the reference plugins (scripts/install-cni-tools.sh), the
# cached kube-apiserver + etcd (scripts/ensure-kapi.sh) and iperf3 (installed
# here from Debian when missing).
#
# Knobs: BENCH_PODS (200), BENCH_REPS (3), BENCH_WORKERS (8),
# BENCH_OCCUPANCY (1000, 0 skips), BENCH_ROUTED_SCALES (100,1000,5000),
# BENCH_ROUTED_SAMPLES (100), BENCH_IPERF_SECONDS (10), BENCH_IPERF_REPS (5),
# BENCH_RECONCILE_N (250), BENCH_RECONCILE_REPS (5),
# BENCH_POLICY_ROUNDS (10: 4 flips each, at each count), BENCH_POLICY_REVOKES (10),
# BENCH_POLICY_COUNTS (100,1000), BENCH_POLICY_REPS (8: pairs of 0 vs n policies, alternating),
# BENCH_POLICY_CNPS (100 ClusterNetworkPolicies beside the last count; 0: no admin phase),
# BENCH_POLICY_ADD_PODS (100 per stack, mode and count of policies; 0: none),
# BENCH_POLICY_BURST (100 pods at once at the last count; 0: none),
# BENCH_POLICY_BURST_REPS (5 runs of each stack: the target is their median),
# BENCH_STAGES (routed,datapath,cni,reconcile,policy,ipam; `make bench
# STAGES=policy` runs one stage: the report is rebuilt from every
# results file there, and meta.json, which describes the last full run,
# is left alone: each stage's own JSON says when it ran), BENCH_DIR (bench: where
# REPORT.md, plots/ and results/ go), BENCH_QUICK=1 (a small smoke run of
# everything, into $TMPDIR/podnet-bench-quick unless BENCH_DIR is set), plus
# scripts/bench-ipam.sh's own knobs.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
# the code measured: the tree as it is before this run writes its results
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then rev="$rev (with uncommitted changes)"; fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "${BENCH_QUICK:-0}" = 1 ]; then
	# Written elsewhere, so that a smoke run never overwrites the report.
	: "${BENCH_DIR:=${TMPDIR:-/tmp}/podnet-bench-quick}"
	: "${BENCH_PODS:=30}" "${BENCH_REPS:=1}" "${BENCH_OCCUPANCY:=100}" "${BENCH_ROUTED_SCALES:=20,100}"
	: "${BENCH_ROUTED_SAMPLES:=10}" "${BENCH_IPERF_SECONDS:=1}" "${BENCH_IPERF_REPS:=1}" "${BENCH_RECONCILE_REPS:=2}"
	: "${BENCH_POLICY_ROUNDS:=2}" "${BENCH_POLICY_REVOKES:=2}" "${BENCH_POLICY_COUNTS:=100}" "${BENCH_POLICY_CNPS:=20}"
	: "${BENCH_POLICY_ADD_PODS:=20}" "${BENCH_POLICY_BURST:=20}"
	export PODNET_BENCH_POLICY_CONNS=${PODNET_BENCH_POLICY_CONNS:-50} PODNET_BENCH_POLICY_IPERF_SECONDS=${PODNET_BENCH_POLICY_IPERF_SECONDS:-1} PODNET_BENCH_POLICY_REPS=${BENCH_POLICY_REPS:-1}
	export PODNET_BENCH_POLICY_SWAP_ROUNDS=${PODNET_BENCH_POLICY_SWAP_ROUNDS:-2} PODNET_BENCH_POLICY_SWAP_BATCHES=${PODNET_BENCH_POLICY_SWAP_BATCHES:-8}
	export BENCH_PAIRS=${BENCH_PAIRS:-20} BENCH_PAIRS_FULL=${BENCH_PAIRS_FULL:-0} BENCH_GO_TIME=${BENCH_GO_TIME:-200x} BENCH_GO_COUNT=${BENCH_GO_COUNT:-1}
fi
pods=${BENCH_PODS:-200}
reps=${BENCH_REPS:-3}
workers=${BENCH_WORKERS:-8}
occupancy=${BENCH_OCCUPANCY:-1000}
all_stages=routed,datapath,cni,reconcile,policy,ipam
stages=${BENCH_STAGES:-$all_stages}
dir=${BENCH_DIR:-bench} # REPORT.md, plots/ and results/ go here
results=$dir/results
mkdir -p "$results" "$dir/plots"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

say() { echo "bench: $*" >&2; }

# ---- what a killed run left ----
# A run killed mid-stage (Ctrl-C, a timeout) never tears its cluster
# down: its netns (pnpolb-*, pnbench-*), the processes inside them
# (podnet-routed, kube-apiserver, etcd, iperf3) and its tmpfs run dirs
# stay, and the next run would compete with them. Only what the bench
# names so is touched.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^(pnpolb|pnbench)-[0-9a-f]+-' || true); do
	say "removing netns $ns, left by an earlier run, and its processes"
	for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
	ip netns del "$ns" 2>/dev/null || true
done
rm -rf /dev/shm/pnpolb-* 2>/dev/null || true

# ---- prerequisites ----
say "building bin/ and the benchmark drivers"
make --no-print-directory build >&2
tools=$(scripts/install-cni-tools.sh)
kapi=$(scripts/ensure-kapi.sh)
if ! command -v iperf3 >/dev/null; then
	say "installing iperf3 (Debian package)"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends iperf3 >&2
fi
CGO_ENABLED=0 go build -trimpath -o "$tmp/noop/noop" ./test/bench/noop
go build -o "$tmp/cnibench" ./test/bench/cnibench
go test -tags bench -c -o "$tmp/routedbench.test" ./test/bench/routedbench
go test -tags bench -c -o "$tmp/reconcilebench.test" ./test/bench/reconcilebench
go test -tags bench -c -o "$tmp/policybench.test" ./test/bench/policybench
go build -C bench/report -o "$tmp/report" .

# ---- stages ----
stage_json=()
failed=0
run_stage() { # name, command...
	local name=$1
	shift
	if [[ ",$stages," != *",$name,"* ]]; then
		return
	fi
	say "---- $name ----"
	local t0 status=ok
	t0=$(date +%s)
	if ! "$@" 2>&1 | tee "$tmp/$name.log" >&2; then
		status="failed (exit status; see the $name stage's output)"
		failed=1
		say "$name FAILED"
	fi
	local dt=$(($(date +%s) - t0))
	say "$name took ${dt}s"
	stage_json+=("{\"name\":\"$name\",\"seconds\":$dt,\"status\":\"$status\"}")
}

export PODNET_BENCH_OUT=$(cd "$results" && pwd) PODNET_KAPI_DIR=$kapi PODNET_CNI_TOOLS=$tools
export PODNET_BENCH_ROUTED_SCALES=${BENCH_ROUTED_SCALES:-100,1000,5000,10000}
export PODNET_BENCH_ROUTED_SAMPLES=${BENCH_ROUTED_SAMPLES:-100}
export PODNET_BENCH_ROUTED_MODES=${BENCH_ROUTED_MODES:-none,vxlan} PODNET_BENCH_ROUTED_CHURN=${BENCH_ROUTED_CHURN:-10}
export PODNET_BENCH_IPERF_SECONDS=${BENCH_IPERF_SECONDS:-10}
export PODNET_BENCH_IPERF_REPS=${BENCH_IPERF_REPS:-5}
export PODNET_BENCH_RECONCILE_N=${BENCH_RECONCILE_N:-250} PODNET_BENCH_RECONCILE_REPS=${BENCH_RECONCILE_REPS:-5}
export PODNET_BENCH_POLICY_ROUNDS=${BENCH_POLICY_ROUNDS:-10} PODNET_BENCH_POLICY_REVOKES=${BENCH_POLICY_REVOKES:-10}
export PODNET_BENCH_POLICY_COUNTS=${BENCH_POLICY_COUNTS:-100,1000} PODNET_BENCH_POLICY_REPS=${BENCH_POLICY_REPS:-${PODNET_BENCH_POLICY_REPS:-8}}
export PODNET_BENCH_POLICY_CNPS=${BENCH_POLICY_CNPS:-100}
export PODNET_BENCH_POLICY_ADD_PODS=${BENCH_POLICY_ADD_PODS:-100} PODNET_BENCH_POLICY_BURST=${BENCH_POLICY_BURST:-100}
export PODNET_BENCH_POLICY_BURST_REPS=${BENCH_POLICY_BURST_REPS:-${PODNET_BENCH_POLICY_BURST_REPS:-5}}
export PODNET_BENCH_COMMIT=$rev

run_stage routed "$tmp/routedbench.test" -test.run '^TestRoutedScale$' -test.v -test.count=1 -test.timeout=30m
run_stage datapath "$tmp/routedbench.test" -test.run '^TestDatapath$' -test.v -test.count=1 -test.timeout=40m
run_stage cni "$tmp/cnibench" -bin bin -ref "$tools" -noop "$tmp/noop/noop" -pods "$pods" -reps "$reps" \
	-workers "$workers" -occupancy "$occupancy" -out "$results/cni.json"
run_stage reconcile "$tmp/reconcilebench.test" -test.run '^TestReconcileCost$' -test.v -test.count=1 -test.timeout=10m
run_stage policy "$tmp/policybench.test" -test.run '^TestPolicyBench$' -test.v -test.count=1 -test.timeout=60m
run_stage ipam env BENCH_OUT="$results/ipam.md" scripts/bench-ipam.sh

# ---- versions, then the report ----
jstr() { # a JSON string
	local s=${1//\\/\\\\}
	s=${s//\"/\\\"}
	printf '"%s"' "$s"
}
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
mem=$(awk '/^MemTotal/ {printf "%.1f", $2/1048576}' /proc/meminfo)
plugins=$(go version -m "$tools/ptp" | awk '$1 == "mod" && $2 == "github.com/containernetworking/plugins" {print $3}')
stages_out=$(
	IFS=,
	echo "${stage_json[*]:-}"
)
# meta.json describes the last full run; a run of some stages only
# (BENCH_STAGES) writes its own beside it, which the report ignores.
meta=$results/meta.json
if [ "$stages" != "$all_stages" ]; then meta=$tmp/meta.json; fi
cat >"$meta" <<EOF
{
 "date": $(jstr "$(date -u '+%Y-%m-%d %H:%M:%S UTC')"),
 "command": $(jstr "make bench$([ "${BENCH_QUICK:-0}" = 1 ] && echo ' (BENCH_QUICK=1)')"),
 "commit": $(jstr "$rev"),
 "cpu": $(jstr "${cpu:-unknown}"),
 "nproc": $(nproc),
 "mem_gib": ${mem:-0},
 "kernel": $(jstr "$(uname -sr)"),
 "go": $(jstr "$(go version | cut -d' ' -f3-)"),
 "cni_plugins": $(jstr "${plugins:-unknown}"),
 "cni_tools_dir": $(jstr "$tools"),
 "kube_apiserver": $(jstr "$("$kapi/kube-apiserver" --version | awk '{print $2}')"),
 "etcd": $(jstr "$("$kapi/etcd" --version | awk '/etcd Version/ {print "v" $3}')"),
 "iperf3": $(jstr "$(iperf3 --version | head -1)"),
 "load_before": $(jstr "$load_before"),
 "load_after": $(jstr "$(cut -d' ' -f1-3 /proc/loadavg)"),
 "started_unix": $started,
 "ended_unix": $(date +%s),
 "stages": [$stages_out]
}
EOF
say "---- report ----"
"$tmp/report" -in "$results" -out "$dir/REPORT.md" -plots "$dir/plots"
say "wrote $dir/REPORT.md and $dir/plots/ ($(($(date +%s) - started)) s in all)"
exit "$failed"
