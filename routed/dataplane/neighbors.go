// VXLAN peers: podnet.vxlan's neighbor entries (VTEP address to MAC)
// and FDB entries (MAC to the peer's underlay address).

package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/desired"
)

// vxlanHandle opens a netlink socket and finds podnet.vxlan's index.
func vxlanHandle() (netlinksafe.Handle, int, error) {
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return h, 0, fmt.Errorf("netlink socket: %w", err)
	}
	link, err := h.LinkByName(desired.VXLANDevice)
	if err != nil {
		h.Close()
		return h, 0, fmt.Errorf("look up %s: %w", desired.VXLANDevice, err)
	}
	return h, link.Attrs().Index, nil
}

// VXLANChanges counts the entries a full VXLAN apply wrote or deleted.
type VXLANChanges struct {
	Neighbors, FDBs int
	// of them, the entries written back because the device no longer
	// held what podnet-routed had written there (VXLANRecord): deleted or
	// edited by someone else
	RepairedNeighbors, RepairedFDBs int
}

// VXLANRecord is what podnet-routed last wrote to podnet.vxlan (or found
// there and kept): each neighbor's MAC by IP and each FDB entry's
// destination by MAC. An entry written back is a repair only when the
// device no longer held what was written; one that changes with the plan
// is not. The zero value is empty.
type VXLANRecord struct {
	mu    sync.Mutex
	neigh map[netip.Addr]string
	fdb   map[string]netip.Addr
}

// Forget forgets every entry: the device went down or away (or was
// re-created), and its entries with it.
func (r *VXLANRecord) Forget() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.neigh, r.fdb = nil, nil
}

// setNeigh and setFDB record an entry as written (mac "" / an invalid
// dst: deleted). The caller holds r.mu.
func (r *VXLANRecord) setNeigh(ip netip.Addr, mac string) {
	if r.neigh == nil {
		r.neigh = map[netip.Addr]string{}
	}
	if mac == "" {
		delete(r.neigh, ip)
		return
	}
	r.neigh[ip] = mac
}

func (r *VXLANRecord) setFDB(mac string, dst netip.Addr) {
	if r.fdb == nil {
		r.fdb = map[string]netip.Addr{}
	}
	if !dst.IsValid() {
		delete(r.fdb, mac)
		return
	}
	r.fdb[mac] = dst
}

// neighKernel is what VXLAN peer apply needs from the kernel (the seam that
// lets its ordering be unit-tested): netlinksafe.Handle is the real one.
type neighKernel interface {
	NeighList(linkIndex, family int) ([]netlink.Neigh, error)
	// NeighSet creates or replaces an entry: a neighbor by its IP, an FDB
	// entry by its MAC (NLM_F_CREATE|NLM_F_REPLACE).
	NeighSet(n *netlink.Neigh) error
	// NeighDel deletes a neighbor by IP (whatever its MAC), an FDB entry's
	// remote by MAC and destination.
	NeighDel(n *netlink.Neigh) error
}

// ApplyVXLANPeers makes the neighbor and FDB entries of podnet.vxlan equal
// to the desired ones. It lists what the device has first, writes only the
// entries that are missing or differ, and deletes the stale ones: a
// resync with nothing changed writes nothing. It returns how many entries
// it wrote or deleted.
// rec (nil: none) is what was written before, kept current: the entries
// written back that the device had lost or changed are counted as
// repaired.
func ApplyVXLANPeers(neighs []desired.Neighbor, fdbs []desired.FDB, rec *VXLANRecord) (VXLANChanges, error) {
	h, idx, err := vxlanHandle()
	if err != nil {
		return VXLANChanges{}, err
	}
	defer h.Close()
	return applyVXLANPeers(h, idx, neighs, fdbs, rec)
}

