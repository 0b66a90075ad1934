package allocator

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Owner is the attachment an address is reserved for.
type Owner struct {
	ContainerID string
	IfName      string
}

// Store keeps reservations. Every call happens under the store's lock
// (Allocator callers hold it for the whole verb). Lookups by owner and by
// address must not cost more as the store fills up; only All may scan.
type Store interface {
	// Reserve records ip for owner; false (and no error) when ip is
	// already reserved by anyone.
	Reserve(ip netip.Addr, owner Owner) (bool, error)
	// Release forgets ip; a missing reservation is not an error.
	Release(ip netip.Addr) error
	// OwnerOf returns ip's owner.
	OwnerOf(ip netip.Addr) (Owner, bool, error)
	// IPsOf returns what owner holds, from the owner index.
	IPsOf(owner Owner) ([]netip.Addr, error)
	// SetIPsOf writes the owner index entry; an empty list deletes it.
	SetIPsOf(owner Owner, ips []netip.Addr) error
	// All returns every reservation (a scan: GC and recovery only).
	All() (map[netip.Addr]Owner, error)
	// Owners returns every owner index entry (a scan: GC only).
	Owners() (map[Owner][]netip.Addr, error)
	// Hint returns the free-space hint of a range: a bitmap of the
	// addresses believed taken plus a cursor, kept by the store across
	// invocations. It may be stale; Reserve is the truth.
	Hint(r Range) (Hint, error)
}

// Hint is a possibly stale view of which offsets of a range are taken.
type Hint interface {
	// NextFree returns the first offset at or after from (wrapping
	// around) not marked taken; ok is false when all are marked.
	NextFree(from uint64) (uint64, bool)
	// Mark sets or clears the taken mark of offset.
	Mark(offset uint64, taken bool) error
	// Reset replaces all marks with taken.
	Reset(taken []uint64) error
	// Cursor is the offset after the last one handed out.
	Cursor() uint64
	SetCursor(uint64) error
}

// Errors the verbs map to CNI codes.
var (
	ErrExhausted   = errors.New("no free address")
	ErrUnavailable = errors.New("requested address unavailable")
)

// Allocator hands out addresses from range sets into a Store.
type Allocator struct {
	Sets    []RangeSet
	Exclude []netip.Prefix
	Store   Store
}

// Allocate returns owner's addresses, one per range set. When owner already
// holds addresses (an ADD repeated) they are returned unchanged. requested
// addresses, when given, must each fall in a distinct range set and be
// free.
func (a *Allocator) Allocate(owner Owner, requested []netip.Addr) ([]netip.Prefix, error) {
	held, err := a.Store.IPsOf(owner)
	if err != nil {
		return nil, err
	}
	if len(held) > 0 {
		return a.withPrefixes(held)
	}
	want, err := a.assignRequested(requested)
	if err != nil {
		return nil, err
	}
	var got []netip.Addr
	release := func() {
		for _, ip := range got {
			_ = a.Store.Release(ip)
			a.markFree(ip) // else the hint calls it taken and STATUS may say full
		}
	}
	for i, set := range a.Sets {
		var ip netip.Addr
		if want[i].IsValid() {
			ip, err = a.reserveRequested(set, want[i], owner)
		} else {
			ip, err = a.reserveNext(set, owner)
		}
		if err != nil {
			release()
			return nil, err
		}
		got = append(got, ip)
	}
	if err := a.Store.SetIPsOf(owner, got); err != nil {
		release()
		return nil, err
	}
	return a.withPrefixes(got)
}

// Release frees everything owner holds.
func (a *Allocator) Release(owner Owner) error {
	ips, err := a.Store.IPsOf(owner)
	if err != nil {
		return err
	}
	for _, ip := range ips {
		if o, ok, err := a.Store.OwnerOf(ip); err != nil {
			return err
		} else if ok && o != owner {
			continue // reused since; not ours any more
		}
		if err := a.Store.Release(ip); err != nil {
			return err
		}
		a.markFree(ip)
	}
	return a.Store.SetIPsOf(owner, nil)
}

// GC releases every reservation whose owner is not in valid, drops owner
// index entries that point nowhere, and rebuilds the hints. It returns the
// released addresses.
func (a *Allocator) GC(valid []Owner) ([]netip.Addr, error) {
	keep := make(map[Owner]bool, len(valid))
	for _, o := range valid {
		keep[o] = true
	}
	all, err := a.Store.All()
	if err != nil {
		return nil, err
	}
	owners, err := a.Store.Owners()
	if err != nil {
		return nil, err
	}
	var released []netip.Addr
	held := make(map[Owner][]netip.Addr)
	for ip, o := range all {
		if keep[o] {
			held[o] = append(held[o], ip)
			continue
		}
		if err := a.Store.Release(ip); err != nil {
			return released, err
		}
		released = append(released, ip)
	}
	// One address per range set: more means an ADD was killed between
	// Reserve and SetIPsOf and the same attachment was added again. Keep
	// what its index lists (what ADD returned), release the rest.
	for o, ips := range held {
		extra := a.extraPerSet(ips, owners[o])
		for _, ip := range extra {
			if err := a.Store.Release(ip); err != nil {
				return released, err
			}
			released = append(released, ip)
		}
		if len(extra) > 0 {
			held[o] = slices.DeleteFunc(ips, func(ip netip.Addr) bool { return slices.Contains(extra, ip) })
		}
	}
	for o, ips := range owners {
		if !slices.Equal(sorted(ips), sorted(held[o])) {
			if err := a.Store.SetIPsOf(o, held[o]); err != nil {
				return released, err
			}
		}
	}
	for o, ips := range held {
		if _, indexed := owners[o]; !indexed {
			if err := a.Store.SetIPsOf(o, ips); err != nil {
				return released, err
			}
		}
	}
	slices.SortFunc(released, netip.Addr.Compare)
	return released, a.rebuildHints(all, released)
}

