// Package policy is the end-to-end test of podnet-routed's NetworkPolicy
// engine (issue 24, table inet podnet-policy): a dual-stack two-node VXLAN
// test/cluster with --network-policy=true on every node, pods with real
// Pod objects (labels, named ports, status.podIPs) in labelled namespaces,
// NetworkPolicies created and deleted through the API server, and every
// verdict read off real TCP and UDP flows between the pods' netns in both
// families.
//
// PODNET_POLICY_ENGINE=off runs the same test against podnet-routed
// without the engine (Pod objects still made): every assertion of a
// refusal, a revocation, a repair and a metric must then fail, which is
// how the test was checked not to be vacuous.
package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// Ports every pod's echo servers listen on (TCP and UDP each).
const (
	portMain = 80   // allowed to clients by allow-client
	portAlt  = 8080 // container port "alt" of the web pods
	portDNS  = 53   // the DNS-like egress port
)

// converge bounds how long a policy change may take to show in the data
// path before the test calls it not enforced (the bench measures it).
const converge = 10 * time.Second

type env struct {
	c                        *cluster.Cluster
	n1, n2                   *cluster.Node
	web, local, dns          *cluster.Pod // node 1
	client, other, devclient *cluster.Pod // node 2
}

// subtests run in order on one cluster: each leaves its policies for
// the next unless it says otherwise.
var subtests = []struct {
	name string
	run  func(*env, *testing.T)
	// routedOnly: not run on podnet-bridge pods (it stops podnet-routed
	// or edits the table: nothing the plugin changes)
	routedOnly bool
}{
	{"DefaultDenyIngressThenAllowFromPod", (*env).defaultDeny, false},
	{"NodeToPodAlwaysAllowed", (*env).nodeToPod, false},
	{"ExplainOnTheNode", (*env).explainOnNode, true},
	{"DropsMetric", (*env).dropsMetric, false},
	{"NamespaceSelector", (*env).namespaceSelector, false},
	{"NamedPort", (*env).namedPort, false},
	{"IPBlockExcept", (*env).ipBlock, false},
	{"NewPodIsolatedFromFirstPacket", (*env).newPod, false},
	{"EgressDenyAllowDNS", (*env).egress, false},
	{"LinkLocalJudgedByPort", (*env).linkLocal, false},
	{"AddressClaimedTwice", (*env).claimedTwice, false},
	{"TableRepaired", (*env).repair, true},
	{"TableRepairedWhole", (*env).repairWhole, false},
	{"Revocation", (*env).revocation, false},
	{"OneWatchPerResource", (*env).oneWatch, true},
	// ClusterNetworkPolicies (cnp_test.go): the CRD installed first
	{"CNPWatched", (*env).cnpWatched, false},
	{"CNPAdminDenyBeatsNetworkPolicy", (*env).cnpAdminDeny, false},
	{"CNPAdminAcceptOpensIsolation", (*env).cnpAdminAccept, false},
	{"CNPAdminPassHandsToNetworkPolicy", (*env).cnpAdminPass, false},
	{"CNPBaselineOnlyWhereNotIsolated", (*env).cnpBaseline, false},
	{"CNPEgressDenyNetworks", (*env).cnpEgressNetworks, false},
	{"CNPEgressDenyNodes", (*env).cnpEgressNodes, false},
	{"CNPRevocation", (*env).cnpRevocation, false},
	{"CNPNewPodFromFirstPacket", (*env).cnpNewPod, false},
	{"CNPDropsAndExplain", (*env).cnpDrops, false},
	{"CNPCRDDeletedAndRecreated", (*env).cnpCRDLifecycle, false},
}

// TestNetworkPolicy: the whole behaviour on pods of the podnet plugin
// (routed /32 pods, host veths).
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "podnet")
	for _, st := range subtests {
		t.Run(st.name, func(t *testing.T) { st.run(e, t) })
	}
}

