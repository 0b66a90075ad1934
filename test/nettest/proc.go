package nettest

// Processes in a netns (podnet-routed, iperf3, ...), their logs, polling,
// HTTP from inside a netns and a pausable TCP forwarder: what every suite
// that runs a daemon in a netns needs.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Proc is a process started in a netns with its output appended to a log.
type Proc struct {
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
	err  error
}

// StartProc starts bin in netns (see StartProcess for dieWithUs) with
// stdout and stderr appended to log.
func StartProc(netns ns.NetNS, dieWithUs bool, log, bin string, args ...string) (*Proc, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := StartProcess(netns, cmd, dieWithUs); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &Proc{Cmd: cmd, Log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// StartProcT is StartProc for a test: it fails the test when the process
// cannot start and stops it (Stop) when the test ends.
func StartProcT(t testing.TB, netns ns.NetNS, log, bin string, args ...string) *Proc {
	t.Helper()
	p, err := StartProc(netns, true, log, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	return p
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited says whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the process's Wait error (valid once it has exited).
func (p *Proc) Err() error { return p.err }

// Alive is an error, with the end of the log, when the process has exited.
func (p *Proc) Alive() error {
	if p.Exited() {
		return fmt.Errorf("%s exited: %v\n%s", filepath.Base(p.Cmd.Path), p.err, Tail(p.Log, 30))
	}
	return nil
}

// Wait waits up to limit for the process to exit by itself and returns
// its Wait error; after limit it kills it.
func (p *Proc) Wait(limit time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(limit):
		_ = p.Cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s still running after %s: killed", filepath.Base(p.Cmd.Path), limit)
	}
}

// Stop sends SIGTERM, waits up to limit, then kills. An exit caused by
// the SIGTERM is not an error (nor is a process that had already exited
// cleanly).
func (p *Proc) Stop(limit time.Duration) error {
	if p == nil {
		return nil
	}
	if !p.Exited() {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(limit):
			_ = p.Cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("%s ignored SIGTERM for %s: killed", filepath.Base(p.Cmd.Path), limit)
		}
	}
	return p.ExitError()
}

// ExitError is the process's exit error, nil for a clean exit (or one by
// SIGTERM).
func (p *Proc) ExitError() error {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
		return fmt.Errorf("%s: %v", filepath.Base(p.Cmd.Path), p.err)
	}
	return p.err
}

// LogRecords returns the JSON (slog) records of the process's log whose
// msg is msg.
func (p *Proc) LogRecords(msg string) []map[string]any {
	f, err := os.Open(p.Log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// LogTime returns the time of the first JSON record whose msg is msg.
func (p *Proc) LogTime(msg string) (time.Time, bool) {
	for _, rec := range p.LogRecords(msg) {
		ts, _ := rec["time"].(string)
		if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			return at, true
		}
	}
	return time.Time{}, false
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Poll calls check every interval until it succeeds, limit passes or ctx
// ends; it returns check's last error.
func Poll(ctx context.Context, limit, interval time.Duration, check func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// Eventually polls f every 10 ms until it returns nil and returns the time
// it took, or fails the test after limit with f's last error.
func Eventually(t testing.TB, limit time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := Poll(context.Background(), limit, 10*time.Millisecond, f); err != nil {
		t.Fatalf("%s: not true after %s: %v", what, limit, err)
	}
	return time.Since(start)
}

// Consistently polls f every 100 ms for d and fails the test as soon as it
// returns an error.
func Consistently(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// HTTPClient is a client whose connections are made inside netns (no
// keep-alive: every request dials again).
func HTTPClient(netns ns.NetNS, timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: DialIn(netns)},
		Timeout:   timeout,
	}
}

// GetIn does an HTTP GET of url from inside netns and returns the status
// and the body.
func GetIn(netns ns.NetNS, url string) (int, string, error) {
	resp, err := HTTPClient(netns, 3*time.Second).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// ParseMetrics reads a Prometheus text exposition into series -> value:
// a series without labels by its name, one with labels as written
// (`podnet_nodes_refused{reason="reserved-range"}`).
func ParseMetrics(body string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[f[0]] = v
	}
	return out, nil
}

// Forwarder forwards TCP from a listener inside a netns to a target
// reached with dial (by default from the machine's netns). A node netns
// reaches an API server on the machine's loopback through it, under the
// address its kubeconfig names.
type Forwarder struct {
	ln     net.Listener
	target string
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	mu     sync.Mutex
	paused bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewForwarder listens on listen inside netns and forwards every
// connection to target, dialled with dial (nil: from the machine's netns).
func NewForwarder(netns ns.NetNS, listen, target string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) (*Forwarder, error) {
	if dial == nil {
		// Not on a thread locked in a netns: dials from the machine's netns.
		dial = (&net.Dialer{}).DialContext
	}
	ln, err := ListenIn(netns, "tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("forwarder on %s: %w", listen, err)
	}
	f := &Forwarder{ln: ln, target: target, dial: dial, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// Forward is NewForwarder for a test: it fails the test on error and
// closes the forwarder when the test ends.
func Forward(t testing.TB, netns ns.NetNS, listen, target string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *Forwarder {
	t.Helper()
	f, err := NewForwarder(netns, listen, target, dial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func (f *Forwarder) serve() {
	defer f.wg.Done()
	for {
		down, err := f.ln.Accept()
		if err != nil {
			return
		}
		if !f.track(down) {
			down.Close()
			continue
		}
		f.wg.Add(1)
		go f.forward(down)
	}
}

func (f *Forwarder) forward(down net.Conn) {
	defer f.wg.Done()
	defer f.drop(down)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	up, err := f.dial(ctx, "tcp", f.target)
	cancel()
	if err != nil {
		return
	}
	if !f.track(up) {
		up.Close()
		return
	}
	defer f.drop(up)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, down); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); done <- struct{}{} }()
	<-done
	up.Close()
	down.Close()
	<-done
}

// track records an open connection; false when paused or closed.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paused || f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) drop(c net.Conn) {
	c.Close()
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// Addr is where the forwarder listens (inside its netns).
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Pause cuts the clients off the target: open connections are closed,
// new ones refused, until Resume.
func (f *Forwarder) Pause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = true
	for c := range f.conns {
		c.Close()
	}
}

// Resume forwards new connections again.
func (f *Forwarder) Resume() {
	f.mu.Lock()
	f.paused = false
	f.mu.Unlock()
}

// Close stops the forwarder and closes every connection.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	err := f.ln.Close()
	f.Pause()
	f.wg.Wait()
	return err
}

// IperfGbps is the receiver's throughput in Gbit/s of an `iperf3 -c -J`
// report; an error when out is not one or reports an error (iperf3 -J
// puts its errors in the JSON and exits 1).
func IperfGbps(out []byte) (float64, error) {
	var j struct {
		End struct {
			Received struct {
				BPS float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &j); err != nil {
		return 0, fmt.Errorf("iperf3 report: %w", err)
	}
	if j.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", j.Error)
	}
	return j.End.Received.BPS / 1e9, nil
}
