#!/usr/bin/env bash
# bench-attach-ab.sh REV [ROUNDS]: the policy stage's attach step (CNI ADD
# of a new pod on node 1 with the engine on: podnet through libcni, its
# last step waiting on the engine) of commit REV and of the working tree,
# side by side on this machine, taking turns (REV, HEAD, HEAD, REV, ...;
# ROUNDS runs of each, 2 by default). Each run is test/bench/policybench
# of its own commit with its own binaries, reduced to the attach steps:
# PODNET_BENCH_POLICY_ATTACHES pods (30) at 0 policies and at each count
# of PODNET_BENCH_POLICY_COUNTS (100,1000), nothing else measured.
#
# Absolute times on a shared machine move by half from one hour to the
# next; a figure filed with an issue is compared with today's code by
# running the code of that day beside it, not by its number.
#
# Writes bench/results/attach-ab.md (bench/report puts it in REPORT.md's
# NetworkPolicy section) and prints it. Needs root, as `make bench`.
set -euo pipefail
rev=${1:?usage: bench-attach-ab.sh REV [ROUNDS]}
rounds=${2:-2}
# shellcheck source=scripts/ab-lib.sh
. "$(dirname "$0")/ab-lib.sh"
ab_setup "$rev"
counts=${PODNET_BENCH_POLICY_COUNTS:-100,1000}
attaches=${PODNET_BENCH_POLICY_ATTACHES:-30}
(cd "$work/old" && go test -tags bench -c -o "$work/old.test" ./test/bench/policybench)
(cd "$repo" && go test -tags bench -c -o "$work/new.test" ./test/bench/policybench)

export PODNET_KAPI_DIR PODNET_CNI_TOOLS
PODNET_KAPI_DIR=$(scripts/ensure-kapi.sh)
PODNET_CNI_TOOLS=$(scripts/install-cni-tools.sh)
export PODNET_BENCH_POLICY_COUNTS=$counts PODNET_BENCH_POLICY_ATTACHES=$attaches
export PODNET_BENCH_POLICY_ROUNDS=1 PODNET_BENCH_POLICY_REVOKES=1 PODNET_BENCH_POLICY_REPS=1
export PODNET_BENCH_POLICY_CNPS=0 PODNET_BENCH_POLICY_ADD_PODS=0 PODNET_BENCH_POLICY_BURST=0
export PODNET_BENCH_POLICY_CONNS=100 PODNET_BENCH_POLICY_IPERF_SECONDS=1

# run WHICH: one run of WHICH (old|new); appends "WHICH POLICIES P50 P99"
# lines to $work/samples
run() {
	local which=$1 dir=$repo log=$work/$1-$RANDOM.log
	[ "$which" = old ] && dir=$work/old
	(export PODNET_BENCH_OUT=$work/out-$which && mkdir -p "$PODNET_BENCH_OUT" && cd "$dir/test/bench/policybench" &&
		"$work/$which.test" -test.run '^TestPolicyBench$' -test.v -test.count=1 -test.timeout=30m) >"$log" 2>&1 ||
		{
			tail -30 "$log" >&2
			echo "bench-attach-ab: the $which run failed (log above)" >&2
			exit 1
		}
	sed -nE 's/.*attach, (no policy|([0-9]+) policies): CNI ADD p50 ([0-9.]+) ms p99 ([0-9.]+) ms.*/\1 \3 \4/p' "$log" |
		sed -E 's/^no policy/0/; s/^([0-9]+) policies/\1/' | sed "s/^/$which /" >>"$work/samples"
}

: >"$work/samples"
for i in $(seq "$rounds"); do
	if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
	for w in $order; do
		echo "round $i: $w" >&2
		run "$w"
	done
done

out=$repo/bench/results/attach-ab.md
{
	echo "**Attach, $old beside $head** (scripts/bench-attach-ab.sh $old $rounds, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg) after): the attach step above, $attaches pods per run at each count, each commit's own policybench and binaries, $rounds runs of each taking turns; the median of the runs' p50 and p99 (ms)."
	echo
	echo "| policies | $old p50 / p99 | $head p50 / p99 | p50 ÷ |"
	echo "|---:|---|---|---:|"
	awk -v old="$old" '
		function median(s,   n, a, i, j, t) {
			n = split(s, a, " ")
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{ p50[$1, $2] = p50[$1, $2] " " $3; p99[$1, $2] = p99[$1, $2] " " $4; pols[$2] = 1 }
		END {
			n = 0
			for (p in pols) list[++n] = p + 0
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (list[j] < list[i]) { t = list[i]; list[i] = list[j]; list[j] = t }
			for (i = 1; i <= n; i++) {
				p = list[i]
				o = median(p50["old", p]); w = median(p50["new", p])
				printf "| %d | %.1f / %.1f | %.1f / %.1f | %.2f× |\n", p, o, median(p99["old", p]), w, median(p99["new", p]), w / o
			}
		}' "$work/samples"
} >"$out"
cat "$out"
