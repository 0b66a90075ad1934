package veth

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/testns"
)

// TestSysctlWriter: settings of one directory are written from it, opened
// once; each lands; a missing setting or directory is fs.ErrNotExist, and
// the next write still works.
func TestSysctlWriter(t *testing.T) {
	err := testns.New(t).Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sw0"}, PeerName: "sw0p"}); err != nil {
			return err
		}
		var w sysctlWriter
		defer w.close()
		for _, s := range [][2]string{
			{"net/ipv4/conf/sw0/proxy_arp", "1"},
			{"net/ipv4/conf/sw0/accept_redirects", "0"},
			{"net/ipv4/conf/sw0/forwarding", "1"},
			{"net/ipv4/neigh/sw0/proxy_delay", "0"},
		} {
			if err := w.write(s[0], s[1]); err != nil {
				t.Fatalf("write %s: %v", s[0], err)
			}
			if got, err := readSysctl(s[0]); err != nil || got != s[1] {
				t.Errorf("%s = %q, %v; want %q", s[0], got, err, s[1])
			}
		}
		if len(w.dirs) != 2 {
			t.Errorf("%d directories opened for two, want each once: %v", len(w.dirs), w.dirs)
		}
		if err := w.write("net/ipv4/conf/sw0/no_such_setting", "1"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a missing setting: %v, want fs.ErrNotExist", err)
		}
		if err := w.write("net/ipv4/conf/nosuchdev/forwarding", "1"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a missing directory: %v, want fs.ErrNotExist", err)
		}
		if err := w.write("net/ipv4/conf/sw0/proxy_arp", "0"); err != nil {
			t.Errorf("after the misses: %v", err)
		}
		if got, _ := readSysctl("net/ipv4/conf/sw0/proxy_arp"); got != "0" {
			t.Errorf("proxy_arp = %q after writing 0", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSetAddrGenMode: the mode is set by netlink, as the sysctl shows it,
// both ways; an interface without IPv6 (an MTU below 1280) is left alone
// without an error.
func TestSetAddrGenMode(t *testing.T) {
	err := testns.New(t).Do(func(ns.NetNS) error {
		for _, name := range []string{"ag0", "ag1"} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("ag0")
		if err != nil {
			return err
		}
		for _, mode := range []int{addrGenModeNone, addrGenModeEUI64} {
			if err := setAddrGenMode(&netlink.Handle{}, l, mode); err != nil {
				t.Fatalf("mode %d: %v", mode, err)
			}
			want := map[int]string{addrGenModeNone: "1", addrGenModeEUI64: "0"}[mode]
			if got, err := readSysctl("net/ipv6/conf/ag0/addr_gen_mode"); err != nil || got != want {
				t.Errorf("mode %d: addr_gen_mode = %q, %v; want %q", mode, got, err, want)
			}
		}
		small, err := netlink.LinkByName("ag1")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMTU(small, 1200); err != nil {
			return err
		}
		if _, err := readSysctl("net/ipv6/conf/ag1/addr_gen_mode"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("an interface with MTU 1200 still has IPv6 settings (%v): the case is not made", err)
		}
		if err := setAddrGenMode(&netlink.Handle{}, small, addrGenModeNone); err != nil {
			t.Errorf("no IPv6 on the interface: %v, want nothing done", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
