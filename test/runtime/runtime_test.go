package runtimee2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podnet/podnet/test/nettest"
	"github.com/podnet/podnet/test/runtime/criclient"
)

const (
	// workers is how many sandboxes are created or removed at a time.
	workers = 4
	// setupPods is the pod count of the create/ping/teardown steps.
	setupPods = 20
	// churnPods is the pod count of the churn loop.
	churnPods = 200
	// callTimeout bounds one CRI call.
	callTimeout = 60 * time.Second
)

// TestShippedConflistsForContainerd checks that every cniVersion 1.0.0
// conflist containerd 1.6 loads is the 1.1.0 conflist of the same plugin
// but for the version, so the two cannot drift apart.
func TestShippedConflistsForContainerd(t *testing.T) {
	repo := nettest.RepoRoot(t)
	for _, plugin := range []string{"podnet", "podnet-bridge"} {
		old := shippedConflist(t, repo, plugin, "1.0.0")
		cur := shippedConflist(t, repo, plugin, "1.1.0")
		a, err := os.ReadFile(old)
		must(t, err)
		b, err := os.ReadFile(cur)
		must(t, err)
		if !jsonEqual(a, []byte(strings.Replace(string(b), `"1.1.0"`, `"1.0.0"`, 1))) {
			t.Errorf("%s is not %s with cniVersion 1.0.0", relPath(repo, old), relPath(repo, cur))
		}
	}
}

// TestContainerd runs the shipped conflists under containerd 1.6 + runc,
// pods driven through CRI, and last podnet-routed's leak reconcile asking
// that containerd (testReconcile).
func TestContainerd(t *testing.T) {
	h := newHarness(t)
	t.Run("podnet", func(t *testing.T) {
		h.useNetwork(t, &network{pluginType: "podnet", podCIDR: "10.244.7.0/24"})
		t.Run("20-pods", h.testPods)
		t.Run("churn-200", h.testChurn)
		t.Run("kill-restart-gc", h.testKillRestartGC)
	})
	t.Run("podnet-bridge", func(t *testing.T) {
		h.useNetwork(t, &network{pluginType: "podnet-bridge", podCIDR: "10.244.8.0/24"})
		t.Run("20-pods", h.testPods)
	})
	// Last: it runs podnet-routed on the node and reboots it.
	t.Run("podnet-reconcile", func(t *testing.T) {
		h.useNetwork(t, &network{pluginType: "podnet", podCIDR: "10.244.9.0/24"})
		h.testReconcile(t)
	})
	h.writeReport(t, os.Getenv("PODNET_RUNTIME_REPORT"))
}

// testPods: 20 sandboxes get distinct addresses from podnet-ipam in the
// node's PodCIDR, reach each other and the node, and stop + remove (two
// CNI DELs each) leaves nothing behind.
func (h *harness) testPods(t *testing.T) {
	start := time.Now()
	pods := h.runPods(t, "pod", setupPods)
	h.note(t, "%d sandboxes up in %v (%d at a time)", len(pods), time.Since(start).Round(time.Millisecond), workers)

	want := map[string]string{} // ip -> owner
	var owners []string
	for _, p := range pods {
		h.checkPodIP(t, p)
		if other, dup := want[p.IP]; dup {
			t.Fatalf("address %s given to both %s and %.12s", p.IP, other, p.ID)
		}
		want[p.IP] = p.ID + ":" + podIfName
		owners = append(owners, p.ID+":"+podIfName)
	}
	sort.Strings(owners)
	ips, index := h.reservations()
	if !equalMaps(ips, want) {
		t.Errorf("reservations %v, want %v", ips, want)
	}
	if !equalSlices(index, owners) {
		t.Errorf("owner index %v, want %v", index, owners)
	}
	h.checkVethsAndRoutes(t, pods)
	h.checkConnectivity(t, pods)

	start = time.Now()
	runParallel(len(pods), workers, func(i int) {
		p := pods[i]
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := h.cri.StopPod(ctx, p.ID); err != nil {
			t.Error(err)
			return
		}
		// The first DEL (stop, with netns and prevResult) did the work.
		if owner, ok := h.reservationOf(p.IP); ok {
			t.Errorf("after stop, %s is still reserved by %s", p.IP, owner)
		}
		if veth := h.vethOf(p.ID); veth != "" {
			t.Errorf("after stop, sandbox %.12s still has veth %s", p.ID, veth)
		}
		// The second DEL (remove, no netns, no prevResult) must succeed too.
		if err := h.cri.RemovePod(ctx, p.ID); err != nil {
			t.Error(err)
		}
	})
	h.note(t, "%d sandboxes stopped and removed in %v", len(pods), time.Since(start).Round(time.Millisecond))
	h.checkTwoTeardowns(t, pods)
	h.requireClean(t)
}

