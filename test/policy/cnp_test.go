package policy

// ClusterNetworkPolicy subtests (issue 33): the Admin tier before
// NetworkPolicies (Deny and Accept final, Pass hands over), the Baseline
// tier for pods no NetworkPolicy isolates, egress to networks and to
// nodes, revocation, new pods, drop counters and explain, and the CRD
// deleted and installed again, on the same cluster as the NetworkPolicy
// subtests (both plugins). Each installs the CRD if absent (cnpReady)
// and deletes its ClusterNetworkPolicies.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

const (
	actAccept = cnpv1.ClusterNetworkPolicyRuleActionAccept
	actDeny   = cnpv1.ClusterNetworkPolicyRuleActionDeny
	actPass   = cnpv1.ClusterNetworkPolicyRuleActionPass
)

// portNode is the TCP echo port on the nodes (every address) for the
// nodes peer.
const portNode = 7312

// clientsToWeb80 are the flows allow-client allows, from a pod of web's
// node (local) and of the other one (client).
func (e *env) clientsToWeb80(allowed bool) []flow {
	fs := []flow{allow(e.client, e.web, "tcp", portMain), allow(e.client, e.web, "udp", portMain), allow(e.local, e.web, "tcp", portMain)}
	for i := range fs {
		fs[i].allowed = allowed
	}
	return both(fs...)
}

// cnpWatched: with the CRD installed, both nodes' engines watch
// ClusterNetworkPolicies; nothing changes until one is created.
//
// Watching them costs one watch per node on clusternetworkpolicies and no
// second one on Nodes: the engine hears the daemon's Node informer.
func (e *env) cnpWatched(t *testing.T) {
	nodesBefore := e.apiWatches(t, "nodes")
	e.cnpReady(t)
	e.expect(t, "CRD installed, no ClusterNetworkPolicy", converge, e.clientsToWeb80(true)...)
	err := nettest.Poll(context.Background(), converge, 200*time.Millisecond, func() error {
		if n, c := e.apiWatches(t, "nodes"), e.apiWatches(t, "clusternetworkpolicies"); n != nodesBefore || c != 2 {
			return fmt.Errorf("WATCH requests: nodes %v (%v before the CRD), clusternetworkpolicies %v (want 2: one per podnet-routed)", n, nodesBefore, c)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// apiWatches is the API server's count of open WATCH requests on resource.
func (e *env) apiWatches(t *testing.T, resource string) float64 {
	t.Helper()
	body, err := e.c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("API server /metrics: %v", err)
	}
	n, _ := cluster.Metric(string(body), "apiserver_longrunning_requests", `resource="`+resource+`"`, `verb="WATCH"`)
	return n
}

// cnpAdminDeny: an Admin Deny from role=client pods on web beats
// allow-client, which lets them in.
func (e *env) cnpAdminDeny(t *testing.T) {
	e.cnpReady(t)
	e.expect(t, "allow-client", converge, e.clientsToWeb80(true)...)
	e.createCNP(t, denyClients("cnp-deny"))
	e.expect(t, "Admin Deny over allow-client", converge, append(e.clientsToWeb80(false),
		both(allow(e.devclient, e.dns, "tcp", portDNS), allow(e.local, e.dns, "tcp", portDNS))...)...)
	e.deleteCNP(t, "cnp-deny")
	e.expect(t, "Admin Deny deleted", converge, e.clientsToWeb80(true)...)
}

// cnpAdminAccept: an Admin Accept of TCP 8080 from prod's role=client
// pods opens what allow-client (port 80 only) leaves closed, and only
// that.
func (e *env) cnpAdminAccept(t *testing.T) {
	e.cnpReady(t)
	closed := both(deny(e.client, e.web, "tcp", portAlt), deny(e.local, e.web, "tcp", portAlt))
	e.expect(t, "8080 closed by deny-in", converge, closed...)
	p := cnp("cnp-accept", cnpv1.AdminTier, 20, webSubject())
	r := ingressRule(actAccept, "alt-from-clients", fromPods(sel("team", "prod"), sel("role", "client")))
	r.Protocols = []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(portAlt)}
	p.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{r}
	e.createCNP(t, p)
	e.expect(t, "Admin Accept TCP 8080 from prod's clients", converge, both(
		allow(e.client, e.web, "tcp", portAlt), allow(e.local, e.web, "tcp", portAlt),
		deny(e.client, e.web, "udp", portAlt),    // protocol not accepted
		deny(e.other, e.web, "tcp", portAlt),     // label not selected
		deny(e.devclient, e.web, "tcp", portAlt), // namespace not selected
	)...)
	e.deleteCNP(t, "cnp-accept")
	e.expect(t, "Admin Accept deleted", converge, closed...)
}

// cnpAdminPass: an Admin Deny of everything at priority 50 closes web;
// an Admin Pass of role=client pods at priority 5 hands them over to the
// NetworkPolicies (allow-client: port 80 only), the later Deny not
// applied to them.
func (e *env) cnpAdminPass(t *testing.T) {
	e.cnpReady(t)
	late := cnp("cnp-deny-late", cnpv1.AdminTier, 50, webSubject())
	late.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{
		ingressRule(actDeny, "deny-all", cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: sel()}),
	}
	e.createCNP(t, late)
	e.expect(t, "Admin Deny of everything", converge, e.clientsToWeb80(false)...)
	p := cnp("cnp-pass", cnpv1.AdminTier, 5, webSubject())
	p.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{ingressRule(actPass, "pass-clients", fromPods(nil, sel("role", "client")))}
	e.createCNP(t, p)
	e.expect(t, "Admin Pass of clients before the Deny", converge, append(e.clientsToWeb80(true), both(
		deny(e.client, e.web, "tcp", portAlt),     // passed: allow-client does not allow 8080
		deny(e.devclient, e.web, "tcp", portMain), // passed: allow-client is prod's clients
		deny(e.other, e.web, "tcp", portMain),     // not passed: the Deny
	)...)...)
	e.deleteCNP(t, "cnp-pass")
	e.expect(t, "Pass deleted, the Deny applies again", converge, e.clientsToWeb80(false)...)
	e.deleteCNP(t, "cnp-deny-late")
	e.expect(t, "both deleted", converge, e.clientsToWeb80(true)...)
}

// cnpBaseline: a Baseline Deny of ports 80 to every pod refuses the pods
// no NetworkPolicy isolates for ingress (dev's dns and devclient), from
// their node and the other, not web, which allow-client decides.
func (e *env) cnpBaseline(t *testing.T) {
	e.cnpReady(t)
	open := both(allow(e.devclient, e.dns, "tcp", portMain), allow(e.devclient, e.dns, "udp", portMain),
		allow(e.local, e.dns, "tcp", portMain), allow(e.client, e.devclient, "tcp", portMain))
	e.expect(t, "dev not isolated", converge, open...)
	p := cnp("cnp-baseline", cnpv1.BaselineTier, 10, cnpv1.ClusterNetworkPolicySubject{Namespaces: sel()})
	r := ingressRule(actDeny, "deny-80", cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: sel()})
	r.Protocols = []cnpv1.ClusterNetworkPolicyProtocol{tcpPort(portMain), udpPort(portMain)}
	p.Spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{r}
	e.createCNP(t, p)
	closed := make([]flow, len(open))
	for i, f := range open {
		f.allowed = false
		closed[i] = f
	}
	e.expect(t, "Baseline Deny of port 80", converge, append(append(closed, e.clientsToWeb80(true)...),
		both(allow(e.devclient, e.dns, "tcp", portDNS))...)...)
	e.deleteCNP(t, "cnp-baseline")
	e.expect(t, "Baseline Deny deleted", converge, open...)
}

