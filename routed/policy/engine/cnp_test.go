package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/routed/policy"
)

// gatedLW is a list-watch whose List waits until open is closed (or the
// test ends), and counts its Lists. It has only List and Watch, so that
// the reflector calls these.
type gatedLW struct {
	src   *fcache.FakeControllerSource
	open  chan struct{}
	done  chan struct{}
	lists atomic.Int32
}

func (g *gatedLW) List(o metav1.ListOptions) (runtime.Object, error) {
	g.lists.Add(1)
	select {
	case <-g.open:
	case <-g.done:
		return nil, fmt.Errorf("test over")
	}
	return g.src.List(o)
}

func (g *gatedLW) Watch(o metav1.ListOptions) (watch.Interface, error) { return g.src.Watch(o) }

// fakeClusterEvents records the ClusterNetworkPolicy Events.
type fakeClusterEvents struct {
	mu  sync.Mutex
	got []string // "name uid type reason: message"
}

func (f *fakeClusterEvents) ClusterPolicy(name string, uid types.UID, typ, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, fmt.Sprintf("%s %s %s %s: %s", name, uid, typ, reason, message))
}

func (f *fakeClusterEvents) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

// cnpRig is rig with ClusterNetworkPolicies and Nodes: served says
// whether the API server serves ClusterNetworkPolicies (the CRD), gate
// holds their List until opened.
type cnpRig struct {
	*rig
	cnps, nodes *fcache.FakeControllerSource
	gate        *gatedLW
	served      atomic.Bool
	// failDiscovery: the served question gets an error
	failDiscovery atomic.Bool
	cev           *fakeClusterEvents
}

// newCNPRig starts an engine with the CRD served or not; with gated, the
// ClusterNetworkPolicy List waits for r.gate.open. before runs before
// the engine starts.
func newCNPRig(t *testing.T, served, gated bool, before func(*cnpRig)) *cnpRig {
	return newCNPRigNodes(t, served, gated, before, false)
}

// newCNPRigNodes is newCNPRig; with shared, the engine hears a Node
// informer it does not run (ListWatches.NodeInformer, as podnet-routed's
// daemon's, which keeps each Node as a desired.Record) instead of
// watching r.nodes itself.
func newCNPRigNodes(t *testing.T, served, gated bool, before func(*cnpRig), shared bool) *cnpRig {
	r := &cnpRig{
		rig:  &rig{t: t, pods: fcache.NewFakeControllerSource(), nss: fcache.NewFakeControllerSource(), pols: fcache.NewFakeControllerSource(), w: &fakeWriter{}, ev: &fakeEvents{}},
		cnps: fcache.NewFakeControllerSource(), nodes: fcache.NewFakeControllerSource(), cev: &fakeClusterEvents{},
	}
	r.gate = &gatedLW{src: r.cnps, open: make(chan struct{}), done: make(chan struct{})}
	if !gated {
		close(r.gate.open)
	}
	r.served.Store(served)
	r.reg = prometheus.NewRegistry()
	r.m = NewMetrics(r.reg, nil)
	r.sock = filepath.Join(t.TempDir(), policysock.FileName)
	lws := ListWatches{Pods: r.pods, Namespaces: r.nss, Policies: r.pols, ClusterPolicies: r.gate, Nodes: r.nodes}
	if shared {
		lws.Nodes, lws.NodeInformer = nil, cache.NewSharedIndexInformer(r.nodes, &corev1.Node{}, 0, cache.Indexers{})
		if err := lws.NodeInformer.SetTransform(desired.Transform(true)); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		go lws.NodeInformer.Run(stop)
		t.Cleanup(func() { close(stop) })
	}
	r.e = New(Config{NodeName: node, Resync: 50 * time.Millisecond, SocketPath: r.sock, ProcSys: t.TempDir(),
		Events: r.ev, ClusterEvents: r.cev, ClusterPolicyPoll: 20 * time.Millisecond},
		ListWatches{Pods: lws.Pods, Namespaces: lws.Namespaces, Policies: lws.Policies, ClusterPolicies: lws.ClusterPolicies,
			Nodes: lws.Nodes, NodeInformer: lws.NodeInformer,
			ClusterPoliciesServed: func(context.Context) (bool, error) {
				if r.failDiscovery.Load() {
					return false, fmt.Errorf("discovery: 403 Forbidden")
				}
				return r.served.Load(), nil
			}},
		r.w, r.m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r.e.SetLocalPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	r.nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "a"}}})
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pods.Add(pod("web-0", "10.244.1.6", map[string]string{"app": "web"}))
	if before != nil {
		before(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		close(r.gate.done)
		if err := <-r.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// adminDenyDB is an Admin ClusterNetworkPolicy denying ingress to app=db
// pods from every namespace.
func adminDenyDB(name string, tier cnpv1.Tier) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: cnpv1.ClusterNetworkPolicySpec{
			Tier: tier, Priority: 10,
			Subject: cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			}},
			Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{
				Name: "no-one", Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
			}},
		},
	}
}

