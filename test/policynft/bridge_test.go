package policynft

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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

// TestListShowsInterfaceNames: `nft list` shows the interface names the
// tables key on (an ifname set declared without its byte order lists
// every name as "", and nft cannot read such a listing back): a table
// saved with `nft list` and restored with `nft -f` lists as it did.
func TestListShowsInterfaceNames(t *testing.T) {
	e := newEnv(t, "a", "b")
	rs := e.withPorts(trafficRulesetAB(e))
	rs.BridgePorts = []string{"pnbr1", "pnbr2"}
	rs.Pods[0].BridgePorts = []string{"pnbr1"}
	e.apply(rs)
	in := e.nft("list", "map", "inet", "podnet-policy", "ingress-ports")
	if !strings.Contains(in, `"pna" : jump pod-a-in`) {
		t.Fatalf("ingress-ports lists no \"pna\" : jump pod-a-in:\n%s", in)
	}
	br := e.nft("list", "table", "bridge", "podnet-policy")
	if !strings.Contains(br, `"pnbr1"`) || !strings.Contains(br, `"pnbr2"`) {
		t.Fatalf("the bridge table lists no pnbr1 and pnbr2:\n%s", br)
	}
	for _, fam := range []string{"inet", "bridge"} {
		saved := e.nft("list", "table", fam, "podnet-policy")
		f := filepath.Join(t.TempDir(), fam+".nft")
		if err := os.WriteFile(f, []byte("delete table "+fam+" podnet-policy\n"+saved), 0o600); err != nil {
			t.Fatal(err)
		}
		e.nft("-f", f)
		if again := e.nft("list", "table", fam, "podnet-policy"); again != saved {
			t.Fatalf("%s table restored from its listing lists differently", fam)
		}
	}
}
