// What changed of a rule since the last Flush, and how much of it the
// next Flush compiles again.

package policy

import (
	"net/netip"
	"slices"
)

// ruleDirt is what changed of a rule since the last Flush: whole, its
// peers are compiled again; else only its members changed, at the
// addresses touched, and its peers are patched there (patchPeers).
// ports: what a rule's named ports resolve against changed, at the
// addresses portsAt (ports false) or anywhere (ports true): for an
// ingress rule the pods its policy selects, for an egress rule the named
// ports of pods its peers hold.
type ruleDirt struct {
	whole, ports     bool
	touched, portsAt []netip.Addr
}

// dirt is the entry of rule i of chain id, made when missing.
func (c *Incremental) dirt(id string, i int) *ruleDirt {
	m := c.dirtyRule[id]
	if m == nil {
		m = map[int]*ruleDirt{}
		c.dirtyRule[id] = m
	}
	d := m[i]
	if d == nil {
		d = &ruleDirt{}
		m[i] = d
	}
	return d
}

// markRule notes that rule i of chain id is to be compiled again.
func (c *Incremental) markRule(id string, i int) {
	d := c.dirt(id, i)
	d.whole, d.touched = true, nil
}

// markPortsAt notes that the named ports of rule i of chain id are to be
// resolved again at the addresses of o and n (either nil).
func (c *Incremental) markPortsAt(id string, i int, o, n *entry) {
	d := c.dirt(id, i)
	if d.whole || d.ports {
		return
	}
	for _, e := range []*entry{o, n} {
		if e != nil {
			d.portsAt = append(d.portsAt, e.ips...)
		}
	}
}

// markMembers notes that the members of rule i of chain id changed at
// the addresses of o and n (either nil).
func (c *Incremental) markMembers(id string, i int, o, n *entry) {
	d := c.dirt(id, i)
	if d.whole {
		return
	}
	for _, e := range []*entry{o, n} {
		if e != nil {
			d.touched = append(d.touched, e.ips...)
		}
	}
}

// markInNamed notes that policy pk's ingress rules that name a port are
// to resolve them again against the pods it selects now: at the
// addresses of entries o and n (either nil), or everywhere (both nil).
func (c *Incremental) markInNamed(pk string, o, n *entry) {
	id := shortID(pk + "/" + string(Ingress))
	if c.cstate[id] == nil {
		c.dirtyPol[pk] = true // no chain yet: compiled whole
		return
	}
	for i, r := range c.parsedRules(pk)[dirIn] {
		if !slices.ContainsFunc(r.ports, func(p parsedPort) bool { return p.name != "" }) {
			continue
		}
		d := c.dirt(id, i)
		if o == nil && n == nil {
			d.ports, d.portsAt = true, nil
		}
		if d.ports {
			continue
		}
		for _, e := range []*entry{o, n} {
			if e != nil {
				d.portsAt = append(d.portsAt, e.ips...)
			}
		}
	}
}