// tiers are db-0's Admin and Baseline ingress lists in rs.
func tiers(rs policy.Ruleset) (admin, baseline []string) {
	for _, p := range rs.Pods {
		if p.Name == "db-0" {
			return p.Admin[0], p.Baseline[0]
		}
	}
	return nil, nil
}

func adminOnly(n int) func(policy.Ruleset) bool {
	return func(rs policy.Ruleset) bool { a, b := tiers(rs); return len(a) == n && len(b) == 0 }
}

func gauge(t *testing.T, g prometheus.Gauge, want float64) {
	t.Helper()
	eventually(t, fmt.Sprintf("gauge %v", want), func() error {
		if got := testutil.ToFloat64(g); got != want {
			return fmt.Errorf("gauge %v, want %v", got, want)
		}
		return nil
	})
}

// TestClusterPolicyFollowsTheCluster: a ClusterNetworkPolicy's add, update
// (to the Baseline tier) and delete each reach the Ruleset written: the
// pod's Admin and Baseline lists, and the gauge.
func TestClusterPolicyFollowsTheCluster(t *testing.T) {
	r := newCNPRig(t, true, false, nil)
	r.until("pods known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") && len(rs.Pods) == 0 })
	r.cnps.Add(adminDenyDB("deny-db", cnpv1.AdminTier))
	rs := r.until("db-0 in the Admin tier", adminOnly(1))
	if i := slices.IndexFunc(rs.Policies, func(p policy.PolicyChain) bool { return p.Name == "deny-db" }); i < 0 ||
		rs.Policies[i].Tier != policy.TierAdmin || rs.Policies[i].Rules[0].Action != policy.ActionDeny {
		t.Fatalf("no Admin Deny chain for deny-db in %+v", rs.Policies)
	}
	if rs.Allows(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432) {
		t.Fatal("web-0 -> db-0 allowed under an Admin Deny")
	}
	gauge(t, r.m.ClusterPolicies, 1)
	gauge(t, r.m.ClusterWatching, 1)
	r.cnps.Modify(adminDenyDB("deny-db", cnpv1.BaselineTier))
	r.until("db-0 in the Baseline tier", func(rs policy.Ruleset) bool { a, b := tiers(rs); return len(a) == 0 && len(b) == 1 })
	r.cnps.Delete(adminDenyDB("deny-db", cnpv1.BaselineTier))
	r.until("db-0 under no ClusterNetworkPolicy", func(rs policy.Ruleset) bool { return len(rs.Pods) == 0 && known(rs, "10.244.1.5") })
	gauge(t, r.m.ClusterPolicies, 0)
}

