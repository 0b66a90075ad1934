package runtimee2e

// Issue 22, "must show 1": leaked pod addresses are reclaimed by
// podnet-routed's leak reconcile under the real containerd, which no
// runtime-driven DEL or GC would ever free.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/ipam"
	"github.com/podnet/podnet/ipam/store"
	"github.com/podnet/podnet/test/runtime/criclient"
)

const (
	// reconcileInterval and reconcileGrace are podnet-routed's
	// --reconcile-interval and --reconcile-grace in the runtime-leak phase;
	// rebootGrace is the grace after the reboot: so long that only the
	// reboot rule can free anything.
	reconcileInterval = 2 * time.Second
	reconcileGrace    = 4 * time.Second
	rebootGrace       = 10 * time.Minute
	// reconcilePods pods run; half of them are torn down.
	reconcilePods = 20
	// containerd is SIGKILLed once killAfterReleased teardowns have
	// released their address, stopWidth being torn down at a time: at
	// least reconcilePods/2-killAfterReleased-stopWidth are never torn
	// down.
	killAfterReleased = 5
	stopWidth         = 2
	// waitLimit bounds every wait for the reconcile (it is judged by its
	// passes, not by time: this only ends a test that would hang).
	waitLimit = time.Minute
	// watchIntervals: how many reconcile intervals the live pods are
	// watched after the pool is whole.
	watchIntervals = 3
)

// testReconcile: with podnet-routed's leak reconcile asking this
// containerd, (A) containerd is SIGKILLed halfway through tearing down 10
// of 20 pods and comes back without the sandboxes it had not torn down
// yet: the first reconcile pass that may free them (they are past the
// grace) frees their addresses, veths and routes; (B) a reboot (every pod
// netns gone, containerd's state wiped, the store's records of an earlier
// boot, podnet-routed restarted with a 10-minute grace): the start-up pass
// frees every reservation of the old boot while new pods start. Live pods
// are pinged every 100 ms throughout: not one ping is lost, and their
// addresses never change.
func (h *harness) testReconcile(t *testing.T) {
	// podnet-routed owns node.json here: the harness's goes.
	must(t, os.Remove(nodestate.Path(h.net.stateDir)))
	r := h.newRouted(t)
	r.start(t, reconcileInterval, reconcileGrace)
	ready := r.waitReady(t)
	h.note(t, "podnet-routed (--reconcile-interval=%v --reconcile-grace=%v --cri-socket=<containerd's>) wrote node.json and was ready in %v",
		reconcileInterval, reconcileGrace, ready.Round(time.Millisecond))

	live := h.reconcileRuntimeLeaks(t, r)
	if t.Failed() {
		return
	}
	h.reconcileWrongRuntime(t, r, live)
	if t.Failed() {
		return
	}
	h.reconcileReboot(t, r, live)
}

