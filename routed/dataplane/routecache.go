// The routes cache: route apply's view of the main table between dumps,
// kept current by the route notifications.

package dataplane

import (
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
)

// RouteCache is route apply's view of the main table between dumps: what
// the last dump read, what applies wrote since, and what the route
// subscription reported since (Observe). Without a complete view (never
// dumped, a failed write, a lost notification: Invalidate) the next apply
// dumps again. The zero value is empty: the first apply dumps.
type RouteCache struct {
	mu    sync.Mutex
	table *routeTable
	// written is the route podnet-routed last wrote (or found in place
	// and kept) to each destination, kept across dumps: a route the
	// kernel then lacks or holds otherwise was deleted or edited behind
	// its back (a repair), while one that differs only from the new
	// plan is an ordinary change.
	written map[netip.Prefix]desired.Route
	// repaired are the destinations written back since TakeRepairs.
	repaired []netip.Prefix
	// devs counts the routes of written by device (blackholes have
	// none), under a lock of its own: the link watcher asks it (Carries)
	// while an apply holds mu.
	devMu sync.Mutex
	devs  map[string]int
}

// Carries tells whether a route podnet-routed wrote goes through the
// device name: its going down or away takes them with it.
func (c *RouteCache) Carries(name string) bool {
	c.devMu.Lock()
	defer c.devMu.Unlock()
	return c.devs[name] > 0
}

// TakeRepairs returns the destinations whose route was put back since
// the last call because the kernel no longer held what podnet-routed had
// written there (deleted or edited by someone else), and forgets them.
func (c *RouteCache) TakeRepairs() []netip.Prefix {
	c.mu.Lock()
	r := c.repaired
	c.repaired = nil
	c.mu.Unlock()
	return r
}

// ForgetDevice forgets what was written through the device name: the
// kernel drops a link's routes when it goes down or away, so writing them
// back is no repair of a route (the link's change is the event, and
// podnet's own tunnel device counts as a tunnel-device repair).
//
// The cached table goes too: the kernel flushed those routes without a
// notification, so the next apply reads the table again. An apply that
// used the view it read before the link went down would take them for in
// place, record them as written, and the apply after it would count
// their absence as repairs.
func (c *RouteCache) ForgetDevice(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.table = nil
	for dst, r := range c.written {
		if r.Kind != desired.Blackhole && r.Dev == name {
			c.forget(dst)
		}
	}
}

// wrote records r as what podnet-routed holds at its destination now.
// The caller holds c.mu.
func (c *RouteCache) wrote(r desired.Route) {
	if c.written == nil {
		c.written = map[netip.Prefix]desired.Route{}
	}
	c.forget(r.Dst)
	c.written[r.Dst] = r
	if r.Kind != desired.Blackhole {
		c.devMu.Lock()
		if c.devs == nil {
			c.devs = map[string]int{}
		}
		c.devs[r.Dev]++
		c.devMu.Unlock()
	}
}

// forget drops what was written to dst. The caller holds c.mu.
func (c *RouteCache) forget(dst netip.Prefix) {
	r, ok := c.written[dst]
	if !ok {
		return
	}
	delete(c.written, dst)
	if r.Kind != desired.Blackhole {
		c.devMu.Lock()
		if c.devs[r.Dev]--; c.devs[r.Dev] <= 0 {
			delete(c.devs, r.Dev)
		}
		c.devMu.Unlock()
	}
}

// Invalidate makes the next apply read the kernel again.
func (c *RouteCache) Invalidate() {
	c.mu.Lock()
	c.table = nil
	c.mu.Unlock()
}

// Observe keeps the cache current with one route notification of the
// main table and tells whether it removed a route podnet-routed wants
// (someone deleted it, or the kernel with its device): the caller then
// applies again, from the cache, to put it back. Notifications of routes
// podnet-routed wrote itself change nothing; a pod's host route is not
// routed's. A new route of another protocol marks its destination as
// foreign; when one goes, the destination is free again (a second foreign
// route on it would still make the exclusive create fail, never be
// overwritten).
func (c *RouteCache) Observe(u netlink.RouteUpdate) (lost bool) {
	del := u.Type == unix.RTM_DELROUTE
	if u.Table != unix.RT_TABLE_MAIN || u.Dst == nil {
		return false
	}
	if u.Protocol == contract.RouteProtocol && (!del || contract.IsPodHostRoute(&u.Route)) {
		// ours, just written (a burst of thousands after a full apply,
		// which must not wait for the lock that apply holds); or a
		// pod's host route
		return false
	}
	dst, ok := netipPrefix(u.Dst)
	if !ok {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.table
	if u.Protocol != contract.RouteProtocol {
		if t != nil {
			if del {
				delete(t.foreign, dst)
			} else {
				t.foreign[dst] = u.Protocol
			}
		}
		return false
	}
	if t == nil {
		return true // nothing to compare with: let an apply dump and see
	}
	if u.Route.Type == unix.RTN_BLACKHOLE && u.Priority != contract.BlackholeMetric {
		return false // an old blackhole, which write deletes
	}
	if _, ok := t.owned[dst]; !ok {
		return false // we deleted it
	}
	delete(t.owned, dst)
	return true
}
