package routed

// The leak reconcile (routed/reconcile, issue 22) end to end, without a
// container runtime: podnet-routed runs in a node netns with
// --ipam-data-dir=<the node's IPAM store> --cri-socket= (the harness's)
// and short --reconcile-interval/--reconcile-grace; pods are attached as a
// cnitool user attaches them (libcni ADD of bin/podnet or
// bin/podnet-bridge in the node netns, into a netns the test made, no
// K8S_POD_* args), and then broken behind podnet's back: their netns
// deleted without DEL, the store carried over a "reboot", a live pod's
// host route and proxy ARP removed, orphan and hostile store entries.
// Every check is on the real effects: the store's files, host veths, host
// routes, the pod filter's elements, podnet_leaks_reclaimed_total{kind},
// podnet_repairs_total{object} and the daemon's log.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/ipam/store"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

const (
	rcInterval = time.Second
	rcGrace    = 3 * time.Second
	// rcSlack is how many intervals past what the reconcile is due to do
	// the tests allow it, for a loaded machine.
	rcSlack = 6 * rcInterval
)

// rcArgs are the daemon flags of a reconcile every rcInterval with a grace
// of grace.
func rcArgs(grace time.Duration) []string {
	return []string{"--reconcile-interval=" + rcInterval.String(), "--reconcile-grace=" + grace.String()}
}

// leakKinds are the values of podnet_leaks_reclaimed_total's label.
var leakKinds = []string{"reboot", "runtime", "netns", "orphan"}

// cniMode is how pods are attached: the plugin and its network (the
// store's directory under the data dir).
type cniMode struct {
	name, plugin, network string
	bridged               bool
}

var (
	routedMode  = cniMode{name: "routed", plugin: "podnet", network: "podnet"}
	bridgedMode = cniMode{name: "bridge", plugin: "podnet-bridge", network: "podnet-br", bridged: true}
)

// rcNode is a node running podnet-routed with the reconcile, and a
// cnitool-like way to attach pods to it.
type rcNode struct {
	*node
	d       *daemon
	args    []string
	mode    cniMode
	podCIDR netip.Prefix
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
	peer    *rcPod // bridge mode: the pod the others are pinged from
}

// rcNode adds machine name (underlay address ip) with its Node object
// (podCIDR), starts podnet-routed with args and waits for it to be ready
// and node.json to hold the PodCIDR. Called from the test's own goroutine
// (the harness fails c.t).
func (c *cluster) rcNode(name, ip, podCIDR string, mode cniMode, args ...string) *rcNode {
	t := c.t
	t.Helper()
	n := &rcNode{node: c.addNode(name, ip), args: args, mode: mode, podCIDR: netip.MustParsePrefix(podCIDR)}
	c.createNode(name, ip, podCIDR)
	n.start()
	n.useConf(t, "usePodCidr")
	return n
}

// useConf gives n the conflist of its mode's plugin with podnet-ipam on
// subnet (usePodCidr: the node's PodCIDR) and a libcni of its own.
func (n *rcNode) useConf(t *testing.T, subnet string) {
	t.Helper()
	plugin := map[string]any{
		"type":     n.mode.plugin,
		"stateDir": n.m.StateDir,
		"ipam": map[string]any{"type": "podnet-ipam", "dataDir": n.m.DataDir,
			"ranges": []any{[]any{map[string]any{"subnet": subnet}}}},
	}
	if n.mode.bridged {
		plugin["bridge"] = "podnet0"
		plugin["isGateway"] = true
	}
	conf, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": n.mode.network, "plugins": []any{plugin}})
	if err != nil {
		t.Fatal(err)
	}
	if n.list, err = libcni.ConfListFromBytes(conf); err != nil {
		t.Fatal(err)
	}
	bin := nettest.BinDir(t, "podnet", "podnet-bridge", "podnet-ipam")
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(n.m.Dir, "cni-cache-"+n.mode.name), nil)
}

// start starts podnet-routed with n.args and waits until it is ready.
func (n *rcNode) start() {
	t := n.c.t
	t.Helper()
	n.d = n.startDaemon(n.args...)
	n.d.waitReady(30 * time.Second)
	nettest.Eventually(t, 10*time.Second, n.name+" node.json with the PodCIDR", func() error {
		st, err := nodestate.Read(n.m.StateDir)
		if err != nil {
			return err
		}
		if !slices.Equal(st.PodCIDRs, []string{n.podCIDR.String()}) {
			return fmt.Errorf("podCIDRs %v", st.PodCIDRs)
		}
		return nil
	})
}

// rcPod is an attachment made by hand (libcni, no runtime).
type rcPod struct {
	n       *rcNode
	name    string
	cid     string
	ns      *nettest.NetNS
	rt      *libcni.RuntimeConf
	ip      netip.Addr
	veth    string    // the host veth
	index   int       // its ifindex
	created time.Time // what ADD recorded in the owner index entry
}

