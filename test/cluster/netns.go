package cluster

// Named network namespaces (what `ip netns add/delete` makes, under
// /run/netns), and running code, processes and sockets inside them. The
// machine's own netns is never changed: a namespace is made by a throwaway
// OS thread that unshares and then dies.

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

// newNetNS creates the named netns name (it must not exist) with lo up.
func newNetNS(name string) (*NetNS, error) {
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
		_ = removeNetNS(name)
		return nil, err
	}
	n := &NetNS{Name: name, NetNS: h}
	if err := n.Do(func() error { return linkUp("lo") }); err != nil {
		n.Close()
		_ = removeNetNS(name)
		return nil, err
	}
	return n, nil
}

// removeNetNS unmounts and removes the named netns (absent is fine). The
// namespace itself goes away once no process or socket holds it.
func removeNetNS(name string) error {
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
	var out []byte
	var runErr error
	err := n.Do(func() error {
		out, runErr = exec.CommandContext(ctx, name, args...).CombinedOutput()
		return nil
	})
	if err != nil {
		return "", err
	}
	if runErr != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w", name, strings.Join(args, " "), n.Name, runErr)
	}
	return string(out), nil
}

// DialContext dials from inside the netns (the socket stays in the netns
// it was made in, whatever thread uses it later).
func (n *NetNS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the netns.
func (n *NetNS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// StartProcess starts cmd inside the netns, in its own process group (a
// Ctrl-C meant for the caller does not reach it). With dieWithUs it is
// killed if this process dies: the fork happens on a thread kept locked in
// the netns until the child exits, because PR_SET_PDEATHSIG fires when the
// forking thread, not the process, goes away.
func (n *NetNS) StartProcess(cmd *exec.Cmd, dieWithUs bool) error {
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
		if err := n.Set(); err != nil {
			started <- fmt.Errorf("enter netns %s: %w", n.Name, err)
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

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	return netlink.LinkSetUp(l)
}
