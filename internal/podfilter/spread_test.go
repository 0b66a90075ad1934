package podfilter

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/testns"
)

// TestL2TablesSpread: the routed mode's ports are spread over the netdev
// tables by interface index: each port's chain and its ports and addrs4
// elements are in the table of its index and in no other, every table
// has its own l2 chain and counters, and a whole write (Repair, on the
// tables an older podnet left: its one netdev table) deletes the older
// table and carries its counts over.
func TestL2TablesSpread(t *testing.T) {
	n := testns.New(t)
	g := Routed.At(t.TempDir())
	err := n.Do(func(ns.NetNS) error {
		ports, err := installPorts(g, 40) // more than the tables: each gets ports
		if err != nil {
			return err
		}
		c, _, err := nftutil.Dial(nftTimeout, 0, ReceiveBuffer)
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		checkSpread(t, c, g, ports)

		// an older podnet's netdev table, with counts
		legacy := legacyL2Table()
		c.AddTable(legacy)
		c.AddObj(&nftables.NamedObj{Table: legacy, Name: contract.PodFilterDropCounter(contract.DropARP), Type: nftables.ObjTypeCounter, Obj: &expr.Counter{Packets: 7, Bytes: 420}})
		if err := c.Flush(); err != nil {
			return err
		}
		before, err := nftutil.ReadCounters(c, l2Table(0))
		if err != nil {
			return err
		}
		why, _, err := g.Repair()
		if err != nil {
			return err
		}
		if why == "" {
			t.Error("Repair wrote nothing with an older podnet's netdev table there")
		}
		if ok, err := nftutil.TableExists(c, legacy); err != nil || ok {
			t.Errorf("after Repair the older netdev table is there: %v %v", ok, err)
		}
		after, err := nftutil.ReadCounters(c, l2Table(0))
		if err != nil {
			return err
		}
		arp := contract.PodFilterDropCounter(contract.DropARP)
		if got, want := after[arp].Packets, before[arp].Packets+7; got != want {
			t.Errorf("netdev %s/%s counts %d packets after the older table's 7, want %d", l2Table(0).Name, arp, got, want)
		}
		if why, _, err := g.Repair(); err != nil || why != "" {
			t.Errorf("a second Repair: %q %v, want nothing to repair", why, err)
		}
		checkSpread(t, c, g, ports)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkSpread checks that each port is in the L2 table of its index and
// in no other.
func checkSpread(t *testing.T, c *nftables.Conn, g Guard, ports []Port) {
	t.Helper()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		t.Fatal(err)
	}
	where := map[string][]string{} // chain -> tables
	for _, ch := range chains {
		where[ch.Name] = append(where[ch.Name], ch.Table.Name)
	}
	if got := len(where[l2ChainName]); got != contract.PodFilterL2Tables {
		t.Errorf("%d tables with chain l2, want %d: %v", got, contract.PodFilterL2Tables, where[l2ChainName])
	}
	used := map[string]bool{}
	for _, p := range ports {
		want := contract.PodFilterL2TableOf(p.Index)
		used[want] = true
		if got := where[portChainName(p.Index)]; !slices.Equal(got, []string{want}) {
			t.Errorf("port %d: chain %s in tables %v, want [%s]", p.Index, portChainName(p.Index), got, want)
		}
		for _, tbl := range l2Tables() {
			for _, s := range g.setsOf(tbl) {
				elems, err := c.GetSetElements(s)
				if err != nil {
					t.Fatalf("set %s/%s: %v", tbl.Name, s.Name, err)
				}
				has := slices.ContainsFunc(elems, func(e nftables.SetElement) bool { i, _ := keyIndex(e.Key); return i == p.Index })
				if has != (tbl.Name == want) {
					t.Errorf("port %d: in netdev %s/%s: %v, want %v", p.Index, tbl.Name, s.Name, has, tbl.Name == want)
				}
			}
		}
		if err := g.Verify(p); err != nil {
			t.Errorf("port %d: %v", p.Index, err)
		}
	}
	if len(used) < 3 {
		t.Fatalf("the ports went to %d tables only: the test spreads nothing", len(used))
	}
}

// BenchmarkGuardPort: adding one port to the routed mode's filter (its
// record, elements and netdev chain: what ADD's guard step writes) with
// 0 and 1,000 ports already in place. Run as root:
//
//	go test -run '^$' -bench GuardPort -benchtime 200x ./internal/podfilter/
func BenchmarkGuardPort(b *testing.B) {
	for _, existing := range []int{0, 1000} {
		b.Run(fmt.Sprintf("ports=%d", existing), func(b *testing.B) {
			n := testns.New(b)
			dir, err := os.MkdirTemp("/dev/shm", "podfilter-bench") // as /run/podnet: tmpfs
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(dir) })
			g := Routed.At(dir)
			err = n.Do(func(ns.NetNS) error {
				port := portMaker()
				c, _, err := nftutil.Dial(0, 0, ReceiveBuffer)
				if err != nil {
					return err
				}
				defer c.CloseLasting()
				for range existing + 1 {
					p, err := port()
					if err != nil {
						return err
					}
					if err := g.InstallOn(c, p); err != nil {
						return err
					}
				}
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					p, err := port()
					if err != nil {
						return err
					}
					b.StartTimer()
					if err := g.InstallOn(c, p); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
