package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultCRISocket is containerd's CRI socket.
const DefaultCRISocket = "unix:///run/containerd/containerd.sock"

// errNoRuntime: no runtime listens on the socket (none is installed, or
// it is down): the netns decides alone.
var errNoRuntime = errors.New("no container runtime")

// Runtime lists a CRI runtime's pod sandboxes.
type Runtime struct {
	endpoint string // unix:///path
	path     string
	conn     *grpc.ClientConn
	client   cri.RuntimeServiceClient
}

// NewRuntime returns the CRI client of endpoint ("unix:///run/...", or a
// plain path). The connection is made on first use.
func NewRuntime(endpoint string) (*Runtime, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", endpoint, err)
	}
	return &Runtime{endpoint: endpoint, path: path, conn: conn, client: cri.NewRuntimeServiceClient(conn)}, nil
}

// SocketPath is the file of a CRI endpoint: "unix:///path" or "/path".
func SocketPath(endpoint string) (string, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	if path == "" || !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("CRI socket %q: want unix:///absolute/path", endpoint)
	}
	return path, nil
}

// Close closes the connection.
func (r *Runtime) Close() error { return r.conn.Close() }

// Sandboxes returns every sandbox the runtime knows, by ID. A socket that
// does not exist is errNoRuntime.
func (r *Runtime) Sandboxes(ctx context.Context, timeout time.Duration) (map[string]SandboxState, error) {
	if _, err := os.Stat(r.path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", errNoRuntime, r.endpoint)
	}
	// A runtime that was down for a while: ask now, not after gRPC's
	// reconnect backoff, which grows past the reconcile's interval.
	r.conn.ResetConnectBackoff()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := r.client.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox on %s: %w", r.endpoint, err)
	}
	out := make(map[string]SandboxState, len(resp.Items))
	for _, sb := range resp.Items {
		if sb.State == cri.PodSandboxState_SANDBOX_READY {
			out[sb.Id] = SandboxReady
		} else {
			out[sb.Id] = SandboxNotReady
		}
	}
	return out, nil
}