// TestNetworkPolicyBridge: the same policies on pods of podnet-bridge,
// where two pods of one node talk through the podnet0 bridge, seen by
// the table only through br_netfilter (bridge-nf-call-iptables and
// -ip6tables, which the engine keeps on): web and local share node 1, so
// every local → web verdict is one of the bridge.
func TestNetworkPolicyBridge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "podnet-bridge")
	for _, st := range subtests {
		if !st.routedOnly {
			t.Run(st.name, func(t *testing.T) { st.run(e, t) })
		}
	}
}

// newEnv brings up the two-node cluster with pods attached by plugin
// (podnet or podnet-bridge), its namespaces and its six pods, and checks
// that everything is open before any policy.
func newEnv(t *testing.T, plugin string) *env {
	engine := os.Getenv("PODNET_POLICY_ENGINE") != "off"
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	ctx := context.Background()
	c, err := cluster.Up(ctx, cluster.Config{
		Name:          "pnpol-" + plugin[len(plugin)-1:] + hex.EncodeToString(id),
		WorkDir:       t.TempDir(),
		RepoRoot:      nettest.RepoRoot(t),
		BinDir:        nettest.BinDir(t, plugin, "podnet-ipam", "podnet-routed"),
		Plugin:        plugin,
		KapiDir:       kapi.BinDir(t),
		Encap:         "vxlan",
		Nodes:         2,
		ClusterCIDR6:  "fd00:10:244::/56",
		NetworkPolicy: engine,
		PodObjects:    true,
		// the engine's read-back (repair) and drop counters run every resync
		Resync: 2 * time.Second,
		Logf:   t.Logf,
	})
	if err != nil {
		t.Fatalf("cluster up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s podnet-routed log (end):\n%s", n.Name, cluster.Tail(n.RoutedLog(), 30))
				if out, err := n.NS.Exec(ctx, "nft", "list", "table", "inet", "podnet-policy"); err == nil {
					t.Logf("%s table inet podnet-policy:\n%s", n.Name, out)
				}
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	e := &env{c: c, n1: c.Nodes[0], n2: c.Nodes[1]}
	for _, ns := range []struct {
		name   string
		labels map[string]string
	}{{"prod", map[string]string{"team": "prod"}}, {"dev", map[string]string{"team": "dev"}}} {
		if err := c.CreateNamespace(ctx, ns.name, ns.labels); err != nil {
			t.Fatal(err)
		}
	}
	webPorts := []corev1.ContainerPort{{Name: "alt", ContainerPort: portAlt, Protocol: corev1.ProtocolTCP}}
	add := func(n *cluster.Node, ns, name string, labels map[string]string, ports []corev1.ContainerPort) *cluster.Pod {
		t.Helper()
		p, err := n.AddPodSpec(ctx, cluster.PodSpec{Namespace: ns, Name: name, Labels: labels, Ports: ports})
		if err != nil {
			t.Fatal(err)
		}
		for _, port := range []int{portMain, portAlt, portDNS} {
			if err := p.ServeEcho(port); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	e.web = add(e.n1, "prod", "web", map[string]string{"app": "web"}, webPorts)
	e.local = add(e.n1, "prod", "local", map[string]string{"role": "client"}, nil)
	e.dns = add(e.n1, "dev", "dns", map[string]string{"app": "dns"}, nil)
	e.client = add(e.n2, "prod", "client", map[string]string{"role": "client"}, nil)
	e.other = add(e.n2, "prod", "other", map[string]string{"role": "other"}, nil)
	e.devclient = add(e.n2, "dev", "devclient", map[string]string{"role": "client"}, nil)

	// Everything is open before any policy (and the probes work).
	e.expect(t, "no policy: all open", 20*time.Second,
		allow(e.client, e.web, "tcp", portMain), allow(e.client, e.web, "udp", portMain),
		allow(e.other, e.web, "tcp", portAlt), allow(e.devclient, e.dns, "udp", portDNS), allow(e.devclient, e.dns, "tcp", portDNS),
		allow(e.local, e.web, "tcp", portAlt))
	return e
}

// ---- expectations ----

// flow is one probe and its expected verdict.
type flow struct {
	from    *cluster.NetNS
	fromN   string
	to      *cluster.Pod
	proto   string
	port    int
	ip6     bool
	allowed bool
	timeout time.Duration // 0: cluster.ProbeTimeout
}

func allow(from, to *cluster.Pod, proto string, port int) flow {
	return flow{from: from.NS, fromN: from.Name, to: to, proto: proto, port: port, allowed: true}
}

func deny(from, to *cluster.Pod, proto string, port int) flow {
	return flow{from: from.NS, fromN: from.Name, to: to, proto: proto, port: port}
}

// both is f over IPv4 and over IPv6.
func both(fs ...flow) []flow {
	var out []flow
	for _, f := range fs {
		f6 := f
		f6.ip6 = true
		out = append(out, f, f6)
	}
	return out
}

func (f flow) dst() netip.AddrPort {
	a := f.to.IP
	if f.ip6 {
		a = f.to.IP6
	}
	return netip.AddrPortFrom(a, uint16(f.port))
}

func (f flow) String() string {
	v := "refused"
	if f.allowed {
		v = "allowed"
	}
	return fmt.Sprintf("%s → %s %s/%s: want %s", f.fromN, f.to.Name, f.proto, f.dst(), v)
}

// check probes f once (a new flow) and says how it differs from the
// expectation ("" = as expected).
func (f flow) check(ctx context.Context) string {
	timeout := f.timeout
	if timeout == 0 {
		timeout = cluster.ProbeTimeout
	}
	err := cluster.Probe(ctx, f.proto, f.from, f.dst(), timeout)
	switch {
	case f.allowed && err != nil:
		return fmt.Sprintf("%s, got %v", f, err)
	case !f.allowed && err == nil:
		return fmt.Sprintf("%s, got an answer", f)
	}
	return ""
}

// probeAll probes every flow once, in parallel, and returns the
// mismatches.
func probeAll(fs []flow) []string {
	out := make([]string, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f.check(context.Background())
		}()
	}
	wg.Wait()
	var bad []string
	for _, s := range out {
		if s != "" {
			bad = append(bad, s)
		}
	}
	return bad
}

// expect waits until every flow has its verdict at once (a policy change
// takes a moment to reach the kernel), up to limit.
func (e *env) expect(t *testing.T, what string, limit time.Duration, fs ...flow) {
	t.Helper()
	var bad []string
	deadline := time.Now().Add(limit)
	for {
		if bad = probeAll(fs); len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%s: after %s, %d of %d flows not as expected:\n  %s", what, limit, len(bad), len(fs), strings.Join(bad, "\n  "))
}

// ---- policies ----

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func port(proto corev1.Protocol, p intstr.IntOrString) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

func ingressPolicy(ns, name string, pods *metav1.LabelSelector, rules ...networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *pods, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, Ingress: rules,
		},
	}
}

func (e *env) create(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	if err := e.c.CreatePolicy(context.Background(), np); err != nil {
		t.Fatal(err)
	}
}

func (e *env) delete(t *testing.T, ns, name string) {
	t.Helper()
	if err := e.c.DeletePolicy(context.Background(), ns, name); err != nil {
		t.Fatal(err)
	}
}

// allowClient is the policy most subtests keep: web takes port 80 (TCP and
// UDP) from the pods labelled role=client of its namespace.
func allowClient() *networkingv1.NetworkPolicy {
	return ingressPolicy("prod", "allow-client", sel("app", "web"), networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "client")}},
		Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, intstr.FromInt32(portMain)), port(corev1.ProtocolUDP, intstr.FromInt32(portMain))},
	})
}

