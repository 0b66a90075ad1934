package reconcilebench

// One reconcile pass over n reservations that podnet-ipam's own ADD made,
// in a throwaway node netns, each pod in a netns of its own: first while
// every pod's netns is there (judged alive, nothing freed), then once they
// are all removed (judged dead and freed, under the store's lock in
// bounded holds). A contender takes the store's lock over and over during
// each pass, as queued ADDs and DELs would, and records how long it
// waited. Root is needed for the network namespaces (`make test` runs as
// root). TestReconcilePass is the smoke run in `make test`; the bench
// (bench_test.go, build tag bench) runs the same at 250 reservations.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/podnet/podnet/internal/testns"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/routed/reconcile"
	"github.com/podnet/podnet/test/nettest"
)

const network = "bench"

// passSample is one pass.
type passSample struct {
	Rep           int     `json:"rep"`
	PassMs        float64 `json:"pass_ms"`
	MaxLockHoldMs float64 `json:"max_lock_hold_ms"` // Result.MaxLockHold; 0: the lock was not taken
	Holds         int     `json:"holds"`            // times the pass took the store's lock
	HoldSumMs     float64 `json:"hold_sum_ms"`
	Reclaimed     int     `json:"reclaimed"`
	RecordsAfter  int     `json:"records_after"` // owner index entries left
	ReservedAfter int     `json:"reserved_after"`
	// The contender's takes of the lock during the pass and their waits.
	ContenderTakes     int     `json:"contender_takes"`
	ContenderMaxWaitMs float64 `json:"contender_max_wait_ms"`
	ContenderP50WaitMs float64 `json:"contender_p50_wait_ms"`
	Err                string  `json:"error,omitempty"`
}