// attach creates netns <cluster>-pod-<name> and runs ADD for it in the
// node netns, as `cnitool add` would (no CNI_ARGS).
func (n *rcNode) attach(t *testing.T, name string) *rcPod {
	t.Helper()
	netns, err := nettest.NewNamedNetNS(n.c.c.Cfg.Name + "-pod-" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Close() }) // the cluster's teardown removes it
	id := make([]byte, 6)
	_, _ = rand.Read(id)
	p := &rcPod{n: n, name: name, cid: "cnitool-" + name + "-" + hex.EncodeToString(id), ns: netns}
	p.rt = &libcni.RuntimeConf{ContainerID: p.cid, NetNS: netns.Path(), IfName: "eth0"}
	var res types.Result
	err = n.ns.Do(func(ns.NetNS) error {
		var err error
		res, err = n.cni.AddNetworkList(context.Background(), n.list, p.rt)
		return err
	})
	if err != nil {
		t.Fatalf("%s: ADD %s: %v", n.name, name, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, ipc := range r.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && a.Unmap().Is4() {
			p.ip = a.Unmap()
		}
	}
	if !n.podCIDR.Contains(p.ip) {
		t.Fatalf("%s: pod %s got %v, want an address in %s", n.name, name, r.IPs, n.podCIDR)
	}
	owner := contract.VethOwner{Network: n.mode.network, ContainerID: p.cid, IfName: "eth0"}
	err = n.ns.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if o, detached, ok := contract.ParseVethAlias(l.Attrs().Alias); ok && !detached && o == owner {
				p.veth, p.index = l.Attrs().Name, l.Attrs().Index
			}
		}
		return nil
	})
	if err != nil || p.veth == "" {
		t.Fatalf("%s: no host veth with the alias of %s (%v)", n.name, name, err)
	}
	rec, err := p.record()
	if err != nil {
		t.Fatal(err)
	}
	p.created = rec.Created
	if p.created.IsZero() || rec.Netns != netns.Path() {
		t.Fatalf("%s: owner index entry of %s records created %v netns %q", n.name, name, rec.Created, rec.Netns)
	}
	t.Logf("%s: pod %s %s on %s (ifindex %d)", n.name, name, p.ip, p.veth, p.index)
	return p
}

func (p *rcPod) storeDir() string  { return filepath.Join(p.n.m.DataDir, p.n.mode.network) }
func (p *rcPod) ipFile() string    { return filepath.Join(p.storeDir(), "ips", p.ip.String()) }
func (p *rcPod) ownerFile() string { return filepath.Join(p.storeDir(), "owners", p.cid+":eth0") }

// record reads the pod's owner index entry.
func (p *rcPod) record() (store.Record, error) {
	b, err := os.ReadFile(p.ownerFile())
	if err != nil {
		return store.Record{}, err
	}
	return store.ParseRecord(b)
}

// dropNetNS removes the pod's netns name without DEL. With hold, the test
// keeps its handle open: the namespace (and with it the host veth) lives
// on, unnamed, as when a process still sits in it.
func (p *rcPod) dropNetNS(t *testing.T, hold bool) {
	t.Helper()
	if !hold {
		_ = p.ns.Close()
	}
	if err := nettest.RemoveNamedNetNS(p.ns.Name); err != nil {
		t.Fatal(err)
	}
}

// hostLink is the host veth at the pod's ifindex when it is still the
// pod's (nil when gone).
func (p *rcPod) hostLink() (netlink.Link, error) {
	var out netlink.Link
	err := p.n.ns.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByIndex(p.index)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		if err != nil {
			return err
		}
		if o, _, ok := contract.ParseVethAlias(l.Attrs().Alias); ok && o.ContainerID == p.cid {
			out = l
		}
		return nil
	})
	return out, err
}

// filterElements are the pod filter's elements of the pod's host veth.
func (p *rcPod) filterElements() ([]string, error) {
	elems, err := nettest.ReadPodFilter(p.n.ns)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range elems {
		if e.Index == p.index {
			out = append(out, e.String())
		}
	}
	return out, nil
}

