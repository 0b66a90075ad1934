// Route writes: the main table read once and indexed, and the delta
// written against it (a full apply, or one Node's change).

package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
)

// routeKernel is what route apply needs from the kernel: the seam that
// lets the delta logic be unit-tested (and its writes counted) without
// root. netlinkRoutes is the real one.
type routeKernel interface {
	// ListMain dumps the main routing table, every protocol, both families.
	ListMain() ([]netlink.Route, error)
	Replace(r *netlink.Route) error
	// Add creates r and fails with EEXIST when any route holds its
	// destination (NLM_F_EXCL).
	Add(r *netlink.Route) error
	Delete(r *netlink.Route) error
	LinkIndex(name string) (int, error)
	LinkName(index int) string
}

// netlinkRoutes is routeKernel on the current netns, through one netlink
// socket kept for the whole apply (netlink's package functions open,
// bind and close a socket for every request: most of the cost of writing
// thousands of routes).
type netlinkRoutes struct {
	h     netlinksafe.Handle
	names map[int]string
}

func (k netlinkRoutes) ListMain() ([]netlink.Route, error) {
	routes, err := k.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list the main routing table: %w", err)
	}
	return routes, nil
}
func (k netlinkRoutes) Replace(r *netlink.Route) error { return k.h.RouteReplace(r) }
func (k netlinkRoutes) Add(r *netlink.Route) error     { return k.h.RouteAdd(r) }
func (k netlinkRoutes) Delete(r *netlink.Route) error  { return k.h.RouteDel(r) }
func (k netlinkRoutes) LinkIndex(name string) (int, error) {
	l, err := k.h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}
func (k netlinkRoutes) LinkName(index int) string {
	if name, ok := k.names[index]; ok {
		return name
	}
	name := ""
	if l, err := k.h.LinkByIndex(index); err == nil {
		name = l.Attrs().Name
	}
	k.names[index] = name
	return name
}

// withRoutes runs f with a netlinkRoutes on the current netns.
func withRoutes(f func(netlinkRoutes) error) error {
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer h.Close()
	return f(netlinkRoutes{h: h, names: map[int]string{}})
}

// routeTable is the main table as route apply knows it, indexed by
// destination: the routes podnet-routed owns, and which destinations
// another protocol holds.
type routeTable struct {
	owned   map[netip.Prefix]desired.Route
	foreign map[netip.Prefix]netlink.RouteProtocol
	// oldBlackholes are podnet blackholes without contract.BlackholeMetric
	// (made by an older podnet-routed, which shadowed podnet0's connected
	// route): write deletes them once the new one is in.
	oldBlackholes []netlink.Route
}

// readRoutes dumps the main table once.
func readRoutes(k routeKernel) (*routeTable, error) {
	routes, err := k.ListMain()
	if err != nil {
		return nil, err
	}
	t := &routeTable{owned: map[netip.Prefix]desired.Route{}, foreign: map[netip.Prefix]netlink.RouteProtocol{}}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		dst, ok := netipPrefix(r.Dst)
		if !ok {
			continue
		}
		if r.Protocol != contract.RouteProtocol {
			t.foreign[dst] = r.Protocol
			continue
		}
		if r.Type == unix.RTN_BLACKHOLE && r.Priority != contract.BlackholeMetric && contract.IsRoutedRoute(&r) {
			t.oldBlackholes = append(t.oldBlackholes, r)
			continue
		}
		if dr, ok := ownedRoute(k, r, dst); ok {
			t.owned[dst] = dr
		}
	}
	return t, nil
}

// ownedRoute converts a podnet-protocol route to a desired.Route when it
// is podnet-routed's (contract.IsRoutedRoute): a blackhole or a route via
// a gateway. The plugin's pod host routes carry the same protocol but are
// the pods': pruning one would cut its pod off.
func ownedRoute(k routeKernel, r netlink.Route, dst netip.Prefix) (desired.Route, bool) {
	if !contract.IsRoutedRoute(&r) {
		return desired.Route{}, false
	}
	dr := desired.Route{Dst: dst}
	if r.Type == unix.RTN_BLACKHOLE {
		dr.Kind = desired.Blackhole
		return dr, true
	}
	dr.Gw, _ = netip.AddrFromSlice(r.Gw)
	dr.Gw = dr.Gw.Unmap()
	dr.OnLink = r.Flags&int(netlink.FLAG_ONLINK) != 0
	dr.Dev = k.LinkName(r.LinkIndex)
	return dr, true
}

// OwnedRoutes lists the routes podnet-routed manages: podnet's protocol in
// the main table, blackholes and routes via a gateway, sorted.
func OwnedRoutes() ([]desired.Route, error) {
	var t *routeTable
	err := withRoutes(func(k netlinkRoutes) (err error) {
		t, err = readRoutes(k)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]desired.Route, 0, len(t.owned))
	for _, r := range t.owned {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b desired.Route) int { return strings.Compare(a.Dst.String(), b.Dst.String()) })
	return out, nil
}

// ApplyRoutes makes podnet-routed's routes equal to want and writes only
// what differs (nothing when nothing changed). With dump, or when cache holds
// nothing valid, it reads the main table first (one dump, indexed by
// destination); otherwise it trusts cache. It returns how many routes it
// changed and how many of its routes are programmed afterwards.
func ApplyRoutes(want []desired.Route, cache *RouteCache, dump bool) (changed, programmed int, err error) {
	err = withRoutes(func(k netlinkRoutes) (err error) {
		changed, programmed, err = applyRoutes(k, want, cache, dump)
		return err
	})
	return changed, programmed, err
}

