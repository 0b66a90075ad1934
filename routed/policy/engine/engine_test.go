package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fcache "k8s.io/client-go/tools/cache/testing"

	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/threadprio"
	"github.com/podnet/podnet/routed/policy"
)

// fakeWriter records what the engine writes.
type fakeWriter struct {
	mu      sync.Mutex
	applied []policy.Ruleset
	resyncs int
	repair  bool
	revokes int
	// remoteToDB: what each scan said of the remote web-r -> db-0
	remoteToDB []bool
	// webToDB: what each revocation's verdict said of web-0 -> db-0 TCP 5432
	webToDB []bool
	// scans: the addresses each scan was for (nil: every connection);
	// scanNice: its thread's nice value
	scans    [][]netip.Addr
	scanNice []int
	counters map[DropKey]uint64
	failNext error
	// nice: the nice value of the thread of each Apply and ApplyDelta
	nice []int
}

// noteNice records the calling thread's nice value. Callers hold f.mu.
func (f *fakeWriter) noteNice() {
	if n, err := threadprio.Nice(); err == nil {
		f.nice = append(f.nice, n)
	}
}

func (f *fakeWriter) Apply(want policy.Ruleset) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noteNice()
	if err := f.failNext; err != nil {
		f.failNext = nil
		return err
	}
	f.applied = append(f.applied, want)
	return nil
}

func (f *fakeWriter) ApplyDelta(d policy.Delta) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noteNice()
	if err := f.failNext; err != nil {
		f.failNext = nil
		return err
	}
	var last policy.Ruleset
	if len(f.applied) > 0 {
		last = f.applied[len(f.applied)-1]
	}
	f.applied = append(f.applied, last.With(d))
	return nil
}

func (f *fakeWriter) Resync(policy.Ruleset) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resyncs++
	r := f.repair
	f.repair = false
	return r, nil
}

func (f *fakeWriter) DropCounters() (map[DropKey]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[DropKey]uint64{}
	for k, v := range f.counters {
		out[k] = v
	}
	return out, nil
}

func (f *fakeWriter) Revoke(allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	return f.revoke(nil, allowed)
}

// RevokeOf judges as nft.RevokeOf does: a connection of none of addrs
// keeps its verdict.
func (f *fakeWriter) RevokeOf(addrs []netip.Addr, allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	if addrs == nil {
		addrs = []netip.Addr{}
	}
	return f.revoke(addrs, func(src, dst netip.Addr, proto uint8, dport uint16) bool {
		return !slices.Contains(addrs, src) && !slices.Contains(addrs, dst) || allowed(src, dst, proto, dport)
	})
}

func (f *fakeWriter) revoke(addrs []netip.Addr, allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revokes++
	slices.SortFunc(addrs, netip.Addr.Compare)
	f.scans = append(f.scans, addrs)
	n, _ := threadprio.Nice()
	f.scanNice = append(f.scanNice, n)
	f.webToDB = append(f.webToDB, allowed(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432))
	f.remoteToDB = append(f.remoteToDB, allowed(netip.MustParseAddr("10.244.2.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432))
	return 0, nil
}

// revocations waits for the n-th revocation and returns what each said of
// web-0 -> db-0.
func (r *rig) revocations(n int) []bool {
	r.t.Helper()
	var got []bool
	eventually(r.t, fmt.Sprintf("%d revocations", n), func() error {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		got = slices.Clone(r.w.webToDB)
		if len(got) < n {
			return fmt.Errorf("%d revocations", len(got))
		}
		return nil
	})
	return got
}

func (f *fakeWriter) Delete() error { return nil }

func (f *fakeWriter) last() (policy.Ruleset, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return policy.Ruleset{}, 0
	}
	return f.applied[len(f.applied)-1], len(f.applied)
}

// fakeEvents records the Events the engine posts.
type fakeEvents struct {
	mu  sync.Mutex
	got []string // "namespace/name uid type reason: message"
}

func (f *fakeEvents) Policy(namespace, name string, uid types.UID, typ, reason, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, fmt.Sprintf("%s/%s %s %s %s: %s", namespace, name, uid, typ, reason, message))
}

func (f *fakeEvents) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

type rig struct {
	t               *testing.T
	pods, nss, pols *fcache.FakeControllerSource
	w               *fakeWriter
	ev              *fakeEvents
	e               *Engine
	m               *Metrics
	reg             *prometheus.Registry
	sock            string
	cancel          context.CancelFunc
	done            chan error
}

const node = "node-a"

func newRig(t *testing.T, before ...func(*Engine)) *rig {
	r := &rig{t: t, pods: fcache.NewFakeControllerSource(), nss: fcache.NewFakeControllerSource(), pols: fcache.NewFakeControllerSource(), w: &fakeWriter{}, ev: &fakeEvents{}}
	r.reg = prometheus.NewRegistry()
	r.m = NewMetrics(r.reg, nil)
	r.sock = filepath.Join(t.TempDir(), policysock.FileName)
	// (RevokeGoneGap 2s: the default 10s would only make the tests slower)
	r.e = New(Config{NodeName: node, Resync: 50 * time.Millisecond, SocketPath: r.sock, ProcSys: t.TempDir(), Events: r.ev, RevokeGoneGap: 2 * time.Second},
		ListWatches{Pods: r.pods, Namespaces: r.nss, Policies: r.pols}, r.w, r.m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, f := range before {
		f(r.e)
	}
	r.e.SetLocalPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	r.nss.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{"team": "a"}}})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// until polls cond (the engine works asynchronously) and fails after a
