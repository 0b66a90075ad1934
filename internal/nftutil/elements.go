package nftutil

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

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

// ElementKey is the canonical text of a set or map element: its key, its
// interval flag, its key end, its verdict (as built, or as read back).
// Two elements are the same when their keys are.
func ElementKey(e nftables.SetElement) string {
	k := hex.EncodeToString(e.Key)
	if e.IntervalEnd {
		k += "(end)"
	}
	if len(e.KeyEnd) > 0 {
		k += "-" + hex.EncodeToString(e.KeyEnd)
	}
	if v := e.VerdictData; v != nil {
		k += fmt.Sprintf(":%d/%s", v.Kind, v.Chain)
	} else if len(e.Val) > 0 {
		// a verdict map's element as read back: the nested verdict
		if kind, chain, ok := decodeVerdict(e.Val); ok {
			k += fmt.Sprintf(":%d/%s", kind, chain)
		} else {
			k += ":" + hex.EncodeToString(e.Val)
		}
	}
	return k
}

// decodeVerdict reads NFTA_VERDICT_CODE and NFTA_VERDICT_CHAIN out of a
// map element's data as the nftables library hands it back.
func decodeVerdict(b []byte) (expr.VerdictKind, string, bool) {
	attrs, err := netlink.UnmarshalAttributes(b)
	if err != nil {
		return 0, "", false
	}
	var kind expr.VerdictKind
	chain, found := "", false
	for _, a := range attrs {
		switch a.Type &^ unix.NLA_F_NESTED {
		case unix.NFTA_VERDICT_CODE:
			if len(a.Data) == 4 {
				kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(a.Data)))
				found = true
			}
		case unix.NFTA_VERDICT_CHAIN:
			chain = strings.TrimRight(string(a.Data), "\x00")
		}
	}
	return kind, chain, found
}

// Changes is ElementChanges by ElementKey.
func Changes(before, after []nftables.SetElement) (del, add []nftables.SetElement) {
	return ElementChanges(before, after, ElementKey)
}

// ElementsDiff says how a set's elements in the kernel (have) differ from
// the wanted ones: "" when they do not.
func ElementsDiff(want, have []nftables.SetElement) string {
	extra, missing := Changes(have, want)
	var out []string
	if len(missing) > 0 {
		out = append(out, fmt.Sprintf("%d element(s) missing (%s)", len(missing), ElementKey(missing[0])))
	}
	if len(extra) > 0 {
		out = append(out, fmt.Sprintf("%d element(s) not wanted (%s)", len(extra), ElementKey(extra[0])))
	}
	return strings.Join(out, ", ")
}
