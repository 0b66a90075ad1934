package policysock

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func serve(t *testing.T, h Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", fi.Mode())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, l, time.Second, h) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left behind after Serve: %v", err)
		}
	})
	return path
}

var pod = Request{Namespace: "ns", Name: "web", ContainerID: "c1", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")}}

func TestWaitGetsTheEngineAnswer(t *testing.T) {
	var got Request
	path := serve(t, func(_ context.Context, r Request) error {
		got = r
		if r.Name == "refused" {
			return errors.New("pod ns/refused is not on this node")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := Wait(ctx, path, pod); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if got.Namespace != "ns" || got.Name != "web" || len(got.IPs) != 2 || got.IPs[1] != pod.IPs[1] {
		t.Fatalf("engine got %+v, want %+v", got, pod)
	}
	r := pod
	r.Name = "refused"
	if err := Wait(ctx, path, r); err == nil || !strings.Contains(err.Error(), "not on this node") {
		t.Fatalf("Wait: %v, want the engine's refusal", err)
	}
}

func TestWaitWithoutEngine(t *testing.T) {
	ctx := context.Background()
	missing := filepath.Join(t.TempDir(), FileName)
	if err := Wait(ctx, missing, pod); !errors.Is(err, ErrNoEngine) {
		t.Fatalf("no socket: %v, want ErrNoEngine", err)
	}
	// a socket file nobody listens on (the engine died)
	dead := filepath.Join(t.TempDir(), FileName)
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if err := Wait(ctx, dead, pod); !errors.Is(err, ErrNoEngine) {
		t.Fatalf("dead socket: %v, want ErrNoEngine", err)
	}
}

func TestWaitTimesOut(t *testing.T) {
	path := serve(t, func(ctx context.Context, _ Request) error {
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := Wait(ctx, path, pod)
	if err == nil || errors.Is(err, ErrNoEngine) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want a deadline error", err)
	}
}

func TestBadRequestsRefused(t *testing.T) {
	var called atomic.Int32
	path := serve(t, func(context.Context, Request) error { called.Add(1); return nil })
	ctx := context.Background()
	for name, r := range map[string]Request{
		"no name":      {Namespace: "ns", IPs: pod.IPs},
		"no addresses": {Namespace: "ns", Name: "p"},
		"unspecified":  {Namespace: "ns", Name: "p", IPs: []netip.Addr{netip.IPv4Unspecified()}},
		"loopback":     {Namespace: "ns", Name: "p", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
		"multicast":    {Namespace: "ns", Name: "p", IPs: []netip.Addr{netip.MustParseAddr("ff02::1")}},
		"zero addr":    {Namespace: "ns", Name: "p", IPs: []netip.Addr{{}}},
		"long name":    {Namespace: "ns", Name: strings.Repeat("a", 254), IPs: pod.IPs},
		"too many":     {Namespace: "ns", Name: "p", IPs: make([]netip.Addr, 9)},
		// the host veth names the port the engine judges as the pod's:
		// only a podnet host veth name
		"host veth not podnet's": {Namespace: "ns", Name: "p", IPs: pod.IPs, HostVeth: "eth0"},
		"host veth too long":     {Namespace: "ns", Name: "p", IPs: pod.IPs, HostVeth: "pn0123456789abcdef"},
		"host veth path":         {Namespace: "ns", Name: "p", IPs: pod.IPs, HostVeth: "pn../../x"},
		"host veth NUL":          {Namespace: "ns", Name: "p", IPs: pod.IPs, HostVeth: "pn\x00x"},
	} {
		if err := Wait(ctx, path, r); err == nil || !strings.Contains(err.Error(), "bad request") {
			t.Errorf("%s: %v, want a bad request", name, err)
		}
	}
	// not JSON at all
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("\x00\x01garbage\n"))
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	c.Close()
	if !strings.Contains(string(buf[:n]), "bad request") {
		t.Errorf("garbage: answer %q, want a bad request", buf[:n])
	}
	if n := called.Load(); n != 0 {
		t.Fatalf("handler called %d times for bad requests", n)
	}
}

// TestEarlyReply: an EarlyHandler's reply reaches the plugin while the
// handler still runs, and the first answer counts: an OK sent early is
// not undone by the handler's error, nor an early error by its success.
func TestEarlyReply(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- ServeEarly(ctx, l, 5*time.Second, func(_ context.Context, r Request, reply func(error)) error {
			switch r.Name {
			case "early-ok":
				reply(nil)
				<-release // still running when the plugin has its answer
				return errors.New("too late to matter")
			case "early-error":
				reply(errors.New("refused early"))
				return nil
			}
			return nil
		})
	}()
	defer func() {
		close(release)
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	r := pod
	r.Name = "early-ok"
	if err := Wait(wctx, path, r); err != nil {
		t.Fatalf("early OK: %v", err)
	}
	r.Name = "early-error"
	if err := Wait(wctx, path, r); err == nil || !strings.Contains(err.Error(), "refused early") {
		t.Fatalf("early error: %v, want refused early", err)
	}
	r.Name = "late"
	if err := Wait(wctx, path, r); err != nil {
		t.Fatalf("answer on return: %v", err)
	}
}

// TestSendThenAwait: the request is with the engine when Send returns,
// before anyone reads the answer; a request given up (Close) leaves the
// engine serving the next one, and a nil Pending closes quietly.
func TestSendThenAwait(t *testing.T) {
	got := make(chan Request, 3)
	path := serve(t, func(ctx context.Context, r Request) error {
		got <- r
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := Send(ctx, path, pod)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.Name != pod.Name || len(r.IPs) != 2 {
			t.Fatalf("engine got %+v", r)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the engine did not get the request before Await")
	}
	if err := p.Await(); err != nil {
		t.Fatalf("Await: %v", err)
	}
	p.Close() // after Await: nothing
	a := pod
	a.Name = "abandoned"
	if p, err = Send(ctx, path, a); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if err := Wait(ctx, path, pod); err != nil {
		t.Fatalf("Wait after an abandoned request: %v", err)
	}
	(*Pending)(nil).Close()
	if _, err := Send(ctx, filepath.Join(t.TempDir(), FileName), pod); !errors.Is(err, ErrNoEngine) {
		t.Errorf("Send with no engine: %v, want ErrNoEngine", err)
	}
}
