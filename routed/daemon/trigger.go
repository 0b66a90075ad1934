// Why the loop applies: Node changes, repairs, link changes and service
// ranges are recorded and coalesce into one wake-up of the loop.

package daemon

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// nodeChanged records that a Node was added, changed or deleted, and kicks
// a reconcile.
func (d *Daemon) nodeChanged(obj any) {
	name := ""
	switch o := obj.(type) {
	case *corev1.Node:
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
	d.trigger("node")
}

func (d *Daemon) takeDirty() map[string]struct{} {
	d.dirtyMu.Lock()
	defer d.dirtyMu.Unlock()
	names := d.dirty
	d.dirty = nil
	return names
}

// trigger records a reason to apply and wakes the loop.
func (d *Daemon) trigger(why string) {
	d.dirtyMu.Lock()
	if d.pending == nil {
		d.pending = map[string]bool{}
	}
	d.pending[why] = true
	d.dirtyMu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default: // the loop is woken already; it will take this reason too
	}
}

// takePending returns the strongest reason recorded since the last call:
// a link change (dump the table and apply everything), a repair (apply
// everything from the cache), Node changes (apply those Nodes), or ""
// when a full apply since has covered them all.
func (d *Daemon) takePending() string {
	d.dirtyMu.Lock()
	defer d.dirtyMu.Unlock()
	p := d.pending
	d.pending = nil
	for _, why := range []string{"link change", "repair", "service cidrs", "node"} {
		if p[why] {
			return why
		}
	}
	return ""
}
