// Package allocator is podnet-ipam's pure allocation logic: ranges, which
// addresses may be handed out, how the next one is chosen, and how GC and
// STATUS are decided. It keeps no state of its own: reservations live in a
// Store (on disk in production, in memory in unit tests).
package allocator

import (
	"fmt"
	"math/big"
	"net/netip"
)

// maxOffset bounds the usable size of one range (2^63 addresses): larger
// IPv6 ranges are used from their start up to that size.
const maxOffset = uint64(1) << 63

// Range is one contiguous allocatable block inside a subnet.
type Range struct {
	Subnet  netip.Prefix
	Start   netip.Addr // first candidate (inclusive)
	End     netip.Addr // last candidate (inclusive)
	Gateway netip.Addr // never allocated; may be invalid (no gateway)
}

// RangeSet is a list of ranges of one address family; an attachment gets
// one address from each range set.
type RangeSet []Range

// String is the range in "subnet start-end" form; it also keys the store's
// per-range hints, so it changes when the range changes.
func (r Range) String() string {
	return fmt.Sprintf("%s %s-%s", r.Subnet, r.Start, r.End)
}

// NewRange validates a range: start and end inside the subnet and in order,
// the gateway inside the subnet. Zero start/end default to the first and
// last usable address of the subnet; a zero gateway defaults to the first
// address after the network address unless noGateway.
func NewRange(subnet netip.Prefix, start, end, gw netip.Addr) (Range, error) {
	subnet = subnet.Masked()
	bits := subnet.Addr().BitLen()
	if (bits == 32 && subnet.Bits() > 30) || (bits == 128 && subnet.Bits() > 126) {
		return Range{}, fmt.Errorf("subnet %s is too small: at most /30 for IPv4 and /126 for IPv6", subnet)
	}
	first := subnet.Addr().Next() // the network address is never handed out
	last := lastAddr(subnet)
	if bits == 32 {
		last = last.Prev() // nor is the IPv4 broadcast address
	}
	if !gw.IsValid() {
		gw = first
	}
	if !subnet.Contains(gw) {
		return Range{}, fmt.Errorf("gateway %s is outside subnet %s", gw, subnet)
	}
	if !start.IsValid() {
		start = first
	}
	if !end.IsValid() {
		end = last
	}
	for name, a := range map[string]netip.Addr{"rangeStart": start, "rangeEnd": end} {
		if a.BitLen() != bits || !subnet.Contains(a) {
			return Range{}, fmt.Errorf("%s %s is outside subnet %s", name, a, subnet)
		}
	}
	if start.Compare(first) < 0 {
		start = first
	}
	if end.Compare(last) > 0 {
		end = last
	}
	if start.Compare(end) > 0 {
		return Range{}, fmt.Errorf("rangeStart %s is after rangeEnd %s in subnet %s", start, end, subnet)
	}
	if diff(end, start) >= maxOffset {
		end = addOffset(start, maxOffset-1)
	}
	return Range{Subnet: subnet, Start: start, End: end, Gateway: gw}, nil
}

// Size is the number of candidate addresses (gateway included).
func (r Range) Size() uint64 { return diff(r.End, r.Start) + 1 }

// Contains reports whether ip is a candidate of r.
func (r Range) Contains(ip netip.Addr) bool {
	return ip.BitLen() == r.Start.BitLen() && ip.Compare(r.Start) >= 0 && ip.Compare(r.End) <= 0
}

// Offset is ip's position in r (ip must be in r).
func (r Range) Offset(ip netip.Addr) uint64 { return diff(ip, r.Start) }

// At is the address at offset in r.
func (r Range) At(offset uint64) netip.Addr { return addOffset(r.Start, offset) }

// Overlaps reports whether two ranges share an address.
func (r Range) Overlaps(o Range) bool {
	if r.Start.BitLen() != o.Start.BitLen() {
		return false
	}
	return r.Start.Compare(o.End) <= 0 && o.Start.Compare(r.End) <= 0
}

// Validate checks that every range of every set has the set's family and
// that no two ranges anywhere overlap.
func Validate(sets []RangeSet) error {
	if len(sets) == 0 {
		return fmt.Errorf("no ranges configured")
	}
	var all []Range
	for i, set := range sets {
		if len(set) == 0 {
			return fmt.Errorf("range set %d is empty", i)
		}
		for _, r := range set {
			if r.Start.BitLen() != set[0].Start.BitLen() {
				return fmt.Errorf("range set %d mixes IPv4 and IPv6 (%s, %s)", i, set[0].Subnet, r.Subnet)
			}
			for _, o := range all {
				if r.Overlaps(o) {
					return fmt.Errorf("ranges %s and %s overlap", o, r)
				}
			}
			all = append(all, r)
		}
	}
	return nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func toInt(a netip.Addr) *big.Int { return new(big.Int).SetBytes(a.AsSlice()) }

// diff is a-b for a >= b, saturated to 2^64-1.
func diff(a, b netip.Addr) uint64 {
	d := new(big.Int).Sub(toInt(a), toInt(b))
	if !d.IsUint64() {
		return ^uint64(0)
	}
	return d.Uint64()
}

func addOffset(a netip.Addr, off uint64) netip.Addr {
	s := new(big.Int).Add(toInt(a), new(big.Int).SetUint64(off)).Bytes()
	buf := make([]byte, a.BitLen()/8)
	copy(buf[len(buf)-len(s):], s)
	r, _ := netip.AddrFromSlice(buf)
	return r
}
