package nettest

// Named network namespaces (what `ip netns add/delete` makes, under
// /run/netns), and running code, processes and sockets inside any netns.
// The machine's own netns is never changed: a namespace is made by a
// throwaway OS thread that unshares and then dies. test/cluster builds its
// clusters out of these; the ipipvm guest its nodes inside the VM.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named network namespaces live (`ip netns` lists it).
const NetNSDir = "/run/netns"

// NetNS is a named network namespace.
type NetNS struct {
	Name string
	ns.NetNS
}

// NewNamedNetNS creates the named netns name (it must not exist) with lo
// up.
func NewNamedNetNS(name string) (*NetNS, error) {
	if err := os.MkdirAll(NetNSDir, 0o755); err != nil {
		return nil, err
	}
	// Like iproute2: make the directory a shared mount point, so the bind
	// mounts below propagate to other mount namespaces.
	if err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		if !errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("make %s shared: %w", NetNSDir, err)
		}
		if err := unix.Mount(NetNSDir, NetNSDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return nil, fmt.Errorf("bind %s: %w", NetNSDir, err)
		}
		if err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			return nil, fmt.Errorf("make %s shared: %w", NetNSDir, err)
		}
	}
	path := filepath.Join(NetNSDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", name, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread leaves the machine's netns and is
		// destroyed with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		errc <- unix.Mount(self, path, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	h, err := ns.GetNS(path)
	if err != nil {
		_ = RemoveNamedNetNS(name)
		return nil, err
	}
	n := &NetNS{Name: name, NetNS: h}
	if err := n.Do(func() error { return LinkUp("lo") }); err != nil {
		n.Close()
		_ = RemoveNamedNetNS(name)
		return nil, err
	}
	return n, nil
}

// RemoveNamedNetNS unmounts and removes the named netns (absent is fine).
// The namespace itself goes away once no process or socket holds it.
func RemoveNamedNetNS(name string) error {
	path := filepath.Join(NetNSDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

// NetNSNames lists the named netns whose name starts with prefix.
func NetNSNames(prefix string) ([]string, error) {
	entries, err := os.ReadDir(NetNSDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Do runs f with the calling goroutine's thread inside the netns.
func (n *NetNS) Do(f func() error) error {
	return n.NetNS.Do(func(ns.NetNS) error { return f() })
}

// Exec runs a command inside the netns and returns its combined output.
func (n *NetNS) Exec(ctx context.Context, name string, args ...string) (string, error) {
	out, err := ExecIn(ctx, n.NetNS, name, args...)
	if err != nil {
		return out, fmt.Errorf("%s %s in %s: %w", name, strings.Join(args, " "), n.Name, err)
	}
	return out, nil
}

// DialContext dials from inside the netns (the socket stays in the netns
// it was made in, whatever thread uses it later).
func (n *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return DialIn(n.NetNS)(ctx, network, addr)
}

// Listen listens inside the netns.
func (n *NetNS) Listen(network, addr string) (net.Listener, error) {
	return ListenIn(n.NetNS, network, addr)
}

// StartProcess starts cmd inside the netns: see StartProcess.
func (n *NetNS) StartProcess(cmd *exec.Cmd, dieWithUs bool) error {
	if err := StartProcess(n.NetNS, cmd, dieWithUs); err != nil {
		return fmt.Errorf("in netns %s: %w", n.Name, err)
	}
	return nil
}

// ExecIn runs a command inside netns and returns its combined output; the
// error is the command's own.
func ExecIn(ctx context.Context, netns ns.NetNS, name string, args ...string) (string, error) {
	var out []byte
	var runErr error
	err := netns.Do(func(ns.NetNS) error {
		out, runErr = exec.CommandContext(ctx, name, args...).CombinedOutput()
		return nil
	})
	if err != nil {
		return "", err
	}
	return string(out), runErr
}

// DialIn returns a DialContext whose sockets are created in netns (a
// socket stays in the netns it was made in).
func DialIn(netns ns.NetNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// ListenIn listens inside netns.
func ListenIn(netns ns.NetNS, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := netns.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// FreePort returns a TCP port free on the loopback of netns.
func FreePort(netns ns.NetNS) (int, error) {
	l, err := ListenIn(netns, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartProcess starts cmd inside netns, in its own process group (a
// Ctrl-C meant for the caller does not reach it). With dieWithUs it is
// killed if this process dies: the fork happens on a thread kept locked in
// the netns until the child exits, because PR_SET_PDEATHSIG fires when the
// forking thread, not the process, goes away.
func StartProcess(netns ns.NetNS, cmd *exec.Cmd, dieWithUs bool) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if dieWithUs {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if err := netns.Set(); err != nil {
			started <- fmt.Errorf("enter netns %s: %w", netns.Path(), err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		// Wait without reaping (the owner of cmd calls Wait).
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	return <-started
}

// LinkUp sets link name up in the calling thread's netns.
func LinkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	return netlink.LinkSetUp(l)
}

// WriteSysctl writes /proc/sys/<name> in the calling thread's netns.
func WriteSysctl(name, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644)
}

// Do runs f inside netns and fails the test on error.
func Do(t testing.TB, netns ns.NetNS, f func() error) {
	t.Helper()
	if err := netns.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}
