// The ordered writer: a whole plan or one Node's change written to the
// tunnel filter, the routes and podnet.vxlan's entries in the one order
// that keeps traffic flowing.

package dataplane

import (
	"errors"

	"github.com/podnet/podnet/routed/desired"
)

// Writer writes podnet-routed's desired state to the dataplane, always in
// this order: the tunnel filter lets a new Node's packets in before its
// route exists; then the routes; then the VXLAN entries; and the filter
// drops a gone Node's packets only once its route is gone. A step that
// fails does not stop the ones after it (one route that cannot be
// installed, a foreign route holding a remote PodCIDR or a gateway not
// reachable yet, must not keep the rest of the node from working): the
// errors are reported together.
type Writer struct {
	Table  *Table
	Routes *RouteCache
	// VXLAN is what was written to podnet.vxlan; its entries are written
	// only with Encap VXLAN.
	VXLAN *VXLANRecord
	Encap desired.Encap
}

// Change is what one Write writes: a whole plan (Full) or the change of
// some Nodes (Delta).
type Change interface {
	// the steps, in the order Write runs them
	admit(w Writer, res *Written) error
	routes(w Writer, res *Written) error
	vxlan(w Writer, res *Written) error
	drop(w Writer) error
}

// Written is what one Write did.
type Written struct {
	// TableRepaired: the filter's full write found the kernel's table
	// changed behind podnet-routed's back and wrote it again.
	TableRepaired bool
	// RoutesWritten: the change had routes to write (a Delta may have
	// none); Changed of them were written, Programmed of podnet-routed's
	// routes are in the kernel afterwards.
	RoutesWritten       bool
	Changed, Programmed int
	// VXLAN counts the entries a Full wrote or deleted.
	VXLAN VXLANChanges
	// the steps' errors: admit, routes, vxlan, drop
	errs [4]error
}

// Filter is the tunnel filter's error (the nft table's): this node's own.
func (r Written) Filter() error { return errors.Join(r.errs[0], r.errs[3]) }

// Remote is the routes' and VXLAN entries' error: what the other Nodes
// need.
func (r Written) Remote() error { return errors.Join(r.errs[1], r.errs[2]) }

// Err is every error of the write, in the order of the steps.
func (r Written) Err() error { return errors.Join(r.errs[:]...) }

// Write writes c in the Writer's order.
func (w Writer) Write(c Change) Written {
	var res Written
	res.errs[0] = c.admit(w, &res)
	res.errs[1] = c.routes(w, &res)
	if w.Encap == desired.VXLAN {
		res.errs[2] = c.vxlan(w, &res)
	}
	res.errs[3] = c.drop(w)
	return res
}

// Full is a whole plan: the nft table (Spec) written whole, which both
// admits and drops peers; every route; every VXLAN entry.
type Full struct {
	Spec TableSpec
	// Verify reads the kernel's table back (and writes it again when it
	// differs) even when Spec is what was written last.
	Verify bool
	Routes []desired.Route
	// DeviceReset: the tunnel device was created, re-created or brought
	// up since the routes were read. Its routes went with it, silently
	// (writing them back is the device's repair, not the routes'): the
	// routes are read again, and what was written through the device
	// and to podnet.vxlan is forgotten.
	DeviceReset bool
	Neighbors   []desired.Neighbor
	FDBs        []desired.FDB
	// SkipVXLAN: podnet.vxlan was not set up (no underlay): its entries
	// are left alone.
	SkipVXLAN bool
}

func (f Full) admit(w Writer, res *Written) error {
	repaired, err := w.Table.Apply(f.Spec, f.Verify)
	res.TableRepaired = repaired && err == nil
	return err
}

func (f Full) routes(w Writer, res *Written) (err error) {
	if f.DeviceReset {
		w.Routes.ForgetDevice(desired.TunnelDevice)
		w.Routes.ForgetDevice(desired.VXLANDevice)
		w.VXLAN.Forget()
	}
	res.RoutesWritten = true
	res.Changed, res.Programmed, err = ApplyRoutes(f.Routes, w.Routes, f.DeviceReset)
	return err
}

func (f Full) vxlan(w Writer, res *Written) (err error) {
	if f.SkipVXLAN {
		return nil
	}
	res.VXLAN, err = ApplyVXLANPeers(f.Neighbors, f.FDBs, w.VXLAN)
	return err
}

func (Full) drop(Writer) error { return nil } // Spec's write dropped them

// Delta is the change of some Nodes (desired.Plan.Update), written
// without reading what else the kernel holds.
type Delta desired.Delta

func (d Delta) admit(w Writer, _ *Written) error { return w.Table.AddPeers(d.AddPeers, d.AddRemote) }

func (d Delta) routes(w Writer, res *Written) (err error) {
	if len(d.Upsert)+len(d.Remove) == 0 { // a VXLAN Node's move changes its FDB entry only
		return nil
	}
	res.RoutesWritten = true
	res.Changed, res.Programmed, err = ApplyRouteDelta(d.Upsert, d.Remove, w.Routes)
	return err
}

func (d Delta) vxlan(w Writer, _ *Written) error {
	return ApplyVXLANDelta(d.SetNeighbors, d.DelNeighbors, d.AddFDBs, d.DelFDBs, w.VXLAN)
}

func (d Delta) drop(w Writer) error { return w.Table.RemovePeers(d.DelPeers, d.DelRemote) }