// extraPerSet returns the addresses of ips beyond one per range set,
// keeping those listed in indexed first, then the lowest.
func (a *Allocator) extraPerSet(ips, indexed []netip.Addr) []netip.Addr {
	if len(ips) <= 1 {
		return nil
	}
	chosen := make(map[int]netip.Addr)
	var extra []netip.Addr
	for _, ip := range sorted(ips) {
		i, _, ok := a.find(ip)
		if !ok {
			continue // outside the configured ranges: left as it is
		}
		cur, has := chosen[i]
		switch {
		case !has:
			chosen[i] = ip
		case slices.Contains(indexed, ip) && !slices.Contains(indexed, cur):
			extra = append(extra, cur)
			chosen[i] = ip
		default:
			extra = append(extra, ip)
		}
	}
	return extra
}

// Usable reports whether every range set still has a free address.
func (a *Allocator) Usable() error {
	for i, set := range a.Sets {
		free := false
		for _, r := range set {
			h, err := a.Store.Hint(r)
			if err != nil {
				return err
			}
			_, ok := a.nextCandidate(r, h, h.Cursor(), r.Size())
			if !ok {
				// The hint says full: it may be stale (see
				// reserveNext). Rebuild it from the store once.
				if err := a.rebuildHint(r, h); err != nil {
					return err
				}
				_, ok = a.nextCandidate(r, h, h.Cursor(), r.Size())
			}
			if ok {
				free = true
				break
			}
		}
		if !free {
			return fmt.Errorf("range set %d (%s): %w", i, describe(set), ErrExhausted)
		}
	}
	return nil
}

// Contains reports whether ip is inside one of the ranges.
func (a *Allocator) Contains(ip netip.Addr) bool {
	_, _, ok := a.find(ip)
	return ok
}

func (a *Allocator) assignRequested(requested []netip.Addr) ([]netip.Addr, error) {
	want := make([]netip.Addr, len(a.Sets))
	for _, ip := range requested {
		i, _, ok := a.find(ip)
		if !ok {
			return nil, fmt.Errorf("%w: %s is outside the configured ranges", ErrUnavailable, ip)
		}
		if want[i].IsValid() {
			return nil, fmt.Errorf("%w: %s and %s are both requested from range set %d (one address per set)", ErrUnavailable, want[i], ip, i)
		}
		want[i] = ip
	}
	return want, nil
}

func (a *Allocator) reserveRequested(set RangeSet, ip netip.Addr, owner Owner) (netip.Addr, error) {
	r := set[slices.IndexFunc(set, func(r Range) bool { return r.Contains(ip) })]
	if !a.allowed(r, ip) {
		return netip.Addr{}, fmt.Errorf("%w: %s is a network, broadcast, gateway or excluded address", ErrUnavailable, ip)
	}
	ok, err := a.Store.Reserve(ip, owner)
	if err != nil {
		return netip.Addr{}, err
	}
	if !ok {
		holder, _, _ := a.Store.OwnerOf(ip)
		return netip.Addr{}, fmt.Errorf("%w: %s is already reserved by container %s (%s)", ErrUnavailable, ip, holder.ContainerID, holder.IfName)
	}
	a.mark(r, ip, true)
	return ip, nil
}

