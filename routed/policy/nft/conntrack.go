package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Allowed tells whether a connection is allowed by the policy now in
// force: source and destination address (after DNAT), IP protocol,
// destination port (after DNAT; 0 for protocols without ports).
type Allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool

// Conntrack is a lasting conntrack (ctnetlink) socket of the netns of the
// thread that first uses it, for Revoke and RevokeOf: one socket for
// every scan, not one per scan. Closing a netfilter netlink socket makes
// the kernel take the netns's nftables commit lock and, while it holds
// it, wait for the release of what recent transactions replaced (an RCU
// grace period, 10-30 ms on a busy node): every nftables write on the
// node (the policy writes that new pods wait for, the pod filter's)
// queued behind each scan's close. The zero Conntrack is ready; it is
// safe for concurrent use (scans take turns). A scan that fails drops
// the socket: the next one dials again.
type Conntrack struct {
	mu sync.Mutex
	s  *nl.NetlinkSocket
}

// Revoke is the package's Revoke on c's socket.
func (c *Conntrack) Revoke(allowed Allowed) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s == nil {
		s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
		if err != nil {
			return 0, fmt.Errorf("revoke conntrack entries: netlink socket: %w", err)
		}
		c.s = s
	}
	n, err := revokeAll(map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: c.s}}, allowed)
	if err != nil {
		// whatever the socket was in the middle of must not be read
		// as the next scan's answer
		c.s.Close()
		c.s = nil
		return n, fmt.Errorf("revoke conntrack entries: %w", err)
	}
	return n, nil
}

// RevokeOf is the package's RevokeOf on c's socket.
func (c *Conntrack) RevokeOf(addrs []netip.Addr, allowed Allowed) (int, error) {
	return revokeOf(c.Revoke, addrs, allowed)
}

// Close closes c's socket (the next scan dials again).
func (c *Conntrack) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s != nil {
		c.s.Close()
		c.s = nil
	}
}

// Revoke deletes the conntrack entries (both families, the calling
// thread's netns) whose connection (origTuple: after DNAT) allowed no
// longer allows, and returns how many it deleted, on a socket of its own
// (a daemon keeps a Conntrack). The table accepts established traffic
// before any policy: a connection a change no longer allows keeps going
// until its entry goes. The next packet of such a TCP connection is then
// picked up as new (nf_conntrack_tcp_loose) and judged, and dropped.
// Entries allowed keeps are not touched: the table is dumped once, both
// families in one walk (a dump walks every bucket of the kernel's hash
// table, shared by all netns: 262,144 on this machine, whatever the
// entries), each entry's tuples read where they lie in the message
// (nothing else of it is decoded), and only the revoked entries are
// deleted, each by its own message sent back in its family. A node's table
// holds tens of thousands of entries (TIME_WAIT alone): a generic
// decoder of every attribute took a core while pods were deleted one
// after another.
func Revoke(allowed Allowed) (int, error) {
	var c Conntrack
	defer c.Close()
	return c.Revoke(allowed)
}

func ctRequest(sockets map[int]*nl.SocketHandle, fam uint8, op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest((unix.NFNL_SUBSYS_CTNETLINK<<8)|op, flags)
	req.Sockets = sockets
	req.AddData(&nl.Nfgenmsg{NfgenFamily: fam, Version: nl.NFNETLINK_V0})
	return req
}

// RevokeOf is Revoke for the connections of addrs only: those with one of
// addrs as their source, or as their destination after DNAT (origTuple).
// Every other entry keeps its verdict unjudged: a change that only took
// away the addresses of pods that are gone (a pod deleted here or on
// another node) changes the verdict of no other connection, and judging
// an entry (allowed) costs more than reading it. The table is still
// dumped whole: a dump the kernel filters by address (CTA_FILTER) walks
// the whole hash table as well, and the two one address needs (as source,
// as reply source) took 178 ms against 81 ms for one unfiltered dump of
// 20,000 entries here, so there is one walk whatever the addresses.
func RevokeOf(addrs []netip.Addr, allowed Allowed) (int, error) {
	return revokeOf(Revoke, addrs, allowed)
}

// revokeOf is RevokeOf with revoke's scan.
func revokeOf(revoke func(Allowed) (int, error), addrs []netip.Addr, allowed Allowed) (int, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	of := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		of[a.Unmap()] = true
	}
	return revoke(func(src, dst netip.Addr, proto uint8, dport uint16) bool {
		return !of[src] && !of[dst] || allowed(src, dst, proto, dport)
	})
}

// ctEntry is a conntrack message to send back for a delete: its family
// and its attributes.
type ctEntry struct {
	fam uint8
	raw []byte
}