// reconcileRuntimeLeaks is phase A; it returns the pods left running.
func (h *harness) reconcileRuntimeLeaks(t *testing.T, r *routed) []*criclient.Sandbox {
	start := time.Now()
	pods := h.runPods(t, "leak", reconcilePods)
	var live, doomed []*criclient.Sandbox
	for i, p := range pods {
		h.checkPodIP(t, p)
		if i%2 == 0 {
			live = append(live, p)
		} else {
			doomed = append(doomed, p)
		}
	}
	if problems := h.poolProblems(pods); len(problems) > 0 {
		t.Fatalf("%d pods up, but:\n  %s", len(pods), strings.Join(problems, "\n  "))
	}
	h.note(t, "%d pods up in %v; %d stay, %d are torn down", len(pods), time.Since(start).Round(time.Millisecond), len(live), len(doomed))
	pr := h.probe(t, live)

	releasedAtKill, stopsOK, stopsFailed := h.tearDownAndKill(t, doomed)
	if stray := h.waitPluginsGone(10 * time.Second); len(stray) > 0 {
		t.Fatalf("CNI plugins %v still running 10s after containerd died", stray)
	}
	var leaked, released []*criclient.Sandbox
	for _, p := range doomed {
		if _, held := h.reservationOf(p.IP); held {
			leaked = append(leaked, p)
		} else {
			released = append(released, p)
		}
	}
	h.note(t, "containerd SIGKILLed while tearing down %d pods (%d at a time) once %d had released their address; "+
		"%d StopPodSandbox calls returned, %d failed with it; when its plugins were done %d were released, %d not",
		len(doomed), stopWidth, releasedAtKill, stopsOK, stopsFailed, len(released), len(leaked))
	if len(leaked) == 0 {
		t.Fatalf("every teardown finished before containerd was killed: nothing leaked, nothing to reclaim")
	}
	// (Read now: once the runtime forgets them, a pass may free them.)
	var pastGrace time.Time
	for _, p := range leaked {
		if at := h.record(t, p.ID).Created.Add(reconcileGrace); at.After(pastGrace) {
			pastGrace = at
		}
	}

	// containerd comes back with its state: it still knows every sandbox.
	h.startContainerd(t)
	ready, notReady := h.sandboxStates(t, doomed)
	// What it tore down is stopped and removed again, as kubelet would;
	// what it had not torn down becomes garbage nobody will DEL: the
	// runtime loses those sandboxes, as a crash that loses its records does.
	runParallel(len(released), workers, func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := h.cri.StopAndRemove(ctx, released[i].ID); err != nil {
			t.Error(err)
		}
	})
	h.forgetSandboxes(t, leaked)
	forgotAt := time.Now()
	h.note(t, "containerd restarted: of the %d torn-down sandboxes it listed %d ready and %d not ready; the %d released were stopped and removed again, "+
		"the %d leaked were deleted behind CRI's back (ctr task + container delete, containerd restarted): no runtime lists them, their netns and veths stay",
		len(doomed), ready, notReady, len(released), len(leaked))

	// Issue 31: while their netns lives, their host veths are in service
	// (up, pod end up, in a live netns): from the node they look exactly
	// like live pods, and a host veth in service is never freed, whatever
	// the runtime says. They are kept, counted and logged.
	eligible := forgotAt
	if pastGrace.After(eligible) {
		eligible = pastGrace
	}
	time.Sleep(time.Until(eligible))
	h.keptWhileInService(t, r, live, leaked)

	// Once their netns goes (what an operator does about them; a reboot
	// does it too), so do their veths, and the first pass begun after
	// frees them (the runtime does not know them).
	goneAt := h.dropNetns(t, leaked)
	c0, err := r.counts()
	must(t, err)
	latency, _ := h.waitWhole(t, r, c0.passes, live, leaked, goneAt)
	h.note(t, "the %d leaks' netns were removed %v after containerd forgot them; their veths went with them, and their routes and addresses were freed "+
		"by the end of reconcile pass %d, the first begun once they could be: %v after the netns went (interval %v)", len(leaked),
		goneAt.Sub(forgotAt).Round(time.Millisecond), c0.passes+1, latency.Round(time.Millisecond), reconcileInterval)

	// Nothing else is freed over the next intervals, and the live pods'
	// addresses do not move.
	h.watchAddresses(t, live, watchIntervals*reconcileInterval)
	res := pr.stop()
	h.note(t, "through the teardown, the kill, two containerd restarts and the reclaim: %s", res)
	if res.Lost > 0 || len(res.Wrong) > 0 || res.Sent == 0 {
		t.Errorf("the live pods did not answer every ping: %s", res)
	}
	c := r.checkReclaimed(t, map[string]int{"runtime": len(leaked)})
	h.note(t, "podnet_leaks_reclaimed_total{kind=\"runtime\"} = %d (the others 0) after %d passes", c.reclaimed["runtime"], c.passes)
	return live
}

