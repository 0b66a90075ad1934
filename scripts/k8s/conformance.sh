#!/usr/bin/env bash
# Runs upstream's Kubernetes e2e specs of the pod network (e2e.test
# v1.34.10) against the cluster of scripts/k8s/cluster.sh, and writes the
# report. Two suites, one code path:
#
#   SUITE=conformance (make conformance; the default): every
#       "[sig-network] ... [Conformance]" spec, minus the skips in
#       test/conformance/skips.txt, each with its reason. Report
#       test/conformance/REPORT.md (FAMILY=ipv4), REPORT-dual.md or
#       REPORT-ipv6.md. FAMILY=dual adds upstream's [Feature:IPv6DualStack]
#       specs.
#   SUITE=netpol (make netpol): every "[sig-network] Netpol" spec labelled
#       Feature:NetworkPolicy (test/e2e/network/netpol: 3 namespaces x 3
#       pods, an 81-pair probe matrix per case), minus the skips in
#       test/conformance/netpol-skips.txt (SCTP). Report
#       test/conformance/REPORT-netpol.md (REPORT-netpol-dual.md, ...).
#   SUITE=cnp (make cnp): upstream's ClusterNetworkPolicy conformance suite
#       (sigs.k8s.io/network-policy-api/conformance v0.3.0, run by test/cnp,
#       its own Go module), profile ClusterNetworkPolicy, every feature,
#       minus the SCTP probes of test/conformance/cnp-skips.txt. Report
#       test/conformance/REPORT-cnp.md (REPORT-cnp-dual.md, ...).
#
#   MODE=vxlan|none NODES=2|3 FAMILY=ipv4|dual|ipv6: the cluster, brought up
#       unless one is up, and down after the run (unless it was already up,
#       or KEEP=1). REPORT=path writes the report elsewhere.
#   FOCUS=regexp  runs the suite's specs matching it instead (SUITE=
#       conformance: any sig-network spec, Conformance or not).
#   NETPOL=subset|all  (SUITE=conformance only) then runs Netpol specs on
#       the same cluster before teardown: `subset` those matching a line
#       of test/conformance/netpol-subset.txt, `all` every one; their own
#       report beside the first (REPORT with -netpol before .md). The run
#       fails when either fails. `make test` can turn this on
#       (test-conformance: NETPOL=subset).
#   CNP=subset|all  (SUITE=conformance only) then, also on the same cluster,
#       the ClusterNetworkPolicy suite: `subset` the tests of
#       test/conformance/cnp-subset.txt, `all` every one; report beside the
#       first (REPORT with -cnp before .md).
#   PROCS=N  runs the specs in N parallel Ginkgo processes (the ginkgo
#       CLI, built once from the module cache; 1 by default).
#       NETPOL_PROCS=N the same for the NETPOL= run (PROCS by default).
#   TIMEOUT=120m  Ginkgo's timeout of each run: the specs not done by then
#       are reported as interrupted.
#
# The e2e images are built here (images.sh) and mapped through the e2e
# framework's image repository config (KUBE_TEST_REPO_LIST): the specs ask
# for $E2E_REGISTRY/agnhost:2.56 and so on, which every node has imported.
# Exit status: non-zero when a spec failed or the cluster did not come up.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export MODE=${MODE:-vxlan} NODES=${NODES:-2} FAMILY
SUITE=${SUITE:-conformance}
NETPOL=${NETPOL:-}
CNP=${CNP:-}
PROCS=${PROCS:-1}
NETPOL_PROCS=${NETPOL_PROCS:-$PROCS}
TIMEOUT=${TIMEOUT:-120m}
case $SUITE in conformance | netpol | cnp) ;; *) die "SUITE=$SUITE: want conformance, netpol or cnp" ;; esac
case $CNP in "" | subset | all) ;; *) die "CNP=$CNP: want subset or all" ;; esac
[ -z "$CNP" ] || [ "$SUITE" = conformance ] || die "CNP=$CNP is for SUITE=conformance (SUITE=cnp runs it all)"
case $NETPOL in "" | subset | all) ;; *) die "NETPOL=$NETPOL: want subset or all" ;; esac
[ -z "$NETPOL" ] || [ "$SUITE" = conformance ] || die "NETPOL=$NETPOL is for SUITE=conformance (SUITE=netpol runs them all)"
# the report of each suite and family: REPORT.md (ipv4), REPORT-dual.md,
# REPORT-ipv6.md; REPORT-netpol.md, REPORT-netpol-dual.md, ...
suffix=""
[ "$FAMILY" = ipv4 ] || suffix=-$FAMILY
if [ "$SUITE" = netpol ]; then
	REPORT=${REPORT:-$REPO/test/conformance/REPORT-netpol$suffix.md}
