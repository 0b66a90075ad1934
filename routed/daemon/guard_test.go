package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
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

// testDaemon is a Daemon with state dir dir and the nftables sockets of
// the pod filter's writes (its guard, its checks), as New makes them.
func testDaemon(dir string) *Daemon {
	return &Daemon{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler), metrics: NewMetrics(), guardConn: newGuardConn(), podFilterConn: newPodFilterConn()}
}

// TestGuardPort: podnet-routed puts the port a plugin describes in the pod
// filter of its mode, as the plugin would (the rules, the port's elements
// and its record, which the repair then keeps), on one lasting socket for
// every request; a mode it does not know is refused and writes nothing.
func TestGuardPort(t *testing.T) {
	n := testns.New(t)
	dir := t.TempDir()
	d := testDaemon(dir)
	err := n.Do(func(ns.NetNS) error {
		var first any
		for i, mode := range []string{"routed", "bridge"} {
			name := []string{"pn0000000000a", "pn0000000000b"}[i]
			l, alias, err := hostVeth(name, "p"+name[2:])
			if err != nil {
				return err
			}
			req := policysock.Request{Namespace: "ns", Name: "web", HostVeth: name,
				IPs:   []netip.Addr{netip.MustParseAddr("10.244.0.7"), netip.MustParseAddr("fd00::7")},
				Guard: &policysock.GuardPort{Mode: mode, Index: l.Attrs().Index, Alias: alias, MAC: "02:00:00:00:00:07"}}
			if err := d.GuardPort(context.Background(), req, nil); err != nil {
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
		if err := d.GuardPort(context.Background(), bad, nil); err == nil || !strings.Contains(err.Error(), "netdev") {
			t.Errorf("mode netdev: %v, want a refusal", err)
		}
		d.guardConn.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGuardPortBatches: the ports asked for while a guard write is under
// way go in together, in one transaction (the ruleset generation moves
// by one for all of them), each verified and recorded; a port the kernel
// refuses (a host veth name longer than IFNAMSIZ) fails alone, and the
// others of its batch are in.
func TestGuardPortBatches(t *testing.T) {
	n := testns.New(t)
	dir := t.TempDir()
	d := testDaemon(dir)
	defer d.guardConn.Close()
	g := podfilter.Routed.At(dir)
	type pod struct {
		req  policysock.Request
		port podfilter.Port
	}
	var pods []pod
	err := n.Do(func(ns.NetNS) error {
		for i := range 9 {
			name := fmt.Sprintf("pn%011x", i+1)
			l, alias, err := hostVeth(name, fmt.Sprintf("pq%011x", i+1))
			if err != nil {
				return err
			}
			ip := netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)})
			mac := net.HardwareAddr{2, 0, 0, 0, 0, byte(10 + i)}
			veth := name
			if i == 4 {
				veth += "-0123456789" // the kernel hooks no such device
			}
			pods = append(pods, pod{
				req: policysock.Request{Namespace: "ns", Name: fmt.Sprintf("web-%d", i), HostVeth: veth, IPs: []netip.Addr{ip},
					Guard: &policysock.GuardPort{Mode: "routed", Index: l.Attrs().Index, Alias: alias, MAC: mac.String()}},
				port: podfilter.Port{Index: l.Attrs().Index, Name: name, Alias: alias, IPs: []net.IP{ip.AsSlice()}, MAC: mac},
			})
		}
		// the first pod's write makes the table and opens the socket
		if err := d.GuardPort(context.Background(), pods[0].req, nil); err != nil {
			return fmt.Errorf("the first port: %w", err)
		}
		c, raw, err := nftutil.Dial(2*time.Second, 0, 0)
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		gen := func() uint32 {
			v, err := nftutil.Generation(raw)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		// a write under way: the other 8 queue behind it
		d.guardMu.Lock()
		errs := make([]error, len(pods))
		// each is answered once, by the write, before its GuardPort returns
		answered := make([]int, len(pods))
		answers := make([]error, len(pods))
		var wg sync.WaitGroup
		for i := 1; i < len(pods); i++ {
			wg.Go(func() {
				errs[i] = n.Do(func(ns.NetNS) error {
					return d.GuardPort(context.Background(), pods[i].req, func(err error) { answered[i]++; answers[i] = err })
				})
			})
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			d.guardQMu.Lock()
			queued := len(d.guardQ)
			d.guardQMu.Unlock()
			if queued == len(pods)-1 {
				break
			}
			if time.Now().After(deadline) {
				d.guardMu.Unlock()
				wg.Wait()
				return fmt.Errorf("%d of %d requests queued", queued, len(pods)-1)
			}
		}
		d.guardMu.Unlock()
		wg.Wait()
		for i, err := range errs {
			if (err != nil) != (i == 4) {
				t.Errorf("pod %d: %v (want an error only for pod 4, the port the kernel refuses)", i, err)
			}
			if i > 0 && (answered[i] != 1 || answers[i] != err) {
				t.Errorf("pod %d: answered %d times with %v, want once with %v", i, answered[i], answers[i], err)
			}
		}
		for i, p := range pods {
			err := g.Verify(p.port)
			if (err != nil) != (i == 4) {
				t.Errorf("pod %d's port: %v (want it guarded unless it is pod 4)", i, err)
			}
		}
		// a batch the kernel takes whole is one transaction
		gen1 := gen()
		d.guardMu.Lock()
		more := []int{0, 1, 2}
		for _, i := range more {
			wg.Go(func() {
				errs[i] = n.Do(func(ns.NetNS) error { return d.GuardPort(context.Background(), pods[i].req, nil) })
			})
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			d.guardQMu.Lock()
			queued := len(d.guardQ)
			d.guardQMu.Unlock()
			if queued == len(more) || time.Now().After(deadline) {
				break
			}
		}
		d.guardMu.Unlock()
		wg.Wait()
		for _, i := range more {
			if errs[i] != nil {
				t.Errorf("pod %d again: %v", i, errs[i])
			}
		}
		if moved := gen() - gen1; moved != 1 {
			t.Errorf("3 ports queued together took %d transactions, want 1", moved)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// hostVeth makes a veth pair, name's end carrying the alias of a podnet
// attachment as ADD gives it, in the calling thread's netns.
func hostVeth(name, peer string) (netlink.Link, string, error) {
	alias := contract.VethOwner{Network: "podnet", ContainerID: "c" + name, IfName: "eth0"}.Alias()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		return nil, "", err
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, "", err
	}
	if err := netlink.LinkSetAlias(l, alias); err != nil {
		return nil, "", err
	}
	return l, alias, nil
}

// TestUnguardPort: podnet-routed takes the port a DEL names out of the
// pod filter on the socket it guards ports on: exactly the elements of
// the addresses and MAC given, or whatever the filter holds for the
// index when none are; the record goes with them, other ports stay; a
// mode it does not know is refused.
func TestUnguardPort(t *testing.T) {
	n := testns.New(t)
	dir := t.TempDir()
	d := testDaemon(dir)
	defer d.guardConn.Close()
	err := n.Do(func(ns.NetNS) error {
		for _, mode := range []string{"routed", "bridge"} {
			g, _ := podfilter.ByMode(mode)
			g = g.At(dir)
			mac, _ := net.ParseMAC("02:00:00:00:00:07")
			var ports []podfilter.Port
			for i, name := range []string{"pn000000000" + mode[:1] + "1", "pn000000000" + mode[:1] + "2", "pn000000000" + mode[:1] + "3"} {
				l, alias, err := hostVeth(name, "p"+name[2:])
				if err != nil {
					return err
				}
				ip := netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)})
				req := policysock.Request{Namespace: "ns", Name: name, HostVeth: name, IPs: []netip.Addr{ip},
					Guard: &policysock.GuardPort{Mode: mode, Index: l.Attrs().Index, Alias: alias, MAC: mac.String()}}
				if err := d.GuardPort(context.Background(), req, nil); err != nil {
					t.Fatalf("%s: GuardPort: %v", mode, err)
				}
				ports = append(ports, podfilter.Port{Index: l.Attrs().Index, Name: name, Alias: alias, IPs: []net.IP{ip.AsSlice()}, MAC: mac})
			}
			socket := d.guardConn.Netlink()
			// exact: the port's addresses and MAC
			exact := policysock.Request{IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 0, 10})},
				Unguard: &policysock.GuardPort{Mode: mode, Index: ports[0].Index, MAC: mac.String()}}
			if err := d.UnguardPort(context.Background(), exact); err != nil {
				t.Fatalf("%s: UnguardPort (exact): %v", mode, err)
			}
			// by index alone
			if err := d.UnguardPort(context.Background(), policysock.Request{Unguard: &policysock.GuardPort{Mode: mode, Index: ports[1].Index}}); err != nil {
				t.Fatalf("%s: UnguardPort (index): %v", mode, err)
			}
			if d.guardConn.Netlink() != socket {
				t.Errorf("%s: UnguardPort dialed a socket of its own", mode)
			}
			time.Sleep(20 * time.Millisecond) // removed elements expire (1 ms timeouts)
			for _, p := range ports[:2] {
				if err := g.Verify(p); err == nil {
					t.Errorf("%s: port %d still in the pod filter after UnguardPort", mode, p.Index)
				}
			}
			if err := g.Verify(ports[2]); err != nil {
				t.Errorf("%s: another port went too: %v", mode, err)
			}
			recs, _, err := g.Desired()
			if err != nil {
				return err
			}
			if len(recs) != 1 || recs[0].Index != ports[2].Index {
				t.Errorf("%s: records %+v, want only port %d's", mode, recs, ports[2].Index)
			}
		}
		bad := policysock.Request{Unguard: &policysock.GuardPort{Mode: "netdev", Index: 99}}
		if err := d.UnguardPort(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "netdev") {
			t.Errorf("mode netdev: %v, want a refusal", err)
		}
		// a live port (its host veth up) stays guarded
		l, alias, err := hostVeth("pn000000000up", "p000000000up")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		mac, _ := net.ParseMAC("02:00:00:00:00:09")
		ip := netip.MustParseAddr("10.244.0.99")
		if err := d.GuardPort(context.Background(), policysock.Request{Namespace: "ns", Name: "up", HostVeth: "pn000000000up", IPs: []netip.Addr{ip},
			Guard: &policysock.GuardPort{Mode: "routed", Index: l.Attrs().Index, Alias: alias, MAC: mac.String()}}, nil); err != nil {
			return err
		}
		live := policysock.Request{IPs: []netip.Addr{ip}, Unguard: &policysock.GuardPort{Mode: "routed", Index: l.Attrs().Index, MAC: mac.String()}}
		if err := d.UnguardPort(context.Background(), live); err == nil || !strings.Contains(err.Error(), "is up") {
			t.Errorf("a live port: %v, want a refusal", err)
		}
		time.Sleep(20 * time.Millisecond)
		if err := podfilter.Routed.At(dir).Verify(podfilter.Port{Index: l.Attrs().Index, Name: "pn000000000up", Alias: alias, IPs: []net.IP{ip.AsSlice()}, MAC: mac}); err != nil {
			t.Errorf("the live port left the pod filter: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
