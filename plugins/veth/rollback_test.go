package veth_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/nettest"
)

// addSteps are the names ADD passes to plugin.step, in order.
var addSteps = []string{"ipam", "veth", "address", "route", "guard", "host", "host-route"}

const (
	testSubnet     = "10.244.30.0/24"
	testPodNS      = "default"
	testPodName    = "web"
	testIfName     = "eth0"
	testCNIArgs    = "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + testPodNS + ";K8S_POD_NAME=" + testPodName
	testNetwork    = "podnet"
	testCNIVersion = "1.0.0"
)

// rollbackModes are the plugins whose ADD rollback is tested, with what
// sets their attachments apart.
var rollbackModes = []struct {
	name       string
	pluginType string
	newPlugin  func(failAfter func(step string) error) skel.CNIFuncs
	// shared are the node links ADD may create that outlive a rollback and
	// a DEL: podnet-bridge's bridge, which the node's pods share.
	shared []string
	// hostRoutes says whether ADD routes the pod address on the node.
	hostRoutes bool
	// podPrefix is the length of the pod's address on its interface.
	podPrefix int
}{
	{name: "routed", pluginType: "podnet", newPlugin: veth.RoutedFailingAfter, hostRoutes: true, podPrefix: 32},
	{name: "bridged", pluginType: "podnet-bridge", newPlugin: veth.BridgedFailingAfter, shared: []string{veth.DefaultBridge}, podPrefix: 24},
}

// addEnv is one in-process attachment: a node netns standing in for the
// host, a pod netns, a host-local data directory and the CNI arguments.
type addEnv struct {
	node     *nettest.Node
	podNS    ns.NetNS
	dataDir  string
	hostVeth string
	shared   []string // node links a rollback may leave (rollbackModes)
	args     *skel.CmdArgs
}

// newAddEnv prepares the netns pair, the network config of pluginType and
// the CNI_* environment that the IPAM delegation passes on to
// host-local. shared are the node links assertClean accepts.
func newAddEnv(t *testing.T, pluginType string, shared []string, containerID string) *addEnv {
	t.Helper()
	tools := nettest.RefToolsDir(t)
	node := nettest.NewNode(t)
	podNS := nettest.NewNetNS(t)
	dataDir := t.TempDir()
	// stateDir keeps resolveMTU away from the machine's /run/podnet: with no
	// node.json there and no default route in the node netns, MTU is 1500.
	conf := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":%q,"stateDir":%q,`+
		`"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":%q}]]}}`,
		testCNIVersion, testNetwork, pluginType, t.TempDir(), dataDir, testSubnet)

	t.Setenv("CNI_COMMAND", "ADD")
	t.Setenv("CNI_CONTAINERID", containerID)
	t.Setenv("CNI_NETNS", podNS.Path())
	t.Setenv("CNI_IFNAME", testIfName)
	t.Setenv("CNI_PATH", tools)
	t.Setenv("CNI_ARGS", testCNIArgs)

	return &addEnv{
		node:     node,
		podNS:    podNS,
		dataDir:  dataDir,
		hostVeth: veth.HostVethName(testPodNS, testPodName, containerID, testIfName),
		shared:   shared,
		args: &skel.CmdArgs{
			ContainerID: containerID,
			Netns:       podNS.Path(),
			IfName:      testIfName,
			Args:        testCNIArgs,
			Path:        tools,
			StdinData:   []byte(conf),
		},
	}
}

// inNode runs f with the calling thread in the node netns, so that every
// netlink call and exec of Add/Del acts on the node netns and never on
// the machine's own.
func (e *addEnv) inNode(f func() error) error {
	return e.node.NS.Do(func(ns.NetNS) error { return f() })
}