// TestClusterPolicyBeforeFirstWrite: served at start, the first Ruleset
// written (and so the first ADD wait's answer) waits for the
// ClusterNetworkPolicy list.
func TestClusterPolicyBeforeFirstWrite(t *testing.T) {
	r := newCNPRig(t, true, true, func(r *cnpRig) { r.cnps.Add(adminDenyDB("deny-db", cnpv1.AdminTier)) })
	eventually(t, "the ClusterNetworkPolicy list asked", func() error {
		if r.gate.lists.Load() == 0 {
			return fmt.Errorf("not listed yet")
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	if _, n := r.w.last(); n != 0 {
		t.Fatalf("%d writes before the ClusterNetworkPolicies were listed", n)
	}
	close(r.gate.open)
	r.until("first write", func(policy.Ruleset) bool { return true })
	r.w.mu.Lock()
	first := r.w.applied[0]
	r.w.mu.Unlock()
	if !adminOnly(1)(first) {
		t.Fatalf("the first write has db-0 outside the Admin tier: %+v", first.Pods)
	}
}

// TestClusterPolicyCRDComesAndGoes: without the CRD the engine writes at
// once (never listing ClusterNetworkPolicies); when it appears the
// policies are watched; when it goes they leave the State even without
// delete events; when it comes back they are listed anew.
func TestClusterPolicyCRDComesAndGoes(t *testing.T) {
	r := newCNPRig(t, false, true, func(r *cnpRig) { r.cnps.Add(adminDenyDB("deny-db", cnpv1.AdminTier)) })
	r.until("first write without the CRD", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") && len(rs.Pods) == 0 })
	if n := r.gate.lists.Load(); n != 0 {
		t.Fatalf("ClusterNetworkPolicies listed %d times while not served", n)
	}
	gauge(t, r.m.ClusterWatching, 0)
	close(r.gate.open)
	r.served.Store(true)
	r.until("the CRD appeared: db-0 in the Admin tier", adminOnly(1))
	gauge(t, r.m.ClusterWatching, 1)

	// the CRD deleted: the informer stops, its policies leave the State
	r.served.Store(false)
	r.until("the CRD went: db-0 under no ClusterNetworkPolicy", func(rs policy.Ruleset) bool { return len(rs.Pods) == 0 })
	gauge(t, r.m.ClusterWatching, 0)
	gauge(t, r.m.ClusterPolicies, 0)
	// the API server deletes the objects with their CRD; the CRD comes
	// back with another policy
	r.cnps.Delete(adminDenyDB("deny-db", cnpv1.AdminTier))
	r.cnps.Add(adminDenyDB("deny-db-2", cnpv1.AdminTier))
	time.Sleep(100 * time.Millisecond) // polls: still not served
	if rs, _ := r.w.last(); len(rs.Pods) != 0 {
		t.Fatalf("a ClusterNetworkPolicy enforced while the CRD is gone: %+v", rs.Pods)
	}
	r.served.Store(true)
	rs := r.until("the CRD is back", adminOnly(1))
	if i := slices.IndexFunc(rs.Policies, func(p policy.PolicyChain) bool { return p.Name == "deny-db-2" }); i < 0 || len(rs.Policies) != 1 {
		t.Fatalf("chains %+v, want deny-db-2's alone", rs.Policies)
	}
	gauge(t, r.m.ClusterPolicies, 1)
}

// egressToNodes denies egress from app=web pods to the Nodes labelled
// role=control.
func egressToNodes() *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "no-control", UID: "uid-no-control"},
		Spec: cnpv1.ClusterNetworkPolicySpec{
			Tier: cnpv1.AdminTier, Priority: 5,
			Subject: cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			}},
			Egress: []cnpv1.ClusterNetworkPolicyEgressRule{{
				Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				To:     []cnpv1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "control"}}}},
			}},
		},
	}
}

func k8sNode(role string, ready corev1.ConditionStatus) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "cp-1", UID: "uid-cp-1", Labels: map[string]string{"role": role}},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.10"}, {Type: corev1.NodeHostName, Address: "cp-1"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}},
		},
	}
}

func webToNode(rs policy.Ruleset) bool {
	return rs.Allows(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("192.168.0.10"), policy.ProtoTCP, 6443)
}

