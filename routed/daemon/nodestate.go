// This node's own state as the plugins and /readyz see it: node.json
// (PodCIDRs, MTU, or why the Node cannot be used) and the self problem.

package daemon

import (
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/routed/desired"
)

// setSelfProblem records why this node's own Node cannot be used ("": it
// can), for /readyz, and logs each change.
func (d *Daemon) setSelfProblem(p string) {
	if old := d.selfProblem.Swap(p); old != p {
		if p != "" {
			d.log.Error("this node's own Node cannot be used: no blackhole, node.json says why; routes to the other Nodes keep converging", "problem", p)
		} else if old != nil && old != "" {
			d.log.Info("this node's own Node is usable again")
		}
	}
}

// writeState publishes this node's PodCIDRs and MTU in node.json for the
// plugins, or, while this node's own Node cannot be used, why not (the
// plugins then refuse ADD with that text). It compares with the file on
// disk, so a node.json someone deleted or edited is written again.
func (d *Daemon) writeState(self *desired.Node, problem string, underlay netlink.Link) error {
	st := nodestate.State{NodeName: d.cfg.NodeName, Encap: string(d.cfg.Encap)}
	cur, err := nodestate.ReadFile(d.cfg.StateDir)
	switch {
	case self != nil:
		for _, p := range self.PodCIDRs {
			st.PodCIDRs = append(st.PodCIDRs, p.String())
		}
	case d.lastSelf != nil:
		// the PodCIDRs the pods here have their addresses from stay
		// beside the error: ADD is refused, DEL still releases
		st.Error = problem
		for _, p := range d.lastSelf.PodCIDRs {
			st.PodCIDRs = append(st.PodCIDRs, p.String())
		}
	default:
		st.Error = problem
		if err == nil { // restarted meanwhile: the file knows them
			st.PodCIDRs = cur.PodCIDRs
		}
	}
	if underlay != nil {
		st.MTU = d.dp.OverlayMTU(underlay)
	} else {
		st.MTU = d.lastState.MTU
	}
	if err == nil && cur.Equal(&st) {
		d.lastState = st
		return nil
	}
	if err := nodestate.Write(d.cfg.StateDir, &st); err != nil {
		return err
	}
	if d.lastState.Equal(&st) { // what it wrote before, deleted or edited since
		d.countStateRepair(err)
	}
	d.lastState = st
	d.log.Info("node state written", "path", nodestate.Path(d.cfg.StateDir), "podCIDRs", st.PodCIDRs, "mtu", st.MTU, "error", st.Error)
	return nil
}
