package daemon

import (
	"net"
	"runtime"
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
