package policysock

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveHandlers serves hs at a fresh socket and returns its path.
func serveHandlers(t *testing.T, hs Handlers) string {
	t.Helper()
	return serveWith(t, func(ctx context.Context, l net.Listener) error { return ServeHandlers(ctx, l, 2*time.Second, 0, hs) })
}

func callUnguard(t *testing.T, path string, r Request) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return Wait(ctx, path, r)
}

// TestUnguard: a DEL's request with Unguard goes to the Unguard handler
// alone (never to the policy wait nor to the guard), with no pod name
// needed, and its error comes back; the handler sees what was sent.
func TestUnguard(t *testing.T) {
	var mu sync.Mutex
	var got []Request
	calls := map[string]int{}
	path := serveHandlers(t, Handlers{
		Guard: func(context.Context, Request, func(error)) error {
			mu.Lock()
			calls["guard"]++
			mu.Unlock()
			return nil
		},
		Unguard: func(_ context.Context, r Request) error {
			mu.Lock()
			defer mu.Unlock()
			calls["unguard"]++
			got = append(got, r)
			if r.Unguard.Index == 13 {
				return errors.New("no such port")
			}
			return nil
		},
		Wait: func(context.Context, Request, func(error)) error { mu.Lock(); calls["wait"]++; mu.Unlock(); return nil },
	})
	exact := Request{IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00::5")},
		Unguard: &GuardPort{Mode: "routed", Index: 42, MAC: "02:00:00:00:00:05"}}
	if err := callUnguard(t, path, exact); err != nil {
		t.Fatalf("exact unguard: %v", err)
	}
	if err := callUnguard(t, path, Request{Unguard: &GuardPort{Mode: "bridge", Index: 7}}); err != nil {
		t.Fatalf("unguard by index: %v", err)
	}
	if err := callUnguard(t, path, Request{Unguard: &GuardPort{Mode: "routed", Index: 13}}); err == nil || !strings.Contains(err.Error(), "no such port") {
		t.Errorf("a failing unguard: %v, want its error", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["unguard"] != 3 || calls["wait"] != 0 || calls["guard"] != 0 {
		t.Errorf("calls %v, want 3 unguards and nothing else", calls)
	}
	if len(got) > 0 && (got[0].Unguard.Index != 42 || got[0].Unguard.MAC != "02:00:00:00:00:05" || len(got[0].IPs) != 2) {
		t.Errorf("the handler got %+v (%+v)", got[0], got[0].Unguard)
	}
}

// TestUnguardRefused: an Unguard that names no podnet port never reaches
// the handler, and a server without an Unguard handler says so: either
// way the plugin gets an error (and takes the port out itself).
func TestUnguardRefused(t *testing.T) {
	called := false
	var mu sync.Mutex
	path := serveHandlers(t, Handlers{
		Unguard: func(context.Context, Request) error { mu.Lock(); called = true; mu.Unlock(); return nil },
		Wait:    func(context.Context, Request, func(error)) error { return nil },
	})
	ip := []netip.Addr{netip.MustParseAddr("10.244.0.5")}
	nine := make([]netip.Addr, 9)
	for i := range nine {
		nine[i] = netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 1)})
	}
	for _, tc := range []struct {
		name string
		r    Request
	}{
		{"mode netdev", Request{Unguard: &GuardPort{Mode: "netdev", Index: 4}}},
		{"no mode", Request{Unguard: &GuardPort{Index: 4}}},
		{"index 0", Request{Unguard: &GuardPort{Mode: "routed"}}},
		{"negative index", Request{Unguard: &GuardPort{Mode: "routed", Index: -3}}},
		{"index past int32", Request{Unguard: &GuardPort{Mode: "routed", Index: 1 << 40}}},
		{"addresses without a MAC", Request{IPs: ip, Unguard: &GuardPort{Mode: "routed", Index: 4}}},
		{"a multicast MAC", Request{IPs: ip, Unguard: &GuardPort{Mode: "routed", Index: 4, MAC: "01:00:5e:00:00:01"}}},
		{"a malformed MAC", Request{IPs: ip, Unguard: &GuardPort{Mode: "routed", Index: 4, MAC: "zz"}}},
		{"nine addresses", Request{IPs: nine, Unguard: &GuardPort{Mode: "routed", Index: 4, MAC: "02:00:00:00:00:05"}}},
		{"a multicast address", Request{IPs: []netip.Addr{netip.MustParseAddr("224.0.0.1")}, Unguard: &GuardPort{Mode: "routed", Index: 4, MAC: "02:00:00:00:00:05"}}},
		{"an unspecified address", Request{IPs: []netip.Addr{netip.IPv6Unspecified()}, Unguard: &GuardPort{Mode: "routed", Index: 4, MAC: "02:00:00:00:00:05"}}},
		{"guard and unguard", Request{Namespace: "ns", Name: "web", HostVeth: "pn0123456789a", IPs: ip,
			Guard:   &GuardPort{Mode: "routed", Index: 4, Alias: "a", MAC: "02:00:00:00:00:05"},
			Unguard: &GuardPort{Mode: "routed", Index: 4}}},
		{"a name too long", Request{Name: strings.Repeat("x", 300), Unguard: &GuardPort{Mode: "routed", Index: 4}}},
	} {
		if err := callUnguard(t, path, tc.r); err == nil || !strings.Contains(err.Error(), "bad request") {
			t.Errorf("%s: %v, want a bad request", tc.name, err)
		}
	}
	mu.Lock()
	if called {
		t.Error("the Unguard handler ran for a bad request")
	}
	mu.Unlock()
	// a server that does not take ports out (an older podnet-routed, or
	// one whose engine guards nothing)
	old := serveHandlers(t, Handlers{Wait: func(context.Context, Request, func(error)) error { return nil }})
	if err := callUnguard(t, old, Request{Unguard: &GuardPort{Mode: "routed", Index: 4}}); err == nil {
		t.Error("a server without an Unguard handler answered OK")
	}
}
