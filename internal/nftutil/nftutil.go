// Package nftutil is podnet's one nftables layer, which every table
// writer builds on: routed/dataplane's table inet podnet (tunnel filter
// and masquerade), routed/policy/nft's tables inet and bridge
// podnet-policy, and internal/podfilter's podnet-pods (inet, bridge,
// netdev). A table is described as data (Table: counters, sets and maps
// with their elements, chains with their rules); it is written whole in
// one transaction (Table.QueueWhole) on one lasting socket with a
// deadline (Conn), element lists are compared by canonical key
// (ElementKey, ElementChanges) so that a change writes only the elements
// that change, and the table is read back by content (Structure,
// StructurePatch) after a write. Repair is one rule for all (Differs):
// whatever differs from the desired table, a missing table included, is
// rewritten, and the writer counts it. Each writer keeps what is its
// own: which rules, which elements.
//
// Why not sigs.k8s.io/knftables: it drives the nft binary (text in, JSON
// out), one process per transaction; podnet speaks netlink to the kernel
// directly (github.com/google/nftables), in the CNI plugin's ADD too,
// with no nft binary on the node and no fork on the hot path. So it is
// not taken.
package nftutil

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// SetSendBuffer gives an nftables socket room for a whole transaction
// (one sendmsg): size bytes, past net.core.wmem_max when the caller has
// CAP_NET_ADMIN (which writing nftables needs anyway), else as much as
// allowed.
func SetSendBuffer(c *netlink.Conn, size int) error {
	return setBuffer(c, size, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF)
}

// SetReceiveBuffer gives an nftables socket room for the kernel's
// answers to a whole transaction: one acknowledgement per message, about
// 1 KiB each as the kernel counts them, so a transaction of thousands of
// chains and rules overflows the default buffer (ENOBUFS) without it.
func SetReceiveBuffer(c *netlink.Conn, size int) error {
	return setBuffer(c, size, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF)
}

// setBuffer sets a socket buffer of c to size with the option force, or
// where that is refused (no CAP_NET_ADMIN) with plain.
func setBuffer(c *netlink.Conn, size, force, plain int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, size); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, plain, size)
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
	// USE (the references to an object) follows other objects' rules and
	// elements, which are compared on their own: an object's line changes
	// only when the object itself does.
	{name: "table", msg: unix.NFT_MSG_GETTABLE, named: 1, skip: []uint16{3 /* USE */, 4 /* HANDLE */, 5 /* PAD */}},
	{name: "object", msg: unix.NFT_MSG_GETOBJ, named: 2, skip: []uint16{4 /* DATA: the counter's values */, 5 /* USE */, 6 /* HANDLE */, 7 /* PAD */}},
	{name: "set", msg: unix.NFT_MSG_GETSET, named: 2, skip: []uint16{14 /* PAD */, 16 /* HANDLE */, 19 /* TYPE: the backend */, 20 /* COUNT: elements */}},
	{name: "chain", msg: unix.NFT_MSG_GETCHAIN, named: 3, skip: []uint16{2 /* HANDLE */, 6 /* USE */, 8 /* COUNTERS */, 9 /* PAD */}},
	{name: "rule", msg: unix.NFT_MSG_GETRULE, named: 2, skip: []uint16{3 /* HANDLE */, 6 /* POSITION */, 8 /* PAD */}},
}

// Structure reads table (of family, an NFPROTO_* value) from the kernel
// as canonical lines, one per object: the table, its objects, sets,
// chains and rules (in order), each "<kind> <name>: <its attributes in
// hex>" without handles, counter values, element counts and reference
// counts. Set elements are not in it. nil, nil: there is no such table.
// conn is a netfilter netlink socket.
func Structure(conn *netlink.Conn, family byte, table string) ([]string, error) {
	var lines []string
	for _, k := range dumpKinds {
		got, err := dumpLines(conn, k, family, table, "")
		if k.name == "table" && errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		lines = append(lines, got...)
	}
	return lines, nil
}

// Patch names what one transaction changed in a table: the objects it
// created or replaced, those it deleted, and the chains whose rules it
// wrote. Sets' and maps' elements are not structure.
type Patch struct {
	Counters, Sets, Chains []string // created or replaced
	Gone                   []string // labels deleted: "object NAME", "set NAME", "chain NAME"
	Rules                  []string // chains whose rules were written
}

