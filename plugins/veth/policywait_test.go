package veth_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/test/nettest"
)

// policySocket listens where the plugin of e looks for the engine (the
// policy socket of its config's stateDir).
func (e *addEnv) policySocket(t *testing.T) net.Listener {
	t.Helper()
	var conf struct {
		StateDir string `json:"stateDir"`
	}
	if err := json.Unmarshal(e.args.StdinData, &conf); err != nil {
		t.Fatal(err)
	}
	l, err := policysock.Listen(policysock.Path(conf.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestPolicyWaitOverlapsThePodSide: ADD sends the NetworkPolicy engine its
// request once the veth pair exists, and reads the answer only after
// it has set up the pod side, so that the engine's write and the plugin's
// work run at the same time. Right after the pod's address step, the
// engine here must have the request: an ADD that asked only after
// configuring the pod would still be in that step when the test gives up.
func TestPolicyWaitOverlapsThePodSide(t *testing.T) {
	for _, m := range rollbackModes {
		t.Run(m.name, func(t *testing.T) {
			e := newAddEnv(t, m.pluginType, m.shared, "0verlap01")
			l := e.policySocket(t)
			got := make(chan policysock.Request, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go policysock.Serve(ctx, l, time.Minute, func(ctx context.Context, r policysock.Request) error {
				got <- r
				return nil
			})
			var req *policysock.Request
			afterAddress := func(step string) error {
				if step != "address" {
					return nil
				}
				select {
				case r := <-got:
					req = &r
				case <-time.After(5 * time.Second):
				}
				return nil
			}
			if _, err := e.add(t, m.newPlugin(afterAddress)); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if req == nil {
				t.Fatal("when the pod had its address, the engine had no request yet: ADD asks it only after setting up the pod")
			}
			if req.HostVeth != e.hostVeth || req.Namespace != testPodNS || req.Name != testPodName || len(req.IPs) != 1 {
				t.Errorf("engine got %+v, want pod %s/%s, host veth %s, one address", *req, testPodNS, testPodName, e.hostVeth)
			}
		})
	}
}

// TestGuardAskedOfTheDaemon: with an engine on the node, ADD asks
// podnet-routed to put the host veth in the pod filter (the plugin's own
// nftables socket would close at its exit, holding the node's nftables
// commit lock through a grace period) and, once it says so, does not write
// the elements itself. The port it describes is the veth's, and the host
// veth is still down when the daemon is asked. When the daemon cannot,
// the plugin writes the elements itself.
func TestGuardAskedOfTheDaemon(t *testing.T) {
	for _, m := range rollbackModes {
		for _, fail := range []bool{false, true} {
			name := m.name + "/daemon guards"
			if fail {
				name = m.name + "/daemon fails"
			}
			t.Run(name, func(t *testing.T) {
				e := newAddEnv(t, m.pluginType, m.shared, "gu4rd01")
				l := e.policySocket(t)
				type asked struct {
					req    policysock.Request
					hostUp bool
					err    error
				}
				got := make(chan asked, 1)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				guard := func(_ context.Context, r policysock.Request, _ func(error)) error {
					a := asked{req: r}
					a.err = e.inNode(func() error {
						l, err := netlink.LinkByName(r.HostVeth)
						if err == nil {
							a.hostUp = l.Attrs().Flags&net.FlagUp != 0
						}
						return err
					})
					got <- a
					if fail {
						return errors.New("nftables: operation not permitted")
					}
					return nil
				}
				go policysock.ServeGuarded(ctx, l, time.Minute, guard, func(context.Context, policysock.Request, func(error)) error { return nil })
				if _, err := e.add(t, m.newPlugin(nil)); err != nil {
					t.Fatalf("ADD: %v", err)
				}
				var a asked
				select {
				case a = <-got:
				default:
					t.Fatal("ADD did not ask podnet-routed to guard the port")
				}
				if a.err != nil {
					t.Fatalf("looking up the host veth when asked: %v", a.err)
				}
				if a.hostUp {
					t.Error("the host veth was up when the daemon was asked to guard it")
				}
				var host netlink.Link
				if err := e.inNode(func() (err error) { host, err = netlink.LinkByName(e.hostVeth); return err }); err != nil {
					t.Fatal(err)
				}
				var podMAC string
				if err := e.podNS.Do(func(ns.NetNS) error {
					l, err := netlink.LinkByName(testIfName)
					if err == nil {
						podMAC = l.Attrs().HardwareAddr.String()
					}
					return err
				}); err != nil {
					t.Fatal(err)
				}
				wantMode := map[string]string{"routed": "routed", "bridged": "bridge"}[m.name]
				g := a.req.Guard
				if a.req.HostVeth != e.hostVeth || g == nil || g.Mode != wantMode || g.Index != host.Attrs().Index || g.Alias != host.Attrs().Alias || g.MAC != podMAC || len(a.req.IPs) != 1 {
					t.Fatalf("daemon asked %+v / %+v, want host veth %s, mode %s, index %d, alias %q, MAC %s, one address",
						a.req, g, e.hostVeth, wantMode, host.Attrs().Index, host.Attrs().Alias, podMAC)
				}
				elems, err := nettest.PodFilterElements(e.node.NS)
				if err != nil {
					t.Fatal(err)
				}
				ip := a.req.IPs[0].String()
				mine := slices.ContainsFunc(elems, func(s string) bool { return strings.HasSuffix(s, " . "+ip) })
				if fail && !mine {
					t.Errorf("the daemon failed and the plugin did not write the port's elements: %v", elems)
				}
				if !fail && len(elems) > 0 {
					t.Errorf("the daemon guarded the port and the plugin wrote elements too: %v", elems)
				}
			})
		}
	}
}

// TestDelUnguardByDaemon: DEL asks podnet-routed to take the port out of
// the pod filter (its host veth's index, the mode, the pod's MAC) and,
// when it says it did, leaves the elements alone (this fake daemon
// removes nothing, so they stay); when it fails, the plugin removes them
// itself.
func TestDelUnguardByDaemon(t *testing.T) {
	for _, m := range rollbackModes {
		for _, fail := range []bool{false, true} {
			name := m.name + "/daemon unguards"
			if fail {
				name = m.name + "/daemon fails"
			}
			t.Run(name, func(t *testing.T) {
				e := newAddEnv(t, m.pluginType, m.shared, "ungu4rd1")
				l := e.policySocket(t)
				got := make(chan policysock.Request, 2)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				// no Guard handler: ADD writes the port itself
				go policysock.ServeHandlers(ctx, l, time.Minute, 0, policysock.Handlers{
					Unguard: func(_ context.Context, r policysock.Request) error {
						got <- r
						if fail {
							return errors.New("nftables: operation not permitted")
						}
						return nil
					},
					Wait: func(context.Context, policysock.Request, func(error)) error { return nil },
				})
				if _, err := e.add(t, m.newPlugin(nil)); err != nil {
					t.Fatalf("ADD: %v", err)
				}
				var host netlink.Link
				if err := e.inNode(func() (err error) { host, err = netlink.LinkByName(e.hostVeth); return err }); err != nil {
					t.Fatal(err)
				}
				before, err := nettest.PodFilterElements(e.node.NS)
				if err != nil {
					t.Fatal(err)
				}
				if len(before) == 0 {
					t.Fatal("ADD wrote no pod filter elements")
				}
				if err := e.del(t, m.newPlugin(nil)); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				var r policysock.Request
				select {
				case r = <-got:
				default:
					t.Fatal("DEL did not ask podnet-routed to take the port out")
				}
				wantMode := map[string]string{"routed": "routed", "bridged": "bridge"}[m.name]
				if r.Unguard == nil || r.Unguard.Mode != wantMode || r.Unguard.Index != host.Attrs().Index || r.Namespace != "" || r.Name != "" {
					t.Fatalf("DEL asked %+v / %+v, want mode %s, index %d and no pod name", r, r.Unguard, wantMode, host.Attrs().Index)
				}
				time.Sleep(20 * time.Millisecond) // removed elements expire (1 ms)
				after, err := nettest.PodFilterElements(e.node.NS)
				if err != nil {
					t.Fatal(err)
				}
				if !fail && !slices.Equal(after, before) {
					t.Errorf("the daemon said it took the port out and the plugin removed elements too: %v, was %v", after, before)
				}
				if fail && len(after) > 0 {
					t.Errorf("the daemon failed and the plugin left the port's elements: %v", after)
				}
			})
		}
	}
}
