//go:build bench

package reconcilebench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestReconcileCost is the bench (`make bench`, scripts/bench.sh's
// reconcile stage): one pass over $PODNET_BENCH_RECONCILE_N (250)
// reservations, $PODNET_BENCH_RECONCILE_REPS (5) repetitions, three passes
// while alive and one that frees them, written to
// $PODNET_BENCH_OUT/reconcile.json for bench/report. It asserts only that
// the passes did their work (alive kept, dead freed); the times are for
// the report.
func TestReconcileCost(t *testing.T) {
	out := os.Getenv("PODNET_BENCH_OUT")
	if out == "" {
		t.Fatal("a benchmark, run by `make bench` (scripts/bench.sh): set PODNET_BENCH_OUT to a directory to run it")
	}
	n, reps := envInt("PODNET_BENCH_RECONCILE_N", 250), envInt("PODNET_BENCH_RECONCILE_REPS", 5)
	res := measure(t, n, reps, 3, 0, time.Second)
	for _, s := range res.Live {
		if s.Err != "" || s.Reclaimed != 0 || s.RecordsAfter != n {
			t.Errorf("live pass: %+v, want nothing reclaimed, %d records left", s, n)
		}
		t.Logf("live rep %d: pass %.2f ms, %d holds, max hold %.3f ms, contender max wait %.3f ms", s.Rep, s.PassMs, s.Holds, s.MaxLockHoldMs, s.ContenderMaxWaitMs)
	}
	for _, s := range res.Dead {
		if s.Err != "" || s.Reclaimed != n || s.RecordsAfter != 0 || s.ReservedAfter != 0 {
			t.Errorf("dead pass: %+v, want %d reclaimed, nothing left", s, n)
		}
		t.Logf("dead rep %d: pass %.2f ms, %d holds, max hold %.3f ms, contender max wait %.3f ms", s.Rep, s.PassMs, s.Holds, s.MaxLockHoldMs, s.ContenderMaxWaitMs)
	}
	data, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(out, "reconcile.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
