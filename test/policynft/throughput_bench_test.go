package policynft

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/test/nettest"
)

// BenchmarkThroughputArms: one iperf3 TCP stream b -> a (pods of one node
// netns, forwarded by it) under each arm in turn, the arms' order
// rotating every round, so that the machine's drift falls on every arm
// alike; the table is swapped in one transaction between runs (no API
// server, no engine), which the policy stage of `make bench` cannot do.
// It asks whether the policies cost an established stream anything: the
// base chains accept established traffic first, so every arm should move
// the same bytes. PODNET_BENCH_ROUNDS (12) and PODNET_BENCH_SECONDS (2)
// size it.
//
//	no-table   no table inet podnet-policy at all
//	open       the table, a and b not isolated
//	isolated   1,000 other policies, a isolated, b -> a allowed
//	tiers      and 100 ClusterNetworkPolicies (Admin and Baseline)
//	           selecting a and b, whose Pass hands b -> a down
func BenchmarkThroughputArms(b *testing.B) {
	rounds := envInt("PODNET_BENCH_ROUNDS", 12)
	secs := envInt("PODNET_BENCH_SECONDS", 2)
	e := newEnv(b, "a", "b")
	pa, pb := e.pods["a"], e.pods["b"]
	nettest.StartProcT(b, pa.ns, filepath.Join(b.TempDir(), "iperf3.log"), "iperf3", "-s", "-B", pa.v4.String(), "-p", "8080")
	iso := connRuleset(e, 1000, false)
	open := iso
	open.Pods = slices.DeleteFunc(slices.Clone(iso.Pods), func(p policy.PodChains) bool { return p.ID == "a" })
	tiers := iso
	tiers.Pods = slices.Clone(iso.Pods)
	tiers.Policies = slices.Clone(iso.Policies)
	for i := range 100 {
		tier := policy.TierAdmin
		if i%2 == 1 {
			tier = policy.TierBaseline
		}
		for d, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			tiers.Policies = append(tiers.Policies, tierPolicy(i, tier, dir, 0))
			for j := range tiers.Pods {
				p := &tiers.Pods[j]
				if p.ID != "a" && p.ID != "b" {
					continue
				}
				id := fmt.Sprintf("c%d-%s", i, dir)
				if tier == policy.TierAdmin {
					p.Admin[d] = append(slices.Clone(p.Admin[d]), id)
				} else {
					p.Baseline[d] = append(slices.Clone(p.Baseline[d]), id)
				}
			}
		}
	}
	arms := []struct {
		name string
		rs   *policy.Ruleset
	}{{"no-table", nil}, {"open", &open}, {"isolated", &iso}, {"tiers", &tiers}}
	iperf := func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+20)*time.Second)
		defer cancel()
		for try := 0; ; try++ {
			out, err := nettest.ExecIn(ctx, pb.ns, "iperf3", "-c", pa.v4.String(), "-p", "8080", "-t", strconv.Itoa(secs), "-J")
			var j struct {
				End struct {
					Received struct {
						BPS float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
			}
			if err == nil && json.Unmarshal([]byte(out), &j) == nil && j.End.Received.BPS > 0 {
				return j.End.Received.BPS / 1e9
			}
			if try == 20 {
				b.Fatalf("iperf3: %v\n%s", err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	got := map[string][]float64{}
	for r := range rounds {
		for k := range arms {
			a := arms[(k+r)%len(arms)]
			if a.rs == nil {
				nettest.Do(b, e.node, e.w.Delete)
			} else {
				nettest.Do(b, e.node, func() error { return e.w.ApplyFull(e.withPorts(*a.rs)) })
			}
			got[a.name] = append(got[a.name], iperf())
		}
	}
	median := func(xs []float64) float64 {
		s := slices.Sorted(slices.Values(xs))
		if len(s)%2 == 1 {
			return s[len(s)/2]
		}
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	for _, a := range arms {
		var ratios []float64
		for i, g := range got[a.name] {
			ratios = append(ratios, g/got["no-table"][i])
		}
		b.Logf("%-9s %5.2f Gbit/s (÷no-table, median of the rounds %.3f): %s", a.name, median(got[a.name]), median(ratios), fmtRatios(ratios))
		b.ReportMetric(median(ratios), a.name+"÷no-table")
	}
}
