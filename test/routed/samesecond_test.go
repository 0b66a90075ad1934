package routed

// Same-second Node conflicts (issue 31, "Must show" 3), against a real
// kube-apiserver: a creationTimestamp has a 1 s resolution, so two Nodes
// created in the same second tie on age. A hostile Node created in the
// same second as a node's own Node, with a PodCIDR inside the node's, is
// refused by that node every time (20 rounds, each with the own Node
// created again and the timestamps checked equal), while the other nodes
// decide the tie by name; two remote Nodes tied on age are decided by
// name, alike on every node.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trySameSecond creates the Nodes in order (each with its
// status.addresses) and tells whether their creationTimestamps are equal;
// when a second boundary fell in between, it deletes them again (the
// caller tries again with new names: a refusal is reported per object).
func (c *cluster) trySameSecond(specs ...nodeSpec) (time.Time, bool) {
	c.t.Helper()
	ctx := context.Background()
	// start early in a second: the creations fit in it
	if ms := time.Now().Nanosecond() / 1e6; ms > 600 {
		time.Sleep(time.Duration(1000-ms+20) * time.Millisecond)
	}
	var stamps []time.Time
	for _, s := range specs {
		c.createNodeSpec(s)
		n, err := c.client.CoreV1().Nodes().Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		stamps = append(stamps, n.CreationTimestamp.Time)
	}
	if slices.IndexFunc(stamps, func(ts time.Time) bool { return !ts.Equal(stamps[0]) }) < 0 {
		return stamps[0], true
	}
	c.t.Logf("creationTimestamps %v differ: again", stamps)
	for i := len(specs) - 1; i >= 0; i-- {
		c.deleteNode(specs[i].name)
	}
	return time.Time{}, false
}

// sameSecond calls trySameSecond with specs(try) until the Nodes share a
// creationTimestamp, and returns it, the Nodes and the tries it took.
func (c *cluster) sameSecond(specs func(try int) []nodeSpec) (time.Time, []nodeSpec, int) {
	c.t.Helper()
	for try := 1; try <= 20; try++ {
		s := specs(try)
		if stamp, ok := c.trySameSecond(s...); ok {
			return stamp, s, try
		}
	}
	c.t.Fatal("no Nodes created in one second in 20 tries")
	return time.Time{}, nil, 0
}

// routedView is what one observer must show: its podnet routes exactly,
// and podnet_nodes_refused by reason.
func routedView(d *daemon, routes []string, gauge map[string]float64) []string {
	var bad []string
	if err := d.alive(); err != nil {
		return []string{err.Error()}
	}
	got, err := d.n.podnetRoutes()
	if err != nil {
		bad = append(bad, err.Error())
	} else if want := sorted(routes...); !slices.Equal(got, want) {
		bad = append(bad, fmt.Sprintf("%s routes: %s", d.n.name, routeDiff(got, want)))
	}
	g, err := d.refusedGauge()
	if err != nil {
		return append(bad, err.Error())
	}
	for _, r := range refuseReasons {
		if g[r] != gauge[r] {
			bad = append(bad, fmt.Sprintf("%s podnet_nodes_refused: got %s, want %s", d.n.name, gaugeString(g), gaugeString(gauge)))
			break
		}
	}
	return bad
}

// refusedOnce says what is wrong with observer obs's report of Node name's
// refusal: want exactly one "node refused" log record with reason and a
// detail holding every one of says, and one NodeRefused Event from obs.
func refusedOnce(c *cluster, d *daemon, obs, name, reason string, says ...string) []string {
	var bad []string
	logs := d.refusalLogs("node refused", name)
	if len(logs) != 1 {
		return []string{fmt.Sprintf("%s: %d \"node refused\" records about %s, want 1: %v", obs, len(logs), name, logs)}
	}
	detail, _ := logs[0]["detail"].(string)
	if logs[0]["reason"] != reason {
		bad = append(bad, fmt.Sprintf("%s refuses %s for %v, want %s (%q)", obs, name, logs[0]["reason"], reason, detail))
	}
	for _, s := range says {
		if !strings.Contains(detail, s) {
			bad = append(bad, fmt.Sprintf("%s: the refusal of %s does not say %q: %q", obs, name, s, detail))
		}
	}
	evs, err := c.nodeEvents("NodeRefused")
	if err != nil {
		return append(bad, err.Error())
	}
	if p := checkEvent(evs[name], name, obs, "NodeRefused", corev1.EventTypeWarning); p != "" {
		bad = append(bad, p)
	}
	return bad
}