// ---- subtests ----

// defaultDeny: a default-deny ingress policy in prod closes web to every
// pod, in both families and protocols; allow-client then opens port 80 to
// prod's role=client pods on the other node (and the local one), nothing
// else. Both stay for the later subtests.
func (e *env) defaultDeny(t *testing.T) {
	e.create(t, ingressPolicy("prod", "deny-in", sel()))
	e.expect(t, "default-deny ingress", converge, both(
		deny(e.client, e.web, "tcp", portMain), deny(e.client, e.web, "udp", portMain),
		deny(e.local, e.web, "tcp", portMain), deny(e.other, e.web, "udp", portAlt),
		// dev is not isolated
		allow(e.devclient, e.dns, "tcp", portDNS))...)
	e.create(t, allowClient())
	e.expect(t, "allow from role=client on port 80", converge, both(
		allow(e.client, e.web, "tcp", portMain), allow(e.client, e.web, "udp", portMain),
		allow(e.local, e.web, "tcp", portMain),
		deny(e.client, e.web, "tcp", portAlt), deny(e.client, e.web, "udp", portAlt), // port not allowed
		deny(e.other, e.web, "tcp", portMain), deny(e.other, e.web, "udp", portMain), // label not selected
		deny(e.devclient, e.web, "tcp", portMain), // role=client of another namespace
	)...)
}

