// Package policysock is how a podnet plugin, at the end of ADD, waits until
// the node's NetworkPolicy engine (podnet-routed) has the new pod's policy
// in the kernel. Until then the engine's table drops the pod's address in
// both directions (a new pod is isolated from its first packet); the wait
// only makes the pod usable as soon as its containers start.
//
// The protocol is one JSON request and one JSON answer per connection on a
// unix stream socket, <stateDir>/policy.sock, which only root can open.
// No socket (the engine is off, or another agent enforces policy) means no
// wait; a socket nobody answers on costs a refused connect.
//
// A request may also ask podnet-routed to add the pod's host veth to the
// pod filter (Request.Guard): then a first answer says whether it did
// (Answer.Guarded, or Answer.GuardError and the plugin adds it itself),
// before the final one. An engine that does not know the field sends only
// the final answer, and the plugin adds the port itself.
//
// A request with Unguard, from DEL, asks podnet-routed to take a port out
// of the pod filter instead: its one answer says whether it did (an
// engine that does not know the field answers about a policy wait, which
// a request without a pod's name and addresses fails), and the plugin
// takes the port out itself when it did not.
package policysock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/threadprio"
)

// FileName is the socket's name in the node state directory.
const FileName = "policy.sock"

// Path is the socket in stateDir.
func Path(stateDir string) string { return filepath.Join(stateDir, FileName) }

// maxMessage bounds a request or an answer: both are a few hundred bytes.
const maxMessage = 16 << 10

// Request tells the engine that a pod has these addresses on this node.
type Request struct {
	Namespace   string       `json:"namespace"`
	Name        string       `json:"name"`
	ContainerID string       `json:"containerID,omitempty"`
	IPs         []netip.Addr `json:"ips"`
	// HostVeth is the pod's host-side interface (its routed host veth or
	// bridge port): the engine judges what passes it as the pod's.
	HostVeth string `json:"hostVeth,omitempty"`
	// Guard, when set, asks podnet-routed to add HostVeth to the pod
	// filter as sending only from IPs (internal/podfilter.Port).
	Guard *GuardPort `json:"guard,omitempty"`
	// Unguard, when set, asks podnet-routed to take the port of host
	// veth index Unguard.Index out of the pod filter: exactly the
	// elements of IPs and Unguard.MAC when IPs are given, else whatever
	// the filter holds for the index. Namespace and Name are then
	// optional, and no policy wait is made.
	Unguard *GuardPort `json:"unguard,omitempty"`
}

// GuardPort is what the pod filter needs of a port beyond its name and
// addresses.
type GuardPort struct {
	// Mode is the pod filter's ("routed", "bridge": podfilter.Guard.Mode).
	Mode  string `json:"mode"`
	Index int    `json:"index"` // the host veth's ifindex in the node netns
	Alias string `json:"alias"` // the host veth's alias (its owner)
	MAC   string `json:"mac"`   // the pod interface's MAC
}

// Answer is the engine's reply: OK once the pod's policy is in the kernel.
// The first answer to a request with a Guard is about the guard only:
// Guarded, or GuardError.
type Answer struct {
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Guarded    bool   `json:"guarded,omitempty"`
	GuardError string `json:"guardError,omitempty"`
}

// aboutGuard says whether a is the answer about the guard.
func (a Answer) aboutGuard() bool { return a.Guarded || a.GuardError != "" }

// ErrNoEngine says that no engine listens on the node: nothing to wait for.
var ErrNoEngine = errors.New("no NetworkPolicy engine on this node")

// Wait sends req to the engine at path and waits for its answer until ctx
// ends. It returns ErrNoEngine (wrapped) when there is no socket or nobody
// listens on it.
func Wait(ctx context.Context, path string, req Request) error {
	p, err := Send(ctx, path, req)
	if err != nil {
		return err
	}
	return p.Await()
}

// Pending is a request sent whose answer is not read yet: the engine
// works on it while the plugin does something else.
type Pending struct {
	ctx  context.Context
	conn net.Conn
	stop func() bool
	// dec reads the answers; final is the final one when AwaitGuard read
	// it first (an engine that does not guard)
	dec   *json.Decoder
	final *Answer
}

