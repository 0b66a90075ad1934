package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/testns"
)

// TestGuardPort: podnet-routed puts the port a plugin describes in the pod
// filter of its mode, as the plugin would (the rules, the port's elements
// and its record, which the repair then keeps), on one lasting socket for
// every request; a mode it does not know is refused and writes nothing.
func TestGuardPort(t *testing.T) {
	n := testns.New(t)
	dir := t.TempDir()
	d := &Daemon{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler), guardConn: nftutil.Conn{Timeout: 2 * time.Second}}
	err := n.Do(func(ns.NetNS) error {
		var first any
		for i, mode := range []string{"routed", "bridge"} {
			name := []string{"pn0000000000a", "pn0000000000b"}[i]
			alias := contract.VethOwner{Network: "podnet", ContainerID: "c" + name, IfName: "eth0"}.Alias()
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Alias: alias}, PeerName: "p" + name[2:]}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetAlias(l, alias); err != nil {
				return err
			}
			req := policysock.Request{Namespace: "ns", Name: "web", HostVeth: name,
				IPs:   []netip.Addr{netip.MustParseAddr("10.244.0.7"), netip.MustParseAddr("fd00::7")},
				Guard: &policysock.GuardPort{Mode: mode, Index: l.Attrs().Index, Alias: alias, MAC: "02:00:00:00:00:07"}}
			if err := d.GuardPort(context.Background(), req); err != nil {
				t.Fatalf("%s: GuardPort: %v", mode, err)
			}
			g, _ := podfilter.ByMode(mode)
			g = g.At(dir)
			mac, _ := net.ParseMAC("02:00:00:00:00:07")
			port := podfilter.Port{Index: l.Attrs().Index, Name: name, Alias: alias, IPs: []net.IP{net.ParseIP("10.244.0.7"), net.ParseIP("fd00::7")}, MAC: mac}
			if err := g.Verify(port); err != nil {
				t.Errorf("%s: after GuardPort: %v", mode, err)
			}
			ports, _, err := g.Desired()
			if err != nil {
				return err
			}
			if len(ports) != 1 || ports[0].Index != port.Index {
				t.Errorf("%s: records %+v, want the port's", mode, ports)
			}
			if i == 0 {
				first = d.guardConn.Netlink()
			} else if d.guardConn.Netlink() != first {
				t.Error("the second request dialed a socket of its own")
			}
		}
		bad := policysock.Request{Namespace: "ns", Name: "x", HostVeth: "pn0000000000c",
			IPs: []netip.Addr{netip.MustParseAddr("10.244.0.8")}, Guard: &policysock.GuardPort{Mode: "netdev", Index: 99, Alias: "a", MAC: "02:00:00:00:00:08"}}
		if err := d.GuardPort(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "netdev") {
			t.Errorf("mode netdev: %v, want a refusal", err)
		}
		d.guardConn.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