// reconcileReboot is phase B: old are the pods that run when the node
// "reboots".
func (h *harness) reconcileReboot(t *testing.T, r *routed, old []*criclient.Sandbox) {
	// Everything dies: podnet-routed, containerd, the shims and pause
	// processes; /run goes (containerd's state, runc's, every pod netns).
	// containerd's root (its metadata: /var/lib/containerd) and the IPAM
	// store stay.
	r.kill()
	h.killContainerd()
	h.wipeRuntimeState(t)
	if left := h.netnsLeft(); len(left) > 0 {
		t.Fatalf("pod netns left after the reboot: %v", left)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.hostVeths()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if v := h.hostVeths(); len(v) > 0 {
		t.Fatalf("veths still on the node 10s after their pod netns went: %v", v)
	}
	// The store's records are of the boot before.
	oldBoot := newBootID()
	n := h.rewriteBootIDs(t, oldBoot)
	ips, _ := h.reservations()
	if n != len(old) || len(ips) != len(old) {
		t.Fatalf("after the reboot the store holds %d reservations (%d owner entries), want the %d of the pods that ran", len(ips), n, len(old))
	}

	h.startContainerd(t)
	listed, notReady := h.sandboxStates(t, old)
	h.note(t, "reboot: every pod netns, shim and pause process gone, containerd's state dirs wiped; the store keeps %d reservations recorded in boot %s "+
		"(this is %s); containerd restarted lists %d of the old sandboxes, %d not ready", len(ips), oldBoot, ipam.ReadBootID(ipam.BootIDPath), listed+notReady, notReady)

	// podnet-routed restarts with a grace no test waits for: only the
	// reboot rule can free anything. New pods start at once, pinged from
	// the moment they are up, and podnet-routed as soon as the first has
	// its address: its start-up pass races the other ADDs.
	pr := h.probe(t, nil)
	pods := make([]*criclient.Sandbox, reconcilePods)
	var mu sync.Mutex
	var errs []error
	created := make(chan struct{})
	go func() {
		defer close(created)
		runParallel(len(pods), workers, func(i int) {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			id, err := h.cri.RunPod(ctx, h.pod("boot", i))
			if err == nil {
				if pods[i], err = h.cri.Inspect(ctx, id); err == nil {
					err = pr.add(pods[i].IP, pods[i].Name)
				}
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}()
	newAtStart := 0
	for deadline := time.Now().Add(callTimeout); newAtStart == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		_, owners := h.reservations()
		newAtStart = len(owners) - len(old)
	}
	freed := make(chan error, 1)
	var freedIn time.Duration
	if newAtStart > 0 {
		r.start(t, reconcileInterval, rebootGrace)
		// Pass 1, the start-up pass, must free the old boot's.
		go func() {
			var err error
			freedIn, err = h.waitFreed(r, 0, old, r.started)
			freed <- err
		}()
	}
	<-created
	if newAtStart == 0 || len(errs) > 0 {
		t.Fatalf("pods after the reboot: %d of %d failed to start (first: %v), %d had an address within %v", len(errs), len(pods), errors.Join(errs...), newAtStart, callTimeout)
	}
	upIn := time.Since(r.started)
	if err := <-freed; err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		h.checkPodIP(t, p)
	}
	latency, _ := h.waitWhole(t, r, 0, pods, old, r.started)
	h.note(t, "podnet-routed restarted (--reconcile-grace=%v) once %d new pod had its address; the %d reservations of the old boot were gone %v after it started, "+
		"by the end of its start-up pass (pass 1), while the new pods' ADDs ran (%s); all %d new pods up %v after it started, the pool whole "+
		"(exactly the new pods' reservations, veths and routes) %v after it started",
		rebootGrace, newAtStart, len(old), freedIn.Round(time.Millisecond), h.raceSummary(t, r, pods), len(pods), upIn.Round(time.Millisecond), latency.Round(time.Millisecond))

	h.watchAddresses(t, pods, watchIntervals*reconcileInterval)
	res := pr.stop()
	h.note(t, "through the start-up reclaim and %d more intervals: %s", watchIntervals, res)
	if res.Lost > 0 || len(res.Wrong) > 0 || res.Sent == 0 {
		t.Errorf("the new pods did not answer every ping: %s", res)
	}
	c := r.checkReclaimed(t, map[string]int{"reboot": len(old)})
	h.note(t, "podnet_leaks_reclaimed_total{kind=\"reboot\"} = %d (the others 0) after %d passes", c.reclaimed["reboot"], c.passes)

	// Teardown as kubelet does it, old sandboxes included: DEL of an
	// attachment the reconcile freed succeeds.
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	all, err := h.cri.List(ctx)
	cancel()
	must(t, err)
	h.teardownLost(t, all, func() { r.cleanup(t) })
}

// raceSummary says when, after podnet-routed started, its reclaims were
// logged and the new pods' ADDs recorded.
func (h *harness) raceSummary(t *testing.T, r *routed, pods []*criclient.Sandbox) string {
	t.Helper()
	span := func(times []time.Time) string {
		if len(times) == 0 {
			return "none"
		}
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		rel := func(at time.Time) string { return at.Sub(r.started).Round(time.Millisecond).String() }
		return fmt.Sprintf("+%s to +%s", rel(times[0]), rel(times[len(times)-1]))
	}
	var reclaims, adds []time.Time
	for _, rec := range r.proc.LogRecords("leak reclaimed") {
		ts, _ := rec["time"].(string)
		if at, err := time.Parse(time.RFC3339Nano, ts); err == nil && !at.Before(r.started) { // this run's
			reclaims = append(reclaims, at)
		}
	}
	for _, p := range pods {
		adds = append(adds, h.record(t, p.ID).Created)
	}
	return fmt.Sprintf("its %d reclaims were logged at %s, the new pods' ADDs recorded at %s", len(reclaims), span(reclaims), span(adds))
}

// probe starts pinging pods from the node netns (more with add).
func (h *harness) probe(t *testing.T, pods []*criclient.Sandbox) *prober {
	t.Helper()
	pr, err := newProber(h.node.NS)
	must(t, err)
	t.Cleanup(func() {
		if res := pr.stop(); t.Failed() {
			t.Logf("prober: %s", res)
		}
	})
	for _, p := range pods {
		if err := pr.add(p.IP, p.Name); err != nil {
			t.Fatal(err)
		}
	}
	return pr
}

// tearDownAndKill stops the sandboxes doomed, stopWidth at a time, and
// SIGKILLs containerd as soon as killAfterReleased of them have released
// their address; no stop is begun after. It returns how many had released
// their address then, and how many stops returned and failed.
func (h *harness) tearDownAndKill(t *testing.T, doomed []*criclient.Sandbox) (releasedAtKill, stopsOK, stopsFailed int) {
	t.Helper()
	var killed atomic.Bool
	var ok, failed atomic.Int32
	var wg sync.WaitGroup
	issued := make(chan struct{})
	go func() {
		defer close(issued)
		sem := make(chan struct{}, stopWidth)
		for _, p := range doomed {
			sem <- struct{}{}
			if killed.Load() {
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				defer cancel()
				if err := h.cri.StopPod(ctx, p.ID); err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
			}()
		}
	}()
	deadline := time.Now().Add(callTimeout)
	for {
		n := 0
		for _, p := range doomed {
			if _, held := h.reservationOf(p.IP); !held {
				n++
			}
		}
		if n >= killAfterReleased {
			releasedAtKill = n
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d teardowns released their address in %v", n, len(doomed), callTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	h.killContainerd()
	killed.Store(true)
	<-issued
	wg.Wait()
	return releasedAtKill, int(ok.Load()), int(failed.Load())
}

// sandboxStates counts the sandboxes of pods containerd lists ready and
// not ready.
func (h *harness) sandboxStates(t *testing.T, pods []*criclient.Sandbox) (ready, notReady int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	all, err := h.cri.List(ctx)
	must(t, err)
	for _, sb := range all {
		if !containsOwner(pods, sb.Id+":"+podIfName) {
			continue
		}
		if sb.State.String() == "SANDBOX_READY" {
			ready++
		} else {
			notReady++
		}
	}
	return ready, notReady
}

// forgetSandboxes makes containerd lose pods' sandboxes without tearing
// down their network, as a crash that loses its records would: their
// tasks (pause processes) and containers are deleted through containerd's
// own API, not CRI, and containerd restarted, so its CRI service no longer
// lists them. Their netns stay mounted, their veths with them.
func (h *harness) forgetSandboxes(t *testing.T, pods []*criclient.Sandbox) {
	t.Helper()
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command("ctr", append([]string{"--address", h.socket(), "--namespace", criNamespace}, args...)...).CombinedOutput()
		return string(out), err
	}
	for _, p := range pods {
		// CRI's exit handler deletes the task too when the pause process
		// dies, so a delete can race it: retry until the container goes.
		var out string
		var err error
		for try := 0; try < 50; try++ {
			_, _ = ctr("tasks", "delete", "--force", p.ID)
			if out, err = ctr("containers", "delete", p.ID); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("ctr containers delete %.12s: %v: %s", p.ID, err, out)
		}
	}
	h.stopContainerd(t)
	h.startContainerd(t)
	if ready, notReady := h.sandboxStates(t, pods); ready+notReady > 0 {
		t.Fatalf("containerd still lists %d of the %d sandboxes it was made to forget", ready+notReady, len(pods))
	}
	for _, p := range pods {
		if _, err := os.Stat(p.NetNS); err != nil {
			t.Fatalf("the netns of forgotten sandbox %s: %v", p.Name, err)
		}
	}
}

// record reads the owner index entry of sandbox id's attachment.
func (h *harness) record(t *testing.T, id string) store.Record {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(h.storeDir(), "owners", id+":"+podIfName))
	must(t, err)
	rec, err := store.ParseRecord(data)
	must(t, err)
	if rec.Created.IsZero() || rec.BootID == "" || rec.Netns == "" || !rec.HasPod() {
		t.Fatalf("owner index entry of %.12s lacks what ADD records: %+v", id, rec)
	}
	return rec
}

// poolProblems compares the store, the node's veths and pod routes with
// exactly pods'.
func (h *harness) poolProblems(pods []*criclient.Sandbox) []string {
	want := map[string]string{}
	var owners, routes []string
	for _, p := range pods {
		want[p.IP] = p.ID + ":" + podIfName
		owners = append(owners, p.ID+":"+podIfName)
		routes = append(routes, p.IP+"/32")
	}
	var out []string
	ips, index := h.reservations()
	var got []string
	for ip, owner := range ips {
		got = append(got, ip+"="+owner)
	}
	var wantIPs []string
	for ip, owner := range want {
		wantIPs = append(wantIPs, ip+"="+owner)
	}
	out = appendDiff(out, "reservations", got, wantIPs)
	out = appendDiff(out, "owner index entries", index, owners)
	var vethOwners []string
	for _, o := range h.hostVeths() {
		vethOwners = append(vethOwners, o)
	}
	out = appendDiff(out, "node veths of", vethOwners, owners)
	var hostRoutes []string
	for _, r := range h.podRoutes() {
		if strings.HasSuffix(r, "/32") {
			hostRoutes = append(hostRoutes, r)
		}
	}
	return appendDiff(out, "pod host routes", hostRoutes, routes)
}

// appendDiff appends what got has more and less than want, if anything.
func appendDiff(out []string, what string, got, want []string) []string {
	in := func(list []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range list {
			m[x] = true
		}
		return m
	}
	g, w := in(got), in(want)
	var extra, missing []string
	for x := range g {
		if !w[x] {
			extra = append(extra, x)
		}
	}
	for x := range w {
		if !g[x] {
			missing = append(missing, x)
		}
	}
	sort.Strings(extra)
	sort.Strings(missing)
	if len(extra) > 0 {
		out = append(out, fmt.Sprintf("%d %s too many: %s", len(extra), what, abbreviate(extra)))
	}
	if len(missing) > 0 {
		out = append(out, fmt.Sprintf("%d %s missing: %s", len(missing), what, abbreviate(missing)))
	}
	if len(got) != len(g) {
		out = append(out, fmt.Sprintf("%s listed twice: %v", what, got))
	}
	return out
}

// checkAddresses fails the test when one of pods no longer holds its
// address in the store (a live pod reclaimed: a false positive).
func (h *harness) checkAddresses(t *testing.T, pods []*criclient.Sandbox) {
	t.Helper()
	for _, p := range pods {
		if owner, ok := h.reservationOf(p.IP); !ok || owner != p.ID+":"+podIfName {
			t.Fatalf("live pod %s (%.12s) lost its address %s: the store says %q", p.Name, p.ID, p.IP, owner)
		}
	}
}

// waitWhole waits until the store, veths and pod routes of the node are
// exactly those of pods, the attachments of gone freed. pass0 is the
// reconcile pass count when they became free to reclaim (since): the pass
// after it must free them all, so seeing pass pass0+2 begun with the pool
// not whole fails the test (no time limit on a slow machine, only the
// passes). Meanwhile pods must keep their addresses. It returns how long
// after since the pool was whole, and the pass count then.
func (h *harness) waitWhole(t *testing.T, r *routed, pass0 int, pods, gone []*criclient.Sandbox, since time.Time) (time.Duration, int) {
	t.Helper()
	limit := time.Now().Add(waitLimit)
	for {
		// The count first: a pass that began before the check is over
		// when the next has begun.
		c, err := r.counts()
		h.checkAddresses(t, pods)
		problems := h.poolProblems(pods)
		if len(problems) == 0 && err == nil {
			return time.Since(since), c.passes
		}
		if err == nil && c.passes >= pass0+2 {
			t.Fatalf("reconcile pass %d (the first begun once the %d leaks could be freed) is over and the pool is not whole:\n  %s",
				pass0+1, len(gone), strings.Join(problems, "\n  "))
		}
		if time.Now().After(limit) {
			t.Fatalf("pool not whole after %v (reconcile passes: %d, %v):\n  %s", waitLimit, c.passes, err, strings.Join(problems, "\n  "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFreed waits until no reservation or owner index entry of gone's
// attachments is left in the store; pass0 is as for waitWhole. It returns
// how long after since they were gone.
func (h *harness) waitFreed(r *routed, pass0 int, gone []*criclient.Sandbox, since time.Time) (time.Duration, error) {
	limit := time.Now().Add(waitLimit)
	for {
		c, err := r.counts()
		ips, owners := h.reservations()
		var left []string
		for _, p := range gone {
			owner := p.ID + ":" + podIfName
			if ips[p.IP] == owner || contains(owners, owner) {
				left = append(left, p.IP+"="+owner)
			}
		}
		if len(left) == 0 && err == nil {
			return time.Since(since), nil
		}
		if err == nil && c.passes >= pass0+2 {
			return 0, fmt.Errorf("reconcile pass %d (the first begun once the %d leaks could be freed) is over and %d are still reserved: %s",
				pass0+1, len(gone), len(left), abbreviate(left))
		}
		if time.Now().After(limit) {
			return 0, fmt.Errorf("%d of %d leaks still reserved after %v (reconcile passes: %d, %v): %s", len(left), len(gone), waitLimit, c.passes, err, abbreviate(left))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watchAddresses checks for d that pods keep their addresses in the store,
// then that the runtime still reports each ready with the same address.
func (h *harness) watchAddresses(t *testing.T, pods []*criclient.Sandbox, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		h.checkAddresses(t, pods)
	}
	if problems := h.poolProblems(pods); len(problems) > 0 {
		t.Errorf("%v after the pool was whole:\n  %s", d, strings.Join(problems, "\n  "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for _, p := range pods {
		sb, err := h.cri.Inspect(ctx, p.ID)
		if err != nil {
			t.Error(err)
			continue
		}
		if !sb.Ready || sb.IP != p.IP {
			t.Errorf("pod %s: ready %v, address %s (was %s)", p.Name, sb.Ready, sb.IP, p.IP)
		}
	}
}

// wipeRuntimeState does to the runtime what a reboot does: every sandbox
// process dies (runc containers deleted, shims killed), and the tmpfs
// state (containerd's state dir with the pod netns, runc's) is gone.
// containerd must be stopped.
func (h *harness) wipeRuntimeState(t *testing.T) {
	t.Helper()
	for _, id := range runcContainers(h.runcRoot()) {
		if out, err := exec.Command("runc", "--root", h.runcRoot(), "delete", "--force", id).CombinedOutput(); err != nil {
			t.Fatalf("runc delete %.12s: %v: %s", id, err, out)
		}
	}
	for _, pid := range shimPIDs(h.dir) {
		killShim(pid)
	}
	for _, d := range []string{"state", "runc"} {
		dir := filepath.Join(h.dir, d)
		for _, m := range mountsUnder(dir) {
			if err := unmount(m.point); err != nil {
				t.Fatalf("unmount %s: %v", m.point, err)
			}
		}
		must(t, os.RemoveAll(dir))
	}
	if m := mountsUnder(h.dir); len(m) > 0 {
		t.Fatalf("mounts left after the reboot: %v", m)
	}
	if s := shimPIDs(h.dir); len(s) > 0 {
		t.Fatalf("shims left after the reboot: %v", s)
	}
}

// rewriteBootIDs makes every owner index entry of the store one of boot
// id: records of the boot before. It returns how many it rewrote.
func (h *harness) rewriteBootIDs(t *testing.T, id string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(h.storeDir(), "owners", "*"))
	must(t, err)
	for _, f := range files {
		data, err := os.ReadFile(f)
		must(t, err)
		lines := strings.Split(string(data), "\n")
		n := 0
		for i, l := range lines {
			if strings.HasPrefix(l, "boot-id=") {
				lines[i] = "boot-id=" + strconv.Quote(id)
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%s has %d boot-id lines, want 1:\n%s", f, n, data)
		}
		must(t, os.WriteFile(f, []byte(strings.Join(lines, "\n")), 0o600))
		rec, err := store.ParseRecord([]byte(strings.Join(lines, "\n")))
		must(t, err)
		if rec.BootID != id {
			t.Fatalf("%s: boot ID %q after the rewrite", f, rec.BootID)
		}
	}
	return len(files)
}

// newBootID is a random boot ID (a UUID as the kernel writes it).
func newBootID() string {
	x := randomHex(16)
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}
