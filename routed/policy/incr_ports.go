// The incremental compile's named ports, patched at the addresses that
// changed (an egress rule's members, the pods an ingress rule's policy
// selects): what disjointPorts makes of a rule's
// boxes is, for each protocol and family, the run-length encoding of the
// address line (each run the merged port spans its addresses allow, runs
// of no port left out, no two neighbouring runs alike), so changing the
// spans of one address changes the runs around it alone.

package policy

import (
	"cmp"
	"net/netip"
	"slices"
)

// portRun is one run: addresses and the port spans each of them allows.
type portRun struct {
	addrs Range
	spans []portSpan
}

// portGroup is a protocol and family of a rule's Ports.
type portGroup struct {
	proto uint8
	v4    bool
}

func (g portGroup) cmp(h portGroup) int {
	return cmp.Or(cmp.Compare(g.proto, h.proto), boolCmp(g.v4, h.v4))
}

func groupOf(p PortRange) portGroup { return portGroup{p.Proto, p.Addrs.From.Is4()} }

// toRuns reads a group's elements (as disjointPorts orders them) back as
// runs.
func toRuns(els []PortRange) []portRun {
	var out []portRun
	for _, e := range els {
		sp := portSpan{e.PortFrom, e.PortTo}
		if n := len(out); n > 0 && out[n-1].addrs == e.Addrs {
			out[n-1].spans = append(out[n-1].spans, sp)
			continue
		}
		out = append(out, portRun{addrs: e.Addrs, spans: []portSpan{sp}})
	}
	return out
}

// fromRuns are the elements of a group's runs.
func fromRuns(runs []portRun, proto uint8) []PortRange {
	var out []PortRange
	for _, r := range runs {
		for _, sp := range r.spans {
			out = append(out, PortRange{Addrs: r.addrs, Proto: proto, PortFrom: sp.from, PortTo: sp.to})
		}
	}
	return out
}

// setRun makes address a allow spans (merged; none: no port) in runs.
func setRun(runs []portRun, a netip.Addr, spans []portSpan) []portRun {
	j, _ := slices.BinarySearchFunc(runs, a, func(r portRun, a netip.Addr) int { return r.addrs.To.Compare(a) })
	in := j < len(runs) && runs[j].addrs.Contains(a)
	var cur []portSpan
	if in {
		cur = runs[j].spans
	}
	if slices.Equal(cur, spans) {
		return runs
	}
	k := j // where a's own run is, if it gets one
	if in {
		r := runs[j]
		var mid []portRun
		if r.addrs.From != a {
			mid = append(mid, portRun{Range{r.addrs.From, a.Prev()}, r.spans})
			k++
		}
		if len(spans) > 0 {
			mid = append(mid, portRun{single(a), spans})
		}
		if r.addrs.To != a {
			mid = append(mid, portRun{Range{a.Next(), r.addrs.To}, r.spans})
		}
		runs = slices.Replace(runs, j, j+1, mid...)
	} else {
		runs = slices.Insert(runs, j, portRun{single(a), spans})
	}
	if len(spans) == 0 {
		return runs // a is a gap now: nothing on either side touches
	}
	// a's run joins a neighbour that touches it with the same spans
	if k+1 < len(runs) && touches(runs[k].addrs, runs[k+1].addrs) && slices.Equal(runs[k].spans, runs[k+1].spans) {
		runs[k].addrs.To = runs[k+1].addrs.To
		runs = slices.Delete(runs, k+1, k+2)
	}
	if k > 0 && touches(runs[k-1].addrs, runs[k].addrs) && slices.Equal(runs[k-1].spans, runs[k].spans) {
		runs[k-1].addrs.To = runs[k].addrs.To
		runs = slices.Delete(runs, k, k+1)
	}
	return runs
}

// touches: y starts right after x ends, in x's family.
func touches(x, y Range) bool {
	return x.To.Is4() == y.From.Is4() && !lastOfFamily(x.To) && x.To.Next() == y.From
}

// patchNamedPorts is ports (rule r's, its named ports resolved as they
// were) with the spans of each touched address resolved again: numbered
// ports anywhere, and the named ports of the entry owner gives for the
// address (nil: none), which must own it: for an egress rule the pod that
// owns the address when the rule's peers hold it, for an ingress rule
// the one that owns it when the policy selects it. A new slice.
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
			changed[g] = setElems(els, a, spansAt(r, proto, a, owner(a)), proto)
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

// setElems is setRun on one group's elements (els, a slice the caller
// owns, changed in place): only the runs around a are read as runs (the
// one that holds a or follows it, and its neighbours), so an address
// costs a binary search and a copy of the elements after it, not the
// group read and written again.
func setElems(els []PortRange, a netip.Addr, spans []portSpan, proto uint8) []PortRange {
	j, _ := slices.BinarySearchFunc(els, a, func(p PortRange, a netip.Addr) int { return p.Addrs.To.Compare(a) })
	lo, hi := j, j
	if j > 0 {
		lo = runStart(els, j-1)
	}
	if hi < len(els) {
		hi = runEnd(els, hi)
		if hi < len(els) {
			hi = runEnd(els, hi)
		}
	}
	runs := setRun(toRuns(els[lo:hi]), a, spans)
	return slices.Replace(els, lo, hi, fromRuns(runs, proto)...)
}

// runStart is the first element of the run els[i] is in.
func runStart(els []PortRange, i int) int {
	for i > 0 && els[i-1].Addrs == els[i].Addrs {
		i--
	}
	return i
}

// runEnd is the element after the run els[i] is in.
func runEnd(els []PortRange, i int) int {
	k := i + 1
	for k < len(els) && els[k].Addrs == els[i].Addrs {
		k++
	}
	return k
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

// spansAt are the port spans r allows to address a for protocol proto:
// its numbered ports, and the named ports of e (nil: none) when it owns
// a.
func spansAt(r *parsedRule, proto uint8, a netip.Addr, e *entry) []portSpan {
	var out []portSpan
	for _, p := range r.ports {
		if p.name == "" && p.proto == proto {
			out = append(out, portSpan{p.from, p.to})
		}
	}
	if e != nil && slices.Contains(e.ips, a) {
		for _, p := range r.ports {
			if p.name == "" || p.proto != proto {
				continue
			}
			for _, np := range e.pod.Ports {
				if np.Name == p.name && np.Protocol == proto {
					out = append(out, portSpan{np.Port, np.Port})
				}
			}
		}
	}
	return mergeSpans(out)
}