// explainOnNode: `podnet-routed --explain-policy` run on web's node (as
// in its podnet-routed pod) names the policies and says the node's
// kernel table is what they compile to; with the table edited behind the
// engine's back, it says that it differs (the engine repairs it at once,
// so the edit is made again and again while explain runs).
func (e *env) explainOnNode(t *testing.T) {
	ctx := context.Background()
	const same = "its table inet podnet-policy is what the API objects compile to"
	for _, tc := range []struct {
		from *cluster.Pod
		port string
		want []string
	}{
		{e.client, "80/tcp", []string{"allowed", "prod/allow-client", same}},
		{e.other, "80/udp", []string{"denied", "prod/deny-in", same}},
	} {
		out, err := e.n1.ExplainPolicy(ctx, tc.from.IP, e.web.IP, tc.port)
		if err != nil {
			t.Fatalf("explain %s -> web %s: %v\n%s", tc.from.Name, tc.port, err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %s -> web %s: no %q in:\n%s", tc.from.Name, tc.port, w, out)
			}
		}
	}
	// the engine repairs the edit as soon as the nftables monitor sees it
	// (about 100 ms): it is made again and again while explain runs
	edit := func() error {
		_, err := e.n1.NS.Exec(ctx, "nft", "add", "element", "inet", "podnet-policy", "known4", "{ 10.244.0.250 }")
		return err
	}
	var out string
	for range 5 {
		if err := edit(); err != nil {
			t.Fatal(err)
		}
		stop, edited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(edited)
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
					edit()
				}
			}
		}()
		var err error
		out, err = e.n1.ExplainPolicy(ctx, e.client.IP, e.web.IP, "80/tcp")
		close(stop)
		<-edited
		if err != nil {
			t.Fatalf("explain: %v\n%s", err, out)
		}
		if strings.Contains(out, "differs from what the API objects compile to (set known4: 1 element(s) not wanted") {
			return
		}
	}
	t.Errorf("explain with an element added behind the engine's back:\n%s", out)
}

// nodeToPod: web's own node reaches it on every port while every pod is
// refused there (the output hook is not filtered: kubelet's probes).
func (e *env) nodeToPod(t *testing.T) {
	for _, a := range []netip.Addr{e.web.IP, e.web.IP6} {
		if err := cluster.ProbeTCP(context.Background(), e.n1.NS, netip.AddrPortFrom(a, portAlt), 3*time.Second); err != nil {
			t.Errorf("node %s → isolated pod web %s: %v", e.n1.Name, a, err)
		}
		if _, err := e.n1.Ping(context.Background(), a); err != nil {
			t.Errorf("node %s pings isolated pod web %s: %v", e.n1.Name, a, err)
		}
	}
	e.expect(t, "while pods are refused on that port", converge, both(deny(e.client, e.web, "tcp", portAlt))...)
}

