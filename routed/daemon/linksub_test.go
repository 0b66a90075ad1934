package daemon

import (
	"encoding/binary"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/testns"
)

// TestSubscribeLinks: the subscription hears veths being created, coming
// up and being deleted in its netns (and nothing of the test's own), each
// update whole however many come after it (its link is decoded from a
// copy, not from the one read buffer); closing done ends it without an
// error.
func TestSubscribeLinks(t *testing.T) {
	n := testns.New(t)
	ch := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	var errs atomic.Int32
	onErr := func(err error) { errs.Add(1); t.Logf("subscription error: %v", err) }
	macs := map[string]net.HardwareAddr{
		"zz0": {0x02, 0, 0, 0, 0, 0x01}, "zz0p": {0x02, 0, 0, 0, 0, 0x11},
		"zz1": {0x02, 0, 0, 0, 0, 0x02}, "zz1p": {0x02, 0, 0, 0, 0, 0x12},
	}
	err := n.Do(func(ns.NetNS) error {
		if err := subscribeLinks(ch, done, onErr); err != nil {
			return err
		}
		for _, name := range []string{"zz0", "zz1"} {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: macs[name]},
				PeerName: name + "p", PeerHardwareAddr: macs[name+"p"]}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("zz0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []netlink.LinkUpdate
	timeout := time.After(5 * time.Second)
	for deleted := false; !deleted; {
		select {
		case u := <-ch:
			got = append(got, u)
			deleted = u.Header.Type == unix.RTM_DELLINK && u.Link.Attrs().Name == "zz0"
		case <-timeout:
			t.Fatalf("no RTM_DELLINK of zz0 within 5 s; heard %d updates", len(got))
		}
	}
	runtime.GC() // nothing an update holds may be reused under it
	var newZZ0, newZZ1, upZZ0 bool
	for _, u := range got {
		a := u.Link.Attrs()
		want, ok := macs[a.Name]
		if !ok {
			t.Errorf("update of %q: not a link of the test", a.Name)
			continue
		}
		if a.HardwareAddr.String() != want.String() {
			t.Errorf("update %d of %s: MAC %s, want %s", u.Header.Type, a.Name, a.HardwareAddr, want)
		}
		if int(u.Index) != a.Index {
			t.Errorf("update of %s: ifinfomsg index %d, link index %d", a.Name, u.Index, a.Index)
		}
		if u.Header.Type == unix.RTM_NEWLINK {
			newZZ0 = newZZ0 || a.Name == "zz0"
			newZZ1 = newZZ1 || a.Name == "zz1"
			upZZ0 = upZZ0 || (a.Name == "zz0" && u.IfInfomsg.Flags&unix.IFF_UP != 0)
		}
	}
	if !newZZ0 || !newZZ1 || !upZZ0 {
		t.Errorf("heard zz0 created %v, zz1 created %v, zz0 up %v: want all", newZZ0, newZZ1, upZZ0)
	}
	close(done)
	timeout = time.After(5 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-ch:
		case <-timeout:
			t.Fatal("the update channel stayed open after done was closed")
		}
	}
	if errs.Load() != 0 {
		t.Errorf("%d subscription errors", errs.Load())
	}
}

// linkMsg is an RTM_NEWLINK of interface index with name and MAC.
func linkMsg(index int32, name string, mac net.HardwareAddr) []byte {
	data := make([]byte, unix.SizeofIfInfomsg) // family, type, index, flags, change
	binary.NativeEndian.PutUint32(data[4:], uint32(index))
	data = append(data, linkAttr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	data = append(data, linkAttr(unix.IFLA_ADDRESS, mac)...)
	return linkNlMsg(unix.RTM_NEWLINK, data)
}

func linkAttr(typ uint16, v []byte) []byte {
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(v)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func linkNlMsg(typ uint16, data []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(unix.SizeofNlMsghdr+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, make([]byte, 10)...) // flags, seq, pid
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// TestDecodeLinkDatagramHostile: a datagram on the link group that is
// not what the kernel sends. A message too short for an ifinfomsg is an
// error and the valid link after it is still heard; other message types
// are skipped; bytes that do not parse as netlink yield one error and no
// update; and an update stays whole when the read buffer is overwritten.
func TestDecodeLinkDatagramHostile(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}
	buf := slices.Concat(
		linkNlMsg(unix.RTM_NEWLINK, []byte{0, 0, 0, 0}), // short
		linkNlMsg(unix.RTM_NEWADDR, make([]byte, 24)),   // another type
		linkMsg(7, "x1", mac),
	)
	updates, errs := decodeLinkDatagram(buf)
	if len(errs) != 1 || len(updates) != 1 {
		t.Fatalf("%d updates, errors %v: want 1 update and 1 error", len(updates), errs)
	}
	clear(buf) // the next read reuses the buffer
	a := updates[0].Link.Attrs()
	if a.Name != "x1" || a.HardwareAddr.String() != mac.String() || updates[0].Index != 7 || updates[0].Header.Type != unix.RTM_NEWLINK {
		t.Errorf("update: name %q MAC %s index %d type %d; want x1 %s 7 RTM_NEWLINK", a.Name, a.HardwareAddr, updates[0].Index, updates[0].Header.Type, mac)
	}

	garbage := linkMsg(8, "x2", mac)
	binary.NativeEndian.PutUint32(garbage, 4096) // claims more than the datagram holds
	if updates, errs := decodeLinkDatagram(garbage); len(updates) != 0 || len(errs) != 1 {
		t.Errorf("a datagram that does not parse: %d updates, errors %v; want none and 1 error", len(updates), errs)
	}
	if updates, errs := decodeLinkDatagram(nil); len(updates) != 0 || len(errs) != 0 {
		t.Errorf("an empty datagram: %d updates, errors %v; want nothing", len(updates), errs)
	}
}
