package podfilter

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/testns"
)

// TestInstallAllOn: the ports of pods that start together go in with one
// transaction (the netns's ruleset generation moves by one), each port's
// elements, port chain and record as Install writes them. A port the
// kernel refuses (a device name longer than the kernel's IFNAMSIZ, which
// its port chain cannot hook) fails alone: the others of its batch are
// in, and the filter holds nothing of it.
func TestInstallAllOn(t *testing.T) {
	n := testns.New(t)
	g := Routed.At(t.TempDir())
	err := n.Do(func(ns.NetNS) error {
		port := portMaker()
		first, err := port()
		if err != nil {
			return err
		}
		if err := g.Install(first); err != nil { // the tables
			return err
		}
		c, raw, err := nftutil.Dial(nftTimeout, 0, 0)
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		installed := []Port{first}
		check := func(what string) {
			var want []string
			for _, p := range installed {
				want = append(want, elementStrings(g, p)...)
				if err := g.Verify(p); err != nil {
					t.Errorf("%s: port %s: %v", what, p.Name, err)
				}
			}
			slices.Sort(want)
			got, err := filterElements(g)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: elements %v, want %v", what, got, want)
			}
			recs, _, err := g.Desired()
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(installed) {
				t.Errorf("%s: %d ports recorded and valid, want %d", what, len(recs), len(installed))
			}
		}

		var batch []Port
		for range 6 {
			p, err := port()
			if err != nil {
				return err
			}
			batch = append(batch, p)
		}
		gen0, err := nftutil.Generation(raw)
		if err != nil {
			return err
		}
		for i, err := range g.InstallAllOn(c, batch) {
			if err != nil {
				t.Errorf("port %d of the batch: %v", i, err)
			}
		}
		if gen1, err := nftutil.Generation(raw); err != nil {
			return err
		} else if gen1 != gen0+1 {
			t.Errorf("6 ports took %d transactions, want 1", gen1-gen0)
		}
		installed = append(installed, batch...)
		check("a batch of 6")

		// the kernel refuses one port of the next batch
		batch = nil
		for range 3 {
			p, err := port()
			if err != nil {
				return err
			}
			batch = append(batch, p)
		}
		bad := &batch[1]
		bad.Name += "-0123456789"
		errs := g.InstallAllOn(c, batch)
		for i, err := range errs {
			switch {
			case i == 1 && (err == nil || !strings.Contains(err.Error(), fmt.Sprint(bad.Index))):
				t.Errorf("the port the kernel refuses: %v, want an error naming index %d", err, bad.Index)
			case i != 1 && err != nil:
				t.Errorf("port %d of the batch, beside one that fails: %v", i, err)
			}
		}
		installed = append(installed, batch[0], batch[2])
		check("a batch with a port the kernel refuses")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
