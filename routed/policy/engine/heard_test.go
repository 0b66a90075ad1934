package engine

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/routed/policy"
)

func linkUpdate(typ uint16, index int, name, alias string, master int) netlink.LinkUpdate {
	u := netlink.LinkUpdate{Link: &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name, Alias: alias, MasterIndex: master}}}
	u.Header.Type = typ
	return u
}

// TestHeardLinks: what the link notifications say of the host veths is
// what the wait finds, and only that: a veth without podnet's alias yet,
// a detached one, one deleted or renamed away, another link, and
// anything heard before notifications were lost are asked of the kernel.
func TestHeardLinks(t *testing.T) {
	var asked []string
	e := &Engine{lookupLink: func(name string) (portLink, bool) {
		asked = append(asked, name)
		return portLink{ifName: "kernel"}, true
	}}
	owner := contract.VethOwner{Network: "podnet", ContainerID: "c1", IfName: "net1"}
	a, b := contract.HostVethName("shop", "db-1", "", "net1"), contract.HostVethName("shop", "db-2", "", "eth0")
	find := func(name string) (portLink, bool) {
		asked = nil
		pl, ok := e.hostVeth(name)
		return pl, ok && len(asked) == 0
	}
	const newL, delL = unix.RTM_NEWLINK, unix.RTM_DELLINK
	steps := []struct {
		what  string
		u     *netlink.LinkUpdate
		lost  bool
		name  string
		heard bool
		want  portLink
	}{
		{what: "created, no alias yet", u: new(linkUpdate(newL, 7, a, "", 0)), name: a},
		{what: "its alias set", u: new(linkUpdate(newL, 7, a, owner.Alias(), 0)), name: a, heard: true, want: portLink{ifName: "net1"}},
		{what: "enslaved to a bridge", u: new(linkUpdate(newL, 7, a, owner.Alias(), 3)), name: a, heard: true, want: portLink{ifName: "net1", bridged: true}},
		{what: "detached", u: new(linkUpdate(newL, 7, a, owner.DetachedAlias(), 0)), name: a},
		{what: "in service again", u: new(linkUpdate(newL, 7, a, owner.Alias(), 0)), name: a, heard: true, want: portLink{ifName: "net1"}},
		{what: "renamed to another host veth name: the old name", u: new(linkUpdate(newL, 7, b, owner.Alias(), 0)), name: a},
		{what: "renamed to another host veth name: the new one", name: b, heard: true, want: portLink{ifName: "net1"}},
		{what: "renamed to a name no plugin gives", u: new(linkUpdate(newL, 7, "eth9", owner.Alias(), 0)), name: b},
		{what: "a link of another name with the alias", name: "eth9"},
		{what: "back, then deleted", u: new(linkUpdate(newL, 7, a, owner.Alias(), 0)), name: a, heard: true, want: portLink{ifName: "net1"}},
		{what: "deleted", u: new(linkUpdate(delL, 7, a, owner.Alias(), 0)), name: a},
		{what: "a new one", u: new(linkUpdate(newL, 8, a, owner.Alias(), 0)), name: a, heard: true, want: portLink{ifName: "net1"}},
		{what: "notifications lost", lost: true, name: a},
	}
	for _, s := range steps {
		if s.u != nil {
			e.HostVethUpdate(*s.u)
		}
		if s.lost {
			e.HostVethsLost()
		}
		pl, heard := find(s.name)
		if heard != s.heard || heard && pl != s.want {
			t.Errorf("%s: %s found as %+v, heard %v; want heard %v as %+v", s.what, s.name, pl, heard, s.heard, s.want)
		}
		if !heard && (pl != portLink{ifName: "kernel"}) {
			t.Errorf("%s: %s not heard of, and not asked of the kernel", s.what, s.name)
		}
	}
	e.HostVethUpdate(netlink.LinkUpdate{}) // no link: nothing
}