// cnpEgressNetworks: an Admin Deny of other's egress to the /32 and /128
// of dns (the other node) and devclient (its node) refuses those flows,
// counted on other's node, and nobody else's.
func (e *env) cnpEgressNetworks(t *testing.T) {
	e.cnpReady(t)
	open := both(allow(e.other, e.dns, "tcp", portDNS), allow(e.other, e.dns, "udp", portDNS),
		allow(e.other, e.devclient, "tcp", portMain), allow(e.other, e.devclient, "udp", portMain))
	e.expect(t, "other's egress open", converge, open...)
	var nets []cnpv1.CIDR
	for _, a := range []netip.Addr{e.dns.IP, e.dns.IP6, e.devclient.IP, e.devclient.IP6} {
		nets = append(nets, cnpv1.CIDR(netip.PrefixFrom(a, a.BitLen()).String()))
	}
	p := cnp("cnp-egress-nets", cnpv1.AdminTier, 10, subjectPods(sel("team", "prod"), sel("role", "other")))
	p.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{egressRule(actDeny, "deny-nets", cnpv1.ClusterNetworkPolicyEgressPeer{Networks: nets})}
	e.createCNP(t, p)
	closed := make([]flow, len(open))
	for i, f := range open {
		f.allowed = false
		closed[i] = f
	}
	e.expect(t, "Admin Deny egress to networks", converge, append(closed,
		both(allow(e.client, e.dns, "tcp", portDNS), allow(e.client, e.devclient, "tcp", portMain))...)...)
	probeAll(closed) // a few more drops
	if err := nettest.Poll(context.Background(), converge, 200*time.Millisecond, func() error {
		return clusterDrops(e.n2, "cnp-egress-nets", "egress 0 deny-nets", 0)
	}); err != nil {
		t.Errorf("egress drops not counted: %v\n%s", err, dropsDiag(e.n2))
	}
	e.deleteCNP(t, "cnp-egress-nets")
	e.expect(t, "Admin Deny egress deleted", converge, open...)
}