// StructurePatch is Structure after a transaction p describes, applied to
// a table whose Structure was old: only what p names is read from the
// kernel, everything else is taken from old, so that an edit someone else
// made to another object is not taken in as written (a comparison with
// Structure later finds it). A kind with few names is read object by
// object (one request each: the cost follows the change, not the table),
// one with many in one dump, filtered.
func StructurePatch(conn *netlink.Conn, family byte, table string, old []string, p Patch) ([]string, error) {
	drop := map[string]bool{}
	for _, g := range p.Gone {
		drop[g] = true
	}
	read := map[string]map[string]bool{"object": {}, "set": {}, "chain": {}, "rule": {}}
	for _, x := range []struct {
		kind  string
		names []string
	}{{"object", p.Counters}, {"set", p.Sets}, {"chain", p.Chains}, {"rule", p.Rules}} {
		for _, n := range x.names {
			read[x.kind][n] = true
			if x.kind != "rule" {
				drop[x.kind+" "+n] = true
			}
		}
	}
	for _, g := range p.Gone {
		if c, ok := strings.CutPrefix(g, "chain "); ok {
			read["rule"][c] = true // its rules are gone with it (none in the kernel)
		}
	}
	var lines []string
	for _, l := range old {
		label, _, _ := strings.Cut(l, ": ")
		if drop[label] {
			continue
		}
		if _, chain, ok := strings.Cut(label, " of chain "); ok && strings.HasPrefix(label, "rule ") && read["rule"][chain] {
			continue
		}
		lines = append(lines, l)
	}
	for _, k := range dumpKinds {
		names := read[k.name]
		if len(names) == 0 {
			continue
		}
		if len(names) > patchGets {
			got, err := dumpLines(conn, k, family, table, "")
			if err != nil {
				return nil, err
			}
			for _, l := range got {
				label, _, _ := strings.Cut(l, ": ")
				name := strings.TrimPrefix(label, k.name+" ")
				if k.name == "rule" {
					_, name, _ = strings.Cut(label, " of chain ")
				}
				if names[name] {
					lines = append(lines, l)
				}
			}
			continue
		}
		for _, n := range slices.Sorted(maps.Keys(names)) {
			var got []string
			var err error
			if k.name == "rule" {
				if slices.Contains(p.Gone, "chain "+n) && !slices.Contains(p.Chains, n) {
					continue
				}
				got, err = dumpLines(conn, k, family, table, n)
			} else {
				got, err = getLines(conn, k, family, table, n)
			}
			if err != nil {
				return nil, err
			}
			lines = append(lines, got...)
		}
	}
	return lines, nil
}

// patchGets is the most objects of one kind StructurePatch reads one by
// one; more are read in one dump.
const patchGets = 32

// Generation is the netns's nftables ruleset generation: the kernel adds
// one at each committed transaction, whatever table it changes. The same
// generation before and after a read means that nothing changed during it.
func Generation(conn *netlink.Conn) (uint32, error) {
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range msgs {
		attrs, err := netlink.UnmarshalAttributes(m.Data[min(4, len(m.Data)):])
		if err != nil {
			return 0, fmt.Errorf("nftables generation: %w", err)
		}
		for _, a := range attrs {
			if a.Type&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == unix.NFTA_GEN_ID && len(a.Data) == 4 {
				return binary.BigEndian.Uint32(a.Data), nil
			}
		}
	}
	return 0, errors.New("nftables generation: no NFTA_GEN_ID in the answer")
}

// getLines reads one named object of kind k (a counter, set or chain) as
// Structure's line.
func getLines(conn *netlink.Conn, k dumpKind, family byte, table, name string) ([]string, error) {
	list := []netlink.Attribute{{Type: 1, Data: []byte(table + "\x00")}, {Type: k.named, Data: []byte(name + "\x00")}}
	if k.name == "object" {
		list = append(list, netlink.Attribute{Type: 3 /* NFTA_OBJ_TYPE */, Data: binary.BigEndian.AppendUint32(nil, unix.NFT_OBJECT_COUNTER)})
	}
	attrs, err := netlink.MarshalAttributes(list)
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | int(k.msg)), Flags: netlink.Request},
		Data:   append([]byte{family, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("get nftables %s %s of %s: %w", k.name, name, table, err)
	}
	return linesOf(msgs, k, table)
}

// dumpLines reads the objects of kind k of table (rules: of chain only,
// when it is set) as Structure's lines.
func dumpLines(conn *netlink.Conn, k dumpKind, family byte, table, chain string) ([]string, error) {
	msgs, err := dump(conn, k, family, table, chain)
	if err != nil {
		return nil, fmt.Errorf("dump nftables %ss of %s: %w", k.name, table, err)
	}
	return linesOf(msgs, k, table)
}