// add runs p.Add in the node netns and returns its error and what it
// printed on stdout.
func (e *addEnv) add(t *testing.T, p skel.CNIFuncs) (string, error) {
	t.Helper()
	t.Setenv("CNI_COMMAND", "ADD")
	out, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	saved := os.Stdout
	os.Stdout = out
	addErr := e.inNode(func() error { return p.Add(e.args) })
	os.Stdout = saved
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	printed, err := io.ReadAll(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(printed), addErr
}

// del runs p.Del in the node netns.
func (e *addEnv) del(t *testing.T, p skel.CNIFuncs) error {
	t.Helper()
	t.Setenv("CNI_COMMAND", "DEL")
	return e.inNode(func() error { return p.Del(e.args) })
}

// state is what an attachment leaves behind, as the checks see it.
type state struct {
	nodeLinks    []string // node links other than lo
	podnetRoutes []string // node routes with protocol contract.RouteProtocol (dst)
	podLinks     []string // pod links other than lo
	reservations []string // host-local reservation files (IPs)
	guard        []string // elements of the pod filter's sets (nettest.PodFilterElements)
}

// observe reads the state with the test's helpers. It must run in the test
// goroutine (the helpers call t.Fatal).
func (e *addEnv) observe(t *testing.T) state {
	t.Helper()
	var s state
	s.nodeLinks = e.node.Links()
	for _, r := range e.node.RoutesWithProto(contract.RouteProtocol) {
		s.podnetRoutes = append(s.podnetRoutes, routeDst(r))
	}
	links, err := nettest.LinkNames(e.podNS)
	if err != nil {
		t.Fatalf("list pod links: %v", err)
	}
	s.podLinks = links
	if s.reservations, err = reservations(e.dataDir); err != nil {
		t.Fatal(err)
	}
	if s.guard, err = nettest.PodFilterElements(e.node.NS); err != nil {
		t.Fatal(err)
	}
	return s
}

// observeRaw reads the same state without touching t, for use inside
// failAfter, which runs on the goroutine of ns.Do with the thread already in
// the node netns.
func (e *addEnv) observeRaw() (state, error) {
	var s state
	var err error
	if s.nodeLinks, err = nettest.LinkNames(e.node.NS); err != nil {
		return s, err
	}
	err = e.node.NS.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: contract.RouteProtocol}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		for _, r := range routes {
			s.podnetRoutes = append(s.podnetRoutes, routeDst(r))
		}
		return err
	})
	if err != nil {
		return s, err
	}
	if s.podLinks, err = nettest.LinkNames(e.podNS); err != nil {
		return s, err
	}
	if s.guard, err = nettest.PodFilterElements(e.node.NS); err != nil {
		return s, err
	}
	s.reservations, err = reservations(e.dataDir)
	return s, err
}

// assertClean fails unless nothing of the attachment is left: no node link
// but the shared ones (the bridge, with no port left since every veth is
// gone), no podnet route, no pod interface, no reservation.
func (e *addEnv) assertClean(t *testing.T, when string) {
	t.Helper()
	s := e.observe(t)
	if left := withoutShared(s.nodeLinks, e.shared); len(left) > 0 {
		t.Errorf("%s: links left in node netns: %v", when, left)
	}
	if len(s.podnetRoutes) > 0 {
		t.Errorf("%s: podnet routes left in node netns: %v", when, s.podnetRoutes)
	}
	if len(s.podLinks) > 0 {
		t.Errorf("%s: interfaces left in pod netns: %v", when, s.podLinks)
	}
	if len(s.reservations) > 0 {
		t.Errorf("%s: host-local reservations left: %v", when, s.reservations)
	}
	// the elements removed get a timeout of 1 ms where the kernel can (see
	// guard.drop): give them a moment to leave the sets
	for deadline := time.Now().Add(2 * time.Second); len(s.guard) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		var err error
		if s.guard, err = nettest.PodFilterElements(e.node.NS); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.guard) > 0 {
		t.Errorf("%s: pod filter elements left: %v", when, s.guard)
	}
}

// withoutShared returns links minus the names in shared.
func withoutShared(links, shared []string) []string {
	var out []string
	for _, l := range links {
		if !slices.Contains(shared, l) {
			out = append(out, l)
		}
	}
	return out
}

// reservations lists host-local's reserved addresses in dataDir/<network>:
// the file names that parse as IPs (not "lock" or "last_reserved_ip.0").
func reservations(dataDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(dataDir, testNetwork))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var ips []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	return ips, nil
}

func routeDst(r netlink.Route) string {
	if r.Dst == nil {
		return "default"
	}
	return r.Dst.String()
}

