package veth_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/policysock"
)

// TestPolicyWaitOverlapsThePodSide: ADD sends the NetworkPolicy engine its
// request once the host side is in place, and reads the answer only after
// it has set up the pod side, so that the engine's write and the plugin's
// work run at the same time. Right after the pod's address step, the
// engine here must have the request: an ADD that asked only after
// configuring the pod would still be in that step when the test gives up.
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
