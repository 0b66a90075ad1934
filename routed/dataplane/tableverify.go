package dataplane

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
)

// Repair by content: after each full write the table's structure is read
// back from the kernel (tableStructure) and kept; the periodic resync
// reads it again and compares, and compares every set's elements with the
// wanted ones. Any difference (a table, chain, rule, set or object
// deleted, added or edited, an element missing or extra) makes Apply
// write the table again.

// dumpKind is one kind of object of the table and the netlink attributes
// of its dump that change without anyone editing the table (handles,
// counter values, element counts, padding), which the comparison ignores.
type dumpKind struct {
	name  string
	msg   uint16
	named uint16 // the attribute naming the object (the rule: its chain)
	skip  []uint16
}

// The attribute numbers are the kernel's (include/uapi/linux/netfilter/
// nf_tables.h), not all of which golang.org/x/sys names.
var dumpKinds = []dumpKind{
	{name: "table", msg: unix.NFT_MSG_GETTABLE, named: 1, skip: []uint16{4 /* HANDLE */, 5 /* PAD */}},
	{name: "object", msg: unix.NFT_MSG_GETOBJ, named: 2, skip: []uint16{4 /* DATA: the counter's values */, 6 /* HANDLE */, 7 /* PAD */}},
	{name: "set", msg: unix.NFT_MSG_GETSET, named: 2, skip: []uint16{14 /* PAD */, 16 /* HANDLE */, 19 /* TYPE: the backend */, 20 /* COUNT: elements */}},
	{name: "chain", msg: unix.NFT_MSG_GETCHAIN, named: 3, skip: []uint16{2 /* HANDLE */, 8 /* COUNTERS */, 9 /* PAD */}},
	{name: "rule", msg: unix.NFT_MSG_GETRULE, named: 2, skip: []uint16{3 /* HANDLE */, 6 /* POSITION */, 8 /* PAD */}},
}

// tableStructure reads podnet's table from the kernel as canonical lines,
// one per object: the table, its objects, sets, chains and rules (in
// order), each "<kind> <name>: <its attributes in hex>" without what
// dumpKinds skips. Set elements are not in it. nil, nil: there is no
// table. conn is a netfilter netlink socket (the Table's).
func tableStructure(conn *netlink.Conn) ([]string, error) {
	var lines []string
	rules := map[string]int{}
	for _, k := range dumpKinds {
		msgs, err := nftDump(conn, k)
		if k.name == "table" && errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("dump nftables %ss of %s: %w", k.name, contract.NFTable, err)
		}
		for _, m := range msgs {
			attrs, err := netlink.UnmarshalAttributes(m.Data[min(4, len(m.Data)):])
			if err != nil {
				return nil, fmt.Errorf("nftables %s: %w", k.name, err)
			}
			table, name := "", ""
			var b strings.Builder
			for _, a := range attrs {
				typ := a.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
				if typ == 1 {
					table = strings.TrimRight(string(a.Data), "\x00")
				}
				if typ == k.named {
					name = strings.TrimRight(string(a.Data), "\x00")
				}
				if slices.Contains(k.skip, typ) {
					continue
				}
				fmt.Fprintf(&b, "%d=%s;", typ, hex.EncodeToString(a.Data))
			}
			if table != contract.NFTable { // a chain dump lists every table's
				continue
			}
			label := k.name + " " + name
			if k.name == "rule" {
				rules[name]++
				label = fmt.Sprintf("rule %d of chain %s", rules[name], name)
			}
			lines = append(lines, label+": "+b.String())
		}
	}
	return lines, nil
}

// nftDump lists the objects of kind k of podnet's table (the table
// itself: a get, which fails with ENOENT when it does not exist).
func nftDump(conn *netlink.Conn, k dumpKind) ([]netlink.Message, error) {
	// the table, by name; the others filtered by table (NFTA_*_TABLE is
	// attribute 1 of each)
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: 1, Data: []byte(contract.NFTable + "\x00")}})
	if err != nil {
		return nil, err
	}
	flags := netlink.Request
	if k.name != "table" {
		flags |= netlink.Dump
	}
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | int(k.msg)), Flags: flags},
		// nfgenmsg: family, version, resource id
		Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	return conn.Execute(req)
}

// structureDiff says how the kernel's structure (have) differs from the
// one written (want): "" when it does not.
func structureDiff(want, have []string) string {
	index := func(lines []string) ([]string, map[string]string) {
		labels := make([]string, 0, len(lines))
		m := make(map[string]string, len(lines))
		for _, l := range lines {
			label, content, _ := strings.Cut(l, ": ")
			labels = append(labels, label)
			m[label] = content
		}
		return labels, m
	}
	wl, wm := index(want)
	hl, hm := index(have)
	var out []string
	for _, l := range wl {
		c, ok := hm[l]
		switch {
		case !ok:
			out = append(out, l+" missing")
		case c != wm[l]:
			out = append(out, l+" changed")
		}
	}
	for _, l := range hl {
		if _, ok := wm[l]; !ok {
			out = append(out, l+" added")
		}
	}
	if len(out) == 0 && !slices.Equal(want, have) {
		out = append(out, "objects in another order")
	}
	return strings.Join(out, ", ")
}

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

// elementChanges compares two lists of elements of a set: del holds those
// of before that after lacks, add those of after that before lacks.
func elementChanges(before, after []nftables.SetElement) (del, add []nftables.SetElement) {
	in := func(list []nftables.SetElement) map[string]bool {
		m := make(map[string]bool, len(list))
		for _, e := range list {
			m[elementKey(e)] = true
		}
		return m
	}
	b, a := in(before), in(after)
	for _, e := range before {
		if !a[elementKey(e)] {
			del = append(del, e)
		}
	}
	for _, e := range after {
		if !b[elementKey(e)] {
			add = append(add, e)
		}
	}
	return del, add
}
