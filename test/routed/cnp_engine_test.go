package routed

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/podnet/podnet/routed/kube"
	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/engine"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// lastWriter is an engine.Writer that keeps the last Ruleset (no kernel).
type lastWriter struct {
	mu sync.Mutex
	rs *policy.Ruleset
}

func (w *lastWriter) Apply(rs policy.Ruleset) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rs = &rs
	return nil
}

func (w *lastWriter) ApplyDelta(d policy.Delta) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var rs policy.Ruleset
	if w.rs != nil {
		rs = *w.rs
	}
	rs = rs.With(d)
	w.rs = &rs
	return nil
}

func (w *lastWriter) Resync(policy.Ruleset) (bool, error) { return false, nil }

func (w *lastWriter) DropCounters() (map[engine.DropKey]uint64, error) { return nil, nil }

func (w *lastWriter) Revoke(func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	return 0, nil
}

func (w *lastWriter) RevokeOf([]netip.Addr, func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	return 0, nil
}

func (w *lastWriter) Delete() error { return nil }

func (w *lastWriter) last() (policy.Ruleset, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rs == nil {
		return policy.Ruleset{}, false
	}
	return *w.rs, true
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

const cnpCRD = "clusternetworkpolicies.policy.networking.k8s.io"

// installCNPCRD creates the ClusterNetworkPolicy CRD of the
// network-policy-api module podnet builds with, and waits until it is
// established.
func installCNPCRD(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api")
	cmd.Dir = nettest.RepoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("find the network-policy-api module: %v", err)
	}
	path := filepath.Join(strings.TrimSpace(string(out)), "config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.ToJSON(raw)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var crd unstructured.Unstructured
	if err := crd.UnmarshalJSON(js); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	ctx := context.Background()
	if _, err := dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	nettest.Eventually(t, 30*time.Second, "CRD established", func() error {
		got, err := dyn.Resource(crdGVR).Get(ctx, cnpCRD, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("not established: %v", conds)
	})
}

// deleteCNPCRD deletes the CRD and waits until it is gone (its objects
// with it).
func deleteCNPCRD(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	ctx := context.Background()
	if err := dyn.Resource(crdGVR).Delete(ctx, cnpCRD, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete CRD: %v", err)
	}
	nettest.Eventually(t, 60*time.Second, "CRD gone", func() error {
		_, err := dyn.Resource(crdGVR).Get(ctx, cnpCRD, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// denyDB is an Admin ClusterNetworkPolicy: no ingress to app=db, no
// egress from it to the Nodes labelled role=control.
func denyDB(name string) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnpv1.ClusterNetworkPolicySpec{
			Tier: cnpv1.AdminTier, Priority: 10,
			Subject: cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			}},
			Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{
				Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				From:   []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
			}},
			Egress: []cnpv1.ClusterNetworkPolicyEgressRule{{
				Action: cnpv1.ClusterNetworkPolicyRuleActionDeny,
				To:     []cnpv1.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "control"}}}},
			}},
		},
	}
}

// cnpEngine is one node's engine against the API server.
type cnpEngine struct {
	w *lastWriter
	m *engine.Metrics
}

func startCNPEngine(t *testing.T, ctx context.Context, s *kapi.Server, client kubernetes.Interface, node string) *cnpEngine {
	t.Helper()
	cfg, err := s.AdminConfig()
	if err != nil {
		t.Fatal(err)
	}
	core, err := kube.CoreClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pods, nss, pols, err := kube.PolicyListWatches(cfg, core)
	if err != nil {
		t.Fatal(err)
	}
	cnps, served, err := kube.ClusterPolicyListWatch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ev := kube.NewPolicyEvents(client.CoreV1().RESTClient(), node, log)
	go ev.Run(ctx)
	ce := &cnpEngine{w: &lastWriter{}, m: engine.NewMetrics(prometheus.NewRegistry(), nil)}
	e := engine.New(engine.Config{NodeName: node, Resync: 200 * time.Millisecond, ProcSys: t.TempDir(),
		Events: ev, ClusterEvents: ev, ClusterPolicyPoll: 200 * time.Millisecond},
		engine.ListWatches{Pods: pods, Namespaces: nss, Policies: pols,
			ClusterPolicies: cnps, ClusterPoliciesServed: served, Nodes: kube.NodesListWatch(core)},
		ce.w, ce.m, log)
	e.SetLocalPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("%s: Run: %v", node, err)
		}
	})
	return ce
}

func (ce *cnpEngine) until(t *testing.T, what string, cond func(policy.Ruleset) bool) {
	t.Helper()
	nettest.Eventually(t, 30*time.Second, what, func() error {
		rs, ok := ce.w.last()
		if !ok || !cond(rs) {
			return fmt.Errorf("not yet; last Ruleset %+v", rs.Pods)
		}
		return nil
	})
}

// dbAdmin: db-0 is in the Admin tier for ingress and egress, and its
// egress to cp-1 denied; or, with !want, under no ClusterNetworkPolicy.
func dbAdmin(want bool) func(policy.Ruleset) bool {
	return func(rs policy.Ruleset) bool {
		if !want {
			return len(rs.Pods) == 0 && len(rs.Known) == 1
		}
		toNode := rs.Allows(netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("192.168.0.10"), policy.ProtoTCP, 6443)
		return len(rs.Pods) == 1 && len(rs.Pods[0].Admin[0]) == 1 && len(rs.Pods[0].Admin[1]) == 1 && !toNode
	}
}

