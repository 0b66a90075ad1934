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
	return applyVXLANDelta(h, idx, setNeigh, delNeigh, addFDB, delFDB, rec)
}

// peerWrite is one apply's writes to podnet.vxlan: the device, what was
// written there before (its lock held), and what the apply changed
// (counted by a full apply) and could not do.
type peerWrite struct {
	k    neighKernel
	idx  int
	rec  *VXLANRecord
	ch   VXLANChanges
	errs []error
}

// lockPeers starts a peerWrite on the device idx, holding rec's lock (a
// nil rec records into a throwaway one); the caller calls done.
func lockPeers(k neighKernel, idx int, rec *VXLANRecord) *peerWrite {
	if rec == nil {
		rec = &VXLANRecord{}
	}
	rec.mu.Lock()
	return &peerWrite{k: k, idx: idx, rec: rec}
}

func (w *peerWrite) done() { w.rec.mu.Unlock() }

// gone: a delete that succeeded, or found nothing to delete.
func gone(err error) bool { return err == nil || errors.Is(err, unix.ENOENT) }

// setNeigh writes the neighbor ip -> mac (created or replaced).
func (w *peerWrite) setNeigh(ip netip.Addr, mac net.HardwareAddr) bool {
	e := &netlink.Neigh{LinkIndex: w.idx, Family: familyOf(ip.AsSlice()), State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}
	if err := w.k.NeighSet(e); err != nil {
		w.errs = append(w.errs, fmt.Errorf("neighbor %s: %w", ip, err))
		return false
	}
	w.ch.Neighbors++
	w.rec.setNeigh(ip, mac.String())
	return true
}

// delNeigh deletes the neighbor of ip, whatever its MAC: family and raw
// are its key as the kernel has it.
func (w *peerWrite) delNeigh(ip netip.Addr, family int, raw net.IP) {
	e := &netlink.Neigh{LinkIndex: w.idx, Family: family, IP: raw}
	if err := w.k.NeighDel(e); !gone(err) {
		w.errs = append(w.errs, fmt.Errorf("delete neighbor %s: %w", ip, err))
		return
	}
	w.ch.Neighbors++
	w.rec.setNeigh(ip, "")
}

func (w *peerWrite) fdbEntry(mac net.HardwareAddr, dst net.IP) *netlink.Neigh {
	return &netlink.Neigh{LinkIndex: w.idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, IP: dst, HardwareAddr: mac}
}

// setFDB writes the FDB entry mac -> dst, permanent: it replaces the
// entry's first destination unless dst is one of them already.
func (w *peerWrite) setFDB(mac net.HardwareAddr, dst netip.Addr) bool {
	e := w.fdbEntry(mac, dst.AsSlice())
	e.State = netlink.NUD_PERMANENT
	if err := w.k.NeighSet(e); err != nil {
		w.errs = append(w.errs, fmt.Errorf("fdb %s -> %s: %w", mac, dst, err))
		return false
	}
	w.ch.FDBs++
	return true
}

// delFDB deletes the destination dst of the FDB entry mac (the entry
// with its last destination); the caller records it.
func (w *peerWrite) delFDB(mac net.HardwareAddr, dst net.IP) bool {
	if err := w.k.NeighDel(w.fdbEntry(mac, dst)); !gone(err) {
		w.errs = append(w.errs, fmt.Errorf("delete fdb %s -> %s: %w", mac, dst, err))
		return false
	}
	w.ch.FDBs++
	return true
}

func applyVXLANPeers(k neighKernel, idx int, neighs []desired.Neighbor, fdbs []desired.FDB, rec *VXLANRecord) (VXLANChanges, error) {
	w := lockPeers(k, idx, rec)
	defer w.done()
	if err := w.neighbors(neighs); err != nil {
		return w.ch, err
	}
	if err := w.fdbs(fdbs); err != nil {
		return w.ch, errors.Join(append(w.errs, err)...)
	}
	return w.ch, errors.Join(w.errs...)
}

