package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/desired"
)

// fakeNeighs is podnet.vxlan's neighbor table and FDB in memory, with the
// kernel's keys: a neighbor by IP (a delete ignores the MAC), an FDB entry
// by MAC with a list of remote destinations (set with NLM_F_REPLACE
// replaces the first one unless the destination is already listed; a
// delete removes the remote it names, the entry with its last remote, and
// fails with ENOENT when that remote is not there).
type fakeNeighs struct {
	neigh  map[netip.Addr]netlink.Neigh
	fdb    map[string]*fakeFDB
	writes int
}

type fakeFDB struct {
	mac     net.HardwareAddr
	state   int
	remotes []netip.Addr
}

func newFakeNeighs() *fakeNeighs {
	return &fakeNeighs{neigh: map[netip.Addr]netlink.Neigh{}, fdb: map[string]*fakeFDB{}}
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func (k *fakeNeighs) NeighList(idx, family int) ([]netlink.Neigh, error) {
	var out []netlink.Neigh
	if family == unix.AF_BRIDGE {
		for _, e := range k.fdb {
			for _, r := range e.remotes {
				out = append(out, netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: e.state, HardwareAddr: e.mac, IP: r.AsSlice()})
			}
		}
		return out, nil
	}
	for ip, n := range k.neigh {
		if (family == netlink.FAMILY_V4) == ip.Is4() {
			out = append(out, n)
		}
	}
	return out, nil
}

func (k *fakeNeighs) NeighSet(n *netlink.Neigh) error {
	k.writes++
	if n.Family != unix.AF_BRIDGE {
		k.neigh[addrOf(n.IP)] = *n
		return nil
	}
	dst := addrOf(n.IP)
	e, ok := k.fdb[n.HardwareAddr.String()]
	if !ok {
		k.fdb[n.HardwareAddr.String()] = &fakeFDB{mac: n.HardwareAddr, state: n.State, remotes: []netip.Addr{dst}}
		return nil
	}
	e.state = n.State
	if !slices.Contains(e.remotes, dst) {
		e.remotes[0] = dst
	}
	return nil
}

func (k *fakeNeighs) NeighDel(n *netlink.Neigh) error {
	k.writes++
	if n.Family != unix.AF_BRIDGE {
		ip := addrOf(n.IP)
		if _, ok := k.neigh[ip]; !ok {
			return unix.ENOENT
		}
		delete(k.neigh, ip)
		return nil
	}
	e, ok := k.fdb[n.HardwareAddr.String()]
	if !ok {
		return unix.ENOENT
	}
	i := slices.Index(e.remotes, addrOf(n.IP))
	if i < 0 {
		return unix.ENOENT
	}
	e.remotes = slices.Delete(e.remotes, i, i+1)
	if len(e.remotes) == 0 {
		delete(k.fdb, n.HardwareAddr.String())
	}
	return nil
}

func (k *fakeNeighs) neighs() []string {
	var out []string
	for ip, n := range k.neigh {
		out = append(out, fmt.Sprintf("%s lladdr %s state %#x", ip, n.HardwareAddr, n.State))
	}
	slices.Sort(out)
	return out
}

func (k *fakeNeighs) fdbs() []string {
	var out []string
	for _, e := range k.fdb {
		for _, r := range e.remotes {
			out = append(out, fmt.Sprintf("%s dst %s state %#x", e.mac, r, e.state))
		}
	}
	slices.Sort(out)
	return out
}

const permanent = netlink.NUD_PERMANENT

// peers is the desired VXLAN state of two remote nodes (as desired.NewPlan
// makes it: the VTEP address and the MAC derived from the node IP).
func peers(nodeIPs ...string) ([]desired.Neighbor, []desired.FDB) {
	var ns []desired.Neighbor
	var fs []desired.FDB
	for i, s := range nodeIPs {
		ip := netip.MustParseAddr(s)
		mac := desired.VTEPMAC(ip)
		ns = append(ns, desired.Neighbor{IP: netip.MustParseAddr(fmt.Sprintf("10.244.%d.0", i+2)), MAC: mac})
		fs = append(fs, desired.FDB{MAC: mac, Dst: ip})
	}
	return ns, fs
}

