// The incremental compile's named ports, patched at the addresses that
// changed (an egress rule's members, the pods an ingress rule's policy
// selects). What disjointPorts makes of a rule's boxes is, for each
// protocol and family, port-major (portMajor): the numbered ports over
// the whole family, and each other port with the merged addresses that
// have it. Changing the named ports of one address adds or takes that
// address in the lists of the ports that changed, and nothing else.

package policy

import (
	"cmp"
	"net/netip"
	"slices"
)

// portGroup is a protocol and family of a rule's Ports.
type portGroup struct {
	proto uint8
	v4    bool
}

func (g portGroup) cmp(h portGroup) int {
	return cmp.Or(cmp.Compare(g.proto, h.proto), boolCmp(g.v4, h.v4))
}

func groupOf(p PortRange) portGroup { return portGroup{p.Proto, p.Addrs.From.Is4()} }

// patchNamedPorts is ports (rule r's, its named ports resolved as they
// were) with the named ports of each touched address resolved again: the
// named ports of the entry owner gives for the address (nil: none),
// which must own it: for an egress rule the pod that owns the address
// when the rule's peers hold it, for an ingress rule the one that owns it
// when the policy selects it. A new slice.
func (c *Incremental) patchNamedPorts(ports []PortRange, r *parsedRule, touched []netip.Addr, owner func(netip.Addr) *entry) []PortRange {
	var protos []uint8
	for _, p := range r.ports {
		if p.name != "" && !slices.Contains(protos, p.proto) {
			protos = append(protos, p.proto)
		}
	}
	changed := map[portGroup][]PortRange{}
	for _, a := range touched {
		for _, proto := range protos {
			g := portGroup{proto, a.Is4()}
			els, ok := changed[g]
			if !ok {
				lo, hi := groupBounds(ports, g)
				els = slices.Clone(ports[lo:hi])
			}
			changed[g] = setNamedAt(els, a, namedAt(r, proto, a, owner(a)), proto)
		}
	}
	out := make([]PortRange, 0, len(ports)+2*len(touched))
	groups := slices.SortedFunc(func(yield func(portGroup) bool) {
		for g := range changed {
			if !yield(g) {
				return
			}
		}
	}, portGroup.cmp)
	rest := ports
	for _, g := range groups {
		lo, hi := groupBounds(rest, g)
		out = append(out, rest[:lo]...)
		out = append(out, changed[g]...)
		rest = rest[hi:]
	}
	out = append(out, rest...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// setNamedAt makes address a have exactly the named ports want (of
// protocol proto, sorted) in els, one group's elements laid out by
// portMajor (a slice the caller owns, changed in place): a is added to
// or taken from the address list of each port that changed, merged with
// its neighbours. A port the numbered ports cover has no list. A port
// whose list would become the whole family is laid out again whole (no
// pod set has that many addresses; portMajor's form is kept anyway).
func setNamedAt(els []PortRange, a netip.Addr, want []uint16, proto uint8) []PortRange {
	fam := fullRange(a.Is4())
	var global []portSpan
	var have []uint16
	for _, e := range els {
		switch {
		case e.Addrs == fam:
			global = append(global, portSpan{e.PortFrom, e.PortTo})
		case e.Addrs.Contains(a):
			have = append(have, e.PortFrom)
		}
	}
	var wantOwn []uint16 // want less what the numbered ports cover
	for _, p := range want {
		if !spansContain(global, p) && !slices.Contains(wantOwn, p) {
			wantOwn = append(wantOwn, p)
		}
	}
	for _, p := range have {
		if !slices.Contains(wantOwn, p) {
			els = setPortAddr(els, p, a, false, proto)
		}
	}
	for _, p := range wantOwn {
		if !slices.Contains(have, p) {
			els = setPortAddr(els, p, a, true, proto)
		}
	}
	for _, e := range els {
		if e.Addrs == fam && e.PortFrom == e.PortTo && !spansContain(global, e.PortFrom) {
			// a port's list reached the whole family
			boxes := make([]portBox, len(els))
			for i, x := range els {
				boxes[i] = portBox{addrs: x.Addrs, proto: x.Proto, from: x.PortFrom, to: x.PortTo}
			}
			return disjointPorts(boxes)
		}
	}
	return els
}

// setPortAddr adds a to (in) or takes it from the address list of port
// in els (portMajor's layout).
func setPortAddr(els []PortRange, port uint16, a netip.Addr, in bool, proto uint8) []PortRange {
	lo, _ := slices.BinarySearchFunc(els, port, func(e PortRange, p uint16) int { return cmp.Compare(e.PortFrom, p) })
	hi := lo
	for hi < len(els) && els[hi].PortFrom == port && els[hi].PortTo == port {
		hi++
	}
	rs := make([]Range, hi-lo, hi-lo+1)
	for i, e := range els[lo:hi] {
		rs[i] = e.Addrs
	}
	i, has := findRange(rs, a)
	switch {
	case in && !has:
		rs = insertAddr(rs, i, a)
	case !in && has:
		rs = removeAddr(rs, i, a)
	default:
		return els
	}
	seg := make([]PortRange, len(rs))
	for i, r := range rs {
		seg[i] = PortRange{Addrs: r, Proto: proto, PortFrom: port, PortTo: port}
	}
	return slices.Replace(els, lo, hi, seg...)
}

// groupBounds is where group g's elements are in ports (sorted by
// protocol, then family).
func groupBounds(ports []PortRange, g portGroup) (lo, hi int) {
	lo, _ = slices.BinarySearchFunc(ports, g, func(p PortRange, g portGroup) int { return groupOf(p).cmp(g) })
	hi = lo
	for hi < len(ports) && groupOf(ports[hi]) == g {
		hi++
	}
	return lo, hi
}

// namedAt are the ports of r's named ports of protocol proto that e
// (nil: none) gives address a when it owns it, sorted.
func namedAt(r *parsedRule, proto uint8, a netip.Addr, e *entry) []uint16 {
	if e == nil || !slices.Contains(e.ips, a) {
		return nil
	}
	var out []uint16
	for _, p := range r.ports {
		if p.name == "" || p.proto != proto {
			continue
		}
		for _, np := range e.pod.Ports {
			if np.Name == p.name && np.Protocol == proto && !slices.Contains(out, np.Port) {
				out = append(out, np.Port)
			}
		}
	}
	slices.Sort(out)
	return out
}
