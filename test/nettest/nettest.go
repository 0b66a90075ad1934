// Package nettest builds the throwaway network namespaces the podnet tests
// run in: a "node" netns that plays the host, pod netns beside it, and a
// libcni runtime that execs the built plugins inside the node netns, exactly
// as a container runtime on that node would. Nothing here touches the
// machine's own netns.
package nettest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/testns"
	"github.com/podnet/podnet/plugins/veth"
)

// NodeAddr is the address every test node has on its loopback: what pods
// ping to reach "the host".
const NodeAddr = "192.168.77.1"

// NodeAddr6 is the node's IPv6 loopback address.
const NodeAddr6 = "fd77::1"

// RepoRoot returns the repository root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// BinDir is where `make` puts the podnet binaries. It fails the test when
// the plugin it needs is not built.
func BinDir(t testing.TB, need ...string) string {
	t.Helper()
	dir := filepath.Join(RepoRoot(t), "bin")
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s not built (run `make` first): %v", b, err)
		}
	}
	return dir
}

// RefToolsDir is where scripts/install-cni-tools.sh installed the reference
// plugins (host-local, ptp, ...) and cnitool; the Makefile exports it as
// PODNET_CNI_TOOLS.
func RefToolsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("PODNET_CNI_TOOLS")
	if dir == "" {
		t.Fatal("PODNET_CNI_TOOLS is not set: run the tests with `make test` (it installs the reference CNI plugins)")
	}
	if _, err := os.Stat(filepath.Join(dir, "host-local")); err != nil {
		t.Fatalf("reference host-local missing in %s: %v", dir, err)
	}
	return dir
}

// Node is a network namespace that plays a Kubernetes node.
type Node struct {
	NS ns.NetNS
	t  testing.TB
}

// NewNode creates a node netns with lo up carrying NodeAddr and NodeAddr6,
// and no default route. It is removed when the test ends.
func NewNode(t testing.TB) *Node {
	t.Helper()
	nodeNS := NewNetNS(t)
	n := &Node{NS: nodeNS, t: t}
	n.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	n.AddAddrs("lo", NodeAddr+"/32", NodeAddr6+"/128")
	return n
}

// AddAddrs adds the addresses (CIDR notation) to the node's link dev.
func (n *Node) AddAddrs(dev string, cidrs ...string) {
	n.t.Helper()
	n.Do(func() error {
		link, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		for _, a := range cidrs {
			addr, err := netlink.ParseAddr(a)
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("add %s to %s: %w", a, dev, err)
			}
		}
		for _, a := range cidrs {
			addr, _ := netlink.ParseAddr(a)
			if link.Attrs().Flags&net.FlagUp == 0 {
				break // no local route until the link is up
			}
			if err := waitLocalRoute(addr.IP); err != nil {
				return fmt.Errorf("add %s to %s: %w", a, dev, err)
			}
		}
		return nil
	})
}

// waitLocalRoute waits until the kernel has installed the local-table
// route of an address just added. IPv6 installs it from a workqueue (after
// DAD, even on lo), so without the wait it can appear in the middle of a
// test and show up in a before/after snapshot of the node.
func waitLocalRoute(ip net.IP) error {
	family, bits := netlink.FAMILY_V4, 32
	if ip.To4() == nil {
		family, bits = netlink.FAMILY_V6, 128
	}
	filter := &netlink.Route{Table: unix.RT_TABLE_LOCAL, Dst: &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		routes, err := netlink.RouteListFiltered(family, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
		if err != nil {
			return fmt.Errorf("list local routes: %w", err)
		}
		if len(routes) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the kernel installed no local route for %s within 10s", ip)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// NewNetNS creates a netns removed at the end of the test (an error of
// the test when it stays).
func NewNetNS(t testing.TB) ns.NetNS { t.Helper(); return testns.New(t) }

// Do runs f inside the node netns and fails the test on error.
func (n *Node) Do(f func() error) {
	n.t.Helper()
	if err := n.NS.Do(func(ns.NetNS) error { return f() }); err != nil {
		n.t.Fatal(err)
	}
}

// Links returns the names of the node's links other than lo.
func (n *Node) Links() []string {
	names, err := LinkNames(n.NS)
	if err != nil {
		n.t.Fatal(err)
	}
	return names
}

// LinkNames lists the links of netns other than lo and other than the
// ends of veth pairs that DEL detached (veth.IsDetached: down, no route,
// no address in use; the kernel removes them with the pod netns, which
// TestDelDetachesUntilNetnsGone checks with AllLinkNames).
func LinkNames(netns ns.NetNS) ([]string, error) {
	return linkNames(netns, func(l netlink.Link) bool { return !veth.IsDetached(l) })
}

// AllLinkNames lists every link of netns other than lo.
func AllLinkNames(netns ns.NetNS) ([]string, error) {
	return linkNames(netns, func(netlink.Link) bool { return true })
}

func linkNames(netns ns.NetNS, keep func(netlink.Link) bool) ([]string, error) {
	var names []string
	err := netns.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" && keep(l) {
				names = append(names, l.Attrs().Name)
			}
		}
		return nil
	})
	return names, err
}

// RoutesWithProto lists the node's routes of protocol proto (both
// families, every table).
func (n *Node) RoutesWithProto(proto netlink.RouteProtocol) []netlink.Route {
	var out []netlink.Route
	n.Do(func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: proto, Table: 0}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		out = routes
		return nil
	})
	return out
}

// Runtime execs CNI plugins through libcni inside a node netns.
type Runtime struct {
	Node  *Node
	CNI   *libcni.CNIConfig
	List  *libcni.NetworkConfigList
	Paths []string
	Cache string
	Ctx   context.Context
}

