// Package nftutil holds what podnet-routed's nftables writers share:
// routed/dataplane's table inet podnet and routed/policy/nft's table inet
// podnet-policy. Both repair their table by content: after a full write
// they read its structure back (Structure) and keep it; at resync they
// read it again and compare (StructureDiff), set elements aside.
package nftutil

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// SetSendBuffer gives an nftables socket room for a whole transaction
// (one sendmsg): size bytes, past net.core.wmem_max when the caller has
// CAP_NET_ADMIN (which writing nftables needs anyway), else as much as
// allowed.
func SetSendBuffer(c *netlink.Conn, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, size)
		}
	}); err != nil {
		return err
	}
	return serr
}

// SetReceiveBuffer gives an nftables socket room for the kernel's
// answers to a whole transaction: one acknowledgement per message, about
// 1 KiB each as the kernel counts them, so a transaction of thousands of
// chains and rules overflows the default buffer (ENOBUFS) without it.
func SetReceiveBuffer(c *netlink.Conn, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
		}
	}); err != nil {
		return err
	}
	return serr
}

// dumpKind is one kind of object of a table and the netlink attributes
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

// Structure reads table (of family, an NFPROTO_* value) from the kernel
// as canonical lines, one per object: the table, its objects, sets,
// chains and rules (in order), each "<kind> <name>: <its attributes in
// hex>" without handles, counter values and element counts. Set elements
// are not in it. nil, nil: there is no such table. conn is a netfilter
// netlink socket.
func Structure(conn *netlink.Conn, family byte, table string) ([]string, error) {
	return structure(conn, family, table, nil, nil)
}

// StructureUpdate is Structure after a change to a table whose Structure
// was old: everything is read again but the rules, which are read only
// for the chains in changed (created or rewritten) and taken from old for
// the others. Its cost is that of the table's chains, sets and objects,
// not of all its rules.
func StructureUpdate(conn *netlink.Conn, family byte, table string, old []string, changed map[string]bool) ([]string, error) {
	if old == nil {
		return Structure(conn, family, table)
	}
	return structure(conn, family, table, old, changed)
}

func structure(conn *netlink.Conn, family byte, table string, old []string, changed map[string]bool) ([]string, error) {
	var lines, chains []string
	for _, k := range dumpKinds {
		if k.name == "rule" && old != nil {
			// the rules, chain by chain in the table's order
			oldRules := map[string][]string{}
			for _, l := range old {
				label, _, _ := strings.Cut(l, ": ")
				if _, chain, ok := strings.Cut(label, " of chain "); ok && strings.HasPrefix(label, "rule ") {
					oldRules[chain] = append(oldRules[chain], l)
				}
			}
			for _, chain := range chains {
				if !changed[chain] {
					lines = append(lines, oldRules[chain]...)
					continue
				}
				got, err := dumpLines(conn, k, family, table, chain)
				if err != nil {
					return nil, err
				}
				lines = append(lines, got...)
			}
			continue
		}
		got, err := dumpLines(conn, k, family, table, "")
		if k.name == "table" && errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if k.name == "chain" {
			for _, l := range got {
				label, _, _ := strings.Cut(l, ": ")
				chains = append(chains, strings.TrimPrefix(label, "chain "))
			}
		}
		lines = append(lines, got...)
	}
	return lines, nil
}

// dumpLines reads the objects of kind k of table (rules: of chain only,
// when it is set) as Structure's lines.
func dumpLines(conn *netlink.Conn, k dumpKind, family byte, table, chain string) ([]string, error) {
	msgs, err := dump(conn, k, family, table, chain)
	if err != nil {
		return nil, fmt.Errorf("dump nftables %ss of %s: %w", k.name, table, err)
	}
	var lines []string
	rules := map[string]int{}
	for _, m := range msgs {
		attrs, err := netlink.UnmarshalAttributes(m.Data[min(4, len(m.Data)):])
		if err != nil {
			return nil, fmt.Errorf("nftables %s: %w", k.name, err)
		}
		tbl, name := "", ""
		var b strings.Builder
		for _, a := range attrs {
			typ := a.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if typ == 1 {
				tbl = strings.TrimRight(string(a.Data), "\x00")
			}
			if typ == k.named {
				name = strings.TrimRight(string(a.Data), "\x00")
			}
			if slices.Contains(k.skip, typ) {
				continue
			}
			fmt.Fprintf(&b, "%d=%s;", typ, hex.EncodeToString(a.Data))
		}
		if tbl != table { // a chain dump lists every table's
			continue
		}
		label := k.name + " " + name
		if k.name == "rule" {
			rules[name]++
			label = fmt.Sprintf("rule %d of chain %s", rules[name], name)
		}
		lines = append(lines, label+": "+b.String())
	}
	return lines, nil
}

// dump lists the objects of kind k of table (the table itself: a get,
// which fails with ENOENT when it does not exist; rules: of chain only,
// when it is set).
func dump(conn *netlink.Conn, k dumpKind, family byte, table, chain string) ([]netlink.Message, error) {
	// the table, by name; the others filtered by table (NFTA_*_TABLE is
	// attribute 1 of each) and the rules by chain (NFTA_RULE_CHAIN, 2)
	list := []netlink.Attribute{{Type: 1, Data: []byte(table + "\x00")}}
	if chain != "" {
		list = append(list, netlink.Attribute{Type: 2, Data: []byte(chain + "\x00")})
	}
	attrs, err := netlink.MarshalAttributes(list)
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
		Data: append([]byte{family, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	return conn.Execute(req)
}

// StructureDiff says how the kernel's structure (have) differs from the
// one written (want), both from Structure: "" when it does not.
func StructureDiff(want, have []string) string {
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
