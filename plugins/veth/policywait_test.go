package veth_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/podnet/podnet/internal/policysock"
)

// TestPolicyWaitOverlapsThePodSide: ADD sends the NetworkPolicy engine its
// request once the host side is in place, and reads the answer only after
// it has set up the pod side, so that the engine's write and the plugin's
// work run at the same time. The engine here answers only once it sees
// the pod's address on its interface: an ADD that asked it after
// configuring the pod, or waited before configuring it, gets no answer.
// A request that comes while the pod's address is already there fails it
// too: the request must not wait for the pod side.
func TestPolicyWaitOverlapsThePodSide(t *testing.T) {
	for _, m := range rollbackModes {
		t.Run(m.name, func(t *testing.T) {
			e := newAddEnv(t, m.pluginType, m.shared, "0verlap01")
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
			podH, err := netns.GetFromPath(e.podNS.Path())
			if err != nil {
				t.Fatal(err)
			}
			defer podH.Close()
			nl, err := netlink.NewHandleAt(podH)
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			podAddrs := func() int {
				addrs, err := nl.AddrList(nil, netlink.FAMILY_V4)
				if err != nil {
					return -1
				}
				n := 0
				for _, a := range addrs {
					if !a.IP.IsLoopback() {
						n++
					}
				}
				return n
			}
			type seen struct {
				before, after int
				veth          string
			}
			got := make(chan seen, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go policysock.Serve(ctx, l, time.Minute, func(ctx context.Context, r policysock.Request) error {
				s := seen{before: podAddrs(), after: -1, veth: r.HostVeth}
				for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
					if n := podAddrs(); n > 0 {
						s.after = n
						break
					}
				}
				got <- s
				if s.after <= 0 {
					return errors.New("the pod side was not set up while the request waited")
				}
				return nil
			})
			start := time.Now()
			if _, err := e.add(t, m.newPlugin(func(string) error { return nil })); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			took := time.Since(start)
			var s seen
			select {
			case s = <-got:
			default:
				t.Fatal("the engine got no request")
			}
			if s.veth != e.hostVeth {
				t.Errorf("request named host veth %q, want %q", s.veth, e.hostVeth)
			}
			if s.before != 0 {
				t.Errorf("the request came after the pod had %d address(es): it waited for the pod side", s.before)
			}
			if s.after != 1 {
				t.Errorf("while the request waited, the pod got %d address(es), want 1 (ADD took %v)", s.after, took)
			}
		})
	}
}