// cnpEgressNodes: an Admin Deny of other's egress to the nodes (a nodes
// peer selecting every Node: their InternalIPs of both families) refuses
// TCP from other to an echo server on its node's addresses and on the
// other node's, not client's.
func (e *env) cnpEgressNodes(t *testing.T) {
	e.cnpReady(t)
	echoDual(t, e.n1.NS, portNode)
	echoDual(t, e.n2.NS, portNode)
	var flows []addrFlow
	for _, from := range []*cluster.Pod{e.other, e.client} {
		for _, n := range []*cluster.Node{e.n2, e.n1} { // other's node first
			for _, a := range []netip.Addr{n.IP, n.IP6} {
				flows = append(flows, addrFlow{from: from, to: netip.AddrPortFrom(a, portNode), what: "node " + n.Name, allowed: true})
			}
		}
	}
	e.expectAddrs(t, "pods reach the nodes", flows...)
	p := cnp("cnp-egress-nodes", cnpv1.AdminTier, 10, subjectPods(sel("team", "prod"), sel("role", "other")))
	p.Spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{egressRule(actDeny, "deny-nodes", cnpv1.ClusterNetworkPolicyEgressPeer{Nodes: sel()})}
	e.createCNP(t, p)
	denied := make([]addrFlow, len(flows))
	for i, f := range flows {
		f.allowed = f.from != e.other
		denied[i] = f
	}
	e.expectAddrs(t, "Admin Deny egress to the nodes", denied...)
	e.deleteCNP(t, "cnp-egress-nodes")
	e.expectAddrs(t, "Admin Deny egress to the nodes deleted", flows...)
}

// echoDual serves TCP echo on port of every address of netns, IPv4 and
// IPv6 (echoOn's tcp6 socket is IPv6 only).
func echoDual(t *testing.T, netns *cluster.NetNS, port int) {
	t.Helper()
	echoListen(t, netns, "tcp", port)
}

// clusterDrops says whether node n's
// podnet_policy_cluster_drops_total{tier="Admin",policy,rule} is above
// than (nil) or not.
func clusterDrops(n *cluster.Node, policy, rule string, than float64) error {
	body, err := n.MetricsText()
	if err != nil {
		return err
	}
	v, ok := clusterDropsIn(body, policy, rule)
	if !ok || v <= than {
		return fmt.Errorf("%s: podnet_policy_cluster_drops_total{tier=\"Admin\",policy=%q,rule=%q} = %v (present %v), want > %v",
			n.Name, policy, rule, v, ok, than)
	}
	return nil
}

// clusterDropsIn is podnet_policy_cluster_drops_total{tier="Admin",policy,rule}
// in /metrics text. Not cluster.Metric: the rule label ("ingress 0
// deny-clients") holds spaces, which it takes for the end of the series.
func clusterDropsIn(body, policy, rule string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		series, val, ok := strings.Cut(line, "} ")
		if !ok || !strings.HasPrefix(series, "podnet_policy_cluster_drops_total{") {
			continue
		}
		labels := strings.Split(strings.TrimPrefix(series, "podnet_policy_cluster_drops_total{"), ",")
		if slices.Contains(labels, `tier="Admin"`) && slices.Contains(labels, `policy="`+policy+`"`) && slices.Contains(labels, `rule="`+rule+`"`) {
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// dropsDiag is what a node has of ClusterNetworkPolicy drops: its
// podnet_policy_cluster_* series and its table's named counters.
func dropsDiag(n *cluster.Node) string {
	var b strings.Builder
	body, err := n.MetricsText()
	if err != nil {
		fmt.Fprintf(&b, "/metrics: %v\n", err)
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "podnet_policy_cluster_") {
			b.WriteString(l + "\n")
		}
	}
	out, err := n.NS.Exec(context.Background(), "nft", "list", "counters", "table", "inet", "podnet-policy")
	fmt.Fprintf(&b, "nft list counters (%v):\n%s", err, out)
	return b.String()
}