func linesOf(msgs []netlink.Message, k dumpKind, table string) ([]string, error) {
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
	// the order of the lines means nothing: a rule's label numbers it in
	// its chain, and the order of the other objects does not matter
	return strings.Join(out, ", ")
}

// Conn is a lasting nftables socket (one netlink socket for every
// request, not one per request), dialed at its first use and again after
// Close. The zero Conn is ready; it is not safe for concurrent use.
type Conn struct {
	// SendBuffer and ReceiveBuffer size the socket when it is dialed (0:
	// the kernel's default); Timeout bounds each use (see Open).
	SendBuffer, ReceiveBuffer int
	Timeout                   time.Duration

	c    *nftables.Conn
	nl   *netlink.Conn
	port uint32 // the socket's netlink port ID (0: unknown)
}

// Open returns the socket, dialed when needed, with a deadline of Timeout
// from now for what the caller does with it: a lost acknowledgement fails
// the request rather than hanging it.
func (x *Conn) Open() (*nftables.Conn, error) {
	if x.c == nil {
		c, raw, err := Dial(0, x.SendBuffer, x.ReceiveBuffer)
		if err != nil {
			return nil, err
		}
		x.c, x.nl = c, raw
		if x.port = portID(raw); x.port != 0 {
			ownPorts.Store(x.port, struct{}{})
		}
	}
	if x.Timeout > 0 {
		if err := x.nl.SetDeadline(time.Now().Add(x.Timeout)); err != nil {
			x.Close()
			return nil, fmt.Errorf("nftables: %w", err)
		}
	}
	return x.c, nil
}

// Dial opens a lasting nftables socket (one netlink socket for every
// request; close it with CloseLasting) whose requests give up timeout
// from now (0: no deadline), with send and receive buffers of the sizes
// given (0: the kernel's default), its acknowledgements without copies
// of the requests (NETLINK_CAP_ACK). It is for one verb's requests (the
// CNI plugin's); a Conn is the socket a daemon keeps.
func Dial(timeout time.Duration, sendBuffer, receiveBuffer int) (*nftables.Conn, *netlink.Conn, error) {
	var raw *netlink.Conn
	c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(c *netlink.Conn) error {
		raw = c
		// an acknowledgement without a copy of its request: a whole
		// write's hundreds of messages fit the default receive buffer,
		// and the kernel copies less (an old kernel without the option
		// copies as before)
		_ = c.SetOption(netlink.CapAcknowledge, true)
		if timeout > 0 {
			if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
				return err
			}
		}
		if receiveBuffer > 0 {
			if err := SetReceiveBuffer(c, receiveBuffer); err != nil {
				return err
			}
		}
		if sendBuffer > 0 {
			return SetSendBuffer(c, sendBuffer)
		}
		return nil
	}))
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: %w", err)
	}
	return c, raw, nil
}

// Netlink is the open socket's netlink side, for the raw requests of
// Structure, StructurePatch and Generation (nil before Open).
func (x *Conn) Netlink() *netlink.Conn { return x.nl }

// Close closes the socket; the next Open dials again. Callers close it
// after an error too: whatever it was in the middle of must not be read
// as the answer to the next request.
func (x *Conn) Close() {
	if x.c != nil {
		ownPorts.Delete(x.port)
		_ = x.c.CloseLasting()
	}
	x.c, x.nl, x.port = nil, nil, 0
}

// ownPorts holds the netlink port IDs of this process's open Conns: each
// entry lives exactly as long as its socket, so there is nothing for a
// test to reset.
var ownPorts sync.Map

// OwnPort tells whether portid is one of this process's open Conns. The
// kernel sends a transaction's nftables notifications (its NEWGEN among
// them) with the port ID of the socket that committed it: a listener uses
// this to tell its own process's writes from everyone else's.
func OwnPort(portid uint32) bool {
	_, ok := ownPorts.Load(portid)
	return ok
}

// portID reads the port ID the kernel bound c to (0 when it cannot).
func portID(c *netlink.Conn) uint32 {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var port uint32
	_ = rc.Control(func(fd uintptr) {
		if sa, err := unix.Getsockname(int(fd)); err == nil {
			if nl, ok := sa.(*unix.SockaddrNetlink); ok {
				port = nl.Pid
			}
		}
	})
	return port
}

// IsNotFound tells whether err is the kernel's "no such table, chain,
// set or object" (ENOENT, as the library hands it back).
func IsNotFound(err error) bool {
	return err != nil && (errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), unix.ENOENT.Error()))
}