// dropsMetric: the refused flows above were counted against the policies
// isolating web (the engine reads the counters every resync).
func (e *env) dropsMetric(t *testing.T) {
	probeAll(both(deny(e.other, e.web, "tcp", portMain))) // a few more drops
	var last string
	err := nettest.Poll(context.Background(), 10*time.Second, 200*time.Millisecond, func() error {
		body, err := e.n1.MetricsText()
		if err != nil {
			return err
		}
		v, ok := cluster.Metric(body, "podnet_policy_drops_total", `namespace="prod"`, `policy="deny-in"`)
		last = fmt.Sprintf("%v (present %v)", v, ok)
		if !ok || v < 1 {
			return errors.New("no drops counted")
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: podnet_policy_drops_total{namespace=\"prod\",policy=\"deny-in\"} = %s, want > 0", e.n1.Name, last)
	}
}

// namespaceSelector: web's port 8080 opens to the pods of namespaces
// labelled team=dev, not to prod's own.
func (e *env) namespaceSelector(t *testing.T) {
	e.create(t, ingressPolicy("prod", "allow-dev", sel("app", "web"), networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "dev")}},
		Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, intstr.FromInt32(portAlt))},
	}))
	e.expect(t, "namespaceSelector team=dev", converge, both(
		allow(e.devclient, e.web, "tcp", portAlt), deny(e.client, e.web, "tcp", portAlt), deny(e.devclient, e.web, "udp", portAlt))...)
	// relabelling the namespace takes it back
	if err := e.c.SetNamespaceLabels(context.Background(), "dev", map[string]string{"team": "qa"}); err != nil {
		t.Fatal(err)
	}
	e.expect(t, "namespace relabelled team=qa", converge, both(deny(e.devclient, e.web, "tcp", portAlt))...)
	if err := e.c.SetNamespaceLabels(context.Background(), "dev", map[string]string{"team": "dev"}); err != nil {
		t.Fatal(err)
	}
	e.delete(t, "prod", "allow-dev")
}

// namedPort: a rule on port "alt" opens web's container port named alt
// (8080/TCP) to role=other, and only that port.
func (e *env) namedPort(t *testing.T) {
	e.create(t, ingressPolicy("prod", "allow-named", sel("app", "web"), networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "other")}},
		Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, intstr.FromString("alt"))},
	}))
	e.expect(t, "named port alt", converge, both(
		allow(e.other, e.web, "tcp", portAlt), deny(e.other, e.web, "tcp", portMain), deny(e.other, e.web, "udp", portAlt))...)
	e.delete(t, "prod", "allow-named")
	e.expect(t, "named port policy deleted", converge, both(deny(e.other, e.web, "tcp", portAlt))...)
}

// ipBlock: node 2's PodCIDRs except other's addresses may reach 8080.
func (e *env) ipBlock(t *testing.T) {
	e.create(t, ingressPolicy("prod", "allow-block", sel("app", "web"), networkingv1.NetworkPolicyIngressRule{
		From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: e.n2.PodCIDR.String(), Except: []string{netip.PrefixFrom(e.other.IP, 32).String()}}},
			{IPBlock: &networkingv1.IPBlock{CIDR: e.n2.PodCIDR6.String(), Except: []string{netip.PrefixFrom(e.other.IP6, 128).String()}}},
		},
		Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, intstr.FromInt32(portAlt))},
	}))
	e.expect(t, "ipBlock node 2's PodCIDRs except other", converge, both(
		allow(e.client, e.web, "tcp", portAlt), allow(e.devclient, e.web, "tcp", portAlt),
		deny(e.other, e.web, "tcp", portAlt), deny(e.local, e.web, "tcp", portAlt))...)
	e.delete(t, "prod", "allow-block")
}

// firstAnswer bounds the wait for a new pod's first allowed answer: its
// first IPv4 packet waits for ARP (up to proxy_delay, 0.8 s), and a loaded
// 2-core CI machine adds to it. A refused flow must stay unanswered for
// ProbeTimeout.
const firstAnswer = 3 * time.Second