// Send sends req to the engine at path; Await reads the answer. ctx bounds
// both (and must outlive the Await). It returns ErrNoEngine (wrapped) when
// there is no socket or nobody listens on it.
func Send(ctx context.Context, path string, req Request) (*Pending, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("%w (%s)", ErrNoEngine, path)
		}
		return nil, fmt.Errorf("connect to the NetworkPolicy engine at %s: %w", path, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			conn.Close()
			return nil, fmt.Errorf("policy socket deadline: %w", err)
		}
	}
	p := &Pending{ctx: ctx, conn: conn, stop: context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })}
	p.dec = json.NewDecoder(io.LimitReader(conn, 4*maxMessage))
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		p.Close()
		return nil, fmt.Errorf("send to the NetworkPolicy engine: %w", err)
	}
	return p, nil
}

// AwaitGuard reads the answer about the request's Guard, for at most
// timeout: true when podnet-routed added the port to the pod filter.
// False with a nil error when it did not (GuardError, or an engine that
// guards nothing: its final answer is kept for Await); an error when no
// answer came in time or the connection failed. Either way the caller
// adds the port itself; Await still reads the final answer.
func (p *Pending) AwaitGuard(timeout time.Duration) (bool, error) {
	dl := time.Now().Add(timeout)
	if cdl, ok := p.ctx.Deadline(); ok && cdl.Before(dl) {
		dl = cdl
	}
	if err := p.conn.SetReadDeadline(dl); err != nil {
		return false, fmt.Errorf("policy socket deadline: %w", err)
	}
	var a Answer
	err := p.dec.Decode(&a)
	if cdl, ok := p.ctx.Deadline(); ok && p.ctx.Err() == nil {
		p.conn.SetReadDeadline(cdl)
	}
	if err != nil {
		// the decoder keeps its error: read on from what it buffered
		p.dec = json.NewDecoder(io.MultiReader(p.dec.Buffered(), io.LimitReader(p.conn, 4*maxMessage)))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false, fmt.Errorf("podnet-routed did not answer about the pod filter within %v", timeout)
		}
		return false, fmt.Errorf("read podnet-routed's answer about the pod filter: %w", err)
	}
	if !a.aboutGuard() {
		p.final = &a
		return false, nil
	}
	if a.GuardError != "" {
		return false, fmt.Errorf("podnet-routed did not add the port to the pod filter: %s", a.GuardError)
	}
	return true, nil
}

// Await reads the engine's answer (once; the connection is closed after).
// An answer about the guard that comes late is skipped.
func (p *Pending) Await() error {
	defer p.Close()
	a := p.final
	for a == nil {
		var next Answer
		if err := p.dec.Decode(&next); err != nil {
			var ne net.Error
			if p.ctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("NetworkPolicy engine did not answer in time: %w", context.DeadlineExceeded)
			}
			return fmt.Errorf("read the NetworkPolicy engine's answer: %w", err)
		}
		if !next.aboutGuard() {
			a = &next
		}
	}
	if !a.OK {
		return fmt.Errorf("NetworkPolicy engine: %s", a.Error)
	}
	return nil
}

// Close gives up on the answer (a nil Pending, or one closed, is fine).
func (p *Pending) Close() {
	if p == nil || p.conn == nil {
		return
	}
	p.stop()
	p.conn.Close()
	p.conn = nil
}

// Handler programs the pod's policy and returns once it is in the kernel
// (or ctx ends).
type Handler func(ctx context.Context, req Request) error

// EarlyHandler is a Handler that may answer before it returns: reply(nil)
// sends the plugin its OK at once, from the calling goroutine (the
// engine's write loop, right after its write: the plugin does not wait
// for another goroutine to be scheduled). The first answer counts; when
// the handler returns without one, its error (or OK) is sent.
type EarlyHandler func(ctx context.Context, req Request, reply func(error)) error

// Listen creates the socket at path (a stale one is replaced), readable and
// writable by root only.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("policy socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale policy socket: %w", err)
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("policy socket: %w", err)
	}
	return l, nil
}

// Serve answers requests on l until ctx ends, each connection in its own
// goroutine with timeout as its deadline. It closes l and removes the
// socket file when it returns.
func Serve(ctx context.Context, l net.Listener, timeout time.Duration, h Handler) error {
	return ServeEarly(ctx, l, timeout, func(ctx context.Context, req Request, _ func(error)) error { return h(ctx, req) })
}

