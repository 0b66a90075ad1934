package policysock

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/threadprio"
)

// serveGuarded serves h with guard (nil: none, ServeEarly) at a fresh
// socket and returns its path.
func serveGuarded(t *testing.T, guard GuardHandler, h EarlyHandler) string {
	t.Helper()
	return serveWith(t, func(ctx context.Context, l net.Listener) error {
		if guard == nil {
			return ServeEarly(ctx, l, 2*time.Second, h)
		}
		return ServeGuarded(ctx, l, 2*time.Second, guard, h)
	})
}

// serveWith runs serve on a fresh socket until the test ends and returns
// the socket's path.
func serveWith(t *testing.T, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return path
}

var guarded = func() Request {
	r := pod
	r.HostVeth = "pn0123456789a"
	r.Guard = &GuardPort{Mode: "routed", Index: 42, Alias: "podnet/c1/eth0", MAC: "02:00:00:00:00:05"}
	return r
}()

// sendGuarded sends the guarded request to the socket at path.
func sendGuarded(t *testing.T, path string) *Pending {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	p, err := Send(ctx, path, guarded)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func okHandler(context.Context, Request, func(error)) error { return nil }

// TestGuardThenPolicy: the guard's answer comes first and says the port
// is guarded, the policy's after it; the guard handler ran before the
// policy handler (the port's write is not queued behind the policy's)
// and got the port.
func TestGuardThenPolicy(t *testing.T) {
	order := make(chan string, 2)
	var got Request
	path := serveGuarded(t, func(_ context.Context, r Request, _ func(error)) error {
		got = r
		order <- "guard"
		return nil
	}, func(context.Context, Request, func(error)) error {
		order <- "policy"
		return nil
	})
	p := sendGuarded(t, path)
	ok, err := p.AwaitGuard(time.Second)
	if !ok || err != nil {
		t.Fatalf("AwaitGuard = %v, %v; want guarded", ok, err)
	}
	if err := p.Await(); err != nil {
		t.Fatalf("Await: %v", err)
	}
	if a, b := <-order, <-order; a != "guard" || b != "policy" {
		t.Fatalf("handlers ran %s then %s, want guard then policy", a, b)
	}
	if got.Guard == nil || *got.Guard != *guarded.Guard || got.HostVeth != guarded.HostVeth {
		t.Fatalf("guard handler got %+v / %+v, want %+v", got.Guard, got.HostVeth, guarded.Guard)
	}
}

// TestGuardAnswersEarly: a guard handler's answer goes out when it gives
// it (the writer's thread, right after the write), not when the handler
// returns; what it returns after that changes nothing.
func TestGuardAnswersEarly(t *testing.T) {
	read := make(chan struct{})
	path := serveGuarded(t, func(_ context.Context, _ Request, answer func(error)) error {
		answer(nil)
		<-read // the plugin has the answer before the handler returns
		return errors.New("too late to count")
	}, okHandler)
	p := sendGuarded(t, path)
	ok, err := p.AwaitGuard(time.Second)
	close(read)
	if !ok || err != nil {
		t.Fatalf("AwaitGuard = %v, %v; want guarded before the handler returned", ok, err)
	}
	if err := p.Await(); err != nil {
		t.Fatalf("Await: %v", err)
	}
}

// TestGuardRefusedOrUnknown: a guard that fails, and an engine that
// guards nothing, both say so first (not guarded, no error from the
// connection); the policy's answer still comes.
func TestGuardRefusedOrUnknown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		guard GuardHandler
		want  string
	}{
		{"guard fails", func(context.Context, Request, func(error)) error { return errors.New("nftables: no such table") }, "no such table"},
		{"engine without guard", nil, "does not add ports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := serveGuarded(t, tc.guard, okHandler)
			p := sendGuarded(t, path)
			ok, err := p.AwaitGuard(time.Second)
			if ok || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AwaitGuard = %v, %v; want not guarded: %q", ok, err, tc.want)
			}
			if err := p.Await(); err != nil {
				t.Fatalf("Await after a refused guard: %v", err)
			}
		})
	}
}

// TestGuardOldEngine: an engine that knows no guard sends only its final
// answer: AwaitGuard says not guarded without an error and Await returns
// that answer (OK or the refusal), without reading again.
func TestGuardOldEngine(t *testing.T) {
	for _, answer := range []Answer{{OK: true}, {Error: "pod ns/web is on node other"}} {
		path := filepath.Join(t.TempDir(), FileName)
		l, err := Listen(path)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			var req map[string]any
			json.NewDecoder(c).Decode(&req)
			json.NewEncoder(c).Encode(answer)
			time.Sleep(200 * time.Millisecond) // nothing more comes
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := Send(ctx, path, guarded)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := p.AwaitGuard(time.Second)
		if ok || err != nil {
			t.Fatalf("AwaitGuard = %v, %v; want not guarded, no error", ok, err)
		}
		err = p.Await()
		if answer.OK && err != nil || !answer.OK && (err == nil || !strings.Contains(err.Error(), "on node other")) {
			t.Fatalf("Await = %v, want the engine's answer %+v", err, answer)
		}
		cancel()
		l.Close()
	}
}

