package nftutil

import (
	"fmt"
	"net/netip"
	"slices"

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

// QueueElements queues on c adding (or, with del, deleting) elems to set
// s, in messages of at most perMessage elements: a message's element list
// is one netlink attribute, whose length is 16 bits.
func QueueElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement, del bool, perMessage int) error {
	for chunk := range slices.Chunk(elems, perMessage) {
		op := c.SetAddElements
		if del {
			op = c.SetDeleteElements
		}
		if err := op(s, chunk); err != nil {
			return fmt.Errorf("nftables set %s: %w", s.Name, err)
		}
	}
	return nil
}
