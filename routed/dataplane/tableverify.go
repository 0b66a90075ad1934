package dataplane

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// Repair by content: after each full write the table's structure is read
// back from the kernel (tableStructure) and kept; the periodic resync
// reads it again and compares, and compares every set's elements with the
// wanted ones. Any difference (a table, chain, rule, set or object
// deleted, added or edited, an element missing or extra) makes Apply
// write the table again.

// tableStructure reads podnet's table from the kernel as canonical lines
// (nftutil.Structure): nil, nil when there is no table. conn is a
// netfilter netlink socket (the Table's).
func tableStructure(conn *netlink.Conn) ([]string, error) {
	return nftutil.Structure(conn, unix.NFPROTO_INET, contract.NFTable)
}

// structureDiff says how the kernel's structure (have) differs from the
// one written (want): "" when it does not.
func structureDiff(want, have []string) string { return nftutil.StructureDiff(want, have) }

// elementKey is the canonical text of a set element.
func elementKey(e nftables.SetElement) string {
	k := hex.EncodeToString(e.Key)
	if e.IntervalEnd {
		k += "(end)"
	}
	return k
}

// elementsDiff says how a set's elements in the kernel (have) differ from
// the wanted ones: "" when they do not.
func elementsDiff(want, have []nftables.SetElement) string {
	extra, missing := elementChanges(have, want)
	var out []string
	if len(missing) > 0 {
		out = append(out, fmt.Sprintf("%d element(s) missing (%s)", len(missing), elementKey(missing[0])))
	}
	if len(extra) > 0 {
		out = append(out, fmt.Sprintf("%d element(s) not wanted (%s)", len(extra), elementKey(extra[0])))
	}
	return strings.Join(out, ", ")
}

// elementChanges compares two lists of a set's elements (nftutil.ElementChanges).
func elementChanges(before, after []nftables.SetElement) (del, add []nftables.SetElement) {
	return nftutil.ElementChanges(before, after, elementKey)
}