elif [ "$SUITE" = cnp ]; then
	REPORT=${REPORT:-$REPO/test/conformance/REPORT-cnp$suffix.md}
else
	REPORT=${REPORT:-$REPO/test/conformance/REPORT$suffix.md}
fi
# the Netpol report of NETPOL=subset|all: beside the first one
NETPOL_REPORT=${REPORT%.md}-netpol.md
CNP_REPORT=${REPORT%.md}-cnp.md
SUBSET=$REPO/test/conformance/netpol-subset.txt

# suite NAME [subset|all]: sets what suite NAME selects: FOCUS_RE (a
# Ginkgo focus regexp), LABELS (a label filter), SKIPS (the file of
# "regexp<TAB>reason" lines, each skipped spec with its reason), SELECTED
# (for the report's header), TITLE.
suite() {
	case $1 in
	conformance)
		# every sig-network [Conformance] spec; on a dual-stack cluster
		# also every [Feature:IPv6DualStack] spec but those that need SCTP
		# in the kernel (Feature:SCTPConnectivity: a feature of its own,
		# which this machine's kernel lacks) or a cloud load balancer
		# (none here has one)
		FOCUS_RE='\[sig-network\].*\[Conformance\]'
		SELECTED='every `[sig-network]` `[Conformance]` spec of the suite'
		if [ "$FAMILY" = dual ]; then
			FOCUS_RE='\[sig-network\].*(\[Conformance\]|\[Feature:IPv6DualStack\])'
			SELECTED='every `[sig-network]` `[Conformance]` spec and every `[Feature:IPv6DualStack]` spec that needs neither SCTP nor a cloud load balancer'
		fi
		[ -n "${FOCUS:-}" ] && FOCUS_RE="\\[sig-network\\].*($FOCUS)" && SELECTED="the \`[sig-network]\` specs matching \`$FOCUS\`"
		LABELS='!Feature:SCTPConnectivity'
		SKIPS=$REPO/test/conformance/skips.txt
		TITLE="Kubernetes sig-network conformance on podnet ($FAMILY)"
		;;
	netpol)
		# upstream's NetworkPolicy suite (test/e2e/network/netpol): every
		# spec labelled Feature:NetworkPolicy; the SCTP ones are in the
		# selection and skipped with their reason (netpol-skips.txt)
		FOCUS_RE='\[sig-network\] Netpol '
		SELECTED='every `[sig-network] Netpol` spec labelled `Feature:NetworkPolicy` (TCP, UDP, SCTP)'
		local f
		if [ "${2:-}" = subset ]; then
			# each line the whole name after "Netpol " (a TCP line must
			# not select the UDP and SCTP specs of the same name)
			f=$(sed -e '/^#/d' -e '/^[[:space:]]*$/d' "$SUBSET" | paste -sd'|')
			[ -n "$f" ] || die "$SUBSET selects no spec"
			FOCUS_RE="\\[sig-network\\] Netpol ($f)( \\[|\$)"
			SELECTED="the \`[sig-network] Netpol\` specs of \`test/conformance/netpol-subset.txt\`"
		elif [ "$SUITE" = netpol ] && [ -n "${FOCUS:-}" ]; then
			# (FOCUS of a conformance run with NETPOL=all is the
			# conformance specs')
			FOCUS_RE="\\[sig-network\\] Netpol .*($FOCUS)"
			SELECTED="the \`[sig-network] Netpol\` \`Feature:NetworkPolicy\` specs matching \`$FOCUS\`"
		fi
		LABELS='Feature:NetworkPolicy'
		SKIPS=$REPO/test/conformance/netpol-skips.txt
		TITLE="Kubernetes NetworkPolicy (upstream Netpol suite) on podnet ($FAMILY)"
		;;
	esac
}

t0=$SECONDS
started=0
clear_leftovers
if [ ! -e "/run/netns/$CP_NS" ]; then
	"$K8S_SCRIPTS/cluster.sh" up >/dev/null
	started=1
fi
# teardown: brings down the cluster this run started (not one that was
# already up, nor with KEEP=1); fails when the machine is not as before.
teardown() {
	trap - EXIT
	if [ "$started" = 1 ] && [ "${KEEP:-0}" != 1 ]; then
		started=0
		"$K8S_SCRIPTS/cluster.sh" down
	fi
}
trap teardown EXIT
bins
read -r MODE NODES FAMILY <"$RUN/config"
t_up=$((SECONDS - t0))