// TestNodePeerFollowsNodes: a Node's labels decide whether a nodes peer
// selects its addresses, and each change is written; a Node update that
// changes neither labels nor addresses (a heartbeat) costs no compile.
func TestNodePeerFollowsNodes(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "own informer", true: "shared informer"}[shared], func(t *testing.T) {
			nodePeerFollowsNodes(t, shared)
		})
	}
}

func nodePeerFollowsNodes(t *testing.T, shared bool) {
	r := newCNPRigNodes(t, true, false, func(r *cnpRig) {
		r.cnps.Add(egressToNodes())
		r.nodes.Add(k8sNode("control", corev1.ConditionTrue))
	}, shared)
	r.until("web-0 -> cp-1 denied", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 && !webToNode(rs) })
	r.nodes.Modify(k8sNode("worker", corev1.ConditionTrue))
	r.until("relabelled: web-0 -> cp-1 allowed", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 && webToNode(rs) })
	r.nodes.Modify(k8sNode("control", corev1.ConditionTrue))
	r.until("labelled again: denied", func(rs policy.Ruleset) bool { return !webToNode(rs) })

	time.Sleep(100 * time.Millisecond) // the write loop settles
	r.e.mu.Lock()
	gen := r.e.gen
	r.e.mu.Unlock()
	_, writes := r.w.last()
	for range 5 {
		r.nodes.Modify(k8sNode("control", corev1.ConditionFalse))
		r.nodes.Modify(k8sNode("control", corev1.ConditionTrue))
	}
	time.Sleep(200 * time.Millisecond)
	r.e.mu.Lock()
	after := r.e.gen
	r.e.mu.Unlock()
	if _, n := r.w.last(); after != gen || n != writes {
		t.Fatalf("heartbeats changed the generation %d -> %d, writes %d -> %d", gen, after, writes, n)
	}
	r.nodes.Delete(k8sNode("control", corev1.ConditionTrue))
	r.until("cp-1 deleted: allowed", webToNode)
}