// checkTwoTeardowns checks containerd's log: the network of each pod was
// torn down twice, successfully (CNI DEL on stop, and again on remove).
func (h *harness) checkTwoTeardowns(t *testing.T, pods []*criclient.Sandbox) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(h.dir, "containerd.log"))
	must(t, err)
	count := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, "TearDown network for sandbox") || !strings.Contains(line, "successfully") {
			continue
		}
		for _, p := range pods {
			if strings.Contains(line, p.ID) {
				count[p.ID]++
			}
		}
	}
	for _, p := range pods {
		if count[p.ID] != 2 {
			t.Errorf("containerd logged %d successful network teardowns of %s (%.12s), want 2 (stop, remove)", count[p.ID], p.Name, p.ID)
		}
	}
	if !t.Failed() {
		t.Logf("containerd tore down each pod's network twice (stop + remove: two CNI DELs), both successful")
	}
}

// testChurn: 200 sandboxes created, checked, stopped and removed, 4 at a
// time: no failure, no address handed out twice, nothing left.
func (h *harness) testChurn(t *testing.T) {
	c := h.newChurner("churn", churnPods)
	start := time.Now()
	c.run(workers, nil)
	wall := time.Since(start)
	for _, err := range c.errs {
		t.Error(err)
	}
	h.note(t, "churn: %d sandboxes created/stopped/removed %d at a time in %v (%.1f pods/s), %d failures",
		c.done.Load(), workers, wall.Round(time.Millisecond), float64(c.done.Load())/wall.Seconds(), len(c.errs))
	h.note(t, "churn latencies: %s", c.latencies())
	if c.done.Load() != churnPods {
		t.Errorf("%d of %d churn cycles completed", c.done.Load(), churnPods)
	}
	h.requireClean(t)
}

