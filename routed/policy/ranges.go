package policy

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
)

// prefixRange is the inclusive address range of p (p need not be masked).
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	first := p.Addr()
	if first.Is4() {
		a := first.As4()
		v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		if p.Bits() < 32 {
			v |= (uint32(1) << (32 - p.Bits())) - 1
		}
		return Range{From: first, To: netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})}
	}
	b := first.As16()
	for i := p.Bits(); i < 128; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return Range{From: first, To: netip.AddrFrom16(b)}
}

// fullRange is every address of a's family.
func fullRange(is4 bool) Range {
	if is4 {
		return prefixRange(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	return prefixRange(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
}

func single(a netip.Addr) Range { return Range{From: a, To: a} }

// Contains reports whether a is in r (same family, From <= a <= To).
func (r Range) Contains(a netip.Addr) bool {
	return a.Is4() == r.From.Is4() && r.From.Compare(a) <= 0 && a.Compare(r.To) <= 0
}

// lastOfFamily reports whether a is the highest address of its family, so
// that a.Next() would leave it.
func lastOfFamily(a netip.Addr) bool {
	n := a.Next()
	return !n.IsValid() || n.Is4() != a.Is4()
}

// mergeRanges sorts rs and merges overlapping and adjacent ranges of the same
// family, in place. The result is nil when rs is empty.
func mergeRanges(rs []Range) []Range {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(a, b Range) int {
		if c := a.From.Compare(b.From); c != 0 {
			return c
		}
		return a.To.Compare(b.To)
	})
	out := rs[:1]
	for _, r := range rs[1:] {
		out = appendMerged(out, r)
	}
	return slices.Clip(out)
}

// appendMerged appends r to out (merged, sorted, r not before its last),
// merged into the last range when it overlaps or touches it.
func appendMerged(out []Range, r Range) []Range {
	if n := len(out); n > 0 {
		last := &out[n-1]
		if r.From.Is4() == last.From.Is4() &&
			(r.From.Compare(last.To) <= 0 || (!lastOfFamily(last.To) && r.From == last.To.Next())) {
			if r.To.Compare(last.To) > 0 {
				last.To = r.To
			}
			return out
		}
	}
	return append(out, r)
}

// unionRanges merges two merged lists into a new merged list (nil when
// both are empty), in linear time.
func unionRanges(x, y []Range) []Range {
	if len(x)+len(y) == 0 {
		return nil
	}
	out := make([]Range, 0, len(x)+len(y))
	add := func(r Range) { out = appendMerged(out, r) }
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		if j == len(y) || (i < len(x) && x[i].From.Compare(y[j].From) <= 0) {
			add(x[i])
			i++
		} else {
			add(y[j])
			j++
		}
	}
	return out
}

// subtractRanges returns base minus the union of holes: both must be merged
// (sorted, disjoint) and base's ranges are of one family or both. The result
// is merged.
func subtractRanges(base, holes []Range) []Range {
	var out []Range
	h := 0
	for _, b := range base {
		cur := b
		alive := true
		// skip holes entirely below cur
		for h < len(holes) && holes[h].To.Compare(cur.From) < 0 {
			h++
		}
		for j := h; j < len(holes) && alive; j++ {
			x := holes[j]
			if x.From.Compare(cur.To) > 0 {
				break
			}
			if x.From.Is4() != cur.From.Is4() {
				continue
			}
			if x.From.Compare(cur.From) > 0 {
				out = append(out, Range{From: cur.From, To: x.From.Prev()})
			}
			if x.To.Compare(cur.To) >= 0 {
				alive = false
				break
			}
			cur.From = x.To.Next()
		}
		if alive {
			out = append(out, cur)
		}
	}
	return out
}

// rangesContain reports whether a is in rs (merged and sorted).
func rangesContain(rs []Range, a netip.Addr) bool {
	i, _ := slices.BinarySearchFunc(rs, a, func(r Range, a netip.Addr) int {
		return r.To.Compare(a)
	})
	return i < len(rs) && rs[i].Contains(a)
}

// portBox is a port element before it is made disjoint.
type portBox struct {
	addrs    Range
	proto    uint8
	from, to uint16
}

// disjointPorts turns boxes (address range x protocol x port range), which
// may overlap, into disjoint PortRanges covering exactly their union: nft
// refuses overlapping elements in a concatenated interval set. Sorted by
// protocol and family. Within those, what Compile makes (boxes over the
// whole family: numbered ports; boxes of one port: named ports) is
// port-major (portMajor), anything else address-major (sweepFamily).
func disjointPorts(boxes []portBox) []PortRange { return disjoint(boxes, true) }

// addressMajorPorts is disjointPorts address-major throughout: sorted by
// protocol, address, port, the form portsContain looks up.
func addressMajorPorts(boxes []portBox) []PortRange { return disjoint(boxes, false) }

func disjoint(boxes []portBox, portMajorOK bool) []PortRange {
	if len(boxes) == 0 {
		return nil
	}
	slices.SortFunc(boxes, func(a, b portBox) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), boolCmp(a.addrs.From.Is4(), b.addrs.From.Is4()))
	})
	var out []PortRange
	for start := 0; start < len(boxes); {
		end := start + 1
		full := boxes[start].addrs == fullRange(boxes[start].addrs.From.Is4())
		for end < len(boxes) && boxes[end].proto == boxes[start].proto &&
			boxes[end].addrs.From.Is4() == boxes[start].addrs.From.Is4() {
			full = full && boxes[end].addrs == boxes[start].addrs
			end++
		}
		if full {
			// numbered ports only: the whole family, merged spans
			spans := make([]portSpan, 0, end-start)
			for _, b := range boxes[start:end] {
				spans = append(spans, portSpan{b.from, b.to})
			}
			for _, sp := range mergeSpans(spans) {
				out = append(out, PortRange{Addrs: boxes[start].addrs, Proto: boxes[start].proto, PortFrom: sp.from, PortTo: sp.to})
			}
		} else if o, ok := portMajor(out, boxes[start:end]); ok && portMajorOK {
			out = o
		} else if o, ok := pointsSweep(out, boxes[start:end]); ok {
			out = o
		} else {
			out = sweepFamily(out, boxes[start:end])
		}
		start = end
	}
	return out
}

