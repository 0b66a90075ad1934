// Why the loop applies: Node changes, repairs, link changes and service
// ranges are recorded and coalesce into one wake-up of the loop.

package daemon

import (
	"log/slog"

	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/routed/desired"
)

// reason is why the loop applies. The reasons trigger records are ordered
// by strength: a stronger one covers what a weaker one would apply, so
// that several pending at once come down to the strongest (takePending).
type reason uint8

const (
	reasonNone         reason = iota // nothing pending
	reasonNode                       // Nodes changed: apply those Nodes
	reasonServiceCIDRs               // the ServiceCIDR objects changed: apply everything
	reasonRepair                     // a podnet route was deleted or edited: apply everything from the cache
	reasonLinkChange                 // a link went down, up or away: dump the table, apply everything
	reasonResync                     // the periodic resync
	reasonInitialSync                // the first apply, once the informer has synced
)

// reasonNames are the reasons as logs say them.
var reasonNames = [...]string{
	reasonNone:         "",
	reasonNode:         "node",
	reasonServiceCIDRs: "service cidrs",
	reasonRepair:       "repair",
	reasonLinkChange:   "link change",
	reasonResync:       "periodic resync",
	reasonInitialSync:  "initial sync",
}

// String is the reason as logs say it ("trigger").
func (r reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// LogValue logs the reason by its name.
func (r reason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// nodeChanged records that a Node was added, changed or deleted, and kicks
// a reconcile.
func (d *Daemon) nodeChanged(obj any) {
	name := ""
	switch o := obj.(type) {
	case *desired.Record:
		name = o.Name
	case cache.DeletedFinalStateUnknown:
		name = o.Key // Nodes are cluster-scoped: the key is the name
	}
	d.dirtyMu.Lock()
	if d.dirty == nil {
		d.dirty = map[string]struct{}{}
	}
	d.dirty[name] = struct{}{}
	d.dirtyMu.Unlock()
	d.trigger(reasonNode)
}

// takeDirty returns the Nodes changed since the last call, and forgets
// them.
func (d *Daemon) takeDirty() (names map[string]struct{}) {
	d.dirtyMu.Lock()
	names, d.dirty = d.dirty, nil
	d.dirtyMu.Unlock()
	return names
}

// trigger records a reason to apply and wakes the loop.
func (d *Daemon) trigger(why reason) {
	d.dirtyMu.Lock()
	d.pending = max(d.pending, why)
	d.dirtyMu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default: // the loop is woken already; it will take this reason too
	}
}

// takePending returns the strongest reason recorded since the last call:
// a link change (dump the table and apply everything), a repair (apply
// everything from the cache), service ranges (apply everything), Node
// changes (apply those Nodes), or reasonNone when a full apply since has
// covered them all.
func (d *Daemon) takePending() (why reason) {
	d.dirtyMu.Lock()
	why, d.pending = d.pending, reasonNone
	d.dirtyMu.Unlock()
	return why
}