// newPod: pods added while the policies are in place are judged from their
// first packet: a probe right after ADD returns (before the kubelet's
// status report) is answered when allowed and refused when not.
func (e *env) newPod(t *testing.T) {
	ctx := context.Background()
	add := func(n *cluster.Node, ns, name string, labels map[string]string) *cluster.Pod {
		return addServing(t, n, cluster.PodSpec{Namespace: ns, Name: name, Labels: labels, LateStatus: true})
	}
	// a new web pod on node 1: allow-client lets role=client in on port
	// 80 (a client on its node and on the other), nothing else
	web2 := add(e.n1, "prod", "web2", map[string]string{"app": "web"})
	var bad []string
	for _, f := range both(allow(e.client, web2, "tcp", portMain), allow(e.local, web2, "udp", portMain), deny(e.other, web2, "tcp", portMain)) {
		if f.allowed {
			// a new pod's first IPv4 answer waits for proxy ARP on its
			// host veth, which the kernel delays by up to proxy_delay
			// (0.8 s): longer than ProbeTimeout, policy or not
			f.timeout = firstAnswer
		}
		if s := f.check(ctx); s != "" {
			bad = append(bad, s)
		}
	}
	// a new client on node 2 in isolated egress (dev denies all egress
	// but DNS): its first DNS packet goes, its first TCP connection not
	e.create(t, egressDenyAllowDNS())
	e.expect(t, "dev egress policies in place", converge, both(deny(e.devclient, e.dns, "tcp", portDNS))...)
	dev2 := add(e.n2, "dev", "dev2", map[string]string{"role": "client"})
	for _, f := range both(allow(dev2, e.dns, "udp", portDNS), deny(dev2, e.dns, "tcp", portDNS), deny(dev2, e.dns, "udp", portMain)) {
		if f.allowed {
			f.timeout = firstAnswer // as for web2 above
		}
		if s := f.check(ctx); s != "" {
			bad = append(bad, s)
		}
	}
	if len(bad) > 0 {
		t.Errorf("first connections of new pods (probed right after ADD):\n  %s", strings.Join(bad, "\n  "))
	}
	for _, p := range []*cluster.Pod{web2, dev2} {
		if err := e.c.ReportPodIPs(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	e.expect(t, "after the kubelet's status report", converge, both(allow(e.client, web2, "tcp", portMain), deny(e.other, web2, "tcp", portMain))...)
	e.delete(t, "dev", "egress")
	e.expect(t, "dev egress policy deleted", converge, both(allow(e.devclient, e.dns, "tcp", portDNS))...)
}

// addServing adds a pod for the test (deleted after it) that echoes on
// portMain.
func addServing(t *testing.T, n *cluster.Node, spec cluster.PodSpec) *cluster.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := n.AddPodSpec(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.DelPod(ctx, p) })
	if err := p.ServeEcho(portMain); err != nil {
		t.Fatal(err)
	}
	return p
}

// egressDenyAllowDNS isolates every dev pod for egress and allows UDP 53
// to anywhere.
func egressDenyAllowDNS() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "dev", Name: "egress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel(),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, intstr.FromInt32(portDNS))}}},
		},
	}
}

// egress: dev's pods may send UDP 53 and nothing else; the pod they talk
// to (dns, dev, not isolated for ingress) is on the other node.
func (e *env) egress(t *testing.T) {
	e.create(t, egressDenyAllowDNS())
	e.expect(t, "egress deny but UDP 53", converge, both(
		allow(e.devclient, e.dns, "udp", portDNS), deny(e.devclient, e.dns, "tcp", portDNS),
		deny(e.devclient, e.dns, "udp", portMain), deny(e.devclient, e.web, "tcp", portMain),
		// the others are not egress-isolated
		allow(e.client, e.dns, "tcp", portDNS))...)
	e.delete(t, "dev", "egress")
	e.expect(t, "egress policy deleted", converge, both(allow(e.devclient, e.dns, "tcp", portDNS))...)
}

// repair: someone deletes the table in node 1; podnet-routed writes it
// back at its next resync, counts the repair, and web is isolated again.
func (e *env) repair(t *testing.T) {
	ctx := context.Background()
	before, _ := repairs(e.n1)
	if out, err := e.n1.NS.Exec(ctx, "nft", "delete", "table", "inet", "podnet-policy"); err != nil {
		t.Errorf("nft delete table inet podnet-policy: %v: %s", err, out)
	}
	err := nettest.Poll(ctx, converge, 200*time.Millisecond, func() error {
		if _, err := e.n1.NS.Exec(ctx, "nft", "list", "table", "inet", "podnet-policy"); err != nil {
			return err
		}
		if v, ok := repairs(e.n1); !ok || v <= before {
			return fmt.Errorf("podnet_repairs_total{object=\"policy-table\"} %v (present %v), was %v", v, ok, before)
		}
		return nil
	})
	if err != nil {
		t.Errorf("table not repaired: %v", err)
	}
	e.expect(t, "after the repair", converge, both(allow(e.client, e.web, "tcp", portMain), deny(e.other, e.web, "tcp", portMain))...)
}