func applyVXLANPeers(k neighKernel, idx int, neighs []desired.Neighbor, fdbs []desired.FDB, rec *VXLANRecord) (VXLANChanges, error) {
	if rec == nil {
		rec = &VXLANRecord{}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var ch VXLANChanges
	var errs []error
	gone := func(err error) bool { return err == nil || errors.Is(err, unix.ENOENT) }

	// Neighbors: the kernel keys them by IP. A peer whose MAC changed is
	// replaced in place; the stale ones deleted (by IP) are only those of
	// an IP no Node asks for, so a delete never takes a new entry along.
	have := map[netip.Addr]netlink.Neigh{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		cur, err := k.NeighList(idx, fam)
		if err != nil {
			return ch, fmt.Errorf("list neighbors of %s: %w", desired.VXLANDevice, err)
		}
		for _, c := range cur {
			if ip, ok := netip.AddrFromSlice(c.IP); ok && c.State == netlink.NUD_PERMANENT {
				have[ip.Unmap()] = c
			}
		}
	}
	for _, n := range neighs {
		mac, _ := net.ParseMAC(n.MAC)
		cur, ok := have[n.IP]
		delete(have, n.IP)
		if ok && cur.HardwareAddr.String() == mac.String() {
			rec.setNeigh(n.IP, mac.String()) // in place: ours now
			continue
		}
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: mac}
		if err := k.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("neighbor %s: %w", n.IP, err))
			continue
		}
		ch.Neighbors++
		if last, wrote := rec.neigh[n.IP]; wrote && (!ok || cur.HardwareAddr.String() != last) {
			ch.RepairedNeighbors++
		}
		rec.setNeigh(n.IP, mac.String())
	}
	for ip, c := range have { // permanent entries no Node asks for
		e := &netlink.Neigh{LinkIndex: idx, Family: c.Family, IP: c.IP}
		if err := k.NeighDel(e); !gone(err) {
			errs = append(errs, fmt.Errorf("delete neighbor %s: %w", ip, err))
			continue
		}
		ch.Neighbors++
		rec.setNeigh(ip, "")
	}

	// FDB: the kernel keys an entry by MAC, with a list of remote
	// destinations. The desired one is set first (replacing a wrong
	// destination in place), then the other destinations of that MAC go,
	// each deleted by MAC and destination: never the desired one.
	curFDB, err := k.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return ch, errors.Join(append(errs, fmt.Errorf("list FDB of %s: %w", desired.VXLANDevice, err))...)
	}
	haveFDB := map[string][]netlink.Neigh{}
	for _, c := range curFDB {
		if c.IP == nil || c.HardwareAddr == nil {
			continue
		}
		haveFDB[c.HardwareAddr.String()] = append(haveFDB[c.HardwareAddr.String()], c)
	}
	fdbEntry := func(mac net.HardwareAddr, dst net.IP) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: dst, HardwareAddr: mac}
	}
	delFDB := func(c netlink.Neigh) {
		if err := k.NeighDel(fdbEntry(c.HardwareAddr, c.IP)); !gone(err) {
			errs = append(errs, fmt.Errorf("delete fdb %s -> %s: %w", c.HardwareAddr, c.IP, err))
			return
		}
		ch.FDBs++
	}
	for _, f := range fdbs {
		mac, _ := net.ParseMAC(f.MAC)
		cur := haveFDB[mac.String()]
		delete(haveFDB, mac.String())
		right := func(c netlink.Neigh) bool {
			ip, _ := netip.AddrFromSlice(c.IP)
			return ip.Unmap() == f.Dst
		}
		if !(len(cur) == 1 && right(cur[0]) && cur[0].State == netlink.NUD_PERMANENT) {
			e := fdbEntry(mac, f.Dst.AsSlice())
			e.State = netlink.NUD_PERMANENT
			if err := k.NeighSet(e); err != nil {
				errs = append(errs, fmt.Errorf("fdb %s -> %s: %w", f.MAC, f.Dst, err))
				continue
			}
			ch.FDBs++
			// a repair when the entry last written is not there as it
			// was (the plan unchanged: any difference; moved: the old
			// destination gone or not permanent)
			if last, wrote := rec.fdb[mac.String()]; wrote && (last == f.Dst || !slices.ContainsFunc(cur, func(c netlink.Neigh) bool {
				ip, _ := netip.AddrFromSlice(c.IP)
				return ip.Unmap() == last && c.State == netlink.NUD_PERMANENT
			})) {
				ch.RepairedFDBs++
			}
		}
		rec.setFDB(mac.String(), f.Dst)
		for _, c := range cur {
			if !right(c) {
				delFDB(c)
			}
		}
	}
	for mac, cur := range haveFDB { // entries no Node asks for
		for _, c := range cur {
			delFDB(c)
		}
		rec.setFDB(mac, netip.Addr{})
	}
	return ch, errors.Join(errs...)
}

// ApplyVXLANDelta writes the neighbor and FDB entries of one Node's
// change to podnet.vxlan and deletes the ones it no longer has, without
// listing the others.
//
// rec (nil: none) records what was written and deleted.
func ApplyVXLANDelta(setNeigh, delNeigh []desired.Neighbor, addFDB, delFDB []desired.FDB, rec *VXLANRecord) error {
	h, idx, err := vxlanHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	if rec == nil {
		rec = &VXLANRecord{}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var errs []error
	gone := func(err error) bool { return err == nil || errors.Is(err, unix.ENOENT) }
	for _, n := range delNeigh {
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), IP: n.IP.AsSlice()}
		if err := h.NeighDel(e); !gone(err) {
			errs = append(errs, fmt.Errorf("delete neighbor %s: %w", n.IP, err))
			continue
		}
		rec.setNeigh(n.IP, "")
	}
	for _, f := range delFDB {
		mac, _ := net.ParseMAC(f.MAC)
		e := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: f.Dst.AsSlice(), HardwareAddr: mac}
		if err := h.NeighDel(e); !gone(err) {
			errs = append(errs, fmt.Errorf("delete fdb %s -> %s: %w", f.MAC, f.Dst, err))
			continue
		}
		if rec.fdb[mac.String()] == f.Dst {
			rec.setFDB(mac.String(), netip.Addr{})
		}
	}
	for _, n := range setNeigh {
		mac, _ := net.ParseMAC(n.MAC)
		e := &netlink.Neigh{LinkIndex: idx, Family: familyOf(n.IP.AsSlice()), State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: mac}
		if err := h.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("neighbor %s: %w", n.IP, err))
			continue
		}
		rec.setNeigh(n.IP, mac.String())
	}
	for _, f := range addFDB {
		mac, _ := net.ParseMAC(f.MAC)
		e := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, IP: f.Dst.AsSlice(), HardwareAddr: mac}
		if err := h.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("fdb %s -> %s: %w", f.MAC, f.Dst, err))
			continue
		}
		rec.setFDB(mac.String(), f.Dst)
	}
	return errors.Join(errs...)
}