func boolCmp(a, b bool) int {
	// IPv4 (true) before IPv6 (false)
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

type portSpan struct{ from, to uint16 }

// portMajor is disjointPorts for boxes of one protocol and family that
// each cover the whole family (numbered ports) or one port (named
// ports): the numbered ports' merged spans over the whole family, then
// each other port with the merged addresses that have it (a port that
// every address has is a numbered one), sorted by port, then address. So
// a pod's named port is an element of its own (or widens a neighbour's
// by its address), and a pod that comes or goes changes only that: the
// kernel's concatenated interval set (pipapo) pays for every wide
// element a change deletes and adds (test/policynft
// BenchmarkPortsSetShapes: 16 ms to split one, 0.4 ms to add a point),
// which an address-major layout would split at each pod's address. ok is
// false for other boxes.
func portMajor(out []PortRange, boxes []portBox) ([]PortRange, bool) {
	fam := fullRange(boxes[0].addrs.From.Is4())
	proto := boxes[0].proto
	var global []portSpan
	for _, b := range boxes {
		switch {
		case b.addrs == fam:
			global = append(global, portSpan{b.from, b.to})
		case b.from != b.to:
			return out, false
		}
	}
	global = mergeSpans(global)
	byPort := map[uint16][]Range{}
	for _, b := range boxes {
		if b.addrs != fam && !spansContain(global, b.from) {
			byPort[b.from] = append(byPort[b.from], b.addrs)
		}
	}
	var elems []PortRange
	for _, p := range slices.Sorted(maps.Keys(byPort)) {
		rs := mergeRanges(byPort[p])
		if len(rs) == 1 && rs[0] == fam {
			global = append(global, portSpan{p, p})
			continue
		}
		for _, r := range rs {
			elems = append(elems, PortRange{Addrs: r, Proto: proto, PortFrom: p, PortTo: p})
		}
	}
	for _, sp := range mergeSpans(global) {
		elems = append(elems, PortRange{Addrs: fam, Proto: proto, PortFrom: sp.from, PortTo: sp.to})
	}
	slices.SortFunc(elems, portMajorCmp)
	return append(out, elems...), true
}

// portMajorCmp orders one protocol's and family's elements port-major.
func portMajorCmp(x, y PortRange) int {
	return cmp.Or(cmp.Compare(x.PortFrom, y.PortFrom), x.Addrs.From.Compare(y.Addrs.From))
}

// spansContain reports whether port is in spans (merged and sorted).
func spansContain(spans []portSpan, port uint16) bool {
	i, _ := slices.BinarySearchFunc(spans, port, func(s portSpan, p uint16) int { return cmp.Compare(s.to, p) })
	return i < len(spans) && spans[i].from <= port
}

// pointsSweep is sweepFamily for what Compile makes: boxes covering the
// whole family (numbered ports) and boxes of one address (named ports). It
// is linear after a sort of the points. ok is false for other boxes.
func pointsSweep(out []PortRange, boxes []portBox) ([]PortRange, bool) {
	fam := fullRange(boxes[0].addrs.From.Is4())
	var global []portSpan
	points := make([]portBox, 0, len(boxes))
	for _, b := range boxes {
		switch {
		case b.addrs == fam:
			global = append(global, portSpan{b.from, b.to})
		case b.addrs.From == b.addrs.To:
			points = append(points, b)
		default:
			return out, false
		}
	}
	global = mergeSpans(global)
	proto := boxes[0].proto
	if !slices.IsSortedFunc(points, func(x, y portBox) int { return x.addrs.From.Compare(y.addrs.From) }) {
		slices.SortFunc(points, func(x, y portBox) int { return x.addrs.From.Compare(y.addrs.From) })
	}
	emit := func(r Range, spans []portSpan) {
		for _, sp := range spans {
			out = append(out, PortRange{Addrs: r, Proto: proto, PortFrom: sp.from, PortTo: sp.to})
		}
	}
	cur, done := fam.From, false
	var prevTo netip.Addr // the last point emitted, and its spans
	var prevSpans, spans []portSpan
	for i := 0; i < len(points); {
		p := points[i].addrs.From
		spans = append(spans[:0], global...)
		for ; i < len(points) && points[i].addrs.From == p; i++ {
			spans = append(spans, portSpan{points[i].from, points[i].to})
		}
		spans = mergeSpans(spans)
		if slices.Equal(spans, global) {
			continue // covered by the gap segments
		}
		if cur.Compare(p) < 0 {
			emit(Range{cur, p.Prev()}, global)
		} else if prevTo.IsValid() && prevTo.Next() == p && slices.Equal(spans, prevSpans) {
			// extend the previous point's elements to p
			for j := len(out) - len(spans); j < len(out); j++ {
				out[j].Addrs.To = p
			}
			prevTo = p
			if lastOfFamily(p) {
				done = true
			} else {
				cur = p.Next()
			}
			continue
		}
		emit(Range{p, p}, spans)
		prevTo, prevSpans = p, append(prevSpans[:0], spans...)
		if lastOfFamily(p) {
			done = true
		} else {
			cur = p.Next()
		}
	}
	if !done {
		emit(Range{cur, fam.To}, global)
	}
	return out, true
}

// sweepFamily handles boxes of one protocol and one family.
func sweepFamily(out []PortRange, boxes []portBox) []PortRange {
	proto := boxes[0].proto
	// Sweep the address line: at each boundary the set of boxes covering
	// the addresses changes; a segment is emitted, one element per merged
	// port span, when its span set differs from the next one's.
	type ev struct {
		at    netip.Addr // boundary: segment starts here
		box   int
		start bool
	}
	evs := make([]ev, 0, 2*len(boxes))
	for i, b := range boxes {
		evs = append(evs, ev{at: b.addrs.From, box: i, start: true})
		if !lastOfFamily(b.addrs.To) {
			evs = append(evs, ev{at: b.addrs.To.Next(), box: i, start: false})
		}
	}
	slices.SortFunc(evs, func(a, b ev) int { return a.at.Compare(b.at) })
	// active boxes: a slice with each box's position, for O(1) removal
	active := make([]int, 0, len(boxes))
	where := make([]int, len(boxes))
	var prevSpans []portSpan
	var segStart netip.Addr
	var spans []portSpan
	flush := func(segEnd netip.Addr) {
		// emit the segment [segStart, segEnd] with prevSpans
		for _, s := range prevSpans {
			out = append(out, PortRange{Addrs: Range{From: segStart, To: segEnd}, Proto: proto, PortFrom: s.from, PortTo: s.to})
		}
	}
	open := false
	for i := 0; i < len(evs); {
		at := evs[i].at
		for i < len(evs) && evs[i].at == at {
			if b := evs[i].box; evs[i].start {
				where[b] = len(active)
				active = append(active, b)
			} else {
				last := active[len(active)-1]
				active[where[b]] = last
				where[last] = where[b]
				active = active[:len(active)-1]
			}
			i++
		}
		spans = spans[:0]
		for _, b := range active {
			spans = append(spans, portSpan{boxes[b].from, boxes[b].to})
		}
		spans = mergeSpans(spans)
		if open && slices.Equal(spans, prevSpans) {
			continue // the current segment goes on
		}
		if open {
			flush(at.Prev())
		}
		open = len(spans) > 0
		segStart = at
		prevSpans = append(prevSpans[:0], spans...)
	}
	if open {
		flush(fullRangeLast(segStart))
	}
	return out
}

func fullRangeLast(a netip.Addr) netip.Addr { return fullRange(a.Is4()).To }

func mergeSpans(s []portSpan) []portSpan {
	if len(s) < 2 {
		return s
	}
	slices.SortFunc(s, func(a, b portSpan) int { return cmp.Compare(a.from, b.from) })
	out := s[:1]
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		if uint32(x.from) <= uint32(last.to)+1 {
			if x.to > last.to {
				last.to = x.to
			}
			continue
		}
		out = append(out, x)
	}
	return out
}