// TestGuardLate: a guard answer later than AwaitGuard's bound is not
// taken (the plugin adds the port itself) and does not stand in for the
// policy's answer, which Await still reads.
func TestGuardLate(t *testing.T) {
	release := make(chan struct{})
	path := serveGuarded(t, func(context.Context, Request, func(error)) error {
		<-release
		return nil
	}, okHandler)
	p := sendGuarded(t, path)
	ok, err := p.AwaitGuard(50 * time.Millisecond)
	if ok || err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("AwaitGuard = %v, %v; want a timeout", ok, err)
	}
	close(release)
	if err := p.Await(); err != nil {
		t.Fatalf("Await after a late guard answer: %v", err)
	}
}

// TestGuardBadRequests: a guard that cannot describe a podnet port is
// refused with the final answer, before any handler runs.
func TestGuardBadRequests(t *testing.T) {
	called := make(chan string, 8)
	path := serveGuarded(t, func(context.Context, Request, func(error)) error {
		called <- "guard"
		return nil
	}, func(context.Context, Request, func(error)) error {
		called <- "policy"
		return nil
	})
	for _, tc := range []struct {
		name string
		edit func(r *Request)
		want string
	}{
		{"no host veth", func(r *Request) { r.HostVeth = "" }, "host veth's name"},
		{"mode", func(r *Request) { r.Guard.Mode = "netdev" }, "guard mode"},
		{"index zero", func(r *Request) { r.Guard.Index = 0 }, "interface index"},
		{"index negative", func(r *Request) { r.Guard.Index = -3 }, "interface index"},
		{"index too big", func(r *Request) { r.Guard.Index = 1 << 40 }, "interface index"},
		{"no alias", func(r *Request) { r.Guard.Alias = "" }, "alias"},
		{"alias control", func(r *Request) { r.Guard.Alias = "podnet/c1\n/eth0" }, "alias"},
		{"alias long", func(r *Request) { r.Guard.Alias = strings.Repeat("a", 300) }, "alias"},
		{"mac bad", func(r *Request) { r.Guard.MAC = "zz" }, "MAC"},
		{"mac multicast", func(r *Request) { r.Guard.MAC = "01:00:5e:00:00:01" }, "MAC"},
		{"mac long", func(r *Request) { r.Guard.MAC = "02:00:00:00:00:00:00:05" }, "MAC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := guarded
			g := *guarded.Guard
			r.Guard = &g
			tc.edit(&r)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			p, err := Send(ctx, path, r)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := p.AwaitGuard(time.Second); ok || err != nil {
				t.Fatalf("AwaitGuard = %v, %v; want the final answer first", ok, err)
			}
			if err := p.Await(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Await = %v, want a refusal naming %q", err, tc.want)
			}
		})
	}
	select {
	case h := <-called:
		t.Fatalf("the %s handler ran for a bad request", h)
	default:
	}
}

// TestGuardConnectionDrops: a connection closed before any answer is an
// error for AwaitGuard and for Await, not a hang.
func TestGuardConnectionDrops(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.(*net.UnixConn).CloseWrite()
			time.Sleep(100 * time.Millisecond)
			c.Close()
		}
	}()
	p := sendGuarded(t, path)
	if ok, err := p.AwaitGuard(time.Second); ok || err == nil {
		t.Fatalf("AwaitGuard = %v, %v; want an error", ok, err)
	}
	if err := p.Await(); err == nil {
		t.Fatal("Await on a closed connection: no error")
	}
}

// TestServeGuardedAtNice: each connection is served at the nice value
// given: the guard handler and the policy handler run there (as root,
// which podnet-routed and the CI are).
func TestServeGuardedAtNice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (CAP_SYS_NICE), as podnet-routed has")
	}
	path := filepath.Join(t.TempDir(), FileName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nices := make(chan int, 2)
	nice := func() int {
		n, err := threadprio.Nice()
		if err != nil {
			t.Error(err)
		}
		return n
	}
	go ServeGuardedAt(ctx, l, 2*time.Second, -7, func(context.Context, Request, func(error)) error {
		nices <- nice()
		return nil
	}, func(context.Context, Request, func(error)) error {
		nices <- nice()
		return nil
	})
	p := sendGuarded(t, path)
	if ok, err := p.AwaitGuard(time.Second); !ok || err != nil {
		t.Fatalf("AwaitGuard = %v, %v", ok, err)
	}
	if err := p.Await(); err != nil {
		t.Fatal(err)
	}
	if g, h := <-nices, <-nices; g != -7 || h != -7 {
		t.Errorf("guard ran at nice %d, policy at %d; want -7", g, h)
	}
}