// generous bound: a liveness check, not a speed claim.
func (r *rig) until(what string, cond func(policy.Ruleset) bool) policy.Ruleset {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if rs, n := r.w.last(); n > 0 && cond(rs) {
			return rs
		}
		time.Sleep(5 * time.Millisecond)
	}
	rs, _ := r.w.last()
	r.t.Fatalf("never written: %s; last Ruleset %+v", what, rs)
	return rs
}

func pod(name, ip string, labels map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels, UID: "uid-" + "name"},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func denyIngress() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "deny-ingress"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
}

func known(rs policy.Ruleset, ip string) bool {
	for _, a := range rs.Known {
		if a == netip.MustParseAddr(ip) {
			return true
		}
	}
	return false
}

// TestEngineFollowsTheCluster: pods, policies and their deletion reach the
// kernel writer, and every change of the chains revokes what the new
// Ruleset no longer allows.
func TestEngineFollowsTheCluster(t *testing.T) {
	r := newRig(t)
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pods.Add(pod("web-0", "10.244.1.6", map[string]string{"app": "web"}))
	r.until("both pods known, none isolated", func(rs policy.Ruleset) bool {
		return known(rs, "10.244.1.5") && known(rs, "10.244.1.6") && len(rs.Pods) == 0
	})
	r.pols.Add(denyIngress())
	rs := r.until("db-0 isolated for ingress", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	if p := rs.Pods[0]; p.Name != "db-0" || !p.IngressIsolated || p.EgressIsolated {
		t.Fatalf("isolated %+v, want db-0 for ingress only", p)
	}
	if rs.Allows(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432) {
		t.Fatal("the written Ruleset still allows web-0 -> db-0")
	}
	// the revocation (beside the write loop) judges by the Ruleset written
	if got := r.revocations(1); got[0] {
		t.Fatalf("the revocation after the policy allowed web-0 -> db-0: %v", got)
	}
	r.pols.Delete(denyIngress())
	r.until("isolation lifted", func(rs policy.Ruleset) bool { return len(rs.Pods) == 0 && known(rs, "10.244.1.5") })
	if got := r.revocations(2); !got[1] {
		t.Fatalf("the revocation after the policy went refused web-0 -> db-0: %v", got)
	}
	r.pods.Delete(pod("db-0", "10.244.1.5", nil))
	r.until("db-0 forgotten", func(rs policy.Ruleset) bool { return !known(rs, "10.244.1.5") })
	// the policy's arrival and its deletion changed the chains; the pod's
	// deletion only the known addresses: no third scan
	time.Sleep(200 * time.Millisecond)
	if got := r.revocations(2); len(got) != 2 {
		t.Fatalf("%d revocations, want 2 (one per change of the chains)", len(got))
	}
}

// TestEngineAnswersTheADDWait: a plugin's request makes the pod known with
// the addresses it reports, before the Pod object shows them, and the
// answer comes only once that Ruleset is written.
func TestEngineAnswersTheADDWait(t *testing.T) {
	r := newRig(t)
	r.pods.Add(pod("cart-0", "", map[string]string{"app": "cart"}))
	r.until("first write", func(policy.Ruleset) bool { return true })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := policysock.Request{Namespace: "shop", Name: "cart-0", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.9")}}
	if err := policysock.Wait(ctx, r.sock, req); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if rs, _ := r.w.last(); !known(rs, "10.244.1.9") {
		t.Fatalf("answered before the pod's address was written: %+v", rs.Known)
	}
	// the Pod object catches up: nothing changes, the override is dropped
	r.pods.Modify(pod("cart-0", "10.244.1.9", map[string]string{"app": "cart"}))
	r.until("still known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.9") })

	// a pod of another node is refused, a pod the API never shows times out
	other := pod("elsewhere", "", nil)
	other.Spec.NodeName = "node-b"
	r.pods.Add(other)
	time.Sleep(100 * time.Millisecond) // let the informer see it
	err := policysock.Wait(ctx, r.sock, policysock.Request{Namespace: "shop", Name: "elsewhere", IPs: req.IPs})
	if err == nil || errors.Is(err, policysock.ErrNoEngine) {
		t.Fatalf("Wait for another node's pod: %v, want a refusal", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if err := policysock.Wait(short, r.sock, policysock.Request{Namespace: "shop", Name: "ghost", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.10")}}); err == nil {
		t.Fatal("Wait for a pod the API never showed succeeded")
	}
	if rs, _ := r.w.last(); known(rs, "10.244.1.10") {
		t.Fatal("a pod unknown to the API became known: it must stay isolated")
	}
}

// TestEngineRepairsAndCounts: a resync that finds the table changed counts
// a repair; a failed write is retried and counted; pod chains' drops are
// attributed to the policies isolating the pod.
func TestEngineRepairsAndCounts(t *testing.T) {
	r := newRig(t)
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pols.Add(denyIngress())
	rs := r.until("db-0 isolated", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	r.w.mu.Lock()
	r.w.repair = true
	r.w.counters = map[DropKey]uint64{{PodID: rs.Pods[0].ID, Direction: policy.Ingress}: 7}
	r.w.failNext = errors.New("netlink: no buffer space")
	r.w.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && (testutil.ToFloat64(r.m.Repairs) < 1 || testutil.ToFloat64(r.m.drops.vec.WithLabelValues("shop", "deny-ingress")) < 7) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := testutil.ToFloat64(r.m.Repairs); got < 1 {
		t.Fatalf("repairs %v after a resync found the table changed", got)
	}
	if got := testutil.ToFloat64(r.m.drops.vec.WithLabelValues("shop", "deny-ingress")); got != 7 {
		t.Fatalf("podnet_policy_drops_total{shop,deny-ingress} = %v, want 7", got)
	}
	// the failed write: the next change still gets written
	r.pods.Add(pod("db-1", "10.244.1.7", map[string]string{"app": "db"}))
	r.until("db-1 isolated after a failed write", func(rs policy.Ruleset) bool { return len(rs.Pods) == 2 })
	if got := testutil.ToFloat64(r.m.Errors); got < 1 {
		t.Fatalf("errors %v after a failed write", got)
	}
}

// TestDropCounterForgetsGonePods: the counter's memory of pod chains
// follows the pods that are there; a pod chain seen again after being
// forgotten counts from its current value (a new chain starts at 0).
func TestDropCounterForgetsGonePods(t *testing.T) {
	d := newDropCounter()
	d.observe("p1", policy.Ingress, "shop", "deny", 5)
	d.observe("p2", policy.Ingress, "shop", "deny", 3)
	d.observe("p1", policy.Ingress, "shop", "deny", 9)
	if got := testutil.ToFloat64(d.vec.WithLabelValues("shop", "deny")); got != 12 {
		t.Fatalf("drops %v, want 5+3+4", got)
	}
	d.forgetAllBut(map[dropSeen]bool{{pod: "p1", namespace: "shop", name: "deny", dir: policy.Ingress}: true})
	if len(d.last) != 1 {
		t.Fatalf("remembers %d pod chains after p2 went, want 1", len(d.last))
	}
	d.observe("p2", policy.Ingress, "shop", "deny", 2) // p2's chain written anew
	if got := testutil.ToFloat64(d.vec.WithLabelValues("shop", "deny")); got != 14 {
		t.Fatalf("drops %v, want 14", got)
	}
}

// TestEngineEventsForRefusedPolicy: a policy the engine refuses gets one
// Warning Event (with its UID), not one per compile; fixed, one Normal
// Event; a refused policy deleted gets none.
func TestEngineEventsForRefusedPolicy(t *testing.T) {
	r := newRig(t)
	bad := denyIngress()
	bad.UID = "uid-deny"
	bad.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.Protocol("ICMP"))}}}}
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pols.Add(bad)
	r.until("db-0 isolated by the refused policy", func(rs policy.Ruleset) bool { return len(rs.Pods) == 1 })
	want := []string{`shop/deny-ingress uid-deny Warning PolicyRefused: podnet refuses this NetworkPolicy: ` +
		`spec.ingress[0].ports[0].protocol: unsupported protocol "ICMP" (TCP, UDP or SCTP); it isolates the pods it selects and allows them nothing until it is fixed`}
	eventually(t, "one Warning Event", func() error { return sameList(r.ev.list(), want) })
	// more compiles (a pod, resyncs) say nothing again
	r.pods.Add(pod("web-0", "10.244.1.6", map[string]string{"app": "web"}))
	r.until("web-0 known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.6") })
	time.Sleep(200 * time.Millisecond) // four resyncs
	if err := sameList(r.ev.list(), want); err != nil {
		t.Fatalf("after more compiles: %v", err)
	}
	good := denyIngress()
	good.UID = "uid-deny"
	r.pols.Modify(good)
	want = append(want, "shop/deny-ingress uid-deny Normal PolicyAccepted: podnet enforces this NetworkPolicy again")
	eventually(t, "one Normal Event", func() error { return sameList(r.ev.list(), want) })
	r.pols.Modify(bad)
	eventually(t, "refused again", func() error {
		if n := len(r.ev.list()); n != 3 {
			return fmt.Errorf("%d Events, want 3", n)
		}
		return nil
	})
	r.pols.Delete(bad)
	r.until("isolation lifted", func(rs policy.Ruleset) bool { return len(rs.Pods) == 0 })
	time.Sleep(200 * time.Millisecond)
	if n := len(r.ev.list()); n != 3 {
		t.Fatalf("a deleted policy got an Event: %q", r.ev.list())
	}
}

