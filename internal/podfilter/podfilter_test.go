package podfilter

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/testns"
)

// TestPodFilterDrop removes elements of the pod filter the ways DEL, GC and
// ADD's rollback do, in a throwaway netns, for both families, on both paths
// of drop: elements given a 1 ms timeout (kernels with element timeout
// updates, this one), and deleted (older kernels, where the timeout update
// is ignored: timeoutUpdates off takes the same path). Only the elements
// of the ports removed go, and removing what is not there is no error.
func TestPodFilterDrop(t *testing.T) {
	for _, g := range []Guard{Routed, Bridged} {
		for _, updates := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/timeout-updates=%v", familyName(g.family), updates), func(t *testing.T) {
				g := g.At(t.TempDir()) // records off the machine's state dir
				saved := timeoutUpdates
				timeoutUpdates = updates
				t.Cleanup(func() { timeoutUpdates = saved })
				n := testns.New(t)
				port := func(i int) Port {
					return Port{Index: i, IPs: []net.IP{net.IPv4(10, 0, 0, byte(i)).To4(), net.ParseIP(fmt.Sprintf("fd00::%d", i))}, MAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i)}}
				}
				err := n.Do(func(ns.NetNS) error {
					for i := 1; i <= 5; i++ {
						if err := g.Install(port(i)); err != nil {
							return err
						}
					}
					steps := []struct {
						what   string
						do     func() error
						remain []int
					}{
						{"removeExact (DEL with prevResult)", func() error { return g.RemoveExact(port(1)) }, []int{2, 3, 4, 5}},
						{"removeExact again (nothing there)", func() error { return g.RemoveExact(port(1)) }, []int{2, 3, 4, 5}},
						{"removeExact with an address the filter does not have", func() error {
							p := port(2)
							p.IPs = append(p.IPs, net.IPv4(10, 9, 9, 9).To4())
							return g.RemoveExact(p)
						}, []int{3, 4, 5}},
						{"removePort (DEL without prevResult)", func() error { return g.RemovePort(3) }, []int{4, 5}},
						{"prune (GC)", func() error {
							_, err := g.remove(func(i int) bool { return i != 5 })
							return err
						}, []int{5}},
					}
					for _, s := range steps {
						if err := s.do(); err != nil {
							return fmt.Errorf("%s: %w", s.what, err)
						}
						var want []string
						for _, i := range s.remain {
							want = append(want, elementStrings(g, port(i))...)
						}
						slices.Sort(want)
						var got []string
						deadline := time.Now().Add(2 * time.Second)
						for {
							var err error
							if got, err = filterElements(g); err != nil {
								return err
							}
							if slices.Equal(got, want) || time.Now().After(deadline) {
								break
							}
							time.Sleep(10 * time.Millisecond)
						}
						if !slices.Equal(got, want) {
							t.Errorf("after %s: elements %v, want %v", s.what, got, want)
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func elementStrings(g Guard, p Port) []string {
	var out []string
	for set, elems := range g.elements(p) {
		for _, e := range elems {
			out = append(out, set+" "+describeKey(set, e.Key))
		}
	}
	return out
}

func filterElements(g Guard) ([]string, error) {
	c, err := newNFT()
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting()
	var out []string
	for _, s := range g.sets(g.table()) {
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list set %s: %w", s.Name, err)
		}
		for _, e := range elems {
			out = append(out, s.Name+" "+describeKey(s.Name, e.Key))
		}
	}
	slices.Sort(out)
	return out, nil
}

// TestPruneKeepsNewPorts runs Prune over and over (as podnet-routed's leak
// reconcile and CNI GC do) while ports come up one after the other, each
// a link created and then given its elements (as ADD does): no port that
// exists may lose its elements. Listing the links before reading the
// elements lost those of a port created in between.
func TestPruneKeepsNewPorts(t *testing.T) {
	const ports = 150
	n := testns.New(t)
	g := Routed.At(t.TempDir())
	stop := make(chan struct{})
	pruned := make(chan error, 1)
	go func() {
		pruned <- n.Do(func(ns.NetNS) error {
			for passes := 0; ; passes++ {
				select {
				case <-stop:
					if passes == 0 {
						return fmt.Errorf("no Prune ran")
					}
					return nil
				default:
				}
				if err := Prune(g); err != nil {
					return err
				}
			}
		})
	}()
	var want []string
	err := n.Do(func(ns.NetNS) error {
		for i := range ports {
			name := fmt.Sprintf("port%d", i)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: fmt.Sprintf("peer%d", i)}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			p := Port{Index: l.Attrs().Index, IPs: []net.IP{net.IPv4(10, 1, byte(i/250), byte(1+i%250)).To4()}, MAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}}
			if err := g.Install(p); err != nil {
				return err
			}
			want = append(want, elementStrings(g, p)...)
		}
		return nil
	})
	close(stop)
	if perr := <-pruned; perr != nil {
		t.Fatal(perr)
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := n.Do(func(ns.NetNS) error { got, err = filterElements(g); return err }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	var lost []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			lost = append(lost, w)
		}
	}
	if len(lost) > 0 {
		t.Errorf("Prune removed %d elements of %d ports that exist: %v", len(lost), ports, lost[:min(len(lost), 6)])
	}
}

// TestRemovalHoldsTheRecordsLock: DEL's removals (RemoveExact,
// RemovePort) take the records' lock, shared, across the elements and the
// record, so that a whole write (which holds it exclusive and rebuilds
// the filter from the records) never runs between the two and puts a
// removed port's elements back for good. While the test holds the lock
// exclusive, a removal waits; once it is released, the removal ends and
// the port is gone, elements and record. A removal where no records
// directory exists makes none.
func TestRemovalHoldsTheRecordsLock(t *testing.T) {
	for _, remove := range []string{"RemoveExact", "RemovePort"} {
		t.Run(remove, func(t *testing.T) {
			g := Routed.At(t.TempDir())
			n := testns.New(t)
			p := Port{Index: 7, IPs: []net.IP{net.IPv4(10, 0, 0, 7).To4()}, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 7}}
			if err := n.Do(func(ns.NetNS) error { return g.Install(p) }); err != nil {
				t.Fatal(err)
			}
			record := filepath.Join(g.recordsDir(), "7")
			if _, err := os.Stat(record); err != nil {
				t.Fatalf("Install wrote no record: %v", err)
			}
			unlock, err := g.lockRecords(true)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				done <- n.Do(func(ns.NetNS) error {
					if remove == "RemoveExact" {
						return g.RemoveExact(p)
					}
					return g.RemovePort(p.Index)
				})
			}()
			select {
			case err := <-done:
				unlock()
				t.Fatalf("%s ended (err %v) while a whole write held the records' lock", remove, err)
			case <-time.After(300 * time.Millisecond):
			}
			unlock()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s still waits after the lock was released", remove)
			}
			if _, err := os.Stat(record); !os.IsNotExist(err) {
				t.Errorf("the record is still there (stat: %v)", err)
			}
			err = n.Do(func(ns.NetNS) error {
				deadline := time.Now().Add(2 * time.Second)
				for {
					got, err := filterElements(g)
					if err != nil || len(got) == 0 {
						return err
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("elements left: %v", got)
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("no records directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "none")
		g := Routed.At(dir)
		n := testns.New(t)
		if err := n.Do(func(ns.NetNS) error { return g.RemovePort(9) }); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(g.recordsDir()); !os.IsNotExist(err) {
			t.Errorf("a removal made the records directory %s (stat: %v)", g.recordsDir(), err)
		}
	})
}
