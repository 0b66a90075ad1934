#!/usr/bin/env bash
# bench-cni-ab.sh REV [ROUNDS]: the cni stage's plugin comparison
# (test/bench/cnibench: podnet+podnet-ipam and ptp+host-local through
# libcni, sequential and 8 concurrent) with the binaries of commit REV and
# of the working tree, side by side on this machine, taking turns (REV,
# HEAD, HEAD, REV, ...; ROUNDS runs of each, 3 by default), each run
# PODNET_BENCH_CNI_AB_PODS pods (200) of each stack and mode.
#
# Absolute times on this shared machine move by half from one hour to the
# next, and kernel work (netlink, netns) and process start do not move
# together: a ratio filed with an issue is compared with today's code by
# running the code of that day beside it, not by its number.
#
# Writes bench/results/cni-ab.md (bench/report puts it in REPORT.md's CNI
# section) and prints it. Needs root, as `make bench`.
set -euo pipefail
rev=${1:?usage: bench-cni-ab.sh REV [ROUNDS]}
rounds=${2:-3}
# shellcheck source=scripts/ab-lib.sh
. "$(dirname "$0")/ab-lib.sh"
ab_setup "$rev"
pods=${PODNET_BENCH_CNI_AB_PODS:-200}
# one harness for both: the working tree's
go build -o "$work/cnibench" ./test/bench/cnibench
mkdir -p "$work/noop"
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$work/noop/noop" ./test/bench/noop
tools=$(scripts/install-cni-tools.sh)

# run WHICH N: run N, with WHICH's binaries (old|new); appends
# "WHICH N MODE STACK ADD_P50 CPU_PER_ADD" lines to $work/samples
run() {
	local which=$1 n=$2 bin=$repo/bin log=$work/$1-$2.log
	[ "$which" = old ] && bin=$work/old/bin
	"$work/cnibench" -bin "$bin" -ref "$tools" -noop "$work/noop/noop" -pods "$pods" -reps 1 \
		-occupancy 0 -floor-n 1 -stacks "podnet+podnet-ipam,ptp+host-local" -out "$work/out-$which.json" >"$log" 2>&1 ||
		{
			tail -30 "$log" >&2
			echo "bench-cni-ab: the $which run failed (log above)" >&2
			exit 1
		}
	sed -nE 's/^cnibench: rep [0-9]+ (sequential|concurrent) +([^ ]+) +ADD p50 +([0-9.]+) ms.*cpu\/ADD +([0-9.]+) ms.*/\1 \2 \3 \4/p' "$log" |
		sed "s/^/$which $n /" >>"$work/samples"
}

: >"$work/samples"
for i in $(seq "$rounds"); do
	if [ $((i % 2)) = 1 ]; then order="old new"; else order="new old"; fi
	for w in $order; do
		echo "round $i: $w" >&2
		run "$w" "$i"
	done
done

out=$repo/bench/results/cni-ab.md
{
	echo "**CNI ADD, $old beside $head** (scripts/bench-cni-ab.sh $old $rounds, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg) after): test/bench/cnibench with each commit's binaries, $pods pods of each stack and mode a run, $rounds runs of each commit taking turns; the median of the runs' ADD p50 and CPU per ADD (ms), and podnet's ÷ the reference's of the same runs."
	echo
	echo "| mode | $old podnet ADD p50 / CPU | $old ptp+host-local | $old ÷ | $head podnet ADD p50 / CPU | $head ptp+host-local | $head ÷ |"
	echo "|---|---|---|---:|---|---|---:|"
	awk '
		function median(s,   n, a, i, j, t) {
			n = split(s, a, " ")
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{ s = ($4 ~ /^podnet/) ? "p" : "r"; add[$1, $3, s] = add[$1, $3, s] " " $5; cpu[$1, $3, s] = cpu[$1, $3, s] " " $6
		  one[$1, $2, $3, s] = $5; runs[$1, $2, $3] = 1 }
		END {
			# the ratio of each run: podnet over the reference of that same run
			for (k in runs) { split(k, f, SUBSEP); if ((f[1], f[2], f[3], "r") in one) ratio[f[1], f[3]] = ratio[f[1], f[3]] " " one[f[1], f[2], f[3], "p"] / one[f[1], f[2], f[3], "r"] }
			split("sequential concurrent", modes, " ")
			for (m = 1; m <= 2; m++) {
				mode = modes[m]; line = "| " mode
				for (w = 1; w <= 2; w++) {
					which = (w == 1) ? "old" : "new"
					line = line sprintf(" | %.2f / %.2f | %.2f / %.2f | %.2f×", median(add[which, mode, "p"]), median(cpu[which, mode, "p"]),
						median(add[which, mode, "r"]), median(cpu[which, mode, "r"]), median(ratio[which, mode]))
				}
				print line " |"
			}
		}' "$work/samples"
} >"$out"
cat "$out"