func ptr[T any](v T) *T { return &v }

func sameList(got, want []string) error {
	if !slices.Equal(got, want) {
		return fmt.Errorf("Events %q, want %q", got, want)
	}
	return nil
}

func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

// TestEngineScansOnlyWhenNarrowed: a new pod that becomes a peer of a
// policy widens its chain, and a new pod's own entry narrows nothing: no
// conntrack scan follows. A peer that leaves the policy's peers does
// narrow it: one scan follows.
func TestEngineScansOnlyWhenNarrowed(t *testing.T) {
	r := newRig(t, func(e *Engine) { e.cfg.GoneScanNice = 9 })
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pods.Add(pod("web-0", "10.244.1.6", map[string]string{"app": "web"}))
	r.until("both pods known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") && known(rs, "10.244.1.6") })
	r.pols.Add(allowWeb())
	r.until("db-0 isolated, web-0 its peer", func(rs policy.Ruleset) bool {
		return len(rs.Pods) == 1 && rs.Allows(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432)
	})
	r.revocations(1) // db-0's entry came with the policy: one scan
	r.pods.Add(pod("web-1", "10.244.1.7", map[string]string{"app": "web"}))
	r.pods.Add(pod("db-1", "10.244.1.8", map[string]string{"app": "db"}))
	r.until("web-1 a peer, db-1 isolated", func(rs policy.Ruleset) bool {
		return len(rs.Pods) == 2 && rs.Allows(netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.1.8"), policy.ProtoTCP, 5432)
	})
	time.Sleep(300 * time.Millisecond)
	if got := r.revocations(1); len(got) != 1 {
		t.Fatalf("%d scans after a new peer and a new isolated pod, want none after the first", len(got))
	}
	r.pods.Modify(pod("web-0", "10.244.1.6", map[string]string{"app": "other"}))
	r.until("web-0 no longer a peer", func(rs policy.Ruleset) bool {
		return !rs.Allows(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432)
	})
	if got := r.revocations(2); got[1] {
		t.Fatalf("the scan after web-0 left the peers allowed web-0 -> db-0: %v", got)
	}
	// a deleted peer: a scan follows, RevokeGoneGap after the last one
	start := time.Now()
	r.pods.Delete(pod("web-1", "10.244.1.7", nil))
	r.revocations(3)
	if took := time.Since(start); took < time.Second {
		t.Fatalf("the scan for a deleted peer came %v after the last one, want RevokeGoneGap (2s)", took)
	}
	// and it judged the deleted peer's connections only, at the gone
	// scans' priority; the earlier ones judged every connection
	r.w.mu.Lock()
	scans, nice := slices.Clone(r.w.scans), slices.Clone(r.w.scanNice)
	r.w.mu.Unlock()
	if want := []netip.Addr{netip.MustParseAddr("10.244.1.7")}; scans[0] != nil || scans[1] != nil || !slices.Equal(scans[2], want) {
		t.Fatalf("scans were for %v, want every connection twice, then %v", scans, want)
	}
	if nice[2] != 9 {
		t.Fatalf("the gone scan ran at nice %d, want GoneScanNice 9", nice[2])
	}
}