// GuardHandler adds the port a request's Guard describes to the pod
// filter (the request is valid). It may answer before it returns:
// answer(nil) tells the plugin its port is guarded at once, from the
// calling goroutine (the thread that wrote it: the plugin does not wait
// for another goroutine to be scheduled). The first answer counts; when
// the handler returns without one, its error (or success) is sent.
type GuardHandler func(ctx context.Context, req Request, answer func(error)) error

// UnguardHandler takes the port a request's Unguard names out of the pod
// filter (the request is valid).
type UnguardHandler func(ctx context.Context, req Request) error

// ServeEarly is Serve for an EarlyHandler. A request's Guard is answered
// as not done: it guards nothing (ServeGuarded does).
func ServeEarly(ctx context.Context, l net.Listener, timeout time.Duration, h EarlyHandler) error {
	return ServeGuarded(ctx, l, timeout, nil, h)
}

// ServeGuarded is ServeEarly that adds the ports of requests with a Guard
// to the pod filter with guard (nil: none), and says so in a first answer,
// before h runs: the port's write is the urgent one (the plugin brings
// the host veth up only after it), and the NetworkPolicy engine's write
// for many pods at once would hold the netns's nftables commit lock ahead
// of it.
func ServeGuarded(ctx context.Context, l net.Listener, timeout time.Duration, guard GuardHandler, h EarlyHandler) error {
	return ServeGuardedAt(ctx, l, timeout, 0, guard, h)
}

// ServeGuardedAt is ServeGuarded with each connection served on a thread
// of its own at the nice value nice (threadprio; 0: the process's): the
// plugin's request is read, its port guarded and its wait registered
// as soon as it comes, not when a thread of a node busy starting pods
// gets to it. A thread whose priority cannot be raised serves at its
// own.
func ServeGuardedAt(ctx context.Context, l net.Listener, timeout time.Duration, nice int, guard GuardHandler, h EarlyHandler) error {
	return ServeHandlers(ctx, l, timeout, nice, Handlers{Guard: guard, Unguard: nil, Wait: h})
}

// Handlers are what a server does with the requests: Guard adds a
// request's port to the pod filter (nil: it guards nothing), Unguard
// takes one out (nil: it does not), Wait is the policy wait.
type Handlers struct {
	Guard   GuardHandler
	Unguard UnguardHandler
	Wait    EarlyHandler
}

// ServeHandlers is ServeGuardedAt with an UnguardHandler too.
func ServeHandlers(ctx context.Context, l net.Listener, timeout time.Duration, nice int, hs Handlers) error {
	go func() { <-ctx.Done(); l.Close() }()
	defer func() {
		if ul, ok := l.(*net.UnixListener); ok {
			os.Remove(ul.Addr().String())
		}
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("policy socket accept: %w", err)
		}
		go threadprio.Do(nice, func() { serveConn(ctx, conn, timeout, hs) })
	}
}

func serveConn(ctx context.Context, conn net.Conn, timeout time.Duration, hs Handlers) {
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.SetDeadline(time.Now().Add(timeout))
	a := &answers{conn: conn}
	var req Request
	if err := json.NewDecoder(io.LimitReader(conn, maxMessage)).Decode(&req); err != nil {
		a.final(fmt.Errorf("bad request: %v", err))
		return
	}
	if err := validate(req); err != nil {
		a.final(err)
		return
	}
	if req.Unguard != nil {
		if hs.Unguard == nil {
			a.final(errors.New("this engine does not take ports out of the pod filter"))
			return
		}
		a.final(hs.Unguard(ctx, req))
		return
	}
	if req.Guard != nil {
		a.guard(callGuard(ctx, hs.Guard, req, a.guard))
	}
	a.final(hs.Wait(ctx, req, a.final))
}

// callGuard runs guard (nil: an engine that guards nothing).
func callGuard(ctx context.Context, guard GuardHandler, req Request, answer func(error)) error {
	if guard == nil {
		return errors.New("this engine does not add ports to the pod filter")
	}
	return guard(ctx, req, answer)
}

// answers writes a connection's answers, the first of each kind: the
// guard's (from whichever goroutine gives it first) and the final one.
type answers struct {
	conn                 net.Conn
	mu                   sync.Mutex
	guardSent, finalSent bool
}