out=$CLUSTER_DIR/e2e
rm -rf "$out"
mkdir -p "$out"
# first what `make cluster` promises: pods on every node reach each other,
# a ClusterIP Service and DNS, from pods and from nodes
rc=0
"$K8S_SCRIPTS/cluster.sh" check >"$out/check.txt" 2>&1 || rc=$?
cat "$out/check.txt" >&2
cat >"$out/repo-list.yaml" <<Y
promoterE2eRegistry: $E2E_REGISTRY
gcRegistry: $E2E_REGISTRY
dockerLibraryRegistry: $E2E_REGISTRY
buildImageRegistry: $E2E_REGISTRY/build-image
Y
go build -C "$REPO" -o "$out/report" ./test/conformance/report

# ginkgo_cli: the ginkgo CLI of e2e.test's Ginkgo (v2.21.0, k8s.io/kubernetes
# v1.34.10's go.mod), built once into $K8S: PROCS>1 runs e2e.test under it.
ginkgo_cli() {
	[ -x "$K8S/ginkgo" ] && return 0
	log "building the ginkgo CLI (once)"
	local w
	w=$(mktemp -d)
	(
		cd "$w"
		printf 'module podnet.local/ginkgo\n\ngo 1.24.0\n' >go.mod
		printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/onsi/ginkgo/v2/ginkgo"\n' >tools.go
		CGO_ENABLED=0 GOFLAGS=-buildvcs=false go get github.com/onsi/ginkgo/v2@v2.21.0 >&2
		CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags '-s -w' -o "$w/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
	) || { rm -rf "$w"; return 1; }
	mv "$w/ginkgo" "$K8S/ginkgo"
	rm -rf "$w"
}
[ "$PROCS" -gt 1 ] || { [ -n "$NETPOL" ] && [ "$NETPOL_PROCS" -gt 1 ]; } && ginkgo_cli