// TestApplyVXLANPeersMACChange: a remote peer whose MAC changed (its node
// moved to another InternalIP, or someone edited the entry) gets its new
// neighbor entry and keeps it: the stale entry of the same IP is not
// deleted after the new one is set (the kernel deletes a neighbor by IP,
// which would take the new one).
func TestApplyVXLANPeersMACChange(t *testing.T) {
	k := newFakeNeighs()
	ns, fs := peers("172.30.0.2", "172.30.0.3")
	ch, err := applyVXLANPeers(k, 5, ns, fs, nil)
	if err != nil || ch != (VXLANChanges{Neighbors: 2, FDBs: 2}) {
		t.Fatalf("first apply: %+v %v", ch, err)
	}
	want := []string{"10.244.2.0 lladdr 0e:70:ac:1e:00:02 state 0x80", "10.244.3.0 lladdr 0e:70:ac:1e:00:03 state 0x80"}
	if got := k.neighs(); !slices.Equal(got, want) {
		t.Fatalf("neighbors %q, want %q", got, want)
	}
	k.writes = 0
	if ch, err := applyVXLANPeers(k, 5, ns, fs, nil); err != nil || ch != (VXLANChanges{}) || k.writes != 0 {
		t.Fatalf("nothing changed: %+v %v, %d writes", ch, err, k.writes)
	}

	// node-b moves to 172.30.0.12: same VTEP address, new MAC, new FDB
	ns2, fs2 := peers("172.30.0.12", "172.30.0.3")
	ch, err = applyVXLANPeers(k, 5, ns2, fs2, nil)
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"10.244.2.0 lladdr 0e:70:ac:1e:00:0c state 0x80", "10.244.3.0 lladdr 0e:70:ac:1e:00:03 state 0x80"}
	if got := k.neighs(); !slices.Equal(got, want) {
		t.Errorf("after node-b's MAC changed, neighbors\n\t%q\nwant\n\t%q", got, want)
	}
	wantFDB := []string{"0e:70:ac:1e:00:03 dst 172.30.0.3 state 0x80", "0e:70:ac:1e:00:0c dst 172.30.0.12 state 0x80"}
	if got := k.fdbs(); !slices.Equal(got, wantFDB) {
		t.Errorf("FDB %q, want %q", got, wantFDB)
	}
	if ch != (VXLANChanges{Neighbors: 1, FDBs: 2}) {
		t.Errorf("changes %+v, want 1 neighbor replaced, 1 FDB entry added and 1 deleted", ch)
	}

	// someone edits the entry's MAC by hand: put back, and kept
	k.neigh[netip.MustParseAddr("10.244.3.0")] = netlink.Neigh{LinkIndex: 5, Family: netlink.FAMILY_V4, State: permanent,
		IP: net.ParseIP("10.244.3.0").To4(), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 9}}
	if ch, err := applyVXLANPeers(k, 5, ns2, fs2, nil); err != nil || ch != (VXLANChanges{Neighbors: 1}) {
		t.Errorf("edited neighbor: %+v %v", ch, err)
	}
	if got := k.neighs(); !slices.Equal(got, want) {
		t.Errorf("after an edited neighbor's repair\n\t%q\nwant\n\t%q", got, want)
	}
}

// TestApplyVXLANPeersFDBRepair: an FDB entry whose destination was changed
// by hand, one with an extra destination appended, a learned (not
// permanent) one, a deleted one and a stale one are all put right in one
// apply, without an error (no delete of a destination the set replaced).
func TestApplyVXLANPeersFDBRepair(t *testing.T) {
	k := newFakeNeighs()
	ns, fs := peers("172.30.0.2", "172.30.0.3", "172.30.0.4", "172.30.0.5")
	if _, err := applyVXLANPeers(k, 5, ns, fs, nil); err != nil {
		t.Fatal(err)
	}
	want := k.fdbs()
	k.fdb["0e:70:ac:1e:00:02"].remotes = []netip.Addr{netip.MustParseAddr("172.30.0.99")}                               // edited
	k.fdb["0e:70:ac:1e:00:03"].remotes = append(k.fdb["0e:70:ac:1e:00:03"].remotes, netip.MustParseAddr("172.30.0.98")) // appended
	k.fdb["0e:70:ac:1e:00:04"].state = netlink.NUD_REACHABLE                                                            // learned
	delete(k.fdb, "0e:70:ac:1e:00:05")                                                                                  // deleted
	k.fdb["0e:70:ac:1e:00:63"] = &fakeFDB{mac: net.HardwareAddr{0x0e, 0x70, 0xac, 0x1e, 0, 0x63}, state: permanent, remotes: []netip.Addr{netip.MustParseAddr("172.30.0.99")}}
	ch, err := applyVXLANPeers(k, 5, ns, fs, nil)
	if err != nil {
		t.Errorf("repair apply: %v", err)
	}
	if got := k.fdbs(); !slices.Equal(got, want) {
		t.Errorf("FDB after repair\n\t%q\nwant\n\t%q", got, want)
	}
	if ch.FDBs < 5 || ch.Neighbors != 0 {
		t.Errorf("changes %+v, want at least 5 FDB writes and no neighbor write", ch)
	}
	k.writes = 0
	if ch, err := applyVXLANPeers(k, 5, ns, fs, nil); err != nil || ch != (VXLANChanges{}) || k.writes != 0 {
		t.Errorf("after the repair: %+v %v, %d writes; want none", ch, err, k.writes)
	}
}