// TestWaitFindsTheHeardPort: the wait takes the port of a host veth it
// heard of from the notifications without asking the kernel; of one it
// did not hear of, it asks.
func TestWaitFindsTheHeardPort(t *testing.T) {
	var lookups atomic.Int32
	r := newRig(t, func(e *Engine) {
		e.lookupLink = func(string) (portLink, bool) {
			lookups.Add(1)
			return portLink{}, false
		}
	})
	r.pols.Add(denyIngress())
	r.pods.Add(pod("db-1", "", map[string]string{"app": "db"}))
	r.pods.Add(pod("db-2", "", map[string]string{"app": "db"}))
	r.until("db-1, db-2 arriving", func(rs policy.Ruleset) bool { return len(rs.Pods) == 2 })
	// a second interface: only the wait (or a link scan) makes it a port
	heard := contract.HostVethName("shop", "db-1", "", "net1")
	unheard := contract.HostVethName("shop", "db-2", "", "net1")
	r.e.HostVethUpdate(linkUpdate(unix.RTM_NEWLINK, 40, heard, contract.VethOwner{Network: "podnet", ContainerID: "c1", IfName: "net1"}.Alias(), 0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := policysock.Request{Namespace: "shop", Name: "db-1", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.21")}, HostVeth: heard}
	if err := policysock.Wait(ctx, r.sock, req); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if n := lookups.Load(); n != 0 {
		t.Errorf("the wait asked the kernel %d time(s) for a host veth it heard of", n)
	}
	rs, _ := r.w.last()
	if !slices.Contains(rs.Ports, heard) {
		t.Errorf("after the wait, ports %v lack %s", rs.Ports, heard)
	}
	req = policysock.Request{Namespace: "shop", Name: "db-2", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.22")}, HostVeth: unheard}
	if err := policysock.Wait(ctx, r.sock, req); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("the wait asked the kernel %d time(s) for a host veth it did not hear of, want 1", n)
	}
	rs, _ = r.w.last()
	if slices.Contains(rs.Ports, unheard) {
		t.Errorf("a host veth neither heard of nor in the kernel is a port: %v", rs.Ports)
	}
}

// TestWaitTakesTheModeOfTheRequest: a podnet-bridge plugin asks before its
// host veth is a port of the bridge; the mode its request names decides
// how the pod is judged (by its addresses, not by a port it will not send
// through), and a routed one's port is a port.
func TestWaitTakesTheModeOfTheRequest(t *testing.T) {
	r := newRig(t, func(e *Engine) {
		e.lookupLink = func(string) (portLink, bool) { return portLink{}, false }
	})
	r.pols.Add(denyIngress())
	r.pods.Add(pod("db-1", "", map[string]string{"app": "db"}))
	r.pods.Add(pod("db-2", "", map[string]string{"app": "db"}))
	r.until("db-1, db-2 arriving", func(rs policy.Ruleset) bool { return len(rs.Pods) == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, mode := range []string{"bridge", "routed"} {
		name := []string{"db-1", "db-2"}[i]
		veth := contract.HostVethName("shop", name, "", "eth0")
		r.e.HostVethUpdate(linkUpdate(unix.RTM_NEWLINK, 50+i, veth, contract.VethOwner{Network: "podnet", ContainerID: "c" + name, IfName: "eth0"}.Alias(), 0))
		req := policysock.Request{Namespace: "shop", Name: name, IPs: []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 31+i))}, HostVeth: veth,
			Guard: &policysock.GuardPort{Mode: mode, Index: 50 + i, Alias: "x", MAC: "02:00:00:00:00:01"}}
		if err := policysock.Wait(ctx, r.sock, req); err != nil {
			t.Fatalf("%s: Wait: %v", mode, err)
		}
		rs, _ := r.w.last()
		if got := slices.Contains(rs.Ports, veth); got != (mode == "routed") {
			t.Errorf("%s: %s among the ports judged by port: %v, want %v (ports %v)", mode, veth, got, mode == "routed", rs.Ports)
		}
	}
}
