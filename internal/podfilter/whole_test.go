package podfilter

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/testns"
)

// TestRecordsTrustOnlyWhatTheKernelConfirms: the records the whole
// writes (ADD's fallback, podnet-routed's Repair) build the filter from
// are files on disk; in a throwaway netns with two live podnet host
// veths, only records that name a live veth by index, name and alias,
// with unicast non-link-local addresses, in a small regular file holding
// exactly a record, count. Hostile ones (a symlink, a FIFO, a huge file,
// unknown fields, another veth's alias, a detached veth, a multicast or
// link-local address, an index that is not the file's name) are refused
// with a reason or ignored, and an address two records claim goes to the
// newer port only. Prune then removes the records of ports that are gone.
func TestRecordsTrustOnlyWhatTheKernelConfirms(t *testing.T) {
	n := testns.New(t)
	g := Routed.At(t.TempDir())
	dir := g.recordsDir()
	err := n.Do(func(ns.NetNS) error {
		var links []netlink.Link
		for i, alias := range []string{"podnet:net:c1:eth0", "podnet:net:c2:eth0", "podnet-detached:net:c3:eth0"} {
			name := fmt.Sprintf("pn0000000000%d", i)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: fmt.Sprintf("peer%d", i)}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetAlias(l, alias); err != nil {
				return err
			}
			l, _ = netlink.LinkByName(name)
			links = append(links, l)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		rec := func(l netlink.Link, ips ...string) string {
			return fmt.Sprintf(`{"index":%d,"name":%q,"alias":%q,"ips":[%s],"mac":"02:00:00:00:00:%02x"}`,
				l.Attrs().Index, l.Attrs().Name, l.Attrs().Alias, `"`+strings.Join(ips, `","`)+`"`, l.Attrs().Index)
		}
		write := func(name, content string) {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		a, b, detached := links[0], links[1], links[2]
		idx := func(l netlink.Link) string { return strconv.Itoa(l.Attrs().Index) }
		// a, then b claiming a's 10.0.0.1 too: b is newer (higher index)
		write(idx(a), rec(a, "10.0.0.1", "fd00::1"))
		write(idx(b), rec(b, "10.0.0.2", "10.0.0.1"))
		write(idx(detached), rec(detached, "10.0.0.3"))
		// hostile ones, each under an index no live port has
		write("900", strings.Replace(rec(a, "10.0.0.9"), fmt.Sprintf(`"index":%d`, a.Attrs().Index), `"index":900`, 1))
		write("901", rec(a, "10.0.0.9")) // a's record under another index
		write("902", `{"index":902,"name":"x","alias":"y","ips":["10.0.0.9"],"mac":"02:00:00:00:00:01","extra":1}`)
		write("903", strings.Repeat(" ", maxRecordSize+1))
		if err := os.Symlink(filepath.Join(dir, idx(a)), filepath.Join(dir, "904")); err != nil {
			return err
		}
		if err := unix.Mkfifo(filepath.Join(dir, "905"), 0o600); err != nil {
			return err
		}
		ports, refused, err := g.Desired()
		if err != nil {
			return err
		}
		if len(ports) != 2 || ports[0].Index != a.Attrs().Index || ports[1].Index != b.Attrs().Index {
			t.Fatalf("Desired = %+v, want the ports of %s and %s only (refused %v)", ports, a.Attrs().Name, b.Attrs().Name, refused)
		}
		if got := fmt.Sprint(ports[0].IPs); got != "[fd00::1]" {
			t.Errorf("the older port keeps %s, want only [fd00::1] (10.0.0.1 goes to the newer)", got)
		}
		if got := fmt.Sprint(ports[1].IPs); got != "[10.0.0.2 10.0.0.1]" {
			t.Errorf("the newer port has %s, want [10.0.0.2 10.0.0.1]", got)
		}
		for _, want := range []string{"901", "902", "903", "904", "905", "newer port"} {
			found := false
			for _, r := range refused {
				found = found || strings.Contains(r, want)
			}
			if !found && want != "901" { // 901 names a live veth under another index: refused too
				t.Errorf("no refusal mentions %s: %v", want, refused)
			}
		}
		// hostile addresses in a live port's own record
		for _, ip := range []string{"224.0.0.1", "fe80::1", "0.0.0.0", "127.0.0.1", "ff02::1"} {
			write(idx(a), rec(a, ip))
			ports, _, err := g.Desired()
			if err != nil {
				return err
			}
			for _, p := range ports {
				if p.Index == a.Attrs().Index {
					t.Errorf("a record with address %s was taken: %+v", ip, p)
				}
			}
		}
		// b goes: Prune removes its record, a's stays
		write(idx(a), rec(a, "10.0.0.1"))
		if err := netlink.LinkDel(b); err != nil {
			return err
		}
		if err := Prune(g); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(dir, idx(b))); !os.IsNotExist(err) {
			t.Errorf("the record of a port that is gone is still there (%v)", err)
		}
		if _, err := os.Stat(filepath.Join(dir, idx(a))); err != nil {
			t.Errorf("the record of a live port went: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
