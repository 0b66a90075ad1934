package routed

// Hostile and careless Node objects (issue 21, "Must show" 1 and 5), against
// a real kube-apiserver: each bad Node gets no route on any observing node,
// the observing nodes keep their API server and their other routes, the
// older of two Nodes claiming the same PodCIDR or InternalIP wins on every
// node whatever the names, each refusal is one Event and one log line per
// observing podnet-routed and is counted in podnet_nodes_refused{reason};
// fixing or deleting the bad Node ends the refusal. And a node whose own
// Node is missing or has no PodCIDR says so (readyz, node.json) while it
// keeps routing to the others.
//
// The checks that wait report every expectation still unmet at the end
// (t.Errorf), so that one run lists every case that fails.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/internal/nodestate"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

// refuseReasons are the values of podnet_nodes_refused's reason label, in
// the order podnet-routed checks them.
var refuseReasons = []string{
	"invalid-podcidr", "reserved-range", "outside-cluster-cidr", "overlaps-service-cidr", "overlaps-apiserver",
	"overlaps-node-network", "overlaps-own-podcidr", "podcidr-conflict", "invalid-node-ip", "own-node-ip", "node-ip-conflict",
	"vtep-mac-conflict",
}

const (
	nodeIPAnnotation = "podnet.io/node-ip"
	eventsNamespace  = "default"
	// hostileClusterCIDRs: the pods' range, a range holding the service
	// CIDRs (so that a PodCIDR there passes the cluster CIDR check and is
	// refused for the service CIDR) and the upper half of the underlay
	// subnet, with the API server (.250) and the outside host (.200) but no
	// node address (.1-.127: a node address inside a cluster CIDR is an
	// invalid next hop).
	hostileClusterCIDRs = "10.244.0.0/16,10.96.0.0/16,172.30.0.128/25"
	extraServiceCIDR    = "10.96.8.0/24" // a ServiceCIDR object the test adds to the default 10.96.0.0/24
	apiServerAddr       = "172.30.0.250:6443"
)

// nodeSpec is a Node object to create.
type nodeSpec struct {
	name    string
	podCIDR string // "" none
	ip      string // InternalIP ("" none)
	extIP   string // ExternalIP ("" none)
	ann     string // podnet.io/node-ip ("" none)
}

func (s nodeSpec) object() (*corev1.Node, []corev1.NodeAddress) {
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.name, Labels: map[string]string{"kubernetes.io/hostname": s.name}}}
	if s.ann != "" {
		obj.Annotations = map[string]string{nodeIPAnnotation: s.ann}
	}
	if s.podCIDR != "" {
		obj.Spec = corev1.NodeSpec{PodCIDR: s.podCIDR, PodCIDRs: []string{s.podCIDR}}
	}
	var addrs []corev1.NodeAddress
	if s.ip != "" {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: s.ip})
	}
	if s.extIP != "" {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: s.extIP})
	}
	if len(addrs) > 0 {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: s.name})
	}
	return obj, addrs
}

// tryCreateNode creates the Node (spec, then status.addresses as the
// kubelet does) and returns the API server's error, if any.
func (c *cluster) tryCreateNode(s nodeSpec) error {
	ctx := context.Background()
	obj, addrs := s.object()
	created, err := c.client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", s.name, err)
	}
	if len(addrs) == 0 {
		return nil
	}
	created.Status.Addresses = addrs
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("Node %s status: %w", s.name, err)
	}
	return nil
}

func (c *cluster) createNodeSpec(s nodeSpec) {
	c.t.Helper()
	if err := c.tryCreateNode(s); err != nil {
		c.t.Fatal(err)
	}
}