// TestSameSecondConflicts: 20 rounds of node-a's own Node created again
// and, in the same second (checked), a hostile Node whose name sorts
// before it with a PodCIDR inside node-a's: node-a keeps its blackhole,
// routes nothing to the hostile Node, stays ready with its PodCIDR in
// node.json, and refuses the hostile Node (log, Event, gauge), every
// round; node-b and node-c decide the tie by name, alike. Then 5 pairs of
// remote Nodes with one PodCIDR, created in the same second with the
// name sorting last created first: every node routes the PodCIDR to the
// one whose name sorts first and refuses the other, naming it.
func TestSameSecondConflicts(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	observers := []string{"node-a", "node-b", "node-c"}
	nodes := map[string]*node{}
	ds := map[string]*daemon{}
	for i, name := range observers {
		ip := fmt.Sprintf("172.30.0.%d", i+1)
		nodes[name] = c.addNode(name, ip)
		c.createNode(name, ip, fmt.Sprintf("10.244.%d.0/24", i+1))
	}
	for _, name := range observers {
		ds[name] = nodes[name].startDaemon()
	}
	route := func(cidr, via string) string { return fmt.Sprintf("%s via %s dev eth0 proto 77", cidr, via) }
	bh := func(i int) string { return fmt.Sprintf("blackhole 10.244.%d.0/24 proto 77", i) }
	viaA, viaB, viaC := route("10.244.1.0/24", "172.30.0.1"), route("10.244.2.0/24", "172.30.0.2"), route("10.244.3.0/24", "172.30.0.3")
	base := map[string][]string{"node-a": {bh(1), viaB, viaC}, "node-b": {viaA, bh(2), viaC}, "node-c": {viaA, viaB, bh(3)}}
	settle(t, syncT, "before the hostile Nodes", func() []string {
		var bad []string
		for _, obs := range observers {
			bad = append(bad, routedView(ds[obs], base[obs], nil)...)
		}
		return bad
	})
	if t.Failed() {
		t.FailNow()
	}

	a := nodes["node-a"]
	const rounds = 20
	held, tries := 0, 0
	hostileRoute := route("10.244.1.0/25", "172.30.0.66")
	hostile := ""
	for i := range rounds {
		if hostile != "" {
			c.deleteNode(hostile)
		}
		c.deleteNode("node-a")
		stamp, specs, n := c.sameSecond(func(try int) []nodeSpec {
			return []nodeSpec{
				{name: "node-a", ip: "172.30.0.1", podCIDR: "10.244.1.0/24"},
				// a name sorting before node-a
				{name: fmt.Sprintf("h-%02d-%d", i, try), ip: "172.30.0.66", podCIDR: "10.244.1.0/25"},
			}
		})
		hostile = specs[1].name
		tries += n
		ok := settle(t, changeT, fmt.Sprintf("round %d: %s created with node-a at %s", i, hostile, stamp.Format(time.RFC3339)), func() []string {
			bad := routedView(ds["node-a"], []string{bh(1), viaB, viaC}, map[string]float64{"overlaps-own-podcidr": 1})
			for _, obs := range []string{"node-b", "node-c"} {
				// the tie goes to the name sorting first: the hostile
				bad = append(bad, routedView(ds[obs], []string{hostileRoute, base[obs][1], base[obs][2]}, map[string]float64{"podcidr-conflict": 1})...)
			}
			if code, body := ds["node-a"].status("/readyz"); code != http.StatusOK {
				bad = append(bad, fmt.Sprintf("node-a /readyz %d %q", code, body))
			}
			if st, err := a.nodeJSON(); err != nil || st["error"] != nil || fmt.Sprint(st["podCIDRs"]) != "[10.244.1.0/24]" {
				bad = append(bad, fmt.Sprintf("node-a node.json %v %v", st, err))
			}
			return append(bad, refusedOnce(c, ds["node-a"], "node-a", hostile, "overlaps-own-podcidr", "node-a", "never yields")...)
		})
		if ok {
			held++
		}
	}
	t.Logf("MEASURE same-second hostile Node refused by node-a in %d of %d rounds (%d creations to get equal timestamps)", held, rounds, tries)
	for _, obs := range []string{"node-b", "node-c"} {
		for _, rec := range ds[obs].refusalLogs("node refused", "node-a") {
			t.Logf("%s: %v", obs, rec["detail"])
			break
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	c.deleteNode(hostile)
	settle(t, changeT, "hostile Node gone", func() []string {
		var bad []string
		for _, obs := range observers {
			bad = append(bad, routedView(ds[obs], base[obs], nil)...)
		}
		return bad
	})

	// Two remote Nodes, one PodCIDR, the same second: the name sorting
	// first keeps it on every node, whichever was created first.
	for i := range 5 {
		cidr := fmt.Sprintf("10.244.%d.0/24", 50+i)
		stamp, pair, _ := c.sameSecond(func(try int) []nodeSpec {
			return []nodeSpec{
				{name: fmt.Sprintf("pair%d-%d-b", i, try), ip: fmt.Sprintf("172.30.0.%d", 52+2*i), podCIDR: cidr},
				{name: fmt.Sprintf("pair%d-%d-a", i, try), ip: fmt.Sprintf("172.30.0.%d", 51+2*i), podCIDR: cidr},
			}
		})
		second, first := pair[0].name, pair[1].name
		won := route(cidr, pair[1].ip)
		settle(t, changeT, fmt.Sprintf("pair %d created at %s", i, stamp.Format(time.RFC3339)), func() []string {
			var bad []string
			for _, obs := range observers {
				bad = append(bad, routedView(ds[obs], append(slices.Clone(base[obs]), won), map[string]float64{"podcidr-conflict": 1})...)
				bad = append(bad, refusedOnce(c, ds[obs], obs, second, "podcidr-conflict", "of Node "+first, "same second")...)
			}
			return bad
		})
		if i == 0 {
			for _, obs := range observers {
				if recs := ds[obs].refusalLogs("node refused", second); len(recs) > 0 {
					t.Logf("%s: %v", obs, recs[0]["detail"])
				}
			}
		}
		c.deleteNode(first)
		c.deleteNode(second)
	}
}