// TestEngineRemotePeerRelabelIsUrgent: a peer on another node that loses
// the label a policy admits it by is a live pod losing its allowance: the
// scan comes RevokeGap (0.2 s) after the last one, not RevokeGoneGap (2 s)
// as for a peer that is gone, and it refuses the peer's connection.
func TestEngineRemotePeerRelabelIsUrgent(t *testing.T) {
	r := newRig(t)
	remote := func(labels map[string]string) *corev1.Pod {
		p := pod("web-r", "10.244.2.6", labels)
		p.Spec.NodeName = "node-b"
		return p
	}
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pods.Add(remote(map[string]string{"app": "web"}))
	r.until("db-0 known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") })
	r.pols.Add(allowWeb())
	r.until("db-0 isolated, the remote web-r its peer", func(rs policy.Ruleset) bool {
		return len(rs.Pods) == 1 && rs.Allows(netip.MustParseAddr("10.244.2.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432)
	})
	r.revocations(1) // db-0's entry came with the policy
	start := time.Now()
	r.pods.Modify(remote(map[string]string{"app": "other"}))
	r.revocations(2)
	took := time.Since(start)
	r.w.mu.Lock()
	allowed := slices.Clone(r.w.remoteToDB)
	r.w.mu.Unlock()
	if allowed[1] {
		t.Fatalf("the scan after web-r left the peers allowed web-r -> db-0: %v", allowed)
	}
	if took > time.Second {
		t.Fatalf("the scan for a live remote peer that lost its label came %v after the change, want RevokeGap (0.2 s), not RevokeGoneGap (2 s)", took)
	}
}

// TestEngineGoneScans: the scan after pods are deleted judges their
// addresses' connections only, a local pod's and a remote peer's, and
// comes RevokeGoneGap after the last scan at GoneScanNice; when a new pod
// holds one of those addresses before it, it comes at once (RevokeGap),
// at the process's priority, and judges that address by the new pod's
// policy.
func TestEngineGoneScans(t *testing.T) {
	r := newRig(t, func(e *Engine) { e.cfg.GoneScanNice = 9 })
	remote := pod("web-r", "10.244.2.6", map[string]string{"app": "web"})
	remote.Spec.NodeName = "node-b"
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.pods.Add(pod("web-0", "10.244.1.6", map[string]string{"app": "web"}))
	r.pods.Add(remote)
	r.until("the pods known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") && known(rs, "10.244.1.6") })
	r.pols.Add(allowWeb())
	r.until("db-0 isolated, web-0 and web-r its peers", func(rs policy.Ruleset) bool {
		return len(rs.Pods) == 1 && rs.Allows(netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432) &&
			rs.Allows(netip.MustParseAddr("10.244.2.6"), netip.MustParseAddr("10.244.1.5"), policy.ProtoTCP, 5432)
	})
	r.revocations(1)
	// web-0 is deleted and its address goes to a new pod that db-0 does
	// not admit, before the gone scan would come (RevokeGoneGap after the
	// last one): the scan comes at once
	start := time.Now()
	r.pods.Delete(pod("web-0", "10.244.1.6", nil))
	r.until("web-0 gone", func(rs policy.Ruleset) bool { return !known(rs, "10.244.1.6") })
	r.pods.Add(pod("other-0", "10.244.1.6", map[string]string{"app": "db"})) // isolated too
	r.revocations(2)
	took := time.Since(start)
	r.w.mu.Lock()
	scan, nice, verdict := r.w.scans[1], r.w.scanNice[1], r.w.webToDB[1]
	r.w.mu.Unlock()
	if took > time.Second {
		t.Fatalf("the scan for a gone address held again came %v after, want RevokeGap (0.2 s), not RevokeGoneGap (2 s)", took)
	}
	if !slices.Equal(scan, []netip.Addr{netip.MustParseAddr("10.244.1.6")}) || nice == 9 || verdict {
		t.Fatalf("the scan for the address held again was for %v at nice %d, and allowed its old connection to db-0: %v", scan, nice, verdict)
	}
	// a local pod and a remote peer deleted: one scan for their
	// addresses only, RevokeGoneGap after the last one, at GoneScanNice
	start = time.Now()
	r.pods.Delete(pod("other-0", "10.244.1.6", nil))
	r.pods.Delete(remote)
	r.revocations(3)
	took = time.Since(start)
	r.w.mu.Lock()
	scan, nice, remoteVerdict := r.w.scans[2], r.w.scanNice[2], r.w.remoteToDB[2]
	r.w.mu.Unlock()
	if want := []netip.Addr{netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("10.244.2.6")}; !slices.Equal(scan, want) {
		t.Fatalf("the scan after other-0 and web-r were deleted was for %v, want %v", scan, want)
	}
	if nice != 9 || remoteVerdict || took < time.Second {
		t.Fatalf("the gone scan came %v after the deletions (want RevokeGoneGap, 2 s) at nice %d (want 9), and allowed web-r's old address -> db-0: %v", took, nice, remoteVerdict)
	}
}

