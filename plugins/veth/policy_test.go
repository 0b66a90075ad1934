package veth

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/policysock"
)

// waitPolicy is startPolicyWait and finish at once.
func waitPolicy(inv *invocation, containerID string, ips []net.IP, log *slog.Logger) {
	startPolicyWait(inv, containerID, ips, log, nil).finish()
}

// TestWaitPolicyAsksTheEngine: ADD's last step tells the engine on the
// node which pod has which addresses and waits for its answer; a slow engine
// costs at most policyWait, and "0s" turns the wait off.
func TestWaitPolicyAsksTheEngine(t *testing.T) {
	dir := t.TempDir()
	l, err := policysock.Listen(policysock.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Pointer[policysock.Request]
	var slow atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go policysock.Serve(ctx, l, time.Minute, func(ctx context.Context, r policysock.Request) error {
		got.Store(&r)
		if slow.Load() {
			<-ctx.Done()
		}
		return nil
	})
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	inv := &invocation{conf: &netConf{StateDir: dir}, pod: podArgs{PodNamespace: "shop", PodName: "cart-0"}}
	ips := []net.IP{net.ParseIP("10.244.1.7"), net.ParseIP("fd00:10:244:1::7")}
	waitPolicy(inv, "c0ffee", ips, log)
	r := got.Load()
	if r == nil {
		t.Fatal("the engine got no request")
	}
	want := []netip.Addr{netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00:10:244:1::7")}
	if r.Namespace != "shop" || r.Name != "cart-0" || r.ContainerID != "c0ffee" || len(r.IPs) != 2 || r.IPs[0] != want[0] || r.IPs[1] != want[1] {
		t.Fatalf("engine got %+v", *r)
	}

	slow.Store(true)
	got.Store(nil)
	w := duration(200 * time.Millisecond)
	inv.conf.PolicyWait = &w
	// the engine never answers (it holds the request for a minute): ADD
	// goes on after policyWait
	done := make(chan struct{})
	go func() { waitPolicy(inv, "c0ffee", ips, log); close(done) }()
	select {
	case <-done:
	case <-time.After(50 * time.Second):
		t.Fatal("waitPolicy did not give up after policyWait 200ms")
	}
	if got.Load() == nil {
		t.Fatal("the slow engine got no request")
	}

	got.Store(nil)
	off := duration(0)
	inv.conf.PolicyWait = &off
	waitPolicy(inv, "c0ffee", ips, log)
	if got.Load() != nil {
		t.Fatal("policyWait 0s still asked the engine")
	}
	// no engine on the node: nothing to ask, no error
	inv.conf = &netConf{StateDir: t.TempDir()}
	waitPolicy(inv, "c0ffee", ips, log)
}