// reserveNext reserves the first free address after the set's cursor,
// trying the ranges in order and each from its cursor, so freed addresses
// are not reused at once.
func (a *Allocator) reserveNext(set RangeSet, owner Owner) (netip.Addr, error) {
	for _, r := range set {
		h, err := a.Store.Hint(r)
		if err != nil {
			return netip.Addr{}, err
		}
		for rebuilt := false; ; rebuilt = true {
			ip, ok, err := a.reserveFromHint(r, h, owner)
			if err != nil || ok {
				return ip, err
			}
			if rebuilt {
				break
			}
			// The hint says full: it may be stale (a crash between a
			// release and its mark). Rebuild it from the store once.
			if err := a.rebuildHint(r, h); err != nil {
				return netip.Addr{}, err
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("%w in %s", ErrExhausted, describe(set))
}

func (a *Allocator) reserveFromHint(r Range, h Hint, owner Owner) (netip.Addr, bool, error) {
	from := h.Cursor() % r.Size()
	budget := r.Size()
	for budget > 0 {
		off, ok := a.nextCandidate(r, h, from, budget)
		if !ok {
			return netip.Addr{}, false, nil
		}
		ip := r.At(off)
		reserved, err := a.Store.Reserve(ip, owner)
		if err != nil {
			return netip.Addr{}, false, err
		}
		if err := h.Mark(off, true); err != nil {
			return netip.Addr{}, false, err
		}
		if reserved {
			return ip, true, h.SetCursor((off + 1) % r.Size())
		}
		// Taken but not marked: the hint was stale; go on after it.
		consumed := (off + r.Size() - from) % r.Size()
		if consumed+1 >= budget {
			break
		}
		budget -= consumed + 1
		from = (off + 1) % r.Size()
	}
	return netip.Addr{}, false, nil
}

// nextCandidate finds the next offset the hint believes free that may be
// allocated, looking at most budget offsets from from.
func (a *Allocator) nextCandidate(r Range, h Hint, from, budget uint64) (uint64, bool) {
	for budget > 0 {
		off, ok := h.NextFree(from % r.Size())
		if !ok {
			return 0, false
		}
		step := (off + r.Size() - from%r.Size()) % r.Size()
		if step >= budget {
			return 0, false
		}
		ip := r.At(off)
		if a.allowed(r, ip) {
			return off, true
		}
		// A never-allocatable address (gateway, excluded): mark it so the
		// next search skips it at bitmap speed, and jump over the rest of
		// its excluded block at once (it may be huge in an IPv6 range).
		_ = h.Mark(off, true)
		last := a.blockedThrough(r, ip, off)
		consumed := step + (last - off) + 1
		if consumed >= budget {
			return 0, false
		}
		budget -= consumed
		from = last + 1
	}
	return 0, false
}

// blockedThrough returns the offset of the last address, from off on, that
// the exclusion covering ip (at off) still covers within r.
func (a *Allocator) blockedThrough(r Range, ip netip.Addr, off uint64) uint64 {
	last := off
	for _, p := range a.Exclude {
		if !p.Contains(ip) {
			continue
		}
		end := lastAddr(p.Masked())
		if end.Compare(r.End) > 0 {
			end = r.End
		}
		if o := r.Offset(end); o > last {
			last = o
		}
	}
	return last
}

func (a *Allocator) allowed(r Range, ip netip.Addr) bool {
	if ip == r.Gateway {
		return false
	}
	for _, p := range a.Exclude {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

func (a *Allocator) find(ip netip.Addr) (int, Range, bool) {
	for i, set := range a.Sets {
		for _, r := range set {
			if r.Contains(ip) {
				return i, r, true
			}
		}
	}
	return 0, Range{}, false
}

func (a *Allocator) mark(r Range, ip netip.Addr, taken bool) {
	if h, err := a.Store.Hint(r); err == nil {
		_ = h.Mark(r.Offset(ip), taken)
	}
}

func (a *Allocator) markFree(ip netip.Addr) {
	if _, r, ok := a.find(ip); ok {
		a.mark(r, ip, false)
	}
}

func (a *Allocator) rebuildHint(r Range, h Hint) error {
	all, err := a.Store.All()
	if err != nil {
		return err
	}
	return h.Reset(a.takenIn(r, all, nil))
}

func (a *Allocator) rebuildHints(all map[netip.Addr]Owner, released []netip.Addr) error {
	for _, set := range a.Sets {
		for _, r := range set {
			h, err := a.Store.Hint(r)
			if err != nil {
				return err
			}
			if err := h.Reset(a.takenIn(r, all, released)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *Allocator) takenIn(r Range, all map[netip.Addr]Owner, released []netip.Addr) []uint64 {
	var taken []uint64
	for ip := range all {
		if r.Contains(ip) {
			if _, gone := slices.BinarySearchFunc(released, ip, netip.Addr.Compare); !gone {
				taken = append(taken, r.Offset(ip))
			}
		}
	}
	return taken
}

// withPrefixes gives each address the prefix length of its subnet.
func (a *Allocator) withPrefixes(ips []netip.Addr) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ips))
	for _, ip := range ips {
		_, r, ok := a.find(ip)
		if !ok {
			return nil, fmt.Errorf("reserved address %s is no longer in the configured ranges", ip)
		}
		out = append(out, netip.PrefixFrom(ip, r.Subnet.Bits()))
	}
	return out, nil
}

// GatewayOf returns the gateway of the range holding ip.
func (a *Allocator) GatewayOf(ip netip.Addr) netip.Addr {
	_, r, _ := a.find(ip)
	return r.Gateway
}

func describe(set RangeSet) string {
	s := ""
	for i, r := range set {
		if i > 0 {
			s += ", "
		}
		s += r.String()
	}
	return s
}

func sorted(ips []netip.Addr) []netip.Addr {
	c := slices.Clone(ips)
	slices.SortFunc(c, netip.Addr.Compare)
	return c
}
