package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRI is a CRI runtime service of grpc-go and the generated API (what
// containerd serves): its answer to ListPodSandbox, or its error.
type fakeCRI struct {
	cri.UnimplementedRuntimeServiceServer
	items atomic.Pointer[[]*cri.PodSandbox]
	err   atomic.Pointer[error]
	calls atomic.Int64
	conns atomic.Int64 // connections accepted
}

func (f *fakeCRI) ListPodSandbox(_ context.Context, req *cri.ListPodSandboxRequest) (*cri.ListPodSandboxResponse, error) {
	f.calls.Add(1)
	if req.Filter != nil {
		return nil, status.Error(codes.InvalidArgument, "a filter was sent")
	}
	if err := f.err.Load(); err != nil {
		return nil, *err
	}
	return &cri.ListPodSandboxResponse{Items: *f.items.Load()}, nil
}

// countingListener counts the connections accepted.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// serveCRI serves f on a unix socket at path until the test ends (or
// stop is called).
func serveCRI(t *testing.T, path string, f *fakeCRI) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	cri.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(countingListener{l, &f.conns}) }()
	t.Cleanup(srv.Stop)
	return srv.Stop
}

// TestRuntimeSandboxes: the hand-made ListPodSandbox call against grpc-go
// and the generated CRI API: states (READY is the default, left out on
// the wire), every other field skipped, many sandboxes, an empty list,
// error statuses, no runtime at all, and a runtime that comes back.
func TestRuntimeSandboxes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "cri.sock")
	rt, err := NewRuntime("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx := context.Background()

	if _, err := rt.Sandboxes(ctx, time.Second); !errors.Is(err, errNoRuntime) {
		t.Fatalf("no socket: %v, want errNoRuntime", err)
	}

	f := &fakeCRI{}
	meta := func(name string) *cri.PodSandboxMetadata {
		return &cri.PodSandboxMetadata{Name: name, Uid: "uid-" + name, Namespace: "default", Attempt: 2}
	}
	items := []*cri.PodSandbox{
		{Id: "ready", Metadata: meta("a"), State: cri.PodSandboxState_SANDBOX_READY, CreatedAt: 1700000000000000000,
			Labels: map[string]string{"app": "a"}, Annotations: map[string]string{"x": strings.Repeat("y", 300)}, RuntimeHandler: "runc"},
		{Id: "notready", Metadata: meta("b"), State: cri.PodSandboxState_SANDBOX_NOTREADY, CreatedAt: 1},
		{Id: "bare"},
	}
	f.items.Store(&items)
	stop := serveCRI(t, sock, f)
	got, err := rt.Sandboxes(ctx, 5*time.Second)
	want := map[string]SandboxState{"ready": SandboxReady, "notready": SandboxNotReady, "bare": SandboxReady}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Sandboxes = %v, %v; want %v", got, err, want)
	}

	// many: the answer spans many HTTP/2 frames
	many := make([]*cri.PodSandbox, 5000)
	want = map[string]SandboxState{}
	for i := range many {
		id := fmt.Sprintf("%064x", i)
		many[i] = &cri.PodSandbox{Id: id, Metadata: meta(id), State: cri.PodSandboxState(i % 2), Labels: map[string]string{"io.kubernetes.pod.name": id}}
		want[id] = SandboxState(i % 2)
	}
	f.items.Store(&many)
	if got, err := rt.Sandboxes(ctx, 5*time.Second); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("5000 sandboxes: %d, %v", len(got), err)
	}

	none := []*cri.PodSandbox{}
	f.items.Store(&none)
	if got, err := rt.Sandboxes(ctx, 5*time.Second); err != nil || len(got) != 0 || got == nil {
		t.Fatalf("no sandboxes: %v, %v", got, err)
	}

	refused := status.Error(codes.Unimplemented, "unknown service runtime.v1.RuntimeService: 100% sure")
	f.err.Store(&refused)
	_, err = rt.Sandboxes(ctx, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "rpc error: code = Unimplemented desc = unknown service runtime.v1.RuntimeService: 100% sure") {
		t.Fatalf("an error status: %v", err)
	}
	f.err.Store(nil)

	// a connection per call: none left open to a runtime that restarts
	if c, n := f.conns.Load(), f.calls.Load(); c != n {
		t.Fatalf("%d connections for %d calls", c, n)
	}

	// the runtime goes away and comes back: asked again at once
	stop()
	os.Remove(sock)
	if _, err := rt.Sandboxes(ctx, time.Second); !errors.Is(err, errNoRuntime) {
		t.Fatalf("runtime gone: %v, want errNoRuntime", err)
	}
	f2 := &fakeCRI{}
	f2.items.Store(&items)
	serveCRI(t, sock, f2)
	got, err = rt.Sandboxes(ctx, 5*time.Second)
	if err != nil || len(got) != 3 || f2.calls.Load() != 1 {
		t.Fatalf("runtime back: %v, %v, %d calls", got, err, f2.calls.Load())
	}
}

// TestRuntimeNotGRPC: whatever listens on the socket without speaking
// gRPC is an error, not an empty list, and a call that gets no answer
// ends at its timeout.
func TestRuntimeNotGRPC(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "mute.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // accepts and never answers
		}
	}()
	rt, err := NewRuntime(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	start := time.Now()
	if got, err := rt.Sandboxes(context.Background(), 300*time.Millisecond); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a mute socket: %v, %v", got, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the call took %v with a timeout of 300ms", d)
	}
}

func TestParseSandboxesBad(t *testing.T) {
	for _, b := range [][]byte{{0x0a}, {0x0a, 0x05, 0x0a}, {0x0a, 0x02, 0x18, 0x80}} {
		if got, err := parseSandboxes(b); err == nil {
			t.Errorf("%x: %v, want an error", b, got)
		}
	}
}