// deleteEntries deletes each entry by its own message; one gone already
// (its connection ended meanwhile) counts as deleted.
func deleteEntries(sockets map[int]*nl.SocketHandle, doomed []ctEntry) (int, error) {
	deleted, failed := 0, 0
	for _, e := range doomed {
		req := ctRequest(sockets, e.fam, nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		req.AddRawData(e.raw)
		if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err == nil || errors.Is(err, fs.ErrNotExist) {
			deleted++
		} else {
			failed++
		}
	}
	if failed > 0 {
		return deleted, fmt.Errorf("%d of %d entries not deleted", failed, len(doomed))
	}
	return deleted, nil
}

// revokeAll dumps every entry of the netns (AF_UNSPEC: both families in
// one walk of the hash table) and deletes those allowed refuses.
func revokeAll(sockets map[int]*nl.SocketHandle, allowed Allowed) (int, error) {
	var doomed []ctEntry
	err := ctRequest(sockets, unix.AF_UNSPEC, nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP).ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		if len(msg) < 4 {
			return true
		}
		fam := msg[0] // nfgenmsg: the entry's own family
		if fam != unix.AF_INET && fam != unix.AF_INET6 {
			return true
		}
		t, ok := origTuple(msg[4:])
		if ok && !allowed(t.src, t.dst, t.proto, t.dport) {
			doomed = append(doomed, ctEntry{fam, append([]byte(nil), msg[4:]...)})
		}
		return true
	})
	var errs []error
	if err != nil {
		if !errors.Is(err, nl.ErrDumpInterrupted) {
			return 0, fmt.Errorf("dump: %w", err)
		}
		errs = append(errs, fmt.Errorf("dump: %w (the entries read are judged)", err))
	}
	deleted, err := deleteEntries(sockets, doomed)
	return deleted, errors.Join(append(errs, err)...)
}

// ctTuple is an entry's original direction as Allowed judges it.
type ctTuple struct {
	src, dst netip.Addr
	proto    uint8
	dport    uint16
}

// attrs walks the netlink attributes in b, calling f with each one's
// type (flags masked off) and payload; a malformed one ends the walk.
func attrs(b []byte, f func(typ uint16, val []byte)) {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofNlAttr || l > len(b) {
			return
		}
		f(binary.NativeEndian.Uint16(b[2:])&nl.NLA_TYPE_MASK, b[unix.SizeofNlAttr:l])
		next := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if next > len(b) {
			return
		}
		b = b[next:]
	}
}

// rawTuple is one CTA_TUPLE_ORIG or CTA_TUPLE_REPLY as read.
type rawTuple struct {
	src, dst           netip.Addr
	proto              uint8
	sport, dport       uint16
	hasProto           bool
	hasSport, hasDport bool
}

// readTuple reads the addresses, protocol and ports of one tuple.
func readTuple(val []byte) (r rawTuple) {
	attrs(val, func(typ uint16, val []byte) {
		switch typ {
		case nl.CTA_TUPLE_IP:
			attrs(val, func(typ uint16, val []byte) {
				a, valid := netip.AddrFromSlice(val)
				if !valid {
					return
				}
				switch typ {
				case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
					r.src = a.Unmap()
				case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
					r.dst = a.Unmap()
				}
			})
		case nl.CTA_TUPLE_PROTO:
			attrs(val, func(typ uint16, val []byte) {
				switch {
				case typ == nl.CTA_PROTO_NUM && len(val) == 1:
					r.proto, r.hasProto = val[0], true
				case typ == nl.CTA_PROTO_SRC_PORT && len(val) == 2:
					r.sport, r.hasSport = binary.BigEndian.Uint16(val), true
				case typ == nl.CTA_PROTO_DST_PORT && len(val) == 2:
					r.dport, r.hasDport = binary.BigEndian.Uint16(val), true
				}
			})
		}
	})
	return r
}

// origTuple reads a conntrack message's connection as the policy table
// judged it: the original direction's source, and its destination after
// destination NAT, which is the reply direction's source (address and
// port). A connection to a Service's virtual IP is judged by the table
// (in forward and input, after kube-proxy's DNAT) as one to the backend
// pod, so it is judged so here too; without NAT the reply's source is the
// original destination. ok is false when the original tuple lacks the
// addresses or the protocol.
func origTuple(msg []byte) (t ctTuple, ok bool) {
	var orig, reply rawTuple
	var hasOrig, hasReply bool
	attrs(msg, func(typ uint16, val []byte) {
		switch typ {
		case nl.CTA_TUPLE_ORIG:
			orig, hasOrig = readTuple(val), true
		case nl.CTA_TUPLE_REPLY:
			reply, hasReply = readTuple(val), true
		}
	})
	if !hasOrig || !orig.hasProto || !orig.src.IsValid() || !orig.dst.IsValid() {
		return ctTuple{}, false
	}
	t = ctTuple{src: orig.src, dst: orig.dst, proto: orig.proto}
	if orig.hasDport {
		t.dport = orig.dport
	}
	if hasReply && reply.src.IsValid() && reply.src.Is4() == orig.dst.Is4() {
		t.dst = reply.src
		if reply.hasSport {
			t.dport = reply.sport
		}
	}
	switch t.proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_UDPLITE, unix.IPPROTO_DCCP:
	default:
		t.dport = 0 // ICMP's "port" attributes are its id, type and code
	}
	return t, true
}
