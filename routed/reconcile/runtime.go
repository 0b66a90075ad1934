package reconcile

// The CRI client: one call, RuntimeService/ListPodSandbox, made by hand
// (gRPC is HTTP/2 with a length-prefixed protobuf body and its status in
// the trailers) over net/http's unencrypted HTTP/2 and protowire, both in
// the binary anyway. grpc-go and the generated CRI API would add 3.3 MB
// to podnet-routed and their init code and tables 1.7 MiB to its
// resident memory, for a call made once a minute.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// DefaultCRISocket is containerd's CRI socket.
const DefaultCRISocket = "unix:///run/containerd/containerd.sock"

// maxCRIResponse bounds a ListPodSandbox answer (the kubelet's own limit
// on CRI messages).
const maxCRIResponse = 16 << 20

// errNoRuntime: no runtime listens on the socket (none is installed, or
// it is down): the netns decides alone.
var errNoRuntime = errors.New("no container runtime")

// Runtime lists a CRI runtime's pod sandboxes.
type Runtime struct {
	endpoint string // unix:///path
	path     string
	client   *http.Client
}

// NewRuntime returns the CRI client of endpoint ("unix:///run/...", or a
// plain path). Each call has a connection of its own (one a minute): a
// runtime that restarted is asked at once, never through a connection it
// closed.
func NewRuntime(endpoint string) (*Runtime, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true) // gRPC: HTTP/2 with prior knowledge
	tr := &http.Transport{
		Protocols:         &protos,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Runtime{endpoint: endpoint, path: path, client: &http.Client{Transport: tr}}, nil
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
func (r *Runtime) Close() error {
	r.client.CloseIdleConnections()
	return nil
}

// Sandboxes returns every sandbox the runtime knows, by ID. A socket that
// does not exist is errNoRuntime.
func (r *Runtime) Sandboxes(ctx context.Context, timeout time.Duration) (map[string]SandboxState, error) {
	if _, err := os.Stat(r.path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", errNoRuntime, r.endpoint)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// ListPodSandboxRequest{}: no filter, an empty message
	resp, err := r.call(ctx, "/runtime.v1.RuntimeService/ListPodSandbox", nil)
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox on %s: %w", r.endpoint, err)
	}
	out, err := parseSandboxes(resp)
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox on %s: %w", r.endpoint, err)
	}
	return out, nil
}

// call makes the unary gRPC call method with the encoded request msg and
// returns the encoded response.
func (r *Runtime) call(ctx context.Context, method string, msg []byte) ([]byte, error) {
	body := make([]byte, 5, 5+len(msg)) // uncompressed, then the length
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+method, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("User-Agent", "podnet-routed")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || !strings.HasPrefix(ct, "application/grpc") {
		return nil, fmt.Errorf("not a gRPC answer: HTTP status %s, content type %q", resp.Status, ct)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxCRIResponse+6))
	if err != nil {
		return nil, err
	}
	if len(data) > maxCRIResponse+5 {
		return nil, fmt.Errorf("response larger than %d bytes", maxCRIResponse)
	}
	// the status is in the trailers, or in the headers of a response
	// that has no body (trailers only)
	st := resp.Trailer
	if st.Get("Grpc-Status") == "" {
		st = resp.Header
	}
	if err := grpcStatus(st); err != nil {
		return nil, err
	}
	if len(data) < 5 {
		return nil, fmt.Errorf("truncated response (%d bytes)", len(data))
	}
	n := binary.BigEndian.Uint32(data[1:5])
	switch {
	case data[0] != 0:
		return nil, errors.New("compressed response (none was offered)")
	case int64(n) != int64(len(data)-5):
		return nil, fmt.Errorf("response of %d bytes announces %d", len(data)-5, n)
	}
	return data[5:], nil
}

// grpcStatus is the error of a gRPC status (nil: OK).
func grpcStatus(h http.Header) error {
	s := h.Get("Grpc-Status")
	if s == "" {
		return errors.New("no grpc-status in the response")
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("grpc-status %q", s)
	}
	if code == 0 {
		return nil
	}
	msg, err := url.PathUnescape(h.Get("Grpc-Message"))
	if err != nil {
		msg = h.Get("Grpc-Message")
	}
	return fmt.Errorf("rpc error: code = %s desc = %s", grpcCode(code), msg)
}

// grpcCode names a gRPC status code as grpc-go does.
func grpcCode(c int) string {
	names := []string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
		"PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
		"Internal", "Unavailable", "DataLoss", "Unauthenticated"}
	if c >= 0 && c < len(names) {
		return names[c]
	}
	return "Code(" + strconv.Itoa(c) + ")"
}

// parseSandboxes reads a ListPodSandboxResponse: items (1) are
// PodSandbox messages, of which id (1) and state (3: SANDBOX_READY 0,
// the default, so absent; SANDBOX_NOTREADY 1) are read.
func parseSandboxes(b []byte) (map[string]SandboxState, error) {
	out := map[string]SandboxState{}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var id string
		state := SandboxReady
		err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				id = string(v)
			case num == 3 && typ == protowire.VarintType:
				if x != 0 {
					state = SandboxNotReady
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("PodSandbox: %w", err)
		}
		out[id] = state
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandboxResponse: %w", err)
	}
	return out, nil
}

// fields calls f with each field of the protobuf message b: its number,
// wire type, and its bytes (BytesType) or value (VarintType).
func fields(b []byte, f func(protowire.Number, protowire.Type, []byte, uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
