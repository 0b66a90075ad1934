package nftutil

import (
	"net/netip"

	"github.com/google/nftables"
)

// AddrElements are the elements of a set of addresses: those of addrs in
// the family v6 says, in their order.
func AddrElements(addrs []netip.Addr, v6 bool) []nftables.SetElement {
	var out []nftables.SetElement
	for _, a := range addrs {
		if a.Is6() == v6 {
			out = append(out, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	return out
}

// ElementChanges compares two lists of a set's elements, each element
// named by key (its canonical text): del holds those of before that after
// lacks, add those of after that before lacks, in their lists' order.
func ElementChanges(before, after []nftables.SetElement, key func(nftables.SetElement) string) (del, add []nftables.SetElement) {
	in := func(list []nftables.SetElement) map[string]bool {
		m := make(map[string]bool, len(list))
		for _, e := range list {
			m[key(e)] = true
		}
		return m
	}
	b, a := in(before), in(after)
	for _, e := range before {
		if !a[key(e)] {
			del = append(del, e)
		}
	}
	for _, e := range after {
		if !b[key(e)] {
			add = append(add, e)
		}
	}
	return del, add
}