// TestClusterPolicyEngineRealAPI: two nodes' engines against a real API
// server without the ClusterNetworkPolicy CRD start and write at once;
// the CRD installed, a ClusterNetworkPolicy created with the typed client
// reaches both (a nodes peer resolved from a real Node); one refused in
// part gets one Event in the cluster; the CRD deleted (its policies with
// it) and created again, the engines follow.
func TestClusterPolicyEngineRealAPI(t *testing.T) {
	s := kapi.Start(t)
	cfg, err := s.AdminConfig()
	if err != nil {
		t.Fatal(err)
	}
	client := s.Client()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cnpc, err := cnpclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := tcluster.EnsureServiceAccount(ctx, client, "shop"); err != nil {
		t.Fatal(err)
	}
	p, err := client.CoreV1().Pods("shop").Create(ctx, tcluster.PodObject(tcluster.PodSpec{Namespace: "shop", Name: "db-0", Labels: map[string]string{"app": "db"}}, "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.5"}}
	p.Status.Phase = corev1.PodRunning
	if _, err := client.CoreV1().Pods("shop").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1", Labels: map[string]string{"role": "control"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.10"}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	engines := []*cnpEngine{startCNPEngine(t, ctx, s, client, "node-a"), startCNPEngine(t, ctx, s, client, "node-b")}
	a := engines[0]
	a.until(t, "first write without the CRD", dbAdmin(false))
	if got := testutil.ToFloat64(a.m.ClusterWatching); got != 0 {
		t.Fatalf("podnet_policy_cluster_watching %v without the CRD", got)
	}

	// discovery needs no RBAC: podnet-routed's user, granted nothing
	// here, is told whether the resource is served
	path, err := s.WriteKubeconfig(kapi.RoutedUser, "")
	if err != nil {
		t.Fatal(err)
	}
	routedCfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	_, routedServed, err := kube.ClusterPolicyListWatch(routedCfg)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := routedServed(ctx); ok || err != nil {
		t.Fatalf("discovery as %s without the CRD: %v, %v; want false, nil", kapi.RoutedUser, ok, err)
	}
	installCNPCRD(t, dyn)
	nettest.Eventually(t, 10*time.Second, "discovery as "+kapi.RoutedUser+" says served", func() error {
		if ok, err := routedServed(ctx); !ok || err != nil {
			return fmt.Errorf("%v, %v; want true, nil", ok, err)
		}
		return nil
	})
	if _, err := cnpc.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, denyDB("deny-db"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.until(t, "the CRD appeared: db-0 under deny-db", dbAdmin(true))

	bad := denyDB("half-read")
	bad.Spec.Egress = append(bad.Spec.Egress, cnpv1.ClusterNetworkPolicyEgressRule{
		Action: cnpv1.ClusterNetworkPolicyRuleActionAccept,
		To:     []cnpv1.ClusterNetworkPolicyEgressPeer{{DomainNames: []cnpv1.DomainName{"example.com"}}},
	})
	bad, err = cnpc.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, bad, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range engines {
		nettest.Eventually(t, 30*time.Second, "refusal counted on every node", func() error {
			if got := testutil.ToFloat64(e.m.ClusterRefused); got != 1 {
				return fmt.Errorf("podnet_policy_cluster_refused %v", got)
			}
			return nil
		})
	}
	nettest.Eventually(t, 30*time.Second, "one Event in the cluster", func() error {
		list, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ClusterNetworkPolicy"})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Events: %+v", len(list.Items), list.Items)
		}
		ev := list.Items[0]
		if ev.InvolvedObject.Name != "half-read" || ev.InvolvedObject.UID != bad.UID || ev.Type != corev1.EventTypeWarning ||
			!strings.Contains(ev.Message, "spec.egress[1].to[0].domainNames") {
			return fmt.Errorf("Event %+v", ev)
		}
		return nil
	})

	deleteCNPCRD(t, dyn)
	a.until(t, "the CRD went: no ClusterNetworkPolicy", dbAdmin(false))
	for _, e := range engines {
		nettest.Eventually(t, 30*time.Second, "not watching", func() error {
			if w, c := testutil.ToFloat64(e.m.ClusterWatching), testutil.ToFloat64(e.m.ClusterPolicies); w != 0 || c != 0 {
				return fmt.Errorf("watching %v, policies %v", w, c)
			}
			return nil
		})
	}
	installCNPCRD(t, dyn)
	if _, err := cnpc.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, denyDB("deny-db-again"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.until(t, "the CRD is back: db-0 under deny-db-again", dbAdmin(true))
	for _, e := range engines {
		nettest.Eventually(t, 30*time.Second, "one policy held", func() error {
			if c := testutil.ToFloat64(e.m.ClusterPolicies); c != 1 {
				return fmt.Errorf("policies %v", c)
			}
			return nil
		})
	}
	cancel()
}