// testKillRestartGC: containerd is SIGKILLed while sandboxes are being
// created and removed, restarted, and CNI GC (cniVersion 1.1.0, through
// libcni) is given the surviving sandboxes as valid attachments: then the
// reservations, veths and routes are exactly the survivors'.
func (h *harness) testKillRestartGC(t *testing.T) {
	residents := h.runPods(t, "resident", 8)
	known := map[string]bool{}
	for _, p := range residents {
		known[p.ID] = true
	}

	c := h.newChurner("crash", 0)
	quit := make(chan struct{})
	churnDone := make(chan struct{})
	go func() { c.run(workers, quit); close(churnDone) }()

	// Kill while an ADD is in flight: a reservation whose sandbox the
	// runtime has not returned yet.
	inFlight := h.waitForInFlightAdd(c, known, 6, 20*time.Second)
	h.killContainerd()
	close(quit)
	<-churnDone
	h.note(t, "containerd SIGKILLed after %d churn cycles (ADD in flight seen: %v); %d calls failed with it",
		c.done.Load(), inFlight, len(c.errs))
	if stray := h.waitPluginsGone(10 * time.Second); len(stray) > 0 {
		t.Errorf("CNI plugins %v still running 10s after containerd died", stray)
	}
	ipsAtKill, _ := h.reservations()

	start := time.Now()
	h.startContainerd(t)
	h.note(t, "containerd restarted in %v", time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	all, err := h.cri.List(ctx)
	must(t, err)
	var survivors []*criclient.Sandbox
	var valid []types.GCAttachment
	notReady := 0
	for _, p := range all {
		sb, err := h.cri.Inspect(ctx, p.Id)
		must(t, err)
		if !sb.Ready {
			notReady++
			continue
		}
		survivors = append(survivors, sb)
		valid = append(valid, types.GCAttachment{ContainerID: sb.ID, IfName: podIfName})
	}
	stale := 0
	for _, owner := range ipsAtKill {
		if !containsOwner(survivors, owner) {
			stale++
		}
	}
	h.note(t, "after restart: %d sandboxes ready (%d residents), %d not ready; %d reservations, %d of them not a ready sandbox's",
		len(survivors), len(residents), notReady, len(ipsAtKill), stale)
	for _, p := range residents {
		if !containsOwner(survivors, p.ID+":"+podIfName) {
			t.Errorf("resident sandbox %s (%.12s) did not survive the restart", p.Name, p.ID)
		}
	}

	if err := h.gc(t, valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	want := map[string]string{}
	var owners []string
	for _, sb := range survivors {
		want[sb.IP] = sb.ID + ":" + podIfName
		owners = append(owners, sb.ID+":"+podIfName)
	}
	sort.Strings(owners)
	ips, index := h.reservations()
	if !equalMaps(ips, want) {
		t.Errorf("after GC, reservations %v\nwant the surviving sandboxes' %v", ips, want)
	}
	if !equalSlices(index, owners) {
		t.Errorf("after GC, owner index %v\nwant %v", index, owners)
	}
	h.checkVethsAndRoutes(t, survivors)
	h.note(t, "after GC: %d reservations = the %d surviving sandboxes (%d released)", len(ips), len(survivors), len(ipsAtKill)-len(ips))
	h.checkConnectivity(t, survivors)

	// Tear down what is left the normal way; DEL after GC must succeed.
	h.teardownLost(t, all, nil)
}

// teardownLost stops and removes every sandbox of all the way kubelet
// does (DEL included), runs before (when not nil) once they are gone,
// and checks that no CNI state is left. What containerd itself lost of
// sandboxes it was killed in the middle of (netns, runc containers,
// cgroups, libcni cache entries) is not CNI state: it is reported and
// removed.
func (h *harness) teardownLost(t *testing.T, all []*cri.PodSandbox, before func()) {
	runParallel(len(all), workers, func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := h.cri.StopAndRemove(ctx, all[i].Id); err != nil {
			t.Error(err)
		}
	})
	if before != nil {
		before()
	}
	if left := h.cniLeftovers(); len(left) > 0 {
		t.Errorf("left behind after teardown:\n  %s", strings.Join(left, "\n  "))
	}
	if leaks := h.runtimeLeftovers(); len(leaks) > 0 {
		h.note(t, "containerd left of the sandboxes it lost (not podnet's; removed by the harness):\n  %s", strings.Join(leaks, "\n  "))
		h.removeRuntimeLeaks(t)
	}
	h.requireClean(t)
}

// removeRuntimeLeaks removes what containerd left of sandboxes it lost:
// shims, runc containers (and their cgroups), pod netns, libcni cache
// entries.
// Only call it once every sandbox is gone.
func (h *harness) removeRuntimeLeaks(t *testing.T) {
	for _, pid := range shimPIDs(h.dir) {
		t.Logf("killing shim pid %d of lost sandbox %s", pid, shimID(pid))
		killShim(pid)
	}
	for _, id := range runcContainers(h.runcRoot()) {
		state, _ := exec.Command("runc", "--root", h.runcRoot(), "state", id).CombinedOutput()
		t.Logf("runc container %.12s left: %s", id, strings.Join(strings.Fields(string(state)), " "))
		if out, err := exec.Command("runc", "--root", h.runcRoot(), "delete", "--force", id).CombinedOutput(); err != nil {
			t.Errorf("runc delete %s: %v: %s", id, err, out)
		}
	}
	if n := removeCgroups(h.cgroupParent); n > 0 {
		t.Logf("removed %d sandbox cgroup dirs", n)
	}
	for _, n := range h.netnsLeft() {
		h.removeOrphanNetns(t, strings.TrimSuffix(n, " (file)"))
	}
	removeCacheEntries(h.podNamespace)
}

// runPods creates n sandboxes, workers at a time, and returns their status.
func (h *harness) runPods(t *testing.T, prefix string, n int) []*criclient.Sandbox {
	t.Helper()
	pods := make([]*criclient.Sandbox, n)
	var mu sync.Mutex
	var errs []error
	runParallel(n, workers, func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		id, err := h.cri.RunPod(ctx, h.pod(prefix, i))
		if err == nil {
			pods[i], err = h.cri.Inspect(ctx, id)
		}
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	if len(errs) > 0 {
		t.Fatalf("%d of %d sandboxes failed; first: %v", len(errs), n, errs[0])
	}
	return pods
}

// checkPodIP checks that p is ready, has its netns, and an address in the
// node's PodCIDR.
func (h *harness) checkPodIP(t *testing.T, p *criclient.Sandbox) {
	t.Helper()
	cidr := netip.MustParsePrefix(h.net.podCIDR)
	ip, err := netip.ParseAddr(p.IP)
	if err != nil || !cidr.Contains(ip) {
		t.Errorf("sandbox %s got address %q, want one in the PodCIDR %s", p.Name, p.IP, cidr)
	}
	if !p.Ready || p.NetNS == "" {
		t.Errorf("sandbox %s: ready %v, netns %q", p.Name, p.Ready, p.NetNS)
	}
}

// checkVethsAndRoutes checks that the node's veths are exactly one per
// pod, owned by its sandbox, and (podnet) that the podnet routes are
// exactly the pods' /32s.
func (h *harness) checkVethsAndRoutes(t *testing.T, pods []*criclient.Sandbox) {
	t.Helper()
	var wantOwners, wantRoutes []string
	for _, p := range pods {
		wantOwners = append(wantOwners, p.ID+":"+podIfName)
		wantRoutes = append(wantRoutes, p.IP+"/32")
	}
	sort.Strings(wantOwners)
	sort.Strings(wantRoutes)
	veths := h.hostVeths()
	var gotOwners []string
	for _, o := range veths {
		gotOwners = append(gotOwners, o)
	}
	sort.Strings(gotOwners)
	if !equalSlices(gotOwners, wantOwners) {
		t.Errorf("node veths owned by %v\nwant one per sandbox %v", gotOwners, wantOwners)
	}
	if h.net.pluginType != "podnet" {
		return
	}
	if routes := h.podRoutes(); !equalSlices(routes, wantRoutes) {
		t.Errorf("podnet routes %v, want %v", routes, wantRoutes)
	}
}

// checkConnectivity pings, for every pod, the node and the next pod, and
// the pod from the node.
func (h *harness) checkConnectivity(t *testing.T, pods []*criclient.Sandbox) {
	t.Helper()
	if len(pods) == 0 {
		return
	}
	start := time.Now()
	runParallel(len(pods), workers, func(i int) {
		p, next := pods[i], pods[(i+1)%len(pods)]
		if err := pingFrom(p.NetNS, nettest.NodeAddr); err != nil {
			t.Errorf("pod %s -> node: %v", p.Name, err)
		}
		if len(pods) > 1 {
			if err := pingFrom(p.NetNS, next.IP); err != nil {
				t.Errorf("pod %s -> pod %s: %v", p.Name, next.Name, err)
			}
		}
		if err := nettest.Ping(h.node.NS, p.IP); err != nil {
			t.Errorf("node -> pod %s: %v", p.Name, err)
		}
	})
	t.Logf("connectivity: %d pods -> node, -> next pod, node -> pod: ok in %v", len(pods), time.Since(start).Round(time.Millisecond))
}

func pingFrom(netnsPath, addr string) error {
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		return err
	}
	defer podNS.Close()
	return nettest.Ping(podNS, addr)
}

// reservationOf returns the owner of ip in the store, if reserved.
func (h *harness) reservationOf(ip string) (string, bool) {
	data, err := os.ReadFile(filepath.Join(h.storeDir(), "ips", ip))
	if err != nil {
		return "", false
	}
	return strings.ReplaceAll(strings.TrimSpace(string(data)), "\n", ":"), true
}

// vethOf returns the node veth owned by sandbox id, if any.
func (h *harness) vethOf(id string) string {
	for name, owner := range h.hostVeths() {
		if strings.HasPrefix(owner, id+":") {
			return name
		}
	}
	return ""
}

// requireClean fails the test with everything that was left behind.
func (h *harness) requireClean(t *testing.T) {
	t.Helper()
	if left := h.leftovers(); len(left) > 0 {
		t.Errorf("left behind after teardown:\n  %s", strings.Join(left, "\n  "))
		return
	}
	h.note(t, "nothing left: no sandbox, veth, proto-77 route, reservation, shim, netns, runc container, cgroup or libcni cache entry")
}

// removeOrphanNetns unmounts and removes a pod netns containerd lost.
func (h *harness) removeOrphanNetns(t *testing.T, path string) {
	for _, m := range mountsUnder(path) {
		if err := unmount(m.point); err != nil {
			t.Errorf("unmount %s: %v", m.point, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("remove %s: %v", path, err)
	}
}

// churner creates, checks, stops and removes sandboxes in a loop.
type churner struct {
	h      *harness
	prefix string
	total  int // cycles to run; 0 runs until quit

	next atomic.Int64 // next pod number
	done atomic.Int64 // completed cycles

	mu       sync.Mutex
	live     map[string]string // address -> sandbox of the pods up now
	returned map[string]bool   // sandboxes RunPodSandbox returned
	errs     []error
	lat      map[string][]time.Duration
}

func (h *harness) newChurner(prefix string, total int) *churner {
	return &churner{h: h, prefix: prefix, total: total, live: map[string]string{}, returned: map[string]bool{}, lat: map[string][]time.Duration{}}
}

// run runs workers loops until total cycles are done, or quit is closed,
// or (with quit set) a call fails.
func (c *churner) run(workers int, quit <-chan struct{}) {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-quit:
					return
				default:
				}
				i := int(c.next.Add(1)) - 1
				if c.total > 0 && i >= c.total {
					return
				}
				if err := c.cycle(i); err != nil {
					c.fail(err)
					if quit != nil {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

// cycle is one pod's life: run, check its address is free and in the
// PodCIDR and that it reaches the node, stop, remove.
func (c *churner) cycle(i int) error {
	h := c.h
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	pod := h.pod(c.prefix, i)
	t0 := time.Now()
	id, err := h.cri.RunPod(ctx, pod)
	if err != nil {
		return err
	}
	c.record("run", t0)
	c.mu.Lock()
	c.returned[id] = true
	c.mu.Unlock()
	sb, err := h.cri.Inspect(ctx, id)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil || !netip.MustParsePrefix(h.net.podCIDR).Contains(ip) {
		return fmt.Errorf("%s (%.12s): address %q not in the PodCIDR %s", pod.Name, id, sb.IP, h.net.podCIDR)
	}
	c.mu.Lock()
	holder, dup := c.live[sb.IP]
	c.live[sb.IP] = id
	c.mu.Unlock()
	if dup {
		return fmt.Errorf("%s (%.12s) got %s, which live sandbox %.12s holds", pod.Name, id, sb.IP, holder)
	}
	if err := pingFrom(sb.NetNS, nettest.NodeAddr); err != nil {
		return fmt.Errorf("%s: %w", pod.Name, err)
	}
	c.mu.Lock()
	delete(c.live, sb.IP)
	c.mu.Unlock()
	t0 = time.Now()
	if err := h.cri.StopPod(ctx, id); err != nil {
		return err
	}
	c.record("stop", t0)
	t0 = time.Now()
	if err := h.cri.RemovePod(ctx, id); err != nil {
		return err
	}
	c.record("remove", t0)
	c.done.Add(1)
	return nil
}

func (c *churner) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

func (c *churner) record(op string, since time.Time) {
	d := time.Since(since)
	c.mu.Lock()
	c.lat[op] = append(c.lat[op], d)
	c.mu.Unlock()
}

// latencies summarizes the CRI call latencies (p50/p95/max).
func (c *churner) latencies() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for _, op := range []string{"run", "stop", "remove"} {
		d := append([]time.Duration(nil), c.lat[op]...)
		if len(d) == 0 {
			continue
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		q := func(f float64) time.Duration { return d[int(f*float64(len(d)-1))].Round(time.Millisecond) }
		parts = append(parts, fmt.Sprintf("%s p50 %v p95 %v max %v", op, q(0.5), q(0.95), d[len(d)-1].Round(time.Millisecond)))
	}
	return strings.Join(parts, "; ")
}

// waitForInFlightAdd waits until at least minDone cycles are done and then
// until the store holds a reservation for a sandbox the runtime has not
// returned yet (an ADD in flight). It gives up after timeout.
func (h *harness) waitForInFlightAdd(c *churner, known map[string]bool, minDone int64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for c.done.Load() < minDone && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	for time.Now().Before(deadline) {
		_, owners := h.reservations()
		c.mu.Lock()
		for _, o := range owners {
			id, _, _ := strings.Cut(o, ":")
			if !known[id] && !c.returned[id] {
				c.mu.Unlock()
				return true
			}
		}
		c.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	return false
}

func containsOwner(pods []*criclient.Sandbox, owner string) bool {
	for _, p := range pods {
		if p.ID+":"+podIfName == owner {
			return true
		}
	}
	return false
}

// runParallel calls f(0..n-1), at most width at a time.
func runParallel(n, width int, f func(i int)) {
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}(i)
	}
	wg.Wait()
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equalSlices(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
