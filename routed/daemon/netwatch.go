// The kernel's netlink notifications of routes and links, which keep
// the routes cache current and call for repairs.

package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
)

// watchRoutes keeps the routes cache current with the kernel's route
// notifications and kicks a reconcile whenever a route podnet-routed wants
// disappears (someone deleted it, or its device went away). A lost
// notification (a new subscription, an overflow) drops the cache: the
// next apply reads the table.
func (d *Daemon) watchRoutes(ctx context.Context, first chan struct{}) {
	watch(ctx, d.log, "route", first, d.routes.Invalidate, func(ch chan netlink.RouteUpdate, done chan struct{}, onErr func(error)) error {
		// a full apply writes thousands of routes in a burst: room for
		// their notifications (kernel memory, not the daemon's)
		return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{
			ErrorCallback: onErr, ReceiveBufferSize: 16 << 20, ReceiveBufferForceSize: true})
	}, func(u netlink.RouteUpdate) {
		if d.routes.Observe(u) {
			d.trigger(reasonRepair)
		}
	})
}

// watchLinks kicks a reconcile when a link change may have taken routes
// with it, or may let routes that could not be written be written now
// (linkMatters).
func (d *Daemon) watchLinks(ctx context.Context, first chan struct{}) {
	lw := linkWatch{carries: d.routes.Carries, retry: d.routesIncomplete.Load}
	watch(ctx, d.log, "link", first, func() {
		for _, o := range d.hostVeths {
			o.HostVethsLost()
		}
	}, func(ch chan netlink.LinkUpdate, done chan struct{}, onErr func(error)) error {
		return subscribeLinks(ch, done, onErr)
	}, func(u netlink.LinkUpdate) {
		for _, o := range d.hostVeths {
			o.HostVethUpdate(u)
		}
		matters, lost := lw.matters(u)
		if !matters {
			return
		}
		if lost {
			// the kernel drops the link's routes with it: putting
			// them back is no route repair
			d.routes.ForgetDevice(u.Link.Attrs().Name)
			if u.Link.Attrs().Name == desired.VXLANDevice {
				d.vxlanRec.Forget()
			}
		}
		d.trigger(reasonLinkChange)
	})
}

// HostVethObserver hears the node's link notifications, every one (a
// host veth renamed is heard under its new name, which may be any), and
// when notifications may have been lost (every subscription, a
// subscription error): what it heard before is then not to be trusted.
type HostVethObserver interface {
	HostVethUpdate(netlink.LinkUpdate)
	HostVethsLost()
}

// OnHostVeth adds o to the observers of host veth notifications; call it
// before Run.
func (d *Daemon) OnHostVeth(o HostVethObserver) *Daemon {
	d.hostVeths = append(d.hostVeths, o)
	return d
}

// linkWatch decides which link notifications call for a full apply.
// Its state is the watcher goroutine's own.
type linkWatch struct {
	// carries tells whether podnet-routed's routes go through a device
	// (dataplane.RouteCache.Carries); retry whether the last apply left
	// something unwritten (a route, a device).
	carries func(name string) bool
	retry   func() bool
	// tookRoutes are the links whose going down or away took
	// podnet-routed's routes: their coming up again puts them back.
	tookRoutes map[int]bool
}

// matters tells whether a link notification calls for a full apply, and
// whether the link's routes are gone with it (lost).
//
// A full apply (a route dump and a recompute) is due when:
//   - the link carries podnet-routed's routes (the underlay in `none`
//     mode and across subnets) and is deleted, goes down or loses or
//     regains its carrier: the kernel flushes a link's routes when it
//     goes down, without a route notification;
//   - podnet's own tunnel device is deleted or goes down (its coming up
//     is the apply's own doing);
//   - a link comes up whose going down took routes, or any link comes up
//     while the last apply left something unwritten (a gateway
//     unreachable until then).
//
// Any other link (a pod's host veth above all, another runtime's
// containers, a second CNI's pods) coming and going costs nothing: on a
// node that starts pods of another plugin, each of their veths' up and
// down would otherwise be a full apply. A link being created, or changing
// something else (MTU, address, statistics), has no routes to lose.
func (w *linkWatch) matters(u netlink.LinkUpdate) (matters, lost bool) {
	if u.Link == nil || contract.IsHostVeth(u.Link.Attrs().Name) {
		return false, false
	}
	name, index := u.Link.Attrs().Name, int(u.Index)
	if index == 0 {
		index = u.Link.Attrs().Index
	}
	own := name == desired.VXLANDevice || name == desired.TunnelDevice
	down := u.Header.Type == unix.RTM_DELLINK || u.IfInfomsg.Flags&unix.IFF_UP == 0
	if u.Header.Type != unix.RTM_DELLINK {
		const created = ^uint32(0)
		change := u.IfInfomsg.Change
		if change == created || change&(unix.IFF_UP|unix.IFF_LOWER_UP|unix.IFF_RUNNING) == 0 {
			return false, false
		}
	}
	carries := w.carries != nil && w.carries(name)
	if down {
		if carries {
			if w.tookRoutes == nil {
				w.tookRoutes = map[int]bool{}
			}
			w.tookRoutes[index] = true
		}
		if u.Header.Type == unix.RTM_DELLINK {
			delete(w.tookRoutes, index) // indexes are not handed out again
		}
		return own || carries, true
	}
	if own {
		return false, false
	}
	took := w.tookRoutes[index]
	delete(w.tookRoutes, index)
	return carries || took || (w.retry != nil && w.retry()), false
}

// watch keeps a netlink subscription open until ctx ends, resubscribing
// after errors, and hands every update to handle. lost is called whenever
// updates may have been missed: on every (re)subscription and error.
// first is closed after the first attempt to subscribe.
func watch[U any](ctx context.Context, log *slog.Logger, what string, first chan struct{}, lost func(),
	subscribe func(chan U, chan struct{}, func(error)) error, handle func(U)) {
	defer func() {
		select {
		case <-first:
		default:
			close(first)
		}
	}()
	for ctx.Err() == nil {
		updates := make(chan U, 256)
		done := make(chan struct{})
		lost()
		err := subscribe(updates, done, func(err error) {
			lost()
			log.Warn(what+" subscription error", "err", err)
		})
		select {
		case <-first:
		default:
			close(first)
		}
		if err != nil {
			log.Error("cannot subscribe to "+what+" changes; relying on periodic resync", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			continue
		}
	loop:
		for {
			select {
			case <-ctx.Done():
				close(done)
				return
			case u, ok := <-updates:
				if !ok {
					break loop
				}
				handle(u)
			}
		}
		close(done)
	}
}