// NewRuntime parses conflist and prepares libcni with the given plugin
// directories and a private result cache.
func NewRuntime(t testing.TB, node *Node, conflist string, paths ...string) *Runtime {
	t.Helper()
	list, err := libcni.ConfListFromBytes([]byte(conflist))
	if err != nil {
		t.Fatalf("parse conflist: %v\n%s", err, conflist)
	}
	cache := t.TempDir()
	return &Runtime{
		Node:  node,
		CNI:   libcni.NewCNIConfigWithCacheDir(paths, cache, nil),
		List:  list,
		Paths: paths,
		Cache: cache,
		Ctx:   context.Background(),
	}
}

// Pod is one attachment made through a Runtime.
type Pod struct {
	NS     ns.NetNS
	RT     *libcni.RuntimeConf
	Result *current.Result
}

// RuntimeConf returns the runtime conf of a new pod in netns podNS.
func RuntimeConf(containerID string, podNS ns.NetNS, ifName string, args ...[2]string) *libcni.RuntimeConf {
	path := ""
	if podNS != nil {
		path = podNS.Path()
	}
	// Like kubelet's runtimes, tell plugins to ignore CNI_ARGS they do not know.
	args = append([][2]string{{"IgnoreUnknown", "1"}}, args...)
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: path, IfName: ifName, Args: args}
}

// inNode runs f in the node netns, keeping the thread locked for the exec
// libcni does inside f (a forked plugin inherits the thread's netns).
func (r *Runtime) inNode(f func() error) error {
	return r.Node.NS.Do(func(ns.NetNS) error { return f() })
}

// Add runs ADD for rt and returns the result converted to the current
// version.
func (r *Runtime) Add(rt *libcni.RuntimeConf) (*current.Result, error) {
	var res types.Result
	err := r.inNode(func() error {
		var err error
		res, err = r.CNI.AddNetworkList(r.Ctx, r.List, rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	return current.NewResultFromResult(res)
}

// Del runs DEL (with the cached prevResult when there is one).
func (r *Runtime) Del(rt *libcni.RuntimeConf) error {
	return r.inNode(func() error { return r.CNI.DelNetworkList(r.Ctx, r.List, rt) })
}

// Check runs CHECK with the cached prevResult.
func (r *Runtime) Check(rt *libcni.RuntimeConf) error {
	return r.inNode(func() error { return r.CNI.CheckNetworkList(r.Ctx, r.List, rt) })
}

// GC runs GC with valid as the attachments to keep.
func (r *Runtime) GC(valid []types.GCAttachment) error {
	return r.inNode(func() error {
		return r.CNI.GCNetworkList(r.Ctx, r.List, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// Status runs STATUS.
func (r *Runtime) Status() error {
	return r.inNode(func() error { return r.CNI.GetStatusNetworkList(r.Ctx, r.List) })
}

// ForgetCache drops libcni's cached results, so the next DEL or GC runs
// without prevResult and without cached attachments.
func (r *Runtime) ForgetCache(t testing.TB) {
	t.Helper()
	if err := os.RemoveAll(r.Cache); err != nil {
		t.Fatal(err)
	}
}

// Ping sends count ICMP echo requests from netns to addr and returns an
// error with ping's output when none is answered.
func Ping(netns ns.NetNS, addr string) error {
	var out []byte
	err := netns.Do(func(ns.NetNS) error {
		runtime.LockOSThread()
		cmd := exec.Command("ping", "-c", "1", "-W", "2", addr)
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	if err != nil {
		return fmt.Errorf("ping %s from %s: %w\n%s", addr, netns.Path(), err, out)
	}
	return nil
}

// ReadSysctl reads /proc/sys/<name> inside netns.
func ReadSysctl(netns ns.NetNS, name string) (string, error) {
	var v string
	err := netns.Do(func(ns.NetNS) error {
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		v = strings.TrimSpace(string(b))
		return err
	})
	return v, err
}

// CNIError returns err as a CNI error, or nil.
func CNIError(err error) *types.Error {
	var e *types.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// MustParseCIDR parses s as an IPNet keeping the address (not the network).
func MustParseCIDR(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// BuildFakeIPAM builds test/fakeipam into dir and returns dir.
func BuildFakeIPAM(dir string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(root) == root {
			return "", errors.New("go.mod not found")
		}
		root = filepath.Dir(root)
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "fakeipam"), "./test/fakeipam")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build fakeipam: %w\n%s", err, out)
	}
	return dir, nil
}

// RemoveNetNS deletes a netns made by NewNetNS before the test ends (the
// pod's netns disappearing before DEL).
func RemoveNetNS(n ns.NetNS) error {
	return testutils.UnmountNS(n)
}

// RunDir is a new directory on a tmpfs (/dev/shm, else /run), removed when
// t ends, for the node's state and IPAM stores: the DaemonSet keeps them
// under /run, a tmpfs, and the IPAM store fsyncs each reservation, which a
// disk makes cost every ADD milliseconds. Without a writable tmpfs it is
// t.TempDir(). The second result says which it is.
func RunDir(t testing.TB, prefix string) (string, string) {
	t.Helper()
	for _, root := range []string{"/dev/shm", "/run"} {
		var st unix.Statfs_t
		if unix.Statfs(root, &st) != nil || st.Type != unix.TMPFS_MAGIC {
			continue
		}
		if d, err := os.MkdirTemp(root, prefix); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d, "tmpfs " + root
		}
	}
	return t.TempDir(), "t.TempDir (not tmpfs)"
}
