package daemon

// Repairs: how the daemon tells a repair (the kernel or node.json no
// longer holds what it put there: deleted or edited by someone else) from
// a change of plan, and counts each in podnet_repairs_total{object}.
// Routes and VXLAN entries are judged one by one against what was last
// written (dataplane.RouteCache, dataplane.VXLANRecord), whatever
// triggered the apply; what goes with a link that goes down or away is
// the link's event.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
)

// Objects of podnet_repairs_total.
const (
	RepairRoute         = "route" // routes and blackholes
	RepairTunnelDevice  = dataplane.FixTunnelDevice
	RepairVXLANNeighbor = "vxlan-neighbor"
	RepairVXLANFDB      = "vxlan-fdb"
	RepairSysctl        = dataplane.FixSysctl
	RepairNFTTable      = "nft-table"
	RepairNodeState     = "node-state" // node.json deleted or edited
	// the plugins' pod filter (internal/podfilter): the plugins write it,
	// podnet-routed writes it whole again when someone damages it
	RepairPodFilter = "pod-filter"
	// a live pod's host route and host veth sysctls, put back by the
	// leak reconcile (routed/reconcile)
	RepairPodRoute  = "pod-route"
	RepairPodSysctl = "pod-sysctl"
)

// RepairObjects are the label values of podnet_repairs_total, all exported
// from the start (at 0).
var RepairObjects = []string{RepairRoute, RepairTunnelDevice, RepairVXLANNeighbor, RepairVXLANFDB, RepairSysctl, RepairNFTTable, RepairNodeState, RepairPodFilter, RepairPodRoute, RepairPodSysctl}

func newRepairsTotal() *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "podnet_repairs_total",
		Help: "Objects podnet-routed owns that it found deleted or edited and put back, by object."}, []string{"object"})
	for _, o := range RepairObjects {
		v.WithLabelValues(o)
	}
	return v
}

func newSysctlErrorsTotal() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "podnet_sysctl_errors_total",
		Help: "Sysctls podnet-routed could not set (a read-only /proc/sys), by name, per apply; the apply goes on without them."}, []string{"name"})
}

// repairState is what the daemon remembers to tell repairs from changes.
type repairState struct {
	// setupKey is the device configuration of the last Setup: what a
	// Setup with the same configuration fixes was broken behind the
	// daemon's back (the first Setup of a configuration builds).
	setupKey string
}

// setup runs the dataplane's Setup, counts what it repaired and the
// sysctls it could not set, and tells whether the routes cache must be
// read again (the tunnel device was re-created or brought up: the kernel
// dropped its routes silently). A sysctl failure is no error; a device
// failure is, and the caller goes on with what does not need the device.
func (d *Daemon) setup(self desired.Node, vteps []netip.Prefix, underlay netlink.Link) (reset bool, err error) {
	res, err := d.dp.Setup(self, vteps)
	for _, e := range res.SysctlErrors {
		d.metrics.SysctlErrors.WithLabelValues(e.Setting.DisplayName()).Inc()
	}
	if slices.ContainsFunc(res.Fixes, func(f dataplane.Fix) bool { return f.Object == RepairTunnelDevice }) {
		// a device changed (its MAC, say) has the kernel flush its
		// neighbor entries: writing them back is that device's repair
		d.vxlanRec.Forget()
	}
	key := fmt.Sprint(self.IP, self.PodCIDRs, vteps, underlay.Attrs().Index, d.dp.OverlayMTU(underlay))
	if key == d.repairs.setupKey {
		for _, f := range res.Fixes {
			d.countRepair(f.Object, 1, f.What)
		}
	}
	d.repairs.setupKey = key
	if err != nil {
		err = fmt.Errorf("tunnel device: %w", err)
	}
	return res.DeviceReset, err
}

// countRepair adds n repairs of object.
func (d *Daemon) countRepair(object string, n int, what string) {
	if n <= 0 {
		return
	}
	d.metrics.ObjectRepairs.WithLabelValues(object).Add(float64(n))
	d.log.Info("repaired", "object", object, "count", n, "what", what)
}

// newPodFilterConn is repairPodFilter's socket: lasting, with room for
// the acknowledgements of a whole write.
func newPodFilterConn() nftutil.Conn {
	return nftutil.Conn{Timeout: 10 * time.Second, ReceiveBuffer: podfilter.ReceiveBuffer}
}

// repairPodFilter checks the plugins' pod filter of each mode against the
// records of the ports it guards (internal/podfilter) and, when anything
// is missing or changed (the table, a chain, a rule, a set, a counter, an
// element: `nft delete table`, `nft flush ruleset`, a firewall reload),
// writes it whole again, every live pod's elements with it. A check that
// finds the filter as it should be counts nothing.
func (d *Daemon) repairPodFilter() {
	d.podFilterMu.Lock()
	defer d.podFilterMu.Unlock()
	for _, g := range []podfilter.Guard{podfilter.Routed, podfilter.Bridged} {
		g = g.At(d.cfg.StateDir)
		var why string
		var refused []string
		c, err := d.podFilterConn.Open()
		if err == nil {
			if why, refused, err = g.RepairOn(c); err != nil {
				d.podFilterConn.Close() // whatever it was in the middle of
			}
		}
		seen := map[string]bool{}
		for _, r := range refused {
			key := g.Mode() + " " + r
			if !d.podFilterRefused[key] {
				d.log.Warn("pod filter record refused", "mode", g.Mode(), "why", r)
			}
			seen[key] = true
		}
		for key := range d.podFilterRefused { // logged again if it comes back
			if strings.HasPrefix(key, g.Mode()+" ") && !seen[key] {
				delete(d.podFilterRefused, key)
			}
		}
		if d.podFilterRefused == nil {
			d.podFilterRefused = map[string]bool{}
		}
		for key := range seen {
			d.podFilterRefused[key] = true
		}
		if err != nil {
			d.log.Warn("cannot check the plugins' pod filter", "mode", g.Mode(), "err", err)
			continue
		}
		if why != "" {
			d.countRepair(RepairPodFilter, 1, "the pod filter ("+g.String()+"): "+why)
		}
	}
}

// countRouteRepairs counts the routes the last write put back because
// the kernel no longer held what podnet-routed had written there
// (dataplane.RouteCache.TakeRepairs): deleted or edited by someone else.
// A route that changes with the plan (a Node, this node's network, a
// resync that finds a new verdict) or that went with its link is not
// one, whatever triggered the apply.
func (d *Daemon) countRouteRepairs() {
	dsts := d.routes.TakeRepairs()
	if len(dsts) == 0 {
		return
	}
	d.metrics.Repairs.Inc()
	d.countRepair(RepairRoute, len(dsts), fmt.Sprint("routes and blackholes ", dsts))
}

// countStateRepair counts node.json written back: readErr is why the
// file did not hold what the daemon wrote there before (nil: edited).
func (d *Daemon) countStateRepair(readErr error) {
	why := "node.json edited"
	if errors.Is(readErr, nodestate.ErrNotReady) {
		why = "node.json deleted"
	} else if readErr != nil {
		why = "node.json unreadable: " + readErr.Error()
	}
	d.countRepair(RepairNodeState, 1, why)
}