# e2e DIR GINKGO-FLAGS...: e2e.test from the control plane's netns with
# the Ginkgo flags (without their ginkgo. prefix: --focus=...), under the
# ginkgo CLI with PROCS>1.
e2e() {
	local dir=$1 a
	shift
	# --num-nodes: under the ginkgo CLI only process 1 counts the nodes;
	# without it the other processes' specs that need 2 nodes skip
	# themselves ("Requires at least 2 nodes (not -1)")
	local tflags=(--kubeconfig="$PKI/admin.kubeconfig" --kubectl-path="$K8S/kubectl" --provider=skeleton
		--num-nodes="$NODES" --report-dir="$dir" --dump-logs-on-failure=false)
	if [ "$PROCS" -gt 1 ] && [[ " $* " != *" --dry-run "* ]]; then
		# the CLI writes its reports under --output-dir (else beside the
		# binary): DIR
		local cflags=(--output-dir="$dir")
		for a in "$@"; do
			case $a in --json-report=*) cflags+=(--json-report="$(basename "${a#*=}")") ;; *) cflags+=("$a") ;; esac
		done
		KUBE_TEST_REPO_LIST=$out/repo-list.yaml nsenter --net="/run/netns/$CP_NS" "$K8S/ginkgo" \
			--procs="$PROCS" --no-color --timeout="$TIMEOUT" "${cflags[@]}" "$K8S/e2e.test" -- "${tflags[@]}"
	else
		local gflags=()
		for a in "$@"; do
			a=${a#-}
			gflags+=("--ginkgo.${a#-}")
		done
		KUBE_TEST_REPO_LIST=$out/repo-list.yaml nsenter --net="/run/netns/$CP_NS" "$K8S/e2e.test" \
			"${tflags[@]}" --ginkgo.no-color --ginkgo.timeout="$TIMEOUT" "${gflags[@]}"
	fi
}

# run_suite NAME [subset|all] REPORT: the dry run (every selected spec) and
# the run of suite NAME, logs under $out/NAME, and its report at REPORT.
run_suite() {
	local name=$1 sub=$2 report=$3 dir=$out/$1 skip t1 t_run src=0
	suite "$name" "$sub"
	mkdir -p "$dir"
	# skip regexp: the first field of every rule
	skip=$(sed -e '/^#/d' -e '/^[[:space:]]*$/d' "$SKIPS" | cut -f1 | paste -sd'|')
	local skip_args=()
	[ -n "$skip" ] && skip_args=(--skip="$skip")
	e2e "$dir" --focus="$FOCUS_RE" --label-filter="$LABELS" --dry-run --json-report="$dir/all.json" >"$dir/dry-run.log" 2>&1
	log "running the $name specs ($(grep -o 'Ran [0-9]* of' "$dir/dry-run.log" | awk '{print $2}') selected; log: $dir/e2e.log)"
	t1=$SECONDS
	e2e "$dir" --focus="$FOCUS_RE" --label-filter="$LABELS" "${skip_args[@]}" --json-report="$dir/run.json" --v >"$dir/e2e.log" 2>&1 || src=1
	t_run=$((SECONDS - t1))
	grep -E '^\s*(\[(PASSED|FAILED|SKIPPED)\]|Ran [0-9]+ of)' "$dir/e2e.log" | tail -3 >&2 || true
	local check=()
	[ "$name" = "$SUITE" ] && check=(-check "$out/check.txt")
	mkdir -p "$(dirname "$report")"
	"$out/report" -dry-run "$dir/all.json" -run "$dir/run.json" -skips "$SKIPS" "${check[@]}" \
		-title "$TITLE" -selected "$SELECTED" \
		-meta "Kubernetes=v1.34.10 (kube-apiserver, controller-manager --allocate-node-cidrs, scheduler, kubelet, kube-proxy in nftables mode, e2e.test), etcd v3.6.8, containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), CoreDNS v1.12.1" \
		-meta "podnet=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown), installed by conf/k8s/podnet.yaml (encap $MODE, portmap chained), $NODES nodes" \
		-meta "Machine=$(nproc) cores, kernel $(uname -r)" \
		-meta "$ADMIN_TIERS_META" \
		-meta "Wall time=cluster up ${t_up}s (shared), specs ${t_run}s with $PROCS Ginkgo process(es), $((SECONDS - t0))s since the start before teardown" \
		-meta "Command=scripts/k8s/conformance.sh ($(case $name/$sub in netpol/subset) echo "NETPOL=subset after the conformance specs, make test" ;; netpol/all) echo "NETPOL=all after the conformance specs" ;; netpol/) echo "make netpol" ;; *) echo "make conformance, make test" ;; esac)) with MODE=$MODE NODES=$NODES FAMILY=$FAMILY" >"$report" || src=1
	log "report: $report"
	return "$src"
}

# admin_tiers on|off: the ClusterNetworkPolicies of
# test/conformance/admin-tiers.yaml (no verdict changes, every pod under
# both tiers) created, or deleted; ADMIN_TIERS=0 leaves them out. "on"
# waits until every node's engine holds them.
ADMIN_TIERS=${ADMIN_TIERS:-1}
ADMIN_TIERS_META="Admin tiers=off (ADMIN_TIERS=0)"
admin_tiers() {
	local f=$REPO/test/conformance/admin-tiers.yaml
	if [ "$1" = off ] || [ "$ADMIN_TIERS" = 0 ]; then
		kc delete --ignore-not-found -f "$f" >/dev/null
		return 0
	fi
	kc apply -f "$f" >/dev/null || die "creating the admin-tier ClusterNetworkPolicies"
	wait_for 60 "every node's engine holds the admin-tier ClusterNetworkPolicies" admin_tiers_held ||
		die "the admin-tier ClusterNetworkPolicies did not reach every node's engine"
	ADMIN_TIERS_META="Admin tiers=on: the ClusterNetworkPolicies of test/conformance/admin-tiers.yaml (an Admin Pass and a Baseline Accept for every pod, no verdict changed) were in place: every pod's chains jump through both tiers"
	log "admin tiers on (test/conformance/admin-tiers.yaml)"
}

# admin_tiers_held: each node's podnet-routed reports 2 or more
# ClusterNetworkPolicies (its metrics on 127.0.0.1:9098 in the node).
admin_tiers_held() {
	local n v
	for n in $(seq 1 "$NODES"); do
		v=$(on_node "$n" curl -s --max-time 2 http://127.0.0.1:9098/metrics 2>/dev/null |
			awk '$1 == "podnet_policy_cluster_policies" {print int($2)}')
		[ "${v:-0}" -ge 2 ] || return 1
	done
}

# run_cnp [subset|all] REPORT: upstream's ClusterNetworkPolicy suite
# (test/cnp: a test binary of its own module, run from the control plane's
# netns against the cluster's API server), its go test -json events under
# $out/cnp, and its report at REPORT. `subset`: the tests of
# test/conformance/cnp-subset.txt (one ShortName a line).
run_cnp() {
	local sub=$1 report=$2 dir=$out/cnp t1 t_run src=0 sel="" selected="every test" run_re
	mkdir -p "$dir"
	if [ "$sub" = subset ]; then
		sel=$(sed -e '/^#/d' -e '/^[[:space:]]*$/d' "$REPO/test/conformance/cnp-subset.txt" | paste -sd'|')
		[ -n "$sel" ] || die "test/conformance/cnp-subset.txt selects no test"
		selected='the tests of `test/conformance/cnp-subset.txt`'
	elif [ "$SUITE" = cnp ] && [ -n "${FOCUS:-}" ]; then
		sel=$FOCUS
		selected="the tests matching \`$FOCUS\`"
	fi
	run_re='^TestClusterNetworkPolicy$'
	[ -n "$sel" ] && run_re="$run_re/^($sel)\$"
	go test -C "$REPO/test/cnp" -tags cnpsuite -c -o "$dir/cnp.test" . || die "building test/cnp"
	go build -C "$REPO/test/cnp" -o "$dir/report" ./report || die "building test/cnp/report"
	log "running the ClusterNetworkPolicy suite ($selected; log: $dir/run.log)"
	t1=$SECONDS
	(cd "$REPO/test/cnp" && nsenter --net="/run/netns/$CP_NS" "$dir/cnp.test" -test.v=test2json \
		-test.timeout="$TIMEOUT" -test.run="$run_re" \
		-cnp.kubeconfig="$PKI/admin.kubeconfig" -cnp.skips="$REPO/test/conformance/cnp-skips.txt" \
		-cnp.profile-report="$dir/profile-report.yaml" \
		-cnp.version="$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown)" 2>&1) |
		tee "$dir/run.log" | go tool test2json -t -p cnp >"$dir/run.json" || src=1
	t_run=$((SECONDS - t1))
	grep -aE -- '--- (PASS|FAIL|SKIP): TestClusterNetworkPolicy ' "$dir/run.log" >&2 || true
	mkdir -p "$(dirname "$report")"
	"$dir/report" -run "$dir/run.json" -skips "$REPO/test/conformance/cnp-skips.txt" -select "$sel" \
		-title "ClusterNetworkPolicy conformance (upstream suite) on podnet ($FAMILY)" -selected "$selected" \
		-meta "Kubernetes=v1.34.10 (kube-apiserver, controller-manager, scheduler, kubelet, kube-proxy in nftables mode), etcd v3.6.8, containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), CoreDNS v1.12.1; the CRD: conf/k8s/cnp-crds.yaml (network-policy-api v0.3.0, experimental channel)" \
		-meta "podnet=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown), installed by conf/k8s/podnet.yaml (encap $MODE, portmap chained), $NODES nodes" \
		-meta "Image=registry.k8s.io/e2e-test-images/agnhost:2.45, the suite's pods' image: here the image of scripts/k8s/images.sh (upstream's agnhost v1.34.10 binary) under that name; the pods without their SCTP server containers (this kernel has no SCTP)" \
		-meta "Machine=$(nproc) cores, kernel $(uname -r)" \
		-meta "Wall time=cluster up ${t_up}s (shared), suite ${t_run}s (setup of its 10 pods included), $((SECONDS - t0))s since the start before teardown" \
		-meta "Command=scripts/k8s/conformance.sh ($(case $sub in subset) echo "CNP=subset after the conformance specs, make test" ;; all) echo "CNP=all after the conformance specs" ;; *) echo "make cnp" ;; esac)) with MODE=$MODE NODES=$NODES FAMILY=$FAMILY" \
		>"$report" || src=1
	log "report: $report"
	return "$src"
}

if [ "$SUITE" = cnp ]; then
	admin_tiers off
	run_cnp "" "$REPORT" || rc=1
else
	admin_tiers on
	run_suite "$SUITE" "" "$REPORT" || rc=1
fi
[ -n "$CNP" ] && { admin_tiers off && run_cnp "$CNP" "$CNP_REPORT" || rc=1; }
[ -n "$NETPOL" ] && { admin_tiers on && PROCS=$NETPOL_PROCS run_suite netpol "$NETPOL" "$NETPOL_REPORT" || rc=1; }
t_total=$((SECONDS - t0))
teardown || rc=1
log "$SUITE run: $((SECONDS - t0))s in all (cluster down $((SECONDS - t0 - t_total))s)"
exit "$rc"
