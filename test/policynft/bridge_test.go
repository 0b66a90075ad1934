package policynft

import "testing"

// TestBridgeTableQuiet: once written, both tables read back as written: a
// resync repairs nothing (a resync that found a difference in a table it
// just wrote would rewrite it at every check, and the nftables monitor
// would turn that into a loop); after the bridge table is deleted, one
// resync repairs it and the next finds nothing.
func TestBridgeTableQuiet(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := e.withPorts(trafficRulesetAB(e))
	rs.BridgePorts = []string{"pnbr1", "pnbr2"}
	rs.Pods[0].BridgePorts = []string{"pnbr1"}
	e.apply(rs)
	resync := func() bool {
		var repaired bool
		e.do(func() error {
			var err error
			repaired, err = e.w.Resync(rs)
			return err
		})
		return repaired
	}
	for i := range 3 {
		// someone else's transaction moves the generation: the resync
		// reads both tables
		e.nft("add", "table", "inet", "someone-else")
		if resync() {
			t.Fatalf("resync %d repaired a table nobody touched", i)
		}
	}
	e.nft("delete", "table", "bridge", "podnet-policy")
	if !resync() {
		t.Fatalf("the bridge table deleted: resync repaired nothing")
	}
	if resync() {
		t.Fatalf("the resync after the repair repaired again")
	}
}