// Ranges are canonical once, here: Compile hands routed/policy/nft its
// rules' Peers merged and sorted and its Ports disjoint (the contract of
// Rule), and LocalPodCIDRs as prefixes that PrefixRanges makes canonical;
// the writer takes them as they are. Canonical is for rules made by hand.

// PrefixRanges are prefixes as ranges, merged and sorted (IPv4 before
// IPv6): an IPv4-mapped prefix counts as IPv4, an invalid one is left out.
func PrefixRanges(prefixes []netip.Prefix) []Range {
	var rs []Range
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		rs = append(rs, prefixRange(p))
	}
	return mergeRanges(rs)
}

// Canonical is r with its ranges as Compile makes them: Peers merged and
// sorted, Ports disjoint covering the same (address, protocol, port)
// points; a range that is no range (invalid, mixed or reversed) is left
// out, IPv4-mapped addresses count as IPv4. It is for rules made by hand
// (tests, benchmarks): Compile's are canonical already.
func (r Rule) Canonical() Rule {
	var peers []Range
	for _, p := range r.Peers {
		if c, ok := p.canonical(); ok {
			peers = append(peers, c)
		}
	}
	var boxes []portBox
	for _, p := range r.Ports {
		if c, ok := p.Addrs.canonical(); ok && p.PortFrom <= p.PortTo {
			boxes = append(boxes, portBox{addrs: c, proto: p.Proto, from: p.PortFrom, to: p.PortTo})
		}
	}
	r.Peers, r.Ports = mergeRanges(peers), disjointPorts(boxes)
	return r
}

// canonical is r unmapped and without zones; false: r is no range.
func (r Range) canonical() (Range, bool) {
	f, t := r.From.Unmap().WithZone(""), r.To.Unmap().WithZone("")
	if !f.IsValid() || !t.IsValid() || f.Is4() != t.Is4() || t.Less(f) {
		return Range{}, false
	}
	return Range{From: f, To: t}, true
}