// setAnnotation sets (or, with "", removes) the podnet.io/node-ip annotation.
func (c *cluster) setAnnotation(name, value string) {
	c.t.Helper()
	c.updateNode(name, false, func(n *corev1.Node) {
		if value == "" {
			delete(n.Annotations, nodeIPAnnotation)
			return
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[nodeIPAnnotation] = value
	})
}

// ---- what the observing nodes must show ----

// refusedGauge scrapes podnet_nodes_refused{reason} (absent: 0); a reason
// outside the contract's list is an error.
func (d *daemon) refusedGauge() (map[string]float64, error) {
	code, body, err := d.n.get(d.metricsAddr, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics %d", code)
	}
	out := map[string]float64{}
	re := regexp.MustCompile(`^podnet_nodes_refused\{reason="([^"]*)"\} (\S+)$`)
	seen := false
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "# TYPE podnet_nodes_refused ") {
			seen = true
		}
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if !slices.Contains(refuseReasons, m[1]) {
			return nil, fmt.Errorf("podnet_nodes_refused has reason %q, not one of the contract's", m[1])
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[m[1]] = v
	}
	if !seen {
		return nil, errors.New("/metrics has no gauge podnet_nodes_refused")
	}
	return out, nil
}

func gaugeString(m map[string]float64) string {
	var parts []string
	for _, r := range refuseReasons {
		if m[r] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%v", r, m[r]))
		}
	}
	if len(parts) == 0 {
		return "{}"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// refusalLogs returns the daemon's "node refused" records about node.
func (d *daemon) refusalLogs(msg, node string) []map[string]any {
	var out []map[string]any
	for _, rec := range d.logLines(msg) {
		if rec["node"] == node {
			out = append(out, rec)
		}
	}
	return out
}

// nodeEvents lists the Events with reason about Node objects, by Node name.
func (c *cluster) nodeEvents(reason string) (map[string][]corev1.Event, error) {
	list, err := c.client.CoreV1().Events(eventsNamespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,reason=" + reason})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out := map[string][]corev1.Event{}
	for _, e := range list.Items {
		out[e.InvolvedObject.Name] = append(out[e.InvolvedObject.Name], e)
	}
	return out, nil
}

// checkEvent says what is wrong with the Events from observer obs about a
// Node (of the list evs): want exactly one, of type typ, from podnet-routed,
// emitted once (count 1: not again at every resync).
func checkEvent(evs []corev1.Event, node, obs, reason, typ string) string {
	prefix := "podnet-routed on " + obs + ": "
	var mine []corev1.Event
	for _, e := range evs {
		if strings.HasPrefix(e.Message, prefix) {
			mine = append(mine, e)
		}
	}
	if len(mine) != 1 {
		var msgs []string
		for _, e := range evs {
			msgs = append(msgs, fmt.Sprintf("%q (count %d)", e.Message, e.Count))
		}
		return fmt.Sprintf("Node %s: %d %s Events from %s, want 1 (all %s Events about it: %v)", node, len(mine), reason, obs, reason, msgs)
	}
	e := mine[0]
	switch {
	case e.Type != typ:
		return fmt.Sprintf("Node %s: %s Event from %s has type %q, want %q", node, reason, obs, e.Type, typ)
	case e.Source.Component != "podnet-routed":
		return fmt.Sprintf("Node %s: %s Event from %s has source component %q, want podnet-routed", node, reason, obs, e.Source.Component)
	case e.Count > 1:
		return fmt.Sprintf("Node %s: %s Event from %s has count %d: emitted again with nothing changed (%q)", node, reason, obs, e.Count, e.Message)
	case len(e.Message) == len(prefix):
		return fmt.Sprintf("Node %s: %s Event from %s says nothing after the prefix", node, reason, obs)
	}
	return ""
}

// settle polls check until it finds nothing wrong or limit passes, and
// reports what is still wrong as test errors (the test goes on). It says
// whether everything held.
func settle(t *testing.T, limit time.Duration, what string, check func() []string) bool {
	t.Helper()
	start := time.Now()
	var left []string
	_ = nettest.Poll(context.Background(), limit, 50*time.Millisecond, func() error {
		left = check()
		if len(left) > 0 {
			return errors.New("not yet")
		}
		return nil
	})
	for _, l := range left {
		t.Errorf("%s (after %s): %s", what, limit, l)
	}
	if len(left) == 0 {
		t.Logf("%s: held after %s", what, time.Since(start).Round(time.Millisecond))
	}
	return len(left) == 0
}

// steady checks for dur that check finds nothing wrong; it reports the
// first problems as test errors.
func steady(t *testing.T, dur time.Duration, what string, check func() []string) {
	t.Helper()
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		if left := check(); len(left) > 0 {
			for _, l := range left {
				t.Errorf("%s: %s", what, l)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reachesAPIServer dials the API server's own address from the node netns
// (the daemon's kubeconfig names it: no proxy in this test).
func (n *node) reachesAPIServer() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := nettest.DialIn(n.ns)(ctx, "tcp", apiServerAddr)
	if err != nil {
		return fmt.Errorf("%s cannot reach the API server at %s: %w", n.name, apiServerAddr, err)
	}
	return conn.Close()
}

// ---- the model of the cluster the observers must agree with ----

// mNode is a Node as the observers must treat it.
type mNode struct {
	podCIDR, via string
	refused      map[string]string // observer -> reason (absent: routed)
	noRoute      bool              // no route anywhere, not refused (its route cannot be installed)
}

type world struct {
	nodes     map[string]*mNode
	observers []string
}

func (w *world) routes(obs string) []string {
	var out []string
	for name, m := range w.nodes {
		switch {
		case name == obs:
			out = append(out, "blackhole "+m.podCIDR+" proto 77")
		case m.noRoute || m.refused[obs] != "":
		default:
			out = append(out, fmt.Sprintf("%s via %s dev eth0 proto 77", m.podCIDR, m.via))
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) gauge(obs string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range w.nodes {
		if r := m.refused[obs]; r != "" {
			out[r]++
		}
	}
	return out
}

// check compares every observer with the model: routes, gauge, readyz 200,
// the API server reachable.
func (w *world) check(ds map[string]*daemon) []string {
	var bad []string
	for _, obs := range w.observers {
		d := ds[obs]
		if err := d.alive(); err != nil {
			bad = append(bad, err.Error())
			continue
		}
		got, err := d.n.podnetRoutes()
		if err != nil {
			bad = append(bad, err.Error())
		} else if want := w.routes(obs); !slices.Equal(got, want) {
			bad = append(bad, fmt.Sprintf("%s routes: %s", obs, routeDiff(got, want)))
		}
		want := w.gauge(obs)
		if g, err := d.refusedGauge(); err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", obs, err))
		} else {
			for _, r := range refuseReasons {
				if g[r] != want[r] {
					bad = append(bad, fmt.Sprintf("%s podnet_nodes_refused: got %s, want %s", obs, gaugeString(g), gaugeString(want)))
					break
				}
			}
		}
		if code, body := d.status("/readyz"); code != http.StatusOK {
			bad = append(bad, fmt.Sprintf("%s /readyz %d %q", obs, code, body))
		}
		if err := d.n.reachesAPIServer(); err != nil {
			bad = append(bad, err.Error())
		}
	}
	return bad
}

func routeDiff(got, want []string) string {
	var missing, extra []string
	for _, r := range want {
		if !slices.Contains(got, r) {
			missing = append(missing, r)
		}
	}
	for _, r := range got {
		if !slices.Contains(want, r) {
			extra = append(extra, r)
		}
	}
	return fmt.Sprintf("missing %q, unexpected %q", missing, extra)
}

// hostileCase is one bad (or tricky) Node.
type hostileCase struct {
	what string
	spec nodeSpec
	// reason it is refused for by every observer, unless by overrides it
	reason  string
	by      map[string]string // observer -> reason ("" routed there)
	noRoute bool
	// later: created a second after the others (younger than all of them)
	later bool
}

// TestHostileNodes: issue 21, "Must show" 1 and 5. Three nodes run
// podnet-routed and watch bad Nodes come: each gets no route where it is
// bad, with one Event and one log line per observer and the gauge per
// reason; the good Nodes' routes stay and a later good Node still gets
// its route; readyz stays 200 and the API server reachable. Then every
// bad Node is fixed or deleted and the refusals end.
func TestHostileNodes(t *testing.T) {
	c := newClusterWith(t, func(cfg *tcluster.Config) {
		cfg.ClusterCIDR = hostileClusterCIDRs
		// podnet-routed talks to 172.30.0.250 itself (no forwarder on
		// its loopback): a route over the API server's address would
		// cut it off, and the daemon knows the API server's address.
		cfg.APIProxy = false
	})
	c.grantRBAC()
	ctx := context.Background()

	// The default ServiceCIDR (from --service-cluster-ip-range) and one
	// more, as an operator extending the service range adds.
	if sc, err := c.client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Errorf("the API server's default ServiceCIDR: %v", err)
	} else {
		t.Logf("ServiceCIDR kubernetes: %v", sc.Spec.CIDRs)
	}
	if _, err := c.client.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extraServiceCIDR}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ServiceCIDR extra: %v", err)
	}

	w := &world{nodes: map[string]*mNode{}, observers: []string{"node-a", "node-b", "node-c"}}
	obsNodes := map[string]*node{}
	for i, name := range w.observers {
		ip := fmt.Sprintf("172.30.0.%d", i+1)
		cidr := fmt.Sprintf("10.244.%d.0/24", i+1)
		obsNodes[name] = c.addNode(name, ip)
		c.createNode(name, ip, cidr)
		w.nodes[name] = &mNode{podCIDR: cidr, via: ip}
	}
	a := obsNodes["node-a"]
	// node-a has an address of its own outside its subnets (a /32 on lo:
	// no main-table route comes with it) and a foreign route to the
	// PodCIDR of a Node to come (Must show 5).
	a.addPodAddr("10.96.200.1")
	a.addRoute("10.244.40.0/24", "172.30.0.81", uplinkName, unix.RTPROT_STATIC)

	// The older Nodes: the victims of the newer ones.
	for _, s := range []nodeSpec{
		{name: "z-victim", ip: "172.30.0.20", podCIDR: "10.244.20.0/24"},
		{name: "ipdup-old", ip: "172.30.0.60", podCIDR: "10.244.60.0/24"},
	} {
		c.createNodeSpec(s)
		w.nodes[s.name] = &mNode{podCIDR: s.podCIDR, via: s.ip}
	}

	ds := map[string]*daemon{}
	for _, name := range w.observers {
		ds[name] = obsNodes[name].startDaemon()
	}
	if !settle(t, syncT, "before the hostile Nodes", func() []string { return w.check(ds) }) {
		t.FailNow()
	}

	// creationTimestamp has a 1 s resolution: the hostile Nodes are
	// younger than every Node above.
	time.Sleep(1100 * time.Millisecond)
	cases := []hostileCase{
		{what: "podCIDR 0.0.0.0/0", spec: nodeSpec{name: "rsv-all", ip: "172.30.0.101", podCIDR: "0.0.0.0/0"}, reason: "reserved-range"},
		{what: "podCIDR 0.0.0.0/1", spec: nodeSpec{name: "rsv-half", ip: "172.30.0.102", podCIDR: "0.0.0.0/1"}, reason: "reserved-range"},
		{what: "podCIDR swallowing the cluster CIDR", spec: nodeSpec{name: "outside", ip: "172.30.0.103", podCIDR: "10.0.0.0/8"}, reason: "outside-cluster-cidr"},
		{what: "podCIDR covering the whole underlay and the API server", spec: nodeSpec{name: "underlay-all", ip: "172.30.0.104", podCIDR: "172.30.0.0/16"}, reason: "outside-cluster-cidr"},
		{what: "podCIDR on the default service CIDR", spec: nodeSpec{name: "svc-default", ip: "172.30.0.105", podCIDR: "10.96.0.0/24"}, reason: "overlaps-service-cidr"},
		{what: "podCIDR inside an added ServiceCIDR", spec: nodeSpec{name: "svc-object", ip: "172.30.0.106", podCIDR: "10.96.8.0/25"}, reason: "overlaps-service-cidr"},
		{what: "podCIDR covering half the underlay and the API server", spec: nodeSpec{name: "api-cover", ip: "172.30.0.107", podCIDR: "172.30.0.128/25"}, reason: "overlaps-apiserver"},
		{what: "podCIDR on the API server, more specific than the underlay route", spec: nodeSpec{name: "api-exact", ip: "172.30.0.108", podCIDR: "172.30.0.248/29"}, reason: "overlaps-apiserver"},
		{what: "podCIDR inside the underlay's connected route", spec: nodeSpec{name: "underlay-part", ip: "172.30.0.109", podCIDR: "172.30.0.192/27"}, reason: "overlaps-node-network"},
		{what: "podCIDR over node-a's own address (on lo)", spec: nodeSpec{name: "addr-cover", ip: "172.30.0.110", podCIDR: "10.96.200.0/24"},
			by: map[string]string{"node-a": "overlaps-node-network"}},
		{what: "podCIDR inside node-a's PodCIDR", spec: nodeSpec{name: "inner", ip: "172.30.0.111", podCIDR: "10.244.1.128/25"},
			by: map[string]string{"node-a": "overlaps-own-podcidr", "node-b": "podcidr-conflict", "node-c": "podcidr-conflict"}},
		{what: "podCIDR with host bits set", spec: nodeSpec{name: "hostbits", ip: "172.30.0.112", podCIDR: "10.244.5.1/24"}, reason: "invalid-podcidr"},
		{what: "InternalIP of node-a", spec: nodeSpec{name: "own-ip", ip: "172.30.0.1", podCIDR: "10.244.50.0/24"},
			by: map[string]string{"node-a": "own-node-ip", "node-b": "node-ip-conflict", "node-c": "node-ip-conflict"}},
		{what: "InternalIP inside the cluster CIDR", spec: nodeSpec{name: "badip", ip: "10.244.99.1", podCIDR: "10.244.62.0/24"}, reason: "invalid-node-ip"},
		{what: "same PodCIDR as an older Node, name sorting first", spec: nodeSpec{name: "a-thief", ip: "172.30.0.21", podCIDR: "10.244.20.0/24"}, reason: "podcidr-conflict"},
		{what: "a /23 over an older Node's /24", spec: nodeSpec{name: "a-wide", ip: "172.30.0.22", podCIDR: "10.244.20.0/23"}, reason: "podcidr-conflict",
			later: true}, // younger than a-thief, which it overlaps too
		{what: "same InternalIP as an older Node", spec: nodeSpec{name: "a-ipdup-new", ip: "172.30.0.60", podCIDR: "10.244.61.0/24"}, reason: "node-ip-conflict"},
		{what: "node-ip annotation not among its addresses", spec: nodeSpec{name: "ann", ip: "172.30.0.70", extIP: "172.30.0.71", ann: "172.30.0.99", podCIDR: "10.244.70.0/24"}},
		{what: "PodCIDR held by a foreign route on node-a", spec: nodeSpec{name: "foreign", ip: "172.30.0.80", podCIDR: "10.244.40.0/24"},
			by: map[string]string{"node-a": "overlaps-node-network"}},
		{what: "next hop the kernel cannot route to", spec: nodeSpec{name: "unreach", ip: "192.168.77.7", podCIDR: "10.244.41.0/24"}, noRoute: true},
	}
	create := func(hc hostileCase) {
		// The API server (v1.34) takes every one of these, host bits
		// and 0.0.0.0/0 included: podnet-routed is the only check.
		if err := c.tryCreateNode(hc.spec); err != nil {
			t.Fatalf("%s (%s): %v", hc.spec.name, hc.what, err)
		}
		m := &mNode{podCIDR: hc.spec.podCIDR, via: hc.spec.ip, noRoute: hc.noRoute, refused: map[string]string{}}
		for _, obs := range w.observers {
			if r, ok := hc.by[obs]; ok {
				m.refused[obs] = r
			} else if hc.reason != "" {
				m.refused[obs] = hc.reason
			}
		}
		w.nodes[hc.spec.name] = m
	}
	for _, hc := range cases {
		if !hc.later {
			create(hc)
		}
	}
	// A second later, the younger ones, and a good Node (a refused Node
	// must not hold a PodCIDR against younger ones).
	time.Sleep(1100 * time.Millisecond)
	for _, hc := range cases {
		if hc.later {
			create(hc)
		}
	}
	c.createNode("good-late", "172.30.0.90", "10.244.90.0/24")
	w.nodes["good-late"] = &mNode{podCIDR: "10.244.90.0/24", via: "172.30.0.90"}
	for _, obs := range w.observers {
		t.Logf("%s must have: routes %q; podnet_nodes_refused %s", obs, w.routes(obs), gaugeString(w.gauge(obs)))
	}

	settle(t, changeT, "hostile Nodes refused, the good ones routed", func() []string { return w.check(ds) })

	// One Event and one log line per refusal and observer.
	checkRefusals := func() []string {
		evs, err := c.nodeEvents("NodeRefused")
		if err != nil {
			return []string{err.Error()}
		}
		var bad []string
		for name, m := range w.nodes {
			for _, obs := range w.observers {
				reason := m.refused[obs]
				logs := ds[obs].refusalLogs("node refused", name)
				if reason == "" {
					for _, e := range evs[name] {
						if strings.HasPrefix(e.Message, "podnet-routed on "+obs+": ") {
							bad = append(bad, fmt.Sprintf("Node %s is routed by %s, yet it has a NodeRefused Event from it: %q", name, obs, e.Message))
						}
					}
					if len(logs) > 0 {
						bad = append(bad, fmt.Sprintf("Node %s is routed by %s, yet its log refuses it: %v", name, obs, logs))
					}
					continue
				}
				if p := checkEvent(evs[name], name, obs, "NodeRefused", corev1.EventTypeWarning); p != "" {
					bad = append(bad, p)
				}
				switch {
				case len(logs) != 1:
					bad = append(bad, fmt.Sprintf("Node %s: %d \"node refused\" log records on %s, want 1: %v", name, len(logs), obs, logs))
				case logs[0]["reason"] != reason || logs[0]["detail"] == "" || logs[0]["detail"] == nil:
					bad = append(bad, fmt.Sprintf("Node %s: %s logs %v, want reason %s and a detail", name, obs, logs[0], reason))
				}
			}
		}
		return bad
	}
	settle(t, changeT, "one NodeRefused Event and log line per refusal", checkRefusals)

	// Nothing moves over two resyncs (full applies): no refused route
	// comes back, no refusal is reported again.
	steady(t, 2*resync+resync/2, "steady with the hostile Nodes", func() []string { return w.check(ds) })
	settle(t, 0, "no refusal reported twice", checkRefusals)
	for _, obs := range w.observers {
		if m, err := ds[obs].metrics(); err == nil {
			t.Logf("%s: podnet_apply_errors_total %v, podnet_routes_programmed %v", obs, m["podnet_apply_errors_total"], m["podnet_routes_programmed"])
		}
	}

	// A podnet-routed started now (its initial sync: the full list)
	// decides the same.
	ds["node-c"].stop()
	ds["node-c"] = obsNodes["node-c"].startDaemon()
	settle(t, syncT, "node-c restarted with the hostile Nodes there", func() []string { return w.check(ds) })

	// ---- the fixes ----
	accepted := map[string][]string{} // Node -> observers that must send NodeAccepted
	fixedInPlace := func(name string) {
		m := w.nodes[name]
		for obs := range m.refused {
			accepted[name] = append(accepted[name], obs)
		}
		m.refused = nil
	}
	// Deleted.
	deleted := []string{"rsv-all", "rsv-half", "outside", "underlay-all", "svc-default", "svc-object",
		"api-cover", "api-exact", "underlay-part", "addr-cover", "inner", "badip", "hostbits"}
	for _, name := range deleted {
		c.deleteNode(name)
		delete(w.nodes, name)
	}
	// Re-created right.
	c.createNode("hostbits", "172.30.0.112", "10.244.5.0/24")
	w.nodes["hostbits"] = &mNode{podCIDR: "10.244.5.0/24", via: "172.30.0.112"}
	// Fixed in place (a status or annotation change is the next event).
	c.setNodeIP("own-ip", "172.30.0.50")
	w.nodes["own-ip"].via = "172.30.0.50"
	fixedInPlace("own-ip")
	c.setNodeIP("a-ipdup-new", "172.30.0.61")
	w.nodes["a-ipdup-new"].via = "172.30.0.61"
	fixedInPlace("a-ipdup-new")
	c.setNodeIP("unreach", "172.30.0.77")
	w.nodes["unreach"].via = "172.30.0.77"
	w.nodes["unreach"].noRoute = false
	// The annotation, now one of the Node's addresses, is its next hop.
	c.setAnnotation("ann", "172.30.0.71")
	w.nodes["ann"].via = "172.30.0.71"
	settle(t, changeT, "bad Nodes deleted or fixed", func() []string { return w.check(ds) })

	// The foreign route goes: node-a routes the Node (at the latest at the
	// next resync).
	a.delRoutes("10.244.40.0/24")
	fixedInPlace("foreign")
	settle(t, resync+changeT, "foreign route removed", func() []string { return w.check(ds) })

	// The older of the duplicates goes: the next one in age gets the
	// route on every node, whatever the names; then the last.
	c.deleteNode("z-victim")
	delete(w.nodes, "z-victim")
	fixedInPlace("a-thief")
	settle(t, changeT, "z-victim deleted: a-thief routed, a-wide still refused", func() []string { return w.check(ds) })
	c.deleteNode("a-thief")
	delete(w.nodes, "a-thief")
	fixedInPlace("a-wide")
	settle(t, changeT, "a-thief deleted: a-wide routed", func() []string { return w.check(ds) })

	settle(t, changeT, "one NodeAccepted Event and log line per Node fixed in place", func() []string {
		evs, err := c.nodeEvents("NodeAccepted")
		if err != nil {
			return []string{err.Error()}
		}
		var bad []string
		for name, observers := range accepted {
			for _, obs := range observers {
				if p := checkEvent(evs[name], name, obs, "NodeAccepted", corev1.EventTypeNormal); p != "" {
					bad = append(bad, p)
				}
				if logs := ds[obs].refusalLogs("node accepted", name); len(logs) != 1 {
					bad = append(bad, fmt.Sprintf("Node %s: %d \"node accepted\" log records on %s, want 1: %v", name, len(logs), obs, logs))
				}
			}
		}
		return bad
	})
	steady(t, resync+resync/2, "steady after the fixes", func() []string { return w.check(ds) })

	// What a refused Node's deletion says (the contract does not say).
	if evs, err := c.nodeEvents("NodeAccepted"); err == nil {
		for _, name := range deleted[:2] {
			for _, e := range evs[name] {
				t.Logf("refused Node %s deleted: NodeAccepted Event %q", name, e.Message)
			}
		}
	}
}

// nodeJSON reads node.json as raw JSON (fields the State type may not
// have, such as "error").
func (n *node) nodeJSON() (map[string]any, error) {
	data, err := os.ReadFile(filepath.Join(n.stateDir, nodestate.FileName))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("node.json %q: %w", data, err)
	}
	return m, nil
}

// TestOwnNodeMissing: a node whose own Node has no PodCIDR, or is deleted,
// is not ready and says why (readyz, node.json's "error"), while the routes
// of the other Nodes keep converging (a new Node routed, a deleted one
// pruned) and its old blackhole goes.
func TestOwnNodeMissing(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	x := c.addNode("node-x", "172.30.0.9")
	route := func(n int) string { return fmt.Sprintf("10.244.%d.0/24 via 172.30.0.%d dev eth0 proto 77", n, n) }
	remote := func(n int) {
		c.createNode(fmt.Sprintf("r%d", n), fmt.Sprintf("172.30.0.%d", n), fmt.Sprintf("10.244.%d.0/24", n))
	}
	remote(11)
	remote(12)
	c.createNode("node-x", x.ip, "") // registered, no PodCIDR yet
	d := x.startDaemon()

	// expect checks routes, /healthz, and either (usable) readyz 200 and
	// node.json with the PodCIDR, or readyz 503 with a reason and
	// node.json's error.
	expect := func(usable bool, want ...string) func() []string {
		return func() []string {
			var bad []string
			if err := d.alive(); err != nil {
				return []string{err.Error()}
			}
			if got, err := x.podnetRoutes(); err != nil || !slices.Equal(got, sorted(want...)) {
				bad = append(bad, fmt.Sprintf("routes: %s (%v)", routeDiff(got, sorted(want...)), err))
			}
			code, body := d.status("/readyz")
			switch {
			case usable && code != http.StatusOK:
				bad = append(bad, fmt.Sprintf("/readyz %d %q", code, body))
			case !usable && (code != http.StatusServiceUnavailable || !strings.Contains(body, "node-x") && !strings.Contains(strings.ToLower(body), "podcidr")):
				bad = append(bad, fmt.Sprintf("/readyz %d %q, want 503 saying why (naming the node or its PodCIDR)", code, body))
			}
			if code, body := d.status("/healthz"); code != http.StatusOK {
				bad = append(bad, fmt.Sprintf("/healthz %d %q", code, body))
			}
			st, err := x.nodeJSON()
			switch {
			case err != nil:
				bad = append(bad, err.Error())
			case !usable:
				if e, _ := st["error"].(string); e == "" {
					bad = append(bad, fmt.Sprintf("node.json has no \"error\": %v", st))
				}
			case st["error"] != nil:
				bad = append(bad, fmt.Sprintf("node.json still has an error: %v", st))
			case fmt.Sprint(st["podCIDRs"]) != "[10.244.9.0/24]":
				bad = append(bad, fmt.Sprintf("node.json podCIDRs %v, want [10.244.9.0/24]", st["podCIDRs"]))
			}
			return bad
		}
	}
	notReady := func(want ...string) func() []string { return expect(false, want...) }
	ready := func(want ...string) func() []string { return expect(true, want...) }
	logState := func(when string) {
		code, body := d.status("/readyz")
		st, err := x.nodeJSON()
		t.Logf("%s: /readyz %d %q; node.json %v %v", when, code, body, st, err)
	}

	// Own Node without PodCIDR: the remote Nodes are routed all the same.
	settle(t, syncT, "own Node without PodCIDR at start", notReady(route(11), route(12)))
	logState("own Node without PodCIDR")
	remote(13)
	c.deleteNode("r11")
	settle(t, changeT, "own Node without PodCIDR: r13 added, r11 deleted", notReady(route(12), route(13)))

	// The PodCIDR comes: ready, blackhole, node.json.
	c.assignPodCIDR("node-x", "10.244.9.0/24")
	bh := "blackhole 10.244.9.0/24 proto 77"
	settle(t, changeT, "own PodCIDR assigned", ready(bh, route(12), route(13)))

	// Own Node deleted: not ready, the blackhole goes, the others converge.
	c.deleteNode("node-x")
	settle(t, changeT, "own Node deleted", notReady(route(12), route(13)))
	logState("own Node deleted")
	remote(14)
	c.deleteNode("r12")
	settle(t, changeT, "own Node deleted: r14 added, r12 deleted", notReady(route(13), route(14)))

	// A restart meanwhile (the DaemonSet's pod restarted) keeps routing.
	d.stop()
	d = x.startDaemon()
	remote(15)
	settle(t, syncT, "restarted with its own Node deleted: r15 added", notReady(route(13), route(14), route(15)))

	// The Node is back.
	c.createNode("node-x", x.ip, "10.244.9.0/24")
	settle(t, changeT, "own Node re-created", ready(bh, route(13), route(14), route(15)))
	if _, err := c.client.CoreV1().Nodes().Get(context.Background(), "r12", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("r12 still exists: %v", err)
	}
}