func repairs(n *cluster.Node) (float64, bool) {
	body, err := n.MetricsText()
	if err != nil {
		return 0, false
	}
	return cluster.Metric(body, "podnet_repairs_total", `object="policy-table"`)
}

// revocation: established streams client → web stop once allow-client,
// the policy that allowed them, is deleted: their next lines get no echo
// (conntrack entries revoked, the next packet judged anew and dropped).
// oneWatch: a node's podnet-routed holds exactly one watch on each
// resource it reads (its informers share nothing else): stopping it on node
// 1 ends one WATCH each of pods, namespaces, networkpolicies and nodes at
// the API server (apiserver_longrunning_requests), and starting it again
// brings one back.
func (e *env) oneWatch(t *testing.T) {
	ctx := context.Background()
	resources := []string{"pods", "namespaces", "networkpolicies", "nodes"}
	watches := func() map[string]float64 {
		body, err := e.c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatalf("API server /metrics: %v", err)
		}
		out := map[string]float64{}
		for _, r := range resources {
			out[r], _ = cluster.Metric(string(body), "apiserver_longrunning_requests", `resource="`+r+`"`, `verb="WATCH"`)
		}
		return out
	}
	// until every resource's count is want(r), within limit
	await := func(what string, want func(string) float64) {
		t.Helper()
		var got map[string]float64
		for deadline := time.Now().Add(converge); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got = watches()
			ok := true
			for _, r := range resources {
				ok = ok && got[r] == want(r)
			}
			if ok {
				return
			}
		}
		t.Fatalf("%s: API server WATCH requests %v", what, got)
	}
	before := watches()
	for _, r := range resources {
		if before[r] < 2 {
			t.Fatalf("%d WATCH requests on %s with podnet-routed on 2 nodes: %v", int(before[r]), r, before)
		}
	}
	if err := e.n1.StopRouted(); err != nil {
		t.Fatal(err)
	}
	await("node 1's podnet-routed stopped", func(r string) float64 { return before[r] - 1 })
	if err := e.n1.StartRouted(); err != nil {
		t.Fatal(err)
	}
	await("node 1's podnet-routed started again", func(r string) float64 { return before[r] })
}

func (e *env) revocation(t *testing.T) {
	ctx := context.Background()
	var streams []*cluster.Stream
	for _, a := range []netip.Addr{e.web.IP, e.web.IP6} {
		s, err := cluster.OpenStream(ctx, e.client.NS, netip.AddrPortFrom(a, portMain))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Echo(3 * time.Second); err != nil {
			t.Fatalf("stream to %s before the deletion: %v", a, err)
		}
		streams = append(streams, s)
	}
	e.delete(t, "prod", "allow-client")
	for i, s := range streams {
		// one line every 200 ms while the stream still echoes, for up to
		// converge: the first line without echo ends it
		stopped := false
		for end := time.Now().Add(converge); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if err := s.Echo(time.Second); err != nil {
				stopped = true
				break
			}
		}
		if !stopped {
			ct, _ := e.n1.NS.Exec(ctx, "conntrack", "-L", "-p", "tcp")
			t.Errorf("stream %d client → web still echoes %s after allow-client was deleted; %s conntrack:\n%s", i, converge, e.n1.Name, ct)
			continue
		}
		if err := s.Echo(2 * time.Second); err == nil {
			t.Errorf("stream %d client → web echoes again after it stopped", i)
		}
	}
	e.expect(t, "new connections after the deletion", converge, both(deny(e.client, e.web, "tcp", portMain))...)
}