// costResult is reconcile.json.
type costResult struct {
	Reservations int          `json:"reservations"`
	Reps         int          `json:"reps"`
	SettleS      float64      `json:"settle_s"`
	LockBudgetMs float64      `json:"lock_budget_ms"`
	GraceS       float64      `json:"grace_s"`
	DataFS       string       `json:"data_fs"`
	Note         string       `json:"note"`
	FillMs       []float64    `json:"fill_ms"` // the n ADDs of each rep
	Live         []passSample `json:"live"`
	Dead         []passSample `json:"dead"`
	Seconds      float64      `json:"seconds"`
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root for network namespaces (run with `make test` as root)")
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// measure runs reps repetitions of: n pods ADDed, livePasses passes while
// their netns exist, the netns removed, one pass that frees them. budget
// is the loop's LockBudget (0: the default); settle is how long to wait
// after removing the netns, for the kernel's background teardown of them
// (which otherwise competes with the pass for the CPU; the pods of a real
// leak died long before the pass).
func measure(t testing.TB, n, reps, livePasses int, budget, settle time.Duration) costResult {
	needRoot(t)
	start := time.Now()
	root, fsName := nettest.RunDir(t, "reconcilebench-")
	res := costResult{Reservations: n, Reps: reps, SettleS: settle.Seconds(), DataFS: fsName, GraceS: (2 * time.Minute).Seconds(),
		Note: "records made by podnet-ipam's ADD (ipam.Add in-process, CNI_NETNS and K8S_POD_* set), then aged past the grace; no host veths (a pod's veth pair goes with its netns); no runtime asked (judged by netns)"}
	node := nettest.NewNode(t).NS
	for rep := 1; rep <= reps; rep++ {
		dataDir := filepath.Join(root, fmt.Sprintf("rep%d", rep))
		conf := Conf(network, "10.230.0.0/16", dataDir, filepath.Join(root, "state"))
		pods := make([]ns.NetNS, n)
		for i := range pods {
			p := testns.New(t)
			pods[i] = p
		}
		t0 := time.Now()
		var owners []allocator.Owner
		nettest.Do(t, node, func() error {
			o, err := Fill(conf, "pod", n, func(i int) string { return pods[i].Path() })
			owners = o
			return err
		})
		res.FillMs = append(res.FillMs, ms(time.Since(t0)))
		if err := Age(dataDir, network, owners, time.Hour); err != nil {
			t.Fatal(err)
		}
		cfg := reconcile.Config{DataDirs: []string{dataDir}, Grace: 2 * time.Minute, LockBudget: budget}
		loop, err := NewLoop(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.LockBudgetMs == 0 {
			res.LockBudgetMs = ms(budget)
			if budget == 0 {
				res.LockBudgetMs = ms(reconcile.DefaultLockBudget)
			}
		}
		for range livePasses {
			res.Live = append(res.Live, onePass(t, rep, node, loop, dataDir))
		}
		for _, p := range pods {
			_ = p.Close()
			if err := testutils.UnmountNS(p); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(settle)
		res.Dead = append(res.Dead, onePass(t, rep, node, loop, dataDir))
	}
	res.Seconds = time.Since(start).Seconds()
	return res
}

// onePass runs one pass of loop in node with a contender on the lock.
func onePass(t testing.TB, rep int, node ns.NetNS, loop *Loop, dataDir string) passSample {
	s := passSample{Rep: rep}
	holds0, sum0 := loop.Holds()
	c := StartContender(dataDir, network, 200*time.Microsecond)
	var r reconcile.Result
	var passErr error
	nettest.Do(t, node, func() error {
		start := time.Now()
		r, passErr = loop.Pass(t.Context())
		s.PassMs = ms(time.Since(start))
		return nil
	})
	waits, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if passErr != nil {
		s.Err = passErr.Error()
	}
	holds, sum := loop.Holds()
	s.Holds, s.HoldSumMs, s.MaxLockHoldMs = holds-holds0, ms(sum-sum0), ms(r.MaxLockHold)
	for _, k := range r.Reclaimed {
		s.Reclaimed += k
	}
	s.RecordsAfter, s.ReservedAfter, err = Count(dataDir, network)
	if err != nil {
		t.Fatal(err)
	}
	s.ContenderTakes = len(waits)
	if len(waits) > 0 {
		slices.Sort(waits)
		s.ContenderMaxWaitMs, s.ContenderP50WaitMs = ms(waits[len(waits)-1]), ms(waits[(len(waits)-1)/2])
	}
	return s
}

// TestReconcilePass is the smoke run of the bench: 20 reservations. Alive,
// the pass frees none; dead, it frees every one and leaves the store
// empty, in holds of the lock the budget bounds: with a budget of 1 ns
// each hold frees one attachment.
func TestReconcilePass(t *testing.T) {
	const n = 20
	for _, tc := range []struct {
		name      string
		budget    time.Duration
		wantHolds func(int) bool
		want      string
	}{
		{"default budget", 0, func(h int) bool { return h >= 1 && h <= n }, "between 1 and 20"},
		{"1ns budget", time.Nanosecond, func(h int) bool { return h == n }, "20, one per attachment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := measure(t, n, 1, 1, tc.budget, 0)
			for _, s := range res.Live {
				if s.Err != "" || s.Reclaimed != 0 || s.RecordsAfter != n || s.ReservedAfter != n {
					t.Errorf("live pass: %+v, want nothing reclaimed, %d records and reservations left, no error", s, n)
				}
			}
			for _, s := range res.Dead {
				if s.Err != "" || s.Reclaimed != n || s.RecordsAfter != 0 || s.ReservedAfter != 0 {
					t.Errorf("dead pass: %+v, want %d reclaimed, nothing left, no error", s, n)
				}
				if !tc.wantHolds(s.Holds) || s.MaxLockHoldMs <= 0 {
					t.Errorf("dead pass took the lock %d times (max hold %.3f ms), want %s", s.Holds, s.MaxLockHoldMs, tc.want)
				}
			}
			t.Logf("live: %+v", res.Live)
			t.Logf("dead: %+v", res.Dead)
		})
	}
}
