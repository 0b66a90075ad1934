package nodestate

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// nlMsg is one netlink message: header, then data padded to 4 bytes.
func nlMsg(typ, flags uint16, data []byte) []byte {
	b := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(data)+3)
	binary.NativeEndian.PutUint32(b[0:], uint32(unix.SizeofNlMsghdr+len(data)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// rtAttr is one route attribute, padded to 4 bytes.
func rtAttr(typ uint16, v []byte) []byte {
	b := make([]byte, 4, 4+len(v)+3)
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// ifaddr is an RTM_NEWADDR of family with attrs.
func ifaddr(family byte, flags uint16, attrs ...[]byte) []byte {
	data := []byte{family, 32, 0, 0, 1, 0, 0, 0} // ifaddrmsg
	for _, a := range attrs {
		data = append(data, a...)
	}
	return nlMsg(syscall.RTM_NEWADDR, flags, data)
}

func parse(t *testing.T, parts ...[]byte) []syscall.NetlinkMessage {
	t.Helper()
	msgs, err := syscall.ParseNetlinkMessage(slices.Concat(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func errMsg(errno int32) []byte {
	d := make([]byte, 4+unix.SizeofNlMsghdr)
	binary.NativeEndian.PutUint32(d, uint32(-errno))
	return nlMsg(syscall.NLMSG_ERROR, 0, d)
}

// TestAddrsOfHostile: what the kernel's address dump could hold that is
// not a plain address: addrsOf keeps the global unicast addresses of the
// family asked for, each by its local end, and skips or refuses the rest
// without letting one bad message hide the good ones after it.
func TestAddrsOfHostile(t *testing.T) {
	v4 := func(s string) []byte { a := netip.MustParseAddr(s).As4(); return a[:] }
	msgs := parse(t,
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_ADDRESS, v4("10.1.1.2")), rtAttr(syscall.IFA_LOCAL, v4("10.1.1.1"))), // peer, local
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_ADDRESS, v4("10.2.2.2"))),                                            // no IFA_LOCAL
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_LOCAL, v4("127.0.0.1"))),                                             // loopback
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_LOCAL, v4("169.254.1.1"))),                                           // link-local
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_LOCAL, v4("224.0.0.1"))),                                             // multicast
		ifaddr(unix.AF_INET6, 0, rtAttr(syscall.IFA_LOCAL, netip.MustParseAddr("fd00::1").AsSlice())),                   // another family
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_LOCAL, []byte{10, 3})),                                               // truncated address
		ifaddr(unix.AF_INET, 0), // no attribute
		nlMsg(syscall.RTM_NEWADDR, 0, []byte{unix.AF_INET, 32, 0}), // shorter than ifaddrmsg
		nlMsg(syscall.RTM_NEWLINK, 0, make([]byte, 16)),            // another type
		errMsg(0), // an acknowledgement
		ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_LOCAL, v4("10.4.4.4"))),
	)
	got, interrupted, err := addrsOf(msgs, unix.AF_INET)
	want := []netip.Addr{netip.MustParseAddr("10.1.1.1"), netip.MustParseAddr("10.2.2.2"), netip.MustParseAddr("10.4.4.4")}
	if err != nil || interrupted || !slices.Equal(got, want) {
		t.Errorf("addrsOf = %v, interrupted %v, err %v; want %v, false, nil", got, interrupted, err, want)
	}

	// the kernel says the dump was interrupted: the caller takes it again
	_, interrupted, err = addrsOf(parse(t, ifaddr(unix.AF_INET, unix.NLM_F_DUMP_INTR, rtAttr(syscall.IFA_LOCAL, v4("10.5.5.5")))), unix.AF_INET)
	if err != nil || !interrupted {
		t.Errorf("a dump marked NLM_F_DUMP_INTR: interrupted %v, err %v; want true, nil", interrupted, err)
	}
	// an error answer fails the dump with its errno
	if _, _, err := addrsOf(parse(t, errMsg(int32(syscall.EPERM))), unix.AF_INET); !errors.Is(err, syscall.EPERM) {
		t.Errorf("NLMSG_ERROR EPERM: err %v, want EPERM", err)
	}
	// an attribute that claims more bytes than its message holds
	bad := ifaddr(unix.AF_INET, 0, rtAttr(syscall.IFA_LOCAL, v4("10.6.6.6")))
	binary.NativeEndian.PutUint16(bad[unix.SizeofNlMsghdr+8:], 200)
	if got, _, err := addrsOf(parse(t, bad), unix.AF_INET); err == nil {
		t.Errorf("an attribute longer than its message: %v, no error", got)
	}
}
