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
// with it (linkMatters).
func (d *Daemon) watchLinks(ctx context.Context, first chan struct{}) {
	watch(ctx, d.log, "link", first, func() {}, func(ch chan netlink.LinkUpdate, done chan struct{}, onErr func(error)) error {
		return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr})
	}, func(u netlink.LinkUpdate) {
		if linkMatters(u) {
			if u.Header.Type == unix.RTM_DELLINK || u.IfInfomsg.Flags&unix.IFF_UP == 0 {
				// the kernel drops the link's routes with it: putting
				// them back is no route repair
				d.routes.ForgetDevice(u.Link.Attrs().Name)
				if u.Link.Attrs().Name == desired.VXLANDevice {
					d.vxlanRec.Forget()
				}
			}
			d.trigger(reasonLinkChange)
		}
	})
}

// linkMatters tells whether a link notification calls for a full apply:
// a link deleted (the tunnel device), or one that went down or up (the
// kernel flushes the routes of a link that goes down, without a route
// notification; when the underlay comes back its routes must be put
// back). Pods' host veths are the plugin's; a link being created, or
// changing something else (MTU, address, statistics), has no routes to
// lose; podnet's own tunnel device coming up is the daemon's own doing
// (the apply that follows its going down brings it up).
func linkMatters(u netlink.LinkUpdate) bool {
	if u.Link == nil || contract.IsHostVeth(u.Link.Attrs().Name) {
		return false
	}
	if u.Header.Type == unix.RTM_DELLINK {
		return true
	}
	const created = ^uint32(0)
	change := u.IfInfomsg.Change
	if change == created || change&(unix.IFF_UP|unix.IFF_LOWER_UP|unix.IFF_RUNNING) == 0 {
		return false
	}
	name := u.Link.Attrs().Name
	own := name == desired.VXLANDevice || name == desired.TunnelDevice
	return !own || u.IfInfomsg.Flags&unix.IFF_UP == 0
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
