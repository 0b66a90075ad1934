package nft

// The table's sets and maps: their shapes and their elements.

import (
	"bytes"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"

	"github.com/podnet/podnet/routed/policy"
)

// setKind is the shape of a set.
type setKind int

const (
	kindAddrs    setKind = iota // addresses
	kindInterval                // address ranges
	kindPorts                   // (address . protocol . port) ranges
	kindVmap                    // address : verdict
	kindIfnames                 // interface names
	kindIfVmap                  // interface name : verdict
	kindIfAddrs                 // (interface name . address)
)

// isMap says whether sets of kind k are verdict maps (written after the
// chains their jumps name).
func (k setKind) isMap() bool { return k == kindVmap || k == kindIfVmap }

// setDef is a named set (or verdict map) and its elements.
type setDef struct {
	name  string
	kind  setKind
	v6    bool
	elems []nftables.SetElement
}

func (d setDef) set(t *nftables.Table) *nftables.Set {
	addr := nftables.TypeIPAddr
	if d.v6 {
		addr = nftables.TypeIP6Addr
	}
	s := &nftables.Set{Table: t, Name: d.name, KeyType: addr}
	switch d.kind {
	case kindInterval:
		s.Interval = true
	case kindPorts:
		s.Interval, s.Concatenation = true, true
		s.KeyType = nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
	case kindVmap:
		s.IsMap, s.DataType = true, nftables.TypeVerdict
	case kindIfnames:
		// host byte order, as nft declares ifname sets: without it `nft
		// list` shows every name as ""
		s.KeyType, s.KeyByteOrder = nftables.TypeIFName, binaryutil.NativeEndian
	case kindIfAddrs:
		s.KeyType, s.Concatenation = nftables.MustConcatSetType(nftables.TypeIFName, addr), true
	case kindIfVmap:
		s.KeyType, s.KeyByteOrder = nftables.TypeIFName, binaryutil.NativeEndian
		s.IsMap, s.DataType = true, nftables.TypeVerdict
	}
	return s
}

// rangeElements are an interval set's elements for ranges (merged and
// sorted, as the policy model hands them) of the family v6 says: each
// range's first address, and the address after its last flagged as the
// interval's end (none at the top of the address space: the interval is
// then open).
func rangeElements(ranges []policy.Range, v6 bool) []nftables.SetElement {
	n := 0
	for _, r := range ranges {
		if r.From.Is6() == v6 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	size := 4
	if v6 {
		size = 16
	}
	// the keys in one array: one allocation for the set, not one a key
	keys := make(keyBuf, 0, 2*n*size)
	out := make([]nftables.SetElement, 0, 2*n)
	for _, r := range ranges {
		if r.From.Is6() != v6 {
			continue
		}
		out = append(out, nftables.SetElement{Key: keys.add(r.From)})
		if end := r.To.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: keys.add(end), IntervalEnd: true})
		}
	}
	return out
}

// keyBuf holds the keys of a set's elements, each a slice of it that
// appending to cannot reach.
type keyBuf []byte

// add appends a's bytes and returns them.
func (b *keyBuf) add(a netip.Addr) []byte {
	start := len(*b)
	if a.Is4() {
		x := a.As4()
		*b = append(*b, x[:]...)
	} else {
		x := a.As16()
		*b = append(*b, x[:]...)
	}
	return (*b)[start:len(*b):len(*b)]
}

// addPort appends a . proto . port (portKey) and returns it.
func (b *keyBuf) addPort(a netip.Addr, proto uint8, port uint16) []byte {
	start := len(*b)
	b.add(a)
	*b = append(*b, proto, 0, 0, 0, byte(port>>8), byte(port), 0, 0)
	return (*b)[start:len(*b):len(*b)]
}

// portElements are a ports set's elements (disjoint, as the policy model
// hands them) of the
// family v6 says: the key is the box's first corner, KeyEnd its last.
func portElements(ports []policy.PortRange, v6 bool) []nftables.SetElement {
	n := 0
	for _, p := range ports {
		if p.Addrs.From.Is6() == v6 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	size := 4 + 8
	if v6 {
		size = 16 + 8
	}
	keys := make(keyBuf, 0, 2*n*size)
	out := make([]nftables.SetElement, 0, n)
	for _, p := range ports {
		if p.Addrs.From.Is6() != v6 {
			continue
		}
		out = append(out, nftables.SetElement{
			Key:    keys.addPort(p.Addrs.From, p.Proto, p.PortFrom),
			KeyEnd: keys.addPort(p.Addrs.To, p.Proto, p.PortTo),
		})
	}
	return out
}

// portKey is addr . proto . port, each field padded to 4 bytes.
func portKey(a netip.Addr, proto uint8, port uint16) []byte {
	var b keyBuf
	return b.addPort(a, proto, port)
}

// sortedElements are elems (keys only) sorted by key, each once.
func sortedElements(elems []nftables.SetElement) []nftables.SetElement {
	out := slices.Clone(elems)
	slices.SortFunc(out, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b nftables.SetElement) bool { return bytes.Equal(a.Key, b.Key) })
}