// neighbors makes the device's neighbors those of neighs. The kernel keys
// them by IP. A peer whose MAC changed is replaced in place; the stale
// ones deleted (by IP) are only those of an IP no Node asks for, so a
// delete never takes a new entry along. The error is the listing's.
func (w *peerWrite) neighbors(neighs []desired.Neighbor) error {
	have := map[netip.Addr]netlink.Neigh{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		cur, err := w.k.NeighList(w.idx, fam)
		if err != nil {
			return fmt.Errorf("list neighbors of %s: %w", desired.VXLANDevice, err)
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
			w.rec.setNeigh(n.IP, mac.String()) // in place: ours now
			continue
		}
		last, wrote := w.rec.neigh[n.IP]
		if w.setNeigh(n.IP, mac) && wrote && (!ok || cur.HardwareAddr.String() != last) {
			w.ch.RepairedNeighbors++
		}
	}
	for ip, c := range have { // permanent entries no Node asks for
		w.delNeigh(ip, c.Family, c.IP)
	}
	return nil
}

// fdbs makes the device's FDB entries those of fdbs. The kernel keys an
// entry by MAC, with a list of remote destinations. The desired one is
// set first (replacing a wrong destination in place), then the other
// destinations of that MAC go, each deleted by MAC and destination: never
// the desired one. The error is the listing's.
func (w *peerWrite) fdbs(fdbs []desired.FDB) error {
	list, err := w.k.NeighList(w.idx, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("list FDB of %s: %w", desired.VXLANDevice, err)
	}
	have := map[string][]netlink.Neigh{}
	for _, c := range list {
		if c.IP == nil || c.HardwareAddr == nil {
			continue
		}
		have[c.HardwareAddr.String()] = append(have[c.HardwareAddr.String()], c)
	}
	for _, f := range fdbs {
		mac, _ := net.ParseMAC(f.MAC)
		cur := have[mac.String()]
		delete(have, mac.String())
		w.fdb(f.Dst, mac, cur)
	}
	for mac, cur := range have { // entries no Node asks for
		for _, c := range cur {
			w.delFDB(c.HardwareAddr, c.IP)
		}
		w.rec.setFDB(mac, netip.Addr{})
	}
	return nil
}

// fdb makes the entry mac, which holds cur, lead to dst alone.
func (w *peerWrite) fdb(dst netip.Addr, mac net.HardwareAddr, cur []netlink.Neigh) {
	at := func(c netlink.Neigh, dst netip.Addr) bool {
		ip, _ := netip.AddrFromSlice(c.IP)
		return ip.Unmap() == dst
	}
	if !(len(cur) == 1 && at(cur[0], dst) && cur[0].State == netlink.NUD_PERMANENT) {
		if !w.setFDB(mac, dst) {
			return
		}
		// a repair when the entry last written is not there as it was
		// (the plan unchanged: any difference; moved: the old
		// destination gone or not permanent)
		if last, wrote := w.rec.fdb[mac.String()]; wrote && (last == dst || !slices.ContainsFunc(cur, func(c netlink.Neigh) bool {
			return at(c, last) && c.State == netlink.NUD_PERMANENT
		})) {
			w.ch.RepairedFDBs++
		}
	}
	w.rec.setFDB(mac.String(), dst)
	for _, c := range cur {
		if !at(c, dst) {
			w.delFDB(c.HardwareAddr, c.IP)
		}
	}
}

func applyVXLANDelta(k neighKernel, idx int, setNeigh, delNeigh []desired.Neighbor, addFDB, delFDB []desired.FDB, rec *VXLANRecord) error {
	w := lockPeers(k, idx, rec)
	defer w.done()
	for _, n := range delNeigh {
		w.delNeigh(n.IP, familyOf(n.IP.AsSlice()), n.IP.AsSlice())
	}
	for _, f := range delFDB {
		mac, _ := net.ParseMAC(f.MAC)
		if w.delFDB(mac, f.Dst.AsSlice()) && w.rec.fdb[mac.String()] == f.Dst {
			w.rec.setFDB(mac.String(), netip.Addr{})
		}
	}
	for _, n := range setNeigh {
		mac, _ := net.ParseMAC(n.MAC)
		w.setNeigh(n.IP, mac)
	}
	for _, f := range addFDB {
		mac, _ := net.ParseMAC(f.MAC)
		if w.setFDB(mac, f.Dst) {
			w.rec.setFDB(mac.String(), f.Dst)
		}
	}
	return errors.Join(w.errs...)
}
