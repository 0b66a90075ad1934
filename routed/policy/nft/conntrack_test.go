package nft

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

func nla(typ uint16, nested bool, val []byte) []byte {
	if nested {
		typ |= unix.NLA_F_NESTED
	}
	b := binary.NativeEndian.AppendUint16(nil, uint16(unix.SizeofNlAttr+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// tupleAttrs is one tuple's attributes (CTA_TUPLE_IP and _PROTO).
func tupleAttrs(s, d netip.Addr, proto uint8, sp, dp uint16) []byte {
	ipSrc, ipDst := uint16(nl.CTA_IP_V4_SRC), uint16(nl.CTA_IP_V4_DST)
	if s.Is6() {
		ipSrc, ipDst = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	return cat(
		nla(nl.CTA_TUPLE_IP, true, cat(nla(ipSrc, false, s.AsSlice()), nla(ipDst, false, d.AsSlice()))),
		nla(nl.CTA_TUPLE_PROTO, true, cat(nla(nl.CTA_PROTO_NUM, false, []byte{proto}),
			nla(nl.CTA_PROTO_SRC_PORT, false, binary.BigEndian.AppendUint16(nil, sp)),
			nla(nl.CTA_PROTO_DST_PORT, false, binary.BigEndian.AppendUint16(nil, dp)))))
}

// ctMessage is a conntrack message's attributes as the kernel sends
// them: the reply tuple and other attributes around the original one.
func ctMessage(src, dst netip.Addr, proto uint8, sport, dport uint16) []byte {
	return cat(
		nla(nl.CTA_TUPLE_REPLY, true, tupleAttrs(dst, src, proto, dport, sport)),
		nla(nl.CTA_TUPLE_ORIG, true, tupleAttrs(src, dst, proto, sport, dport)),
		nla(nl.CTA_MARK, false, []byte{0, 0, 0, 1}),
	)
}

// TestOrigTuple: the original tuple is read wherever it lies in the
// message (not the reply's), ICMP has no port, and no truncated or
// garbled message panics or yields a tuple it does not hold.
func TestOrigTuple(t *testing.T) {
	src, dst := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.7")
	got, ok := origTuple(ctMessage(src, dst, unix.IPPROTO_TCP, 40000, 8080))
	if want := (ctTuple{src, dst, unix.IPPROTO_TCP, 8080}); !ok || got != want {
		t.Fatalf("origTuple = %+v %v, want %+v", got, ok, want)
	}
	s6, d6 := netip.MustParseAddr("fd00::5"), netip.MustParseAddr("fd00::7")
	if got, ok := origTuple(ctMessage(s6, d6, unix.IPPROTO_ICMPV6, 3, 128)); !ok || got != (ctTuple{s6, d6, unix.IPPROTO_ICMPV6, 0}) {
		t.Fatalf("ICMPv6 origTuple = %+v %v", got, ok)
	}
	// a connection to a Service's virtual IP, DNATed to a backend pod:
	// judged as the table judged it, to the backend's address and port
	vip, backend := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.244.3.9")
	natted := cat(nla(nl.CTA_TUPLE_ORIG, true, tupleAttrs(src, vip, unix.IPPROTO_TCP, 40000, 80)),
		nla(nl.CTA_TUPLE_REPLY, true, tupleAttrs(backend, src, unix.IPPROTO_TCP, 8080, 40000)))
	if got, ok := origTuple(natted); !ok || got != (ctTuple{src, backend, unix.IPPROTO_TCP, 8080}) {
		t.Fatalf("DNAT origTuple = %+v %v, want %s -> %s:8080", got, ok, src, backend)
	}
	// masqueraded to the outside (SNAT): the destination stays
	ext := netip.MustParseAddr("203.0.113.7")
	masq := cat(nla(nl.CTA_TUPLE_ORIG, true, tupleAttrs(src, ext, unix.IPPROTO_TCP, 40000, 443)),
		nla(nl.CTA_TUPLE_REPLY, true, tupleAttrs(ext, netip.MustParseAddr("192.168.0.4"), unix.IPPROTO_TCP, 443, 61000)))
	if got, ok := origTuple(masq); !ok || got != (ctTuple{src, ext, unix.IPPROTO_TCP, 443}) {
		t.Fatalf("SNAT origTuple = %+v %v, want %s -> %s:443", got, ok, src, ext)
	}
	if _, ok := origTuple(nla(nl.CTA_MARK, false, []byte{1, 2, 3, 4})); ok {
		t.Fatal("a message without a tuple gave one")
	}
	msg := ctMessage(src, dst, unix.IPPROTO_UDP, 53, 53)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		b := append([]byte(nil), msg[:r.IntN(len(msg)+1)]...)
		if i%2 == 1 && len(b) > 0 {
			b[r.IntN(len(b))] = byte(r.IntN(256))
		}
		if got, ok := origTuple(b); ok && (!got.src.IsValid() || !got.dst.IsValid()) {
			t.Fatalf("origTuple(%x) = %+v, ok without addresses", b, got)
		}
	}
}