// TestAddRollsBackAfterEachStep makes ADD fail right after each of its
// steps, for every mode, and checks that the rollback leaves neither link,
// route, pod interface nor address reservation behind (only the bridge of
// the bridged mode, which the node's pods share, may stay). The control case
// runs the same checks after a successful ADD, where they must see the
// attachment, and then DEL.
func TestAddRollsBackAfterEachStep(t *testing.T) {
	for _, m := range rollbackModes {
		t.Run(m.name, func(t *testing.T) {
			t.Run("control", func(t *testing.T) {
				e := newAddEnv(t, m.pluginType, m.shared, "ctr-control")
				var calls []string
				p := m.newPlugin(func(step string) error {
					calls = append(calls, step)
					return nil
				})
				printed, err := e.add(t, p)
				if err != nil {
					t.Fatalf("ADD: %v", err)
				}
				if !slices.Equal(calls, addSteps) {
					t.Errorf("ADD stepped through %v, want %v", calls, addSteps)
				}
				raw, err := current.NewResult([]byte(printed))
				if err != nil {
					t.Fatalf("ADD printed no readable result: %v\n%s", err, printed)
				}
				res, err := current.NewResultFromResult(raw)
				if err != nil {
					t.Fatal(err)
				}
				if len(res.IPs) != 1 {
					t.Fatalf("ADD result has IPs %v, want one", res.IPs)
				}
				ip := res.IPs[0].Address.IP.String()
				_, subnet, _ := net.ParseCIDR(testSubnet)
				if !subnet.Contains(res.IPs[0].Address.IP) {
					t.Errorf("ADD gave %s, outside %s", ip, testSubnet)
				}
				if ones, _ := res.IPs[0].Address.Mask.Size(); ones != m.podPrefix {
					t.Errorf("ADD gave %s, want a /%d", res.IPs[0].Address.String(), m.podPrefix)
				}

				s := e.observe(t)
				wantLinks := append(slices.Clone(m.shared), e.hostVeth)
				if !slices.Equal(sorted(s.nodeLinks), sorted(wantLinks)) {
					t.Errorf("node links after ADD: %v, want %v", s.nodeLinks, wantLinks)
				}
				var wantRoutes []string
				if m.hostRoutes {
					wantRoutes = []string{ip + "/32"}
				}
				if !slices.Equal(s.podnetRoutes, wantRoutes) {
					t.Errorf("podnet routes after ADD: %v, want %v", s.podnetRoutes, wantRoutes)
				}
				if !slices.Equal(s.podLinks, []string{testIfName}) {
					t.Errorf("pod links after ADD: %v, want [%s]", s.podLinks, testIfName)
				}
				if !slices.Equal(s.reservations, []string{ip}) {
					t.Errorf("reservations after ADD: %v, want [%s]", s.reservations, ip)
				}
				if !slices.ContainsFunc(s.guard, func(e string) bool { return strings.HasSuffix(e, " . "+ip) }) {
					t.Errorf("pod filter elements after ADD: %v, want one for %s", s.guard, ip)
				}

				if err := e.del(t, p); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				e.assertClean(t, "after DEL")
			})

			for i, step := range addSteps {
				t.Run("fail-after-"+step, func(t *testing.T) {
					e := newAddEnv(t, m.pluginType, m.shared, "ctr-"+step)
					injected := fmt.Errorf("injected failure after step %q", step)
					var calls []string
					var before state
					var observeErr error
					p := m.newPlugin(func(s string) error {
						calls = append(calls, s)
						if s != step {
							return nil
						}
						// What the rollback will have to undo.
						before, observeErr = e.observeRaw()
						return injected
					})

					printed, err := e.add(t, p)
					if !errors.Is(err, injected) {
						t.Fatalf("ADD returned %v, want the injected error %q", err, injected)
					}
					if printed != "" {
						t.Errorf("failed ADD printed a result: %s", printed)
					}
					if want := addSteps[:i+1]; !slices.Equal(calls, want) {
						t.Errorf("ADD stepped through %v, want %v", calls, want)
					}

					// The failure point had something to roll back, so the
					// clean state below is the rollback's doing.
					if observeErr != nil {
						t.Fatalf("observe state at step %q: %v", step, observeErr)
					}
					if len(before.reservations) != 1 {
						t.Errorf("at step %q: reservations %v, want one", step, before.reservations)
					}
					if i >= slices.Index(addSteps, "veth") && !slices.Contains(before.nodeLinks, e.hostVeth) {
						t.Errorf("at step %q: host veth %s missing from node links %v", step, e.hostVeth, before.nodeLinks)
					}
					for _, l := range m.shared {
						if i >= slices.Index(addSteps, "veth") && !slices.Contains(before.nodeLinks, l) {
							t.Errorf("at step %q: shared link %s missing from node links %v", step, l, before.nodeLinks)
						}
					}
					if i >= slices.Index(addSteps, "veth") && !slices.Equal(before.podLinks, []string{testIfName}) {
						t.Errorf("at step %q: pod links %v, want [%s]", step, before.podLinks, testIfName)
					}
					if i >= slices.Index(addSteps, "guard") && len(before.guard) == 0 {
						t.Errorf("at step %q: no pod filter element", step)
					}
					if m.hostRoutes && i >= slices.Index(addSteps, "host-route") && len(before.podnetRoutes) != 1 {
						t.Errorf("at step %q: podnet routes %v, want one", step, before.podnetRoutes)
					}

					e.assertClean(t, "after failed ADD")
				})
			}
		})
	}
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