// ApplyRouteDelta writes upsert and deletes remove (routes of one Node's
// change) against the cache, reading the table only when the cache holds
// nothing valid: a Node event costs the routes of that Node.
func ApplyRouteDelta(upsert, remove []desired.Route, cache *RouteCache) (changed, programmed int, err error) {
	err = withRoutes(func(k netlinkRoutes) (err error) {
		changed, programmed, err = applyRouteDelta(k, upsert, remove, cache)
		return err
	})
	return changed, programmed, err
}

func applyRoutes(k routeKernel, want []desired.Route, cache *RouteCache, dump bool) (changed, programmed int, err error) {
	if cache == nil {
		cache = &RouteCache{}
	}
	cache.mu.Lock()
	defer cache.mu.Unlock()
	t, err := cache.load(k, dump)
	if err != nil {
		return 0, 0, err
	}
	wanted := make(map[netip.Prefix]bool, len(want))
	var upsert, remove []desired.Route
	for _, r := range want {
		wanted[r.Dst] = true
		if cur, ok := t.owned[r.Dst]; !ok || cur != r {
			upsert = append(upsert, r)
		} else {
			cache.wrote(r) // in place already (a previous run's): ours now
		}
	}
	for dst, r := range t.owned {
		if !wanted[dst] {
			remove = append(remove, r)
		}
	}
	return cache.write(k, t, upsert, remove)
}

func applyRouteDelta(k routeKernel, upsert, remove []desired.Route, cache *RouteCache) (changed, programmed int, err error) {
	cache.mu.Lock()
	defer cache.mu.Unlock()
	t, err := cache.load(k, false)
	if err != nil {
		return 0, 0, err
	}
	up := upsert[:0:0]
	for _, r := range upsert {
		if cur, ok := t.owned[r.Dst]; !ok || cur != r {
			up = append(up, r)
		}
	}
	var rm []desired.Route
	for _, r := range remove {
		if _, ok := t.owned[r.Dst]; ok {
			rm = append(rm, r)
		}
	}
	return cache.write(k, t, up, rm)
}

// load returns the table to apply against: the cached one, or a new dump.
// The caller holds c.mu.
func (c *RouteCache) load(k routeKernel, dump bool) (*routeTable, error) {
	if !dump && c.table != nil {
		return c.table, nil
	}
	c.table = nil
	t, err := readRoutes(k)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// write deletes remove and creates or replaces upsert, keeping t equal to
// what the kernel then holds. A route of another protocol is never
// replaced: a destination known to be foreign is reported, and one podnet
// does not own is only ever created exclusively (NLM_F_EXCL), so a route
// that appeared unseen makes the create fail (and is reported) instead of
// being overwritten. After any failure the cache is dropped: the next
// apply reads the kernel. The caller holds c.mu.
func (c *RouteCache) write(k routeKernel, t *routeTable, upsert, remove []desired.Route) (changed, programmed int, err error) {
	c.table = nil // valid again only if every write below succeeds
	var errs []error
	for _, r := range remove {
		if err := k.Delete(kernelRoute(r, 0)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
			continue
		}
		changed++
		delete(t.owned, r.Dst)
		c.forget(r.Dst)
	}
	links := map[string]int{}
	for _, r := range upsert {
		// A blackhole goes under any other route to its destination
		// (contract.BlackholeMetric): podnet0's connected route to the
		// node's PodCIDR holds it already in bridge mode.
		if proto, held := t.foreign[r.Dst]; held && r.Kind != desired.Blackhole {
			errs = append(errs, foreignError(r, proto))
			continue
		}
		idx := 0
		if r.Kind != desired.Blackhole {
			if _, ok := links[r.Dev]; !ok {
				i, err := k.LinkIndex(r.Dev)
				if err != nil {
					errs = append(errs, fmt.Errorf("route %s: device: %w", r, err))
					continue
				}
				links[r.Dev] = i
			}
			idx = links[r.Dev]
		}
		kr := kernelRoute(r, idx)
		write := k.Add
		cur, ours := t.owned[r.Dst]
		if ours {
			write = k.Replace // ours: change it in place
		}
		// a repair when the kernel no longer holds what was written
		// there last, whatever the plan wants now
		last, written := c.written[r.Dst]
		repair := written && (!ours || cur != last)
		if err := write(kr); err != nil {
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("a route to %s that is not podnet-routed's exists (it appeared after the last read of the routing table); leaving it alone", r.Dst)
			}
			errs = append(errs, fmt.Errorf("install route %s: %w", r, err))
			continue
		}
		changed++
		t.owned[r.Dst] = r
		c.wrote(r)
		if repair {
			c.repaired = append(c.repaired, r.Dst)
		}
	}
	// An older podnet-routed's blackholes, after the new ones are in (at
	// the highest metric, so that podnet0's connected route wins).
	for _, old := range t.oldBlackholes {
		if err := k.Delete(&old); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete blackhole %s of an older podnet-routed: %w", old.Dst, err))
			continue
		}
		changed++
	}
	t.oldBlackholes = nil
	if len(errs) == 0 {
		c.table = t
	}
	return changed, len(t.owned), errors.Join(errs...)
}

func foreignError(r desired.Route, proto netlink.RouteProtocol) error {
	return fmt.Errorf("install route %s: a route to %s with protocol %d (not podnet's) exists; leaving it alone", r, r.Dst, proto)
}

func kernelRoute(r desired.Route, linkIndex int) *netlink.Route {
	kr := &netlink.Route{Dst: prefixNet(r.Dst), Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if r.Kind == desired.Blackhole {
		kr.Type = unix.RTN_BLACKHOLE
		kr.Priority = contract.BlackholeMetric
		return kr
	}
	kr.LinkIndex = linkIndex
	kr.Gw = r.Gw.AsSlice()
	if r.OnLink {
		kr.Flags = int(netlink.FLAG_ONLINK)
	}
	return kr
}