func (a *answers) guard(err error) {
	a.send(&a.guardSent, guardedAnswer, func(msg string) Answer { return Answer{GuardError: msg} }, err)
}

func (a *answers) final(err error) {
	a.send(&a.finalSent, okAnswer, func(msg string) Answer { return Answer{Error: msg} }, err)
}

// send writes ok, or failed's answer for err, unless *sent says one was
// written.
func (a *answers) send(sent *bool, ok string, failed func(string) Answer, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if *sent {
		return
	}
	*sent = true
	if err == nil {
		a.conn.Write([]byte(ok))
		return
	}
	json.NewEncoder(a.conn).Encode(failed(err.Error()))
}

// guardedAnswer is Answer{Guarded: true} as sent.
const guardedAnswer = "{\"ok\":false,\"guarded\":true}\n"

// okAnswer is Answer{OK: true} as sent.
const okAnswer = "{\"ok\":true}\n"

// validate refuses a request that names no pod or no usable address.
func validate(r Request) error {
	if r.Unguard != nil {
		return validateUnguard(r)
	}
	if r.Namespace == "" || r.Name == "" {
		return errors.New("bad request: the pod's namespace and name are required")
	}
	if len(r.Namespace) > 253 || len(r.Name) > 253 {
		return errors.New("bad request: namespace or name longer than 253 characters")
	}
	if len(r.IPs) == 0 || len(r.IPs) > 8 {
		return fmt.Errorf("bad request: %d addresses (want 1 to 8)", len(r.IPs))
	}
	for _, ip := range r.IPs {
		if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() {
			return fmt.Errorf("bad request: %v is not a pod address", ip)
		}
	}
	if r.HostVeth != "" && !contract.IsHostVeth(r.HostVeth) || len(r.HostVeth) > 15 || strings.ContainsAny(r.HostVeth, "/ :\x00") {
		return fmt.Errorf("bad request: %q is not a podnet host veth name", r.HostVeth)
	}
	if r.Guard != nil {
		return validateGuard(r)
	}
	return nil
}

// validateUnguard refuses an Unguard that cannot name a podnet port.
func validateUnguard(r Request) error {
	g := r.Unguard
	if r.Guard != nil {
		return errors.New("bad request: both guard and unguard")
	}
	if g.Mode != "routed" && g.Mode != "bridge" {
		return fmt.Errorf("bad request: unguard mode %q (want routed or bridge)", g.Mode)
	}
	if g.Index <= 0 || g.Index > math.MaxInt32 {
		return fmt.Errorf("bad request: unguard interface index %d", g.Index)
	}
	if len(r.IPs) > 8 {
		return fmt.Errorf("bad request: %d addresses (want at most 8)", len(r.IPs))
	}
	for _, ip := range r.IPs {
		if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() {
			return fmt.Errorf("bad request: %v is not a pod address", ip)
		}
	}
	if len(r.IPs) > 0 {
		mac, err := net.ParseMAC(g.MAC)
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			return fmt.Errorf("bad request: unguard MAC %q is not a unicast Ethernet address", g.MAC)
		}
	}
	if len(r.Namespace) > 253 || len(r.Name) > 253 || len(g.Alias) > 255 {
		return errors.New("bad request: namespace, name or alias too long")
	}
	return nil
}

// validateGuard refuses a Guard that cannot describe a podnet port.
func validateGuard(r Request) error {
	g := r.Guard
	if r.HostVeth == "" {
		return errors.New("bad request: a guard needs the host veth's name")
	}
	if g.Mode != "routed" && g.Mode != "bridge" {
		return fmt.Errorf("bad request: guard mode %q (want routed or bridge)", g.Mode)
	}
	if g.Index <= 0 || g.Index > math.MaxInt32 {
		return fmt.Errorf("bad request: guard interface index %d", g.Index)
	}
	if g.Alias == "" || len(g.Alias) > 255 || strings.ContainsFunc(g.Alias, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return errors.New("bad request: the guard's alias is empty, too long or not printable")
	}
	mac, err := net.ParseMAC(g.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return fmt.Errorf("bad request: guard MAC %q is not a unicast Ethernet address", g.MAC)
	}
	return nil
}