// TestEngineWaitsForThePodObject: a plugin's wait that comes before the
// informer has seen the Pod object is answered once the pod arrives (its
// arrival wakes the wait), with the addresses the plugin reported.
func TestEngineWaitsForThePodObject(t *testing.T) {
	r := newRig(t)
	r.pods.Add(pod("first", "10.244.1.3", nil))
	r.until("first write", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.3") })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- policysock.Wait(ctx, r.sock, policysock.Request{Namespace: "shop", Name: "late", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.11")}})
	}()
	select {
	case err := <-done:
		t.Fatalf("the wait ended before the pod existed: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	r.pods.Add(pod("late", "", map[string]string{"app": "late"}))
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if rs, _ := r.w.last(); !known(rs, "10.244.1.11") {
		t.Fatal("answered before the late pod's address was written")
	}
}

// TestEngineWatchedReadsBackOnNotice: with Config.Watched (the daemon's
// nftables monitor calls CheckNow), a resync reads the table back only
// every readBackEvery-th time, and a CheckNow reads it at once; without,
// every resync reads it.
func TestEngineWatchedReadsBackOnNotice(t *testing.T) {
	readBacks := func(r *rig) int {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		return r.w.resyncs
	}
	count := func(watched bool) int {
		r := newRig(t, func(e *Engine) { e.cfg.Watched = watched })
		r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
		r.until("db-0 known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") })
		before := readBacks(r)
		time.Sleep(time.Second) // 20 resyncs of 50 ms
		return readBacks(r) - before
	}
	unwatched := count(false)
	watched := count(true)
	if unwatched < 10 || watched > 4 || watched < 1 {
		t.Fatalf("in 20 resyncs the table was read back %d times unwatched (want about 20) and %d times watched (want about 2)", unwatched, watched)
	}
	// a notice reads it back at once (no resync comes in this test)
	r := newRig(t, func(e *Engine) { e.cfg.Watched, e.cfg.Resync = true, time.Hour })
	r.pods.Add(pod("db-0", "10.244.1.5", map[string]string{"app": "db"}))
	r.until("db-0 known", func(rs policy.Ruleset) bool { return known(rs, "10.244.1.5") })
	for range 3 {
		before := readBacks(r)
		r.e.CheckNow()
		eventually(t, "a read-back after CheckNow", func() error {
			if readBacks(r) == before {
				return errors.New("none")
			}
			return nil
		})
	}
}

// allowWeb is denyIngress letting the app=web pods in.
func allowWeb() *networkingv1.NetworkPolicy {
	p := denyIngress()
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}}
	return p
}