// TestVXLANRepairsOnlyTampering: with a VXLANRecord, an entry written
// back is a repair only when the device no longer held what was written:
// not at the first apply, nor when the plan moves a peer, nor after the
// device lost its entries (Forget); an edited neighbor, and FDB entries
// edited, extended, learned over or deleted, are one repair each.
func TestVXLANRepairsOnlyTampering(t *testing.T) {
	k := newFakeNeighs()
	rec := &VXLANRecord{}
	ns, fs := peers("172.30.0.2", "172.30.0.3", "172.30.0.4", "172.30.0.5")
	check := func(step string, ch VXLANChanges, err error, neigh, fdb int) {
		t.Helper()
		if err != nil || ch.RepairedNeighbors != neigh || ch.RepairedFDBs != fdb {
			t.Fatalf("%s: %+v %v, want %d neighbor and %d FDB repairs", step, ch, err, neigh, fdb)
		}
	}
	ch, err := applyVXLANPeers(k, 5, ns, fs, rec)
	check("first apply", ch, err, 0, 0)
	ns2, fs2 := peers("172.30.0.12", "172.30.0.3", "172.30.0.4", "172.30.0.5") // node-b moves
	ch, err = applyVXLANPeers(k, 5, ns2, fs2, rec)
	if ch.Neighbors != 1 || ch.FDBs != 2 {
		t.Fatalf("the move wrote %+v", ch)
	}
	check("a peer moved", ch, err, 0, 0)

	k.neigh[netip.MustParseAddr("10.244.3.0")] = netlink.Neigh{LinkIndex: 5, Family: netlink.FAMILY_V4, State: permanent,
		IP: net.ParseIP("10.244.3.0").To4(), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 9}}
	k.fdb["0e:70:ac:1e:00:0c"].remotes = []netip.Addr{netip.MustParseAddr("172.30.0.99")}                               // edited
	k.fdb["0e:70:ac:1e:00:03"].remotes = append(k.fdb["0e:70:ac:1e:00:03"].remotes, netip.MustParseAddr("172.30.0.98")) // extended
	k.fdb["0e:70:ac:1e:00:04"].state = netlink.NUD_REACHABLE                                                            // learned
	delete(k.fdb, "0e:70:ac:1e:00:05")                                                                                  // deleted
	ch, err = applyVXLANPeers(k, 5, ns2, fs2, rec)
	check("tampered", ch, err, 1, 4)
	ch, err = applyVXLANPeers(k, 5, ns2, fs2, rec)
	check("resync after the repair", ch, err, 0, 0)

	// the device went down: its entries with it
	clear(k.neigh)
	clear(k.fdb)
	rec.Forget()
	ch, err = applyVXLANPeers(k, 5, ns2, fs2, rec)
	if ch.Neighbors != 4 || ch.FDBs != 4 {
		t.Fatalf("after the device's loss wrote %+v", ch)
	}
	check("entries lost with the device", ch, err, 0, 0)
}

// TestApplyVXLANDelta: one Node's change writes its entries and deletes
// the gone Node's, leaving the others alone; the record follows, so a
// full apply afterwards counts no repair and writes nothing.
func TestApplyVXLANDelta(t *testing.T) {
	k := newFakeNeighs()
	rec := &VXLANRecord{}
	ns, fs := peers("172.30.0.2", "172.30.0.3")
	if _, err := applyVXLANPeers(k, 5, ns, fs, rec); err != nil {
		t.Fatal(err)
	}
	// node-b (172.30.0.3) goes, node-c comes with node-b's VTEP address
	ns2, fs2 := peers("172.30.0.2", "172.30.0.4")
	if err := applyVXLANDelta(k, 5, ns2[1:], ns[1:], fs2[1:], fs[1:], rec); err != nil {
		t.Fatal(err)
	}
	wantNeigh := []string{"10.244.2.0 lladdr 0e:70:ac:1e:00:02 state 0x80", "10.244.3.0 lladdr 0e:70:ac:1e:00:04 state 0x80"}
	if got := k.neighs(); !slices.Equal(got, wantNeigh) {
		t.Errorf("neighbors %q, want %q", got, wantNeigh)
	}
	wantFDB := []string{"0e:70:ac:1e:00:02 dst 172.30.0.2 state 0x80", "0e:70:ac:1e:00:04 dst 172.30.0.4 state 0x80"}
	if got := k.fdbs(); !slices.Equal(got, wantFDB) {
		t.Errorf("FDB %q, want %q", got, wantFDB)
	}
	k.writes = 0
	if ch, err := applyVXLANPeers(k, 5, ns2, fs2, rec); err != nil || ch != (VXLANChanges{}) || k.writes != 0 {
		t.Errorf("full apply after the delta: %+v %v, %d writes; want none", ch, err, k.writes)
	}
	// deleting an FDB destination that is gone already is no error
	if err := applyVXLANDelta(k, 5, nil, nil, nil, fs[1:], rec); err != nil {
		t.Errorf("deleting gone entries: %v", err)
	}
}
