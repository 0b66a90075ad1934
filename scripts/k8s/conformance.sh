#!/usr/bin/env bash
# Runs upstream's Kubernetes e2e conformance specs of the pod network
# (every "[sig-network] ... [Conformance]" spec of e2e.test v1.34.10,
# minus the skips in test/conformance/skips.txt, each with its reason)
# against the cluster of scripts/k8s/cluster.sh, and writes the report.
#
#   scripts/k8s/conformance.sh        MODE=vxlan|none NODES=2|3 FAMILY=ipv4|dual|ipv6
#       brings a cluster up (unless one is up), runs the specs, brings the
#       cluster down (unless it was already up, or KEEP=1), and writes
#       test/conformance/REPORT.md (FAMILY=ipv4), REPORT-dual.md or
#       REPORT-ipv6.md (REPORT=path to write elsewhere). FAMILY=dual adds
#       upstream's [Feature:IPv6DualStack] specs.
#   FOCUS=regexp  runs the sig-network specs matching it instead (any
#       spec, Conformance or not).
#
# The e2e images are built here (images.sh) and mapped through the e2e
# framework's image repository config (KUBE_TEST_REPO_LIST): the specs ask
# for $E2E_REGISTRY/agnhost:2.56 and so on, which every node has imported.
# Exit status: non-zero when a spec failed or the cluster did not come up.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export MODE=${MODE:-vxlan} NODES=${NODES:-2} FAMILY
# the report of each family: REPORT.md (ipv4), REPORT-dual.md, REPORT-ipv6.md
suffix=""
[ "$FAMILY" = ipv4 ] || suffix=-$FAMILY
REPORT=${REPORT:-$REPO/test/conformance/REPORT$suffix.md}
# every sig-network [Conformance] spec; on a dual-stack cluster also every
# [Feature:IPv6DualStack] spec but those that need SCTP in the kernel
# (Feature:SCTPConnectivity: a feature of its own, which this machine's
# kernel lacks) or a cloud load balancer (none here has one)
SELECT='\[sig-network\].*\[Conformance\]'
SELECTED='every `[sig-network]` `[Conformance]` spec of the suite'
if [ "$FAMILY" = dual ]; then
	SELECT='\[sig-network\].*(\[Conformance\]|\[Feature:IPv6DualStack\])'
	SELECTED='every `[sig-network]` `[Conformance]` spec and every `[Feature:IPv6DualStack]` spec that needs neither SCTP nor a cloud load balancer'
fi
SKIPS=$REPO/test/conformance/skips.txt

t0=$SECONDS
started=0
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
# skip regexp: the first field of every rule
skip=$(sed -e '/^#/d' -e '/^[[:space:]]*$/d' "$SKIPS" | cut -f1 | paste -sd'|')
skip_args=()
[ -n "$skip" ] && skip_args=(--ginkgo.skip="$skip")

e2e() {
	KUBE_TEST_REPO_LIST=$out/repo-list.yaml nsenter --net="/run/netns/$CP_NS" "$K8S/e2e.test" \
		--kubeconfig="$PKI/admin.kubeconfig" --kubectl-path="$K8S/kubectl" --provider=skeleton --report-dir="$out" \
		--dump-logs-on-failure=false --ginkgo.no-color --ginkgo.timeout=60m "$@"
}
# every selected spec, then the run
focus=$SELECT
[ -n "${FOCUS:-}" ] && focus="\\[sig-network\\].*($FOCUS)"
e2e --ginkgo.focus="$focus" --ginkgo.label-filter='!Feature:SCTPConnectivity' --ginkgo.dry-run \
	--ginkgo.json-report="$out/all.json" >"$out/dry-run.log" 2>&1
log "running the specs (log: $out/e2e.log)"
t1=$SECONDS
e2e --ginkgo.focus="$focus" --ginkgo.label-filter='!Feature:SCTPConnectivity' "${skip_args[@]}" --ginkgo.json-report="$out/run.json" --ginkgo.v >"$out/e2e.log" 2>&1 || rc=1
t_run=$((SECONDS - t1))
grep -E '^\s*(\[(PASSED|FAILED|SKIPPED)\]|Ran [0-9]+ of)' "$out/e2e.log" | tail -3 >&2 || true

go build -C "$REPO" -o "$out/report" ./test/conformance/report
mkdir -p "$(dirname "$REPORT")"
"$out/report" -dry-run "$out/all.json" -run "$out/run.json" -skips "$SKIPS" -check "$out/check.txt" \
	-title "Kubernetes sig-network conformance on podnet ($FAMILY)" \
	-selected "$SELECTED" \
	-meta "Kubernetes=v1.34.10 (kube-apiserver, controller-manager --allocate-node-cidrs, scheduler, kubelet, kube-proxy in nftables mode, e2e.test), etcd v3.6.8, containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), CoreDNS v1.12.1" \
	-meta "podnet=$(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown), installed by conf/k8s/podnet.yaml (encap $MODE, portmap chained), $NODES nodes" \
	-meta "Machine=$(nproc) cores, kernel $(uname -r)" \
	-meta "Wall time=cluster up ${t_up}s, specs ${t_run}s, total $((SECONDS - t0))s before teardown" \
	-meta "Command=scripts/k8s/conformance.sh (make conformance, make test) with MODE=$MODE NODES=$NODES FAMILY=$FAMILY" >"$REPORT"
log "report: $REPORT"
t_total=$((SECONDS - t0))
teardown || rc=1
log "conformance run: $((SECONDS - t0))s in all (cluster down $((SECONDS - t0 - t_total))s)"
exit "$rc"
