package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// newNamedNetNS creates an empty network namespace pinned at
// /run/netns/<name>, as `ip netns add` does, with lo up.
func newNamedNetNS(name string) (ns.NetNS, error) {
	path := filepath.Join("/run/netns", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it leaves the root netns for
		// good, so the runtime discards it when this goroutine ends.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("netns %s: %w", name, err)
	}
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, err
	}
	err = n.Do(func(ns.NetNS) error {
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: lo up: %w", name, err)
	}
	return n, nil
}

// startIn starts cmd with its network namespace set to n: the fork happens
// on the thread Do switched into n, and the child inherits that.
func startIn(n ns.NetNS, cmd *exec.Cmd) error {
	return n.Do(func(ns.NetNS) error { return cmd.Start() })
}

// runIn runs cmd in n and returns its combined output.
func runIn(n ns.NetNS, cmd *exec.Cmd) ([]byte, error) {
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	return out, err
}

// dialIn returns a DialContext whose sockets are created in n (a socket
// stays in the netns it was created in).
func dialIn(n ns.NetNS) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// tunnelStats is the tunl0 counters of one node.
type tunnelStats struct{ rxPackets, txPackets, rxBytes, txBytes uint64 }

func linkStats(n ns.NetNS, dev string) (tunnelStats, error) {
	var st tunnelStats
	err := n.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(dev)
		if err != nil {
			return err
		}
		s := l.Attrs().Statistics
		if s == nil {
			return fmt.Errorf("%s has no statistics", dev)
		}
		st = tunnelStats{s.RxPackets, s.TxPackets, s.RxBytes, s.TxBytes}
		return nil
	})
	return st, err
}
