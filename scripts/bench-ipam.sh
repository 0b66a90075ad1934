#!/usr/bin/env bash
# `make bench`: podnet-ipam's ADD+DEL cost against occupancy, in-process (Go
# benchmark at 0/50/99 % of a /16) and exec'd side by side with the reference
# host-local (0, 100, 1000, 10000 and 99 % pre-reserved addresses of a /16).
# Writes bench/results/ipam.md; asserts nothing (not part of `make test`).
#
# Knobs: BENCH_PAIRS (ADD+DEL pairs per plugin and occupancy, default 200),
# BENCH_PAIRS_FULL (pairs at 99 %, where one host-local verb takes most of a
# second; default 15, 0 skips that row), BENCH_GO_TIME (-benchtime of the Go
# benchmark, default 2000x), BENCH_GO_COUNT (its -count, default 2),
# BENCH_OUT (default bench/results/ipam.md).
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=${BENCH_PAIRS:-200}
pairs_full=${BENCH_PAIRS_FULL:-15}
go_time=${BENCH_GO_TIME:-2000x}
go_count=${BENCH_GO_COUNT:-2}
out=${BENCH_OUT:-bench/results/ipam.md}
# 99 % of the 65,533 addresses of a /16 that can be handed out (all but the
# network, broadcast and gateway addresses), as in the Go benchmark.
full=$((65533 * 99 / 100))

started=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "bench: building bin/podnet-ipam and the exec harness" >&2
make --no-print-directory bin/podnet-ipam >&2
host_local="$(scripts/install-cni-tools.sh)/host-local"
CGO_ENABLED=0 go build -o "$tmp/ipamexec" ./test/bench/ipamexec

load_before=$(cut -d' ' -f1-3 /proc/loadavg)

echo "bench: exec'ing podnet-ipam and host-local, $pairs ADD+DEL pairs at 0, 100, 1000, 10000 reserved" >&2
"$tmp/ipamexec" -plugin bin/podnet-ipam -plugin "$host_local" \
	-prefill 0,100,1000,10000 -n "$pairs" -warmup 10 -out "$tmp/exec.md"
if [ "$pairs_full" -gt 0 ]; then
	echo "bench: exec'ing both at 99 % ($full reserved), $pairs_full pairs" >&2
	"$tmp/ipamexec" -plugin bin/podnet-ipam -plugin "$host_local" \
		-prefill "$full" -n "$pairs_full" -warmup 1 -out "$tmp/exec-full.md"
fi

echo "bench: go test -bench AddDel -benchtime=$go_time -count=$go_count ./ipam/" >&2
go test -run XXX -bench AddDel -benchtime="$go_time" -count="$go_count" ./ipam/ >"$tmp/gobench.txt" 2>&1 || {
	cat "$tmp/gobench.txt" >&2
	exit 1
}

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then rev="$rev (with uncommitted changes)"; fi

mkdir -p "$(dirname "$out")"
{
	echo "# podnet-ipam benchmark"
	echo
	echo "Written by \`make bench\` (scripts/bench-ipam.sh); numbers are not asserted anywhere."
	echo
	echo "| | |"
	echo "|---|---|"
	echo "| date | $(date -u '+%Y-%m-%d %H:%M:%S UTC') |"
	echo "| commit | $rev |"
	echo "| CPU | ${cpu:-unknown}, nproc $(nproc) |"
	echo "| kernel | $(uname -sr) |"
	echo "| go | $(go version | cut -d' ' -f3-) |"
	echo "| host-local | containernetworking/plugins v1.9.1 ($host_local) |"
	echo "| load average | $load_before before, $load_after after |"
	echo "| total run time | $(($(date +%s) - started)) s |"
	echo
	echo "## Exec'd binaries, side by side with host-local"
	echo
	echo "Each ADD and each DEL is one fork+exec of the plugin binary with the network"
	echo "config on stdin and the CNI_* environment, timed from start to exit, as a"
	echo "runtime (or a main plugin delegating to its IPAM) runs it. The subnet is a /16;"
	echo "the pre-reserved addresses are scattered at random (the same ones for both"
	echo "plugins). The plugins take turns in chunks of 25 pairs, after 10 unmeasured"
	echo "warm-up pairs each (1 at 99 %). Latencies are in milliseconds of"
	echo "wall time, so they include the process start (the bulk of the time when the"
	echo "store is small) and whatever else the machine was doing (see the load above)."
	echo
	cat "$tmp/exec.md"
	if [ -f "$tmp/exec-full.md" ]; then
		echo
		echo "### 99 % of the /16 ($full reserved; fewer pairs, as each host-local verb reads every reservation file)"
		echo
		cat "$tmp/exec-full.md"
	fi
	echo
	echo "## In-process Go benchmark"
	echo
	echo "\`go test -run XXX -bench AddDel -benchtime=$go_time -count=$go_count ./ipam/\`: one ipam.Add of a"
	echo "new container ID plus its ipam.Del per op, on a /16 pre-filled to 0, 50 and 99 %"
	echo "with randomly scattered reservations (the \`prefilled\` column)."
	echo
	echo '```'
	cat "$tmp/gobench.txt"
	echo '```'
} >"$out"
echo "bench: wrote $out ($(($(date +%s) - started)) s)" >&2
