package policynft

import (
	"context"
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
	tiers := withTiers(iso, 100, func(p policy.PodChains) bool { return p.ID == "a" || p.ID == "b" })
	arms := []struct {
		name string
		rs   *policy.Ruleset
	}{{"no-table", nil}, {"open", &open}, {"isolated", &iso}, {"tiers", &tiers}}
	iperf := func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+20)*time.Second)
		defer cancel()
		for try := 0; ; try++ {
			out, err := nettest.ExecIn(ctx, pb.ns, "iperf3", "-c", pa.v4.String(), "-p", "8080", "-t", strconv.Itoa(secs), "-J")
			if gbps, perr := nettest.IperfGbps([]byte(out)); err == nil && perr == nil && gbps > 0 {
				return gbps
			} else if err == nil {
				err = perr
			}
			if try == 20 {
				b.Fatalf("iperf3: %v\n%s", err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	got := map[string][]float64{}
	var tables []*policy.Ruleset
	for _, a := range arms {
		tables = append(tables, a.rs)
	}
	e.rotateArms(rounds, tables, func(i int) { got[arms[i].name] = append(got[arms[i].name], iperf()) })
	for _, a := range arms {
		var ratios []float64
		for i, g := range got[a.name] {
			ratios = append(ratios, g/got["no-table"][i])
		}
		b.Logf("%-9s %5.2f Gbit/s (÷no-table, median of the rounds %.3f): %s", a.name, medianOf(got[a.name]), medianOf(ratios), fmtRatios(ratios))
		b.ReportMetric(medianOf(ratios), a.name+"÷no-table")
	}
}