// TestClusterPolicyRefusalReported: a ClusterNetworkPolicy refused in part
// is logged, counted and gets one Warning Event (not one per compile);
// fixed, one Normal Event; deleted while refused, none.
func TestClusterPolicyRefusalReported(t *testing.T) {
	r := newCNPRig(t, true, false, nil)
	bad := egressToNodes()
	bad.Spec.Egress = append(bad.Spec.Egress, cnpv1.ClusterNetworkPolicyEgressRule{
		Action: cnpv1.ClusterNetworkPolicyRuleActionAccept,
		To:     []cnpv1.ClusterNetworkPolicyEgressPeer{{DomainNames: []cnpv1.DomainName{"example.com"}}},
	})
	r.cnps.Add(bad)
	r.until("web-0 under the policy", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	want := []string{"no-control uid-no-control Warning PolicyRefused: podnet refuses this ClusterNetworkPolicy in part: " +
		"spec.egress[1].to[0].domainNames: domainNames peers are not supported by podnet (they need DNS inspection on the packet path) " +
		"(the peer matches nothing); the rest of it is enforced"}
	eventually(t, "one Warning Event", func() error { return sameList(r.cev.list(), want) })
	gauge(t, r.m.ClusterRefused, 1)
	r.pods.Add(pod("web-1", "10.244.1.7", map[string]string{"app": "web"}))
	r.until("web-1 under the policy", func(rs policy.Ruleset) bool { return len(rs.Pods) == 2 })
	time.Sleep(200 * time.Millisecond) // resyncs
	if err := sameList(r.cev.list(), want); err != nil {
		t.Fatalf("after more compiles: %v", err)
	}
	r.cnps.Modify(egressToNodes())
	want = append(want, "no-control uid-no-control Normal PolicyAccepted: podnet enforces this ClusterNetworkPolicy whole again")
	eventually(t, "one Normal Event", func() error { return sameList(r.cev.list(), want) })
	gauge(t, r.m.ClusterRefused, 0)
	r.cnps.Modify(bad)
	gauge(t, r.m.ClusterRefused, 1)
	r.cnps.Delete(bad)
	gauge(t, r.m.ClusterRefused, 0)
	time.Sleep(200 * time.Millisecond)
	if n := len(r.cev.list()); n != 3 {
		t.Fatalf("Events %q, want 3 (none for the deleted policy)", r.cev.list())
	}
	if n := len(r.ev.list()); n != 0 {
		t.Fatalf("NetworkPolicy Events %q for a ClusterNetworkPolicy", r.ev.list())
	}
}

// syncLog is a log sink the engine's goroutines write.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWaitSyncedSaysWhatIsMissing: while the ClusterNetworkPolicy list
// does not come (RBAC, say), the engine writes nothing and says which
// list it waits for.
func TestWaitSyncedSaysWhatIsMissing(t *testing.T) {
	var logs syncLog
	r := newCNPRig(t, true, true, func(r *cnpRig) {
		r.e.log = slog.New(slog.NewTextHandler(&logs, nil))
		var mu sync.Mutex
		clock := time.Now()
		r.e.now = func() time.Time { // 10 s a reading: the 30 s warning comes at once
			mu.Lock()
			defer mu.Unlock()
			clock = clock.Add(10 * time.Second)
			return clock
		}
	})
	eventually(t, "the warning", func() error {
		if !strings.Contains(logs.String(), `still waiting for the informers' lists`) || !strings.Contains(logs.String(), `waiting="[ClusterNetworkPolicies and Nodes]"`) {
			return fmt.Errorf("log: %s", logs.String())
		}
		return nil
	})
	if _, n := r.w.last(); n != 0 {
		t.Fatalf("%d writes before the lists came", n)
	}
	close(r.gate.open)
	r.until("written once the list came", adminOnly(0))
}

// TestDiscoveryFailingDoesNotBlock: a discovery that keeps failing while
// the lists come does not hold the first write back; once it answers,
// the ClusterNetworkPolicies are watched.
func TestDiscoveryFailingDoesNotBlock(t *testing.T) {
	r := newCNPRig(t, true, false, func(r *cnpRig) {
		r.failDiscovery.Store(true)
		r.cnps.Add(adminDenyDB("deny-db", cnpv1.AdminTier))
	})
	r.until("first write without an answer from discovery", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") && len(rs.Pods) == 0 })
	r.failDiscovery.Store(false)
	r.until("discovery answered: db-0 in the Admin tier", adminOnly(1))
}

// TestClusterDropsCounted: a ClusterNetworkPolicy Deny rule's counter is
// podnet_policy_cluster_drops_total{tier,policy,rule}, and only its own.
func TestClusterDropsCounted(t *testing.T) {
	r := newCNPRig(t, true, false, nil)
	r.cnps.Add(adminDenyDB("no-db", cnpv1.AdminTier))
	rs := r.until("db-0 under no-db", adminOnly(1))
	var id string
	for _, p := range rs.Policies {
		if p.Name == "no-db" {
			id = p.ID
		}
	}
	r.w.mu.Lock()
	r.w.counters = map[DropKey]uint64{{PolicyID: id, Rule: 0, Direction: policy.Ingress}: 4, {PolicyID: "other", Direction: policy.Ingress}: 9}
	r.w.mu.Unlock()
	c := r.m.clusterDrops.vec.WithLabelValues("Admin", "no-db", "ingress 0 no-one")
	eventually(t, "the Deny rule's drops", func() error {
		if got := testutil.ToFloat64(c); got != 4 {
			return fmt.Errorf("podnet_policy_cluster_drops_total{Admin,no-db,ingress 0 no-one} = %v, want 4", got)
		}
		return nil
	})
	if n := testutil.CollectAndCount(r.m.clusterDrops.vec); n != 1 {
		t.Fatalf("%d cluster drop series, want 1 (the counter of no policy of the Ruleset is nobody's)", n)
	}
}