// leftovers lists what of the pod is still on the node: its reservation,
// owner index entry, host veth, pod filter elements, host route.
func (p *rcPod) leftovers() ([]string, error) {
	var out []string
	for _, f := range []string{p.ipFile(), p.ownerFile()} {
		if _, err := os.Lstat(f); err == nil {
			out = append(out, strings.TrimPrefix(f, p.storeDir()+"/"))
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	l, err := p.hostLink()
	if err != nil {
		return nil, err
	}
	if l != nil {
		out = append(out, "host veth "+l.Attrs().Name)
	}
	elems, err := p.filterElements()
	if err != nil {
		return nil, err
	}
	if len(elems) > 0 {
		out = append(out, "pod filter "+strings.Join(elems, ", "))
	}
	routes, err := p.n.routesTo(p.ip.String() + "/32")
	if err != nil {
		return nil, err
	}
	if len(routes) > 0 {
		out = append(out, "routes "+strings.Join(routes, "; "))
	}
	return out, nil
}

// intact checks that the pod has everything its ADD made: reservation and
// owner index entry unchanged, host veth in service, pod filter elements,
// (routed) its host route to the veth.
func (p *rcPod) intact() error {
	b, err := os.ReadFile(p.ipFile())
	if err != nil {
		return fmt.Errorf("pod %s: reservation: %w", p.name, err)
	}
	if string(b) != p.cid+"\neth0\n" {
		return fmt.Errorf("pod %s: ips/%s holds %q", p.name, p.ip, b)
	}
	rec, err := p.record()
	if err != nil {
		return fmt.Errorf("pod %s: owner index entry: %w", p.name, err)
	}
	if !slices.Equal(rec.IPs, []netip.Addr{p.ip}) || !rec.Created.Equal(p.created) {
		return fmt.Errorf("pod %s: owner index entry %+v", p.name, rec)
	}
	l, err := p.hostLink()
	if err != nil {
		return err
	}
	if l == nil || l.Attrs().Name != p.veth {
		return fmt.Errorf("pod %s: host veth %s (ifindex %d) gone", p.name, p.veth, p.index)
	}
	if _, detached, _ := contract.ParseVethAlias(l.Attrs().Alias); detached {
		return fmt.Errorf("pod %s: host veth %s detached", p.name, p.veth)
	}
	elems, err := p.filterElements()
	if err != nil {
		return err
	}
	if len(elems) == 0 {
		return fmt.Errorf("pod %s: no pod filter element of ifindex %d", p.name, p.index)
	}
	if !p.n.mode.bridged {
		routes, err := p.n.routesTo(p.ip.String() + "/32")
		if err != nil {
			return err
		}
		want := fmt.Sprintf("%s/32 dev %s proto 77", p.ip, p.veth)
		if len(routes) != 1 || !strings.HasPrefix(routes[0], want) {
			return fmt.Errorf("pod %s: host routes %q, want one %q", p.name, routes, want)
		}
	}
	return nil
}

// ping pings the pod from the node, and in bridge mode also from n.peer,
// another pod on the bridge. From the node it goes through podnet0's
// connected route, which podnet-routed's blackhole of the same PodCIDR
// (contract.BlackholeMetric) must not shadow.
func (p *rcPod) ping() error {
	if p.n.mode.bridged && p.n.peer != nil && p.n.peer != p {
		if err := nettest.Ping(p.n.peer.ns.NetNS, p.ip.String()); err != nil {
			return fmt.Errorf("pod %s -> pod %s (%s): %w", p.n.peer.name, p.name, p.ip, err)
		}
	}
	if _, err := tcluster.Ping(context.Background(), p.n.m.NS, p.ip); err != nil {
		return fmt.Errorf("node %s -> pod %s (%s): %w", p.n.name, p.name, p.ip, err)
	}
	return nil
}

// del runs DEL for the pod (cached result) and drops its netns.
func (p *rcPod) del(t *testing.T) {
	t.Helper()
	err := p.n.ns.Do(func(ns.NetNS) error { return p.n.cni.DelNetworkList(context.Background(), p.n.list, p.rt) })
	if err != nil {
		t.Fatalf("DEL %s: %v", p.name, err)
	}
	p.dropNetNS(t, false)
}

// ---- the daemon's side ----

// reclaimed reads podnet_leaks_reclaimed_total by kind.
func (n *rcNode) reclaimed() (map[string]float64, error) {
	out := map[string]float64{}
	for _, k := range leakKinds {
		v, err := n.d.labeled("podnet_leaks_reclaimed_total", "kind", k)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// expectReclaimed checks podnet_leaks_reclaimed_total: want by kind, 0 for
// the kinds it does not name.
func (n *rcNode) expectReclaimed(want map[string]float64) error {
	got, err := n.reclaimed()
	if err != nil {
		return err
	}
	for _, k := range leakKinds {
		if got[k] != want[k] {
			return fmt.Errorf("podnet_leaks_reclaimed_total %v, want %v", got, want)
		}
	}
	return nil
}

// noReconcileErrors checks that no pass met an error
// (podnet_reconcile_errors_total 0).
func (n *rcNode) noReconcileErrors() error {
	m, err := n.d.metrics()
	if err != nil {
		return err
	}
	if v := m["podnet_reconcile_errors_total"]; v != 0 {
		return fmt.Errorf("podnet_reconcile_errors_total %v: %v", v, n.d.logLines("leak reconcile"))
	}
	return nil
}

// passes is podnet_reconcile_passes_total.
func (n *rcNode) passes() (float64, error) {
	m, err := n.d.metrics()
	if err != nil {
		return 0, err
	}
	v, ok := m["podnet_reconcile_passes_total"]
	if !ok {
		return 0, errors.New("no podnet_reconcile_passes_total")
	}
	return v, nil
}

// waitPasses waits until k more passes have started, which means k-1 have
// run whole since the call.
func (n *rcNode) waitPasses(t *testing.T, k int) {
	t.Helper()
	p0, err := n.passes()
	if err != nil {
		t.Fatal(err)
	}
	within(t, time.Duration(k)*rcInterval+rcSlack, fmt.Sprintf("%d reconcile passes", k), func() error {
		p, err := n.passes()
		if err != nil {
			return err
		}
		if p < p0+float64(k) {
			return fmt.Errorf("%v passes since, want %d", p-p0, k)
		}
		return nil
	})
}

// reclaimLog returns the "leak reclaimed" record of container cid (nil
// when none) and fails on a second one.
func (n *rcNode) reclaimLog(cid string) (map[string]any, error) {
	var found map[string]any
	for _, rec := range n.d.logLines("leak reclaimed") {
		if rec["container"] == cid {
			if found != nil {
				return nil, fmt.Errorf("%s reclaimed twice: %v and %v", cid, found, rec)
			}
			found = rec
		}
	}
	return found, nil
}

// checkReclaimLog checks the pod's "leak reclaimed" record: kind, its
// network and address, and when: not before the grace from its ADD
// (unless kind is reboot).
func (p *rcPod) checkReclaimLog(kind string, grace time.Duration) error {
	rec, err := p.n.reclaimLog(p.cid)
	if err != nil {
		return err
	}
	if rec == nil {
		return fmt.Errorf("no \"leak reclaimed\" record of %s", p.cid)
	}
	addrs, _ := rec["addrs"].([]any)
	if rec["kind"] != kind || rec["network"] != p.n.mode.network || len(addrs) != 1 || addrs[0] != p.ip.String() || rec["netns"] != p.ns.Path() {
		return fmt.Errorf("reclaim record %v, want kind %s network %s addrs [%s] netns %s", rec, kind, p.n.mode.network, p.ip, p.ns.Path())
	}
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(rec["time"]))
	if err != nil {
		return err
	}
	if kind != "reboot" && at.Sub(p.created) < grace {
		return fmt.Errorf("%s reclaimed %s after its ADD, within the grace of %s", p.name, at.Sub(p.created), grace)
	}
	return nil
}

// ready checks that the daemon runs and /readyz is 200.
func (n *rcNode) ready() error {
	if err := n.d.alive(); err != nil {
		return err
	}
	if code, body := n.d.status("/readyz"); code != http.StatusOK {
		return fmt.Errorf("/readyz %d %q", code, body)
	}
	return nil
}

// within polls f every 200 ms until it succeeds, or fails t after limit.
func within(t *testing.T, limit time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := nettest.Poll(context.Background(), limit, 200*time.Millisecond, f); err != nil {
		t.Fatalf("%s: not true after %s: %v", what, limit, err)
	}
	return time.Since(start)
}

// holds checks f every 300 ms for d, failing t at its first error.
func holds(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(300 * time.Millisecond) {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if time.Now().After(end) {
			return
		}
	}
}

func allIntact(ps ...*rcPod) error {
	for _, p := range ps {
		if err := p.intact(); err != nil {
			return err
		}
	}
	return nil
}

func allGone(ps ...*rcPod) error {
	for _, p := range ps {
		left, err := p.leftovers()
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("pod %s (%s) still has %s", p.name, p.ip, strings.Join(left, ", "))
		}
	}
	return nil
}

// ---- the tests ----

// TestReconcileNetnsGone is issue 22's "Must show 2", in both modes: of
// three pods attached by hand, "gone" loses its netns without DEL (the
// namespace dies, and its veth with it), "held" loses its netns name
// while the namespace lives on, "kept" keeps its netns. "gone" is
// reclaimed once the grace from its ADD has passed, not before; "kept"
// never is. "held" is not either while its namespace lives: its host veth
// is in service, and podnet-routed cannot tell a netns mounted where it
// cannot see from one unmounted while in use. Once the namespace dies
// (and its veth with it) it is reclaimed.
func TestReconcileNetnsGone(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.grantRBAC()
	nodes := []*rcNode{
		c.rcNode("node-a", "172.30.0.1", "10.244.1.0/24", routedMode, rcArgs(rcGrace)...),
		c.rcNode("node-b", "172.30.0.2", "10.244.2.0/24", bridgedMode, rcArgs(rcGrace)...),
	}
	for _, n := range nodes {
		t.Run(n.mode.name, func(t *testing.T) {
			t.Parallel()
			testNetnsGone(t, n)
		})
	}
}

func testNetnsGone(t *testing.T, n *rcNode) {
	kept := n.attach(t, n.mode.name+"-kept")
	live := []*rcPod{kept}
	if n.mode.bridged {
		n.peer = n.attach(t, n.mode.name+"-peer")
		live = append(live, n.peer)
	}
	gone := n.attach(t, n.mode.name+"-gone")
	held := n.attach(t, n.mode.name+"-held")
	if err := allIntact(append([]*rcPod{gone, held}, live...)...); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*rcPod{kept, held} {
		if err := p.ping(); err != nil {
			t.Fatal(err)
		}
	}
	gone.dropNetNS(t, false)
	held.dropNetNS(t, true)

	// Not before the grace: once a whole pass has run since the netns
	// went, both still hold their address (and "held" its veth), as long
	// as their ADD is younger than the grace.
	n.waitPasses(t, 2)
	if age := time.Since(gone.created); age < rcGrace {
		for _, p := range []*rcPod{gone, held} {
			if _, err := os.Stat(p.ipFile()); err != nil {
				t.Fatalf("pod %s reclaimed %s after its ADD, within the grace: %v", p.name, age, err)
			}
			if _, err := os.Stat(p.ownerFile()); err != nil {
				t.Fatalf("pod %s: owner index entry gone within the grace: %v", p.name, err)
			}
		}
		if l, err := held.hostLink(); err != nil || l == nil {
			t.Fatalf("pod held: host veth deleted within the grace (%v)", err)
		}
		if err := n.expectReclaimed(nil); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s after ADD, a whole pass after the netns went: nothing reclaimed yet", n.name, age.Round(time.Millisecond))
	} else {
		t.Logf("%s: the machine was too slow to look inside the grace (%s); the reclaim records' times are checked below", n.name, age)
	}

	// "gone" reclaimed after the grace, within a few passes; "held"
	// kept while its namespace (and so its host veth) lives.
	within(t, rcGrace+rcSlack, n.name+" pod without netns reclaimed", func() error {
		if err := allGone(gone); err != nil {
			return err
		}
		return n.expectReclaimed(map[string]float64{"netns": 1})
	})
	t.Logf("MEASURE %s (%s): pod without netns reclaimed %s after its ADD (grace %s, interval %s)",
		n.name, n.mode.name, time.Since(gone.created).Round(10*time.Millisecond), rcGrace, rcInterval)
	holds(t, 2*rcInterval, "the pod whose netns lives on unnamed", func() error {
		if _, err := os.Stat(held.ipFile()); err != nil {
			return fmt.Errorf("pod held reclaimed while its namespace and host veth live: %w", err)
		}
		if l, err := held.hostLink(); err != nil || l == nil {
			return fmt.Errorf("pod held: host veth deleted while its namespace lives (%v)", err)
		}
		return n.expectReclaimed(map[string]float64{"netns": 1})
	})
	if err := held.ns.Close(); err != nil { // the namespace dies, its veth with it
		t.Fatal(err)
	}
	within(t, rcSlack+2*rcInterval, n.name+" pod whose namespace died reclaimed", func() error {
		if err := allGone(held); err != nil {
			return err
		}
		return n.expectReclaimed(map[string]float64{"netns": 2})
	})
	for _, p := range []*rcPod{gone, held} {
		if err := p.checkReclaimLog("netns", rcGrace); err != nil {
			t.Error(err)
		}
		// both veths died with their namespace
		if rec, _ := n.reclaimLog(p.cid); rec != nil && rec["hostLinks"] != float64(0) {
			t.Errorf("pod %s reclaimed with hostLinks %v, want 0", p.name, rec["hostLinks"])
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// "kept" is never reclaimed: checked until three graces after its ADD.
	holds(t, max(time.Until(kept.created.Add(3*rcGrace)), rcInterval), "the pod with its netns", func() error {
		if err := n.ready(); err != nil {
			return err
		}
		if err := allIntact(live...); err != nil {
			return err
		}
		if err := n.noReconcileErrors(); err != nil {
			return err
		}
		return n.expectReclaimed(map[string]float64{"netns": 2})
	})
	if err := kept.ping(); err != nil {
		t.Fatal(err)
	}
	for _, p := range live {
		if rec, _ := n.reclaimLog(p.cid); rec != nil {
			t.Fatalf("pod %s with its netns reclaimed: %v", p.name, rec)
		}
	}
	// The pool is whole: once the live pods are deleted, the store is
	// empty.
	for _, p := range live {
		p.del(t)
	}
	for _, sub := range []string{"ips", "owners"} {
		entries, err := os.ReadDir(filepath.Join(kept.storeDir(), sub))
		if err != nil || len(entries) > 0 {
			t.Errorf("%s/%s after every pod is gone: %v %v", kept.storeDir(), sub, entries, err)
		}
	}
}

var bootIDLine = regexp.MustCompile(`(?m)^boot-id=.*$`)

// TestReconcileAfterReboot: a store kept across a reboot (every owner
// index entry of another boot ID, the pods' netns gone) is reclaimed at
// podnet-routed's start although the grace is 10 minutes; a pod of this
// boot is not touched.
func TestReconcileAfterReboot(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.grantRBAC()
	n := c.rcNode("node-a", "172.30.0.1", "10.244.1.0/24", routedMode, rcArgs(10*time.Minute)...)
	var before []*rcPod
	for _, name := range []string{"before-1", "before-2"} {
		p := n.attach(t, name)
		before = append(before, p)
	}
	for _, p := range before {
		p.dropNetNS(t, false)
	}
	// Within the grace and of this boot: kept.
	n.waitPasses(t, 2)
	for _, p := range before {
		if _, err := os.Stat(p.ipFile()); err != nil {
			t.Fatalf("pod %s reclaimed within the grace: %v", p.name, err)
		}
	}
	if err := n.expectReclaimed(nil); err != nil {
		t.Fatal(err)
	}

	// "Reboot": podnet-routed stops, the store stays, every entry's boot
	// ID is another one.
	n.d.stop()
	other := make([]byte, 16)
	_, _ = rand.Read(other)
	oldBoot := hex.EncodeToString(other)
	oldBoot = oldBoot[:8] + "-" + oldBoot[8:12] + "-" + oldBoot[12:16] + "-" + oldBoot[16:20] + "-" + oldBoot[20:]
	owners := filepath.Join(n.m.DataDir, routedMode.network, "owners")
	entries, err := os.ReadDir(owners)
	if err != nil || len(entries) != len(before) {
		t.Fatalf("owner index entries %v (%v), want %d", entries, err, len(before))
	}
	for _, e := range entries {
		path := filepath.Join(owners, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(bootIDLine.FindAll(b, -1)) != 1 {
			t.Fatalf("%s has no boot-id line:\n%s", path, b)
		}
		b = bootIDLine.ReplaceAll(b, []byte(`boot-id="`+oldBoot+`"`))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range before {
		if rec, err := p.record(); err != nil || rec.BootID != oldBoot {
			t.Fatalf("pod %s record after the rewrite: %+v %v", p.name, rec, err)
		}
	}
	restart := time.Now()
	n.start()
	took := within(t, rcSlack, "the previous boot's pods reclaimed at start", func() error {
		if err := allGone(before...); err != nil {
			return err
		}
		return n.expectReclaimed(map[string]float64{"reboot": 2})
	})
	t.Logf("MEASURE after the restart, the previous boot's %d pods reclaimed within %s of the start (ready and checked: %s)",
		len(before), time.Since(restart).Round(10*time.Millisecond), took.Round(10*time.Millisecond))
	for _, p := range before {
		if err := p.checkReclaimLog("reboot", 0); err != nil {
			t.Error(err)
		}
	}

	// A pod of this boot, netns present: not touched.
	after := n.attach(t, "after")
	holds(t, 3*rcInterval, "the pod of this boot", func() error {
		if err := n.ready(); err != nil {
			return err
		}
		if err := after.intact(); err != nil {
			return err
		}
		if err := n.noReconcileErrors(); err != nil {
			return err
		}
		return n.expectReclaimed(map[string]float64{"reboot": 2})
	})
	if err := after.ping(); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileRepairsLivePod is issue 22's item 5: a live routed pod
// loses its host /32 route and its host veth's proxy ARP behind podnet's
// back; the reconcile puts both back and counts them, and the pod answers
// the node again. Another live pod is left as it was.
func TestReconcileRepairsLivePod(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.grantRBAC()
	n := c.rcNode("node-a", "172.30.0.1", "10.244.1.0/24", routedMode, rcArgs(rcGrace)...)
	p := n.attach(t, "live")
	other := n.attach(t, "other")
	// A pod is repaired only once its ADD is older than the grace (an ADD
	// in flight is not finished yet); then a whole pass more.
	time.Sleep(time.Until(other.created.Add(rcGrace)))
	n.waitPasses(t, 2)
	if err := allIntact(p, other); err != nil {
		t.Fatal(err)
	}
	proxyARP := func() (string, error) {
		return nettest.ReadSysctl(n.ns, "net/ipv4/conf/"+p.veth+"/proxy_arp")
	}
	base := map[string]float64{"pod-route": n.d.repairs(t, "pod-route"), "pod-sysctl": n.d.repairs(t, "pod-sysctl")}
	if base["pod-route"] != 0 || base["pod-sysctl"] != 0 {
		t.Fatalf("repairs of pods nobody broke: %v", base)
	}

	if out, err := n.ipIn("route", "del", p.ip.String()+"/32", "dev", p.veth); err != nil {
		t.Fatalf("ip route del: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := n.m.NS.Exec(ctx, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/conf/"+p.veth+"/proxy_arp"); err != nil {
		t.Fatalf("proxy_arp off: %v: %s", err, out)
	}
	broke := time.Now()
	within(t, rcSlack, "host route and proxy ARP put back", func() error {
		if err := p.intact(); err != nil {
			return err
		}
		if v, err := proxyARP(); err != nil || v != "1" {
			return fmt.Errorf("proxy_arp of %s = %q (%v)", p.veth, v, err)
		}
		for obj, b := range base {
			if got := n.d.repairs(t, obj); got != b+1 {
				return fmt.Errorf("podnet_repairs_total{object=%q} = %v, want %v", obj, got, b+1)
			}
		}
		return p.ping()
	})
	t.Logf("MEASURE a live pod's host route and proxy ARP put back and the pod answering %s after they were removed (interval %s)",
		time.Since(broke).Round(10*time.Millisecond), rcInterval)
	var routeLog bool
	for _, rec := range n.d.logLines("repaired: the host route of a live pod was missing") {
		routeLog = routeLog || (rec["addr"] == p.ip.String() && rec["container"] == p.cid)
	}
	if !routeLog {
		t.Errorf("no \"repaired: the host route of a live pod was missing\" record for %s", p.ip)
	}
	// Once repaired, nothing more to repair; the other pod untouched.
	holds(t, 2*rcInterval, "after the repair", func() error {
		if err := allIntact(p, other); err != nil {
			return err
		}
		for obj, b := range base {
			if got := n.d.repairs(t, obj); got != b+1 {
				return fmt.Errorf("podnet_repairs_total{object=%q} = %v, want %v", obj, got, b+1)
			}
		}
		if err := n.noReconcileErrors(); err != nil {
			return err
		}
		return n.expectReclaimed(nil)
	})
	if err := other.ping(); err != nil {
		t.Fatal(err)
	}
}

// TestReconcileOrphanAndHostileStore: reservations no owner index entry
// lists (an ADD killed between its two writes, or a reservation file that
// does not parse) are reclaimed once older than the grace. Hostile owner
// index entries neither stop the daemon nor free an address: entries that
// do not parse (a line that is no address, a number out of range, a value
// of 512 KiB) are skipped with their reservations, live pods' included;
// entries podnet-ipam never makes (a symbolic link, a file of 1 TiB, in
// owners/ or ips/) are left alone and named in the error of every pass,
// while the rest of the store is reconciled: the orphans are reclaimed
// with them present.
func TestReconcileOrphanAndHostileStore(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.grantRBAC()
	n := c.rcNode("node-a", "172.30.0.1", "10.244.1.0/24", routedMode, rcArgs(rcGrace)...)
	live1, live2, live3 := n.attach(t, "live-1"), n.attach(t, "live-2"), n.attach(t, "live-3")
	dir := filepath.Join(n.m.DataDir, routedMode.network)
	write := func(rel, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	appendTo := func(p *rcPod, line string) {
		t.Helper()
		f, err := os.OpenFile(p.ownerFile(), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
	}
	ip := func(host int) string {
		a := n.podCIDR.Addr().As4()
		a[3] = byte(host)
		return netip.AddrFrom4(a).String()
	}
	// Orphans: a reservation without owner index entry, and one whose
	// file does not parse.
	orphan, garbled := ip(200), ip(201)
	write("ips/"+orphan, "cnitool-killed-mid-add\neth0\n")
	write("ips/"+garbled, "\x00not a reservation")
	// Owner index entries that do not parse: two live pods', and one (with
	// its reservation) whose netns value is 512 KiB long.
	appendTo(live1, "this is not an address\n")
	appendTo(live2, "netns-ino=99999999999999999999999999\n")
	long := ip(202)
	write("owners/cnitool-long:eth0", long+"\nnetns=\""+strings.Repeat("x", 512<<10)+"\"\n")
	write("ips/"+long, "cnitool-long\neth0\n")
	// Entries podnet-ipam never makes: a symbolic link (named like an
	// entry) to a live pod's entry; an owner index entry and a
	// reservation 1 TiB long (sparse: no disk taken), which podnet-routed
	// used to read whole, and died of.
	link := filepath.Join(dir, "owners", "cnitool-link:eth0")
	if err := os.Symlink(live3.ownerFile(), link); err != nil {
		t.Fatal(err)
	}
	bigOwner, bigIP := filepath.Join(dir, "owners", "cnitool-big:eth0"), filepath.Join(dir, "ips", ip(203))
	for _, p := range []string{bigOwner, bigIP} {
		write(strings.TrimPrefix(p, dir+"/"), "")
		if err := os.Truncate(p, 1<<40); err != nil {
			t.Fatal(err)
		}
	}
	m, err := n.d.metrics()
	if err != nil {
		t.Fatal(err)
	}
	errors0 := m["podnet_reconcile_errors_total"]

	// kept: the daemon is up and ready, no live pod nor entry that does
	// not parse lost anything.
	kept := func() error {
		if err := n.ready(); err != nil {
			return err
		}
		for _, p := range []*rcPod{live1, live2, live3} {
			b, err := os.ReadFile(p.ipFile())
			if err != nil || string(b) != p.cid+"\neth0\n" {
				return fmt.Errorf("pod %s: reservation %q %v", p.name, b, err)
			}
			if l, err := p.hostLink(); err != nil || l == nil {
				return fmt.Errorf("pod %s: host veth gone (%v)", p.name, err)
			}
			if routes, err := n.routesTo(p.ip.String() + "/32"); err != nil || len(routes) != 1 {
				return fmt.Errorf("pod %s: host routes %v (%v)", p.name, routes, err)
			}
		}
		if err := live3.intact(); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(dir, "ips", long)); err != nil {
			return fmt.Errorf("the reservation of the entry with a 512 KiB value: %w", err)
		}
		return nil
	}
	// failedOn waits for a pass's error, logged after since, that names
	// one of unsafe (and says why) and returns it; the daemon stays up and
	// nothing is lost meanwhile.
	failedOn := func(since time.Time, unsafe map[string]string) string {
		t.Helper()
		var named string
		within(t, 2*rcInterval+rcSlack, "a reconcile error naming one of the unsafe entries", func() error {
			if err := kept(); err != nil {
				return err
			}
			for _, rec := range n.d.logLines("leak reconcile") {
				at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(rec["time"]))
				msg := fmt.Sprint(rec["err"])
				for path, why := range unsafe {
					if at.After(since) && strings.Contains(msg, path) && strings.Contains(msg, why) {
						named = path
						return nil
					}
				}
			}
			return errors.New("none yet")
		})
		return named
	}
	start := time.Now()
	holds(t, rcGrace+rcInterval, "with the hostile entries", func() error {
		if err := kept(); err != nil {
			return err
		}
		got, err := n.reclaimed()
		if err != nil {
			return err
		}
		if got["reboot"]+got["runtime"]+got["netns"] != 0 {
			return fmt.Errorf("podnet_leaks_reclaimed_total %v", got)
		}
		return nil
	})
	if m, err = n.d.metrics(); err != nil {
		t.Fatal(err)
	}
	if m["podnet_reconcile_errors_total"] < errors0+2 {
		t.Errorf("podnet_reconcile_errors_total %v -> %v with unsafe entries in the store, want each pass counted", errors0, m["podnet_reconcile_errors_total"])
	}
	got, _ := n.reclaimed()
	t.Logf("%s with the hostile entries: podnet_leaks_reclaimed_total %v, reconcile errors %v", time.Since(start).Round(100*time.Millisecond), got, m["podnet_reconcile_errors_total"]-errors0)
	// Every pass names each unsafe entry and goes on with the rest.
	unsafe := map[string]string{link: "is a symbolic link", bigOwner: "is 1099511627776 bytes long", bigIP: "is 1099511627776 bytes long"}
	for len(unsafe) > 0 {
		path := failedOn(start, unsafe)
		t.Logf("a pass names %s", strings.TrimPrefix(path, dir+"/"))
		delete(unsafe, path)
	}

	// The orphans (older than the grace by now) are reclaimed although
	// the unsafe entries are still there; the reservations of entries
	// that do not parse are not, nor is the unsafe reservation.
	within(t, rcSlack, "orphan reservations reclaimed", func() error {
		if err := n.ready(); err != nil {
			return err
		}
		for _, a := range []string{orphan, garbled} {
			if _, err := os.Lstat(filepath.Join(dir, "ips", a)); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("ips/%s still there (%v)", a, err)
			}
		}
		return n.expectReclaimed(map[string]float64{"orphan": 2})
	})
	for _, p := range []string{link, bigOwner, bigIP} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("unsafe entry %s: %v, want it left alone", p, err)
		}
	}
	for _, a := range []string{orphan, garbled} {
		found := false
		for _, rec := range n.d.logLines("leak reclaimed") {
			addrs, _ := rec["addrs"].([]any)
			found = found || (rec["kind"] == "orphan" && len(addrs) == 1 && addrs[0] == a)
		}
		if !found {
			t.Errorf("no \"leak reclaimed\" record of kind orphan for %s", a)
		}
	}
	warned := map[string]bool{}
	for _, rec := range n.d.logLines("leak reconcile: owner index entry does not parse; CNI GC rewrites it from the reservations") {
		warned[fmt.Sprint(rec["container"])] = true
	}
	for _, cid := range []string{live1.cid, live2.cid, "cnitool-long"} {
		if !warned[cid] {
			t.Errorf("no warning about the owner index entry of %s, which does not parse", cid)
		}
	}
	holds(t, 2*rcInterval, "after the orphans", func() error {
		if err := kept(); err != nil {
			return err
		}
		return n.expectReclaimed(map[string]float64{"orphan": 2})
	})
	for _, p := range []*rcPod{live1, live2, live3} {
		if err := p.ping(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReconcileBootIDChangedWhilePodsRun is issue 31's "must show 4" for
// the boot ID, in both modes: while pods run, every owner index entry of
// the store is rewritten to another boot's ID (what a store copied from
// elsewhere, or a boot ID read wrong, looks like). The pods whose host
// veth is in service keep their reservation, owner index entry, host veth,
// host route and pod filter elements, and answer pings, pass after pass;
// they are counted in podnet_reconcile_overruled{rule="reboot"}, logged
// once each, and /readyz (200) says so. A pod of the same store whose
// netns died (its veth with it) is freed in the same passes, as of another
// boot: the check can fail both ways. On the code before, the live pods
// were freed as "reboot" at the first pass.
func TestReconcileBootIDChangedWhilePodsRun(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.grantRBAC()
	// A grace no test waits for: only the boot ID can free anything.
	nodes := []*rcNode{
		c.rcNode("node-a", "172.30.0.1", "10.244.1.0/24", routedMode, rcArgs(10*time.Minute)...),
		c.rcNode("node-b", "172.30.0.2", "10.244.2.0/24", bridgedMode, rcArgs(10*time.Minute)...),
	}
	for _, n := range nodes {
		t.Run(n.mode.name, func(t *testing.T) {
			t.Parallel()
			testBootIDChanged(t, n)
		})
	}
}

func testBootIDChanged(t *testing.T, n *rcNode) {
	var live []*rcPod
	if n.mode.bridged {
		n.peer = n.attach(t, n.mode.name+"-peer")
		live = append(live, n.peer)
	}
	for _, name := range []string{"live-1", "live-2"} {
		live = append(live, n.attach(t, n.mode.name+"-"+name))
	}
	dead := n.attach(t, n.mode.name+"-dead")
	if err := allIntact(append([]*rcPod{dead}, live...)...); err != nil {
		t.Fatal(err)
	}
	dead.dropNetNS(t, false) // the namespace dies, its veth with it
	within(t, rcSlack, "the dead pod's host veth gone with its netns", func() error {
		if l, err := dead.hostLink(); err != nil || l != nil {
			return fmt.Errorf("host veth %v (%v)", l, err)
		}
		return nil
	})
	for _, p := range live {
		if err := p.ping(); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPasses(t, 2)
	if err := n.expectReclaimed(nil); err != nil {
		t.Fatalf("within the grace, of this boot: %v", err)
	}

	// Every entry of the store: another boot's, while the daemon runs
	// (each file replaced whole, as podnet-ipam writes them).
	oldBoot := newBootIDForTest()
	owners := filepath.Join(n.m.DataDir, n.mode.network, "owners")
	entries, err := os.ReadDir(owners)
	if err != nil || len(entries) != len(live)+1 {
		t.Fatalf("owner index entries %v (%v), want %d", entries, err, len(live)+1)
	}
	for _, e := range entries {
		path := filepath.Join(owners, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(bootIDLine.FindAll(b, -1)) != 1 {
			t.Fatalf("%s has no boot-id line:\n%s", path, b)
		}
		b = bootIDLine.ReplaceAll(b, []byte(`boot-id="`+oldBoot+`"`))
		tmp := filepath.Join(n.m.DataDir, n.mode.network, ".test-"+e.Name())
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range append([]*rcPod{dead}, live...) {
		if rec, err := p.record(); err != nil || rec.BootID != oldBoot {
			t.Fatalf("pod %s record after the rewrite: %+v %v", p.name, rec, err)
		}
	}
	rewritten := time.Now()

	// The dead pod is freed, as of another boot; the live ones are kept
	// and counted.
	overruled := func() error {
		v, err := n.d.labeled("podnet_reconcile_overruled", "rule", "reboot")
		if err != nil {
			return err
		}
		if v != float64(len(live)) {
			return fmt.Errorf(`podnet_reconcile_overruled{rule="reboot"} = %v, want %d`, v, len(live))
		}
		return nil
	}
	within(t, rcSlack, "the dead pod of another boot freed", func() error {
		if err := allGone(dead); err != nil {
			return err
		}
		if err := n.expectReclaimed(map[string]float64{"reboot": 1}); err != nil {
			return err
		}
		return overruled()
	})
	t.Logf("MEASURE %s: the dead pod of another boot freed and the %d live ones counted as kept %s after the rewrite (interval %s)",
		n.name, len(live), time.Since(rewritten).Round(10*time.Millisecond), rcInterval)
	if err := dead.checkReclaimLog("reboot", 0); err != nil {
		t.Error(err)
	}
	holds(t, 4*rcInterval, "the live pods of another boot ID", func() error {
		if err := allIntact(live...); err != nil {
			return err
		}
		if err := n.expectReclaimed(map[string]float64{"reboot": 1}); err != nil {
			return err
		}
		if err := n.noReconcileErrors(); err != nil {
			return err
		}
		if err := overruled(); err != nil {
			return err
		}
		code, body := n.d.status("/readyz")
		want := fmt.Sprintf("warning: leak reconcile: %d attachments recorded in another boot have their host veth in service: kept", len(live))
		if code != http.StatusOK || !strings.Contains(body, want) {
			return fmt.Errorf("/readyz %d %q, want 200 with %q", code, body, want)
		}
		return nil
	})
	for _, p := range live {
		if err := p.ping(); err != nil {
			t.Fatal(err)
		}
		if rec, _ := n.reclaimLog(p.cid); rec != nil {
			t.Fatalf("live pod %s reclaimed: %v", p.name, rec)
		}
		kept := 0
		for _, rec := range n.d.logLines("leak reconcile: kept an attachment whose boot ID (of another boot) says its pod is dead: its host veth is in service") {
			if rec["container"] == p.cid && rec["rule"] == "reboot" {
				kept++
			}
		}
		if kept != 1 {
			t.Errorf("pod %s: %d \"kept an attachment\" log records over several passes, want 1", p.name, kept)
		}
	}
}

// newBootIDForTest is a random boot ID in the kernel's format.
func newBootIDForTest() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	s := hex.EncodeToString(b)
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:]
}
