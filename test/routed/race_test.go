package routed

// TestReconcileRace (issue 22, "Must show 3"): pods come and go on a node
// for two minutes, attached and detached through libcni with the shipped
// conflist, while podnet-routed's leak reconcile runs every second with a
// grace of two seconds, so that it really frees leaked pods during the run.
// Some pods leak (netns deleted without DEL), some lose their DEL (netns
// kept past the grace, then deleted), some have their DEL or their ADD
// killed halfway (the plugin gets SIGKILL). A checker watches every live
// pod all along; at the end the store, the node's links and the pod filter
// must be empty.

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
	"github.com/podnet/podnet/test/nettest"
)

const (
	// raceRun is how long pods are added and deleted.
	raceRun = 2 * time.Minute
	// raceWorkers loop ADD, hold, DEL (or leak) at once.
	raceWorkers = 8
	// The reconcile's flags: a pass every second, frees after 2 s.
	raceInterval = time.Second
	raceGrace    = 2 * time.Second
	// racePodCIDR is small enough that the run cycles through it.
	racePodCIDR = "10.244.1.0/24"
	// raceNetwork is the conflist's network name (the store's directory).
	raceNetwork = "podnet"
	// raceCheckEvery is the checker's period.
	raceCheckEvery = 200 * time.Millisecond
)

// podKind is what happens to a pod after its ADD.
type podKind int

const (
	kindDel     podKind = iota // DEL, then its netns deleted: as a runtime does
	kindLeak                   // netns deleted without DEL (a runtime killed)
	kindSkipDel                // no DEL; netns kept past the grace (live all along), then deleted
	kindKillDel                // DEL killed halfway, netns kept a while, DEL retried or not, netns deleted
	kindKillAdd                // ADD killed halfway, no DEL, netns deleted
)

var kindNames = [...]string{"del", "leak", "skip-del", "kill-del", "kill-add"}

func (k podKind) String() string { return kindNames[k] }

// pickKind: 55 % del, 15 % leak, 10 % skip-del, 15 % kill-del, 5 % kill-add.
func pickKind(rng *rand.Rand) podKind {
	switch n := rng.IntN(100); {
	case n < 55:
		return kindDel
	case n < 70:
		return kindLeak
	case n < 80:
		return kindSkipDel
	case n < 95:
		return kindKillDel
	}
	return kindKillAdd
}

// racePod is one pod sandbox of the run.
type racePod struct {
	seq     int
	name    string
	kind    podKind
	cid     string
	netns   *nettest.NetNS
	rt      *libcni.RuntimeConf
	ip      netip.Addr
	host    string // host veth
	hostIdx int
	// live: ADD returned and was verified, no DEL started, netns there.
	// It goes true once and false once, never back: whoever sees a pod
	// live after looking at its state knows it was live while looking.
	live    atomic.Bool
	addedAt time.Time
	// addStart: when its ADD was started (before its reservation).
	addStart time.Time
	// droppedAt: unix nanos when its netns was about to be deleted;
	// delOK: a DEL of it succeeded.
	droppedAt atomic.Int64
	delOK     atomic.Bool
	addKilled atomic.Bool // its ADD was killed
	reported  atomic.Bool // a violation was reported (once per pod)
}

func (p *racePod) String() string {
	return fmt.Sprintf("pod %s (#%d, %s, container %.12s, %s, host veth %s/%d)", p.name, p.seq, p.kind, p.cid, p.ip, p.host, p.hostIdx)
}

// race is the run's shared state.
type race struct {
	t       *testing.T
	n       *node
	prefix  string // netns name prefix (<cluster>-pod-: swept by the cluster's teardown)
	dataDir string
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
	start   time.Time
	stop    context.CancelFunc // ends the run early (a violation)

	mu         sync.Mutex
	seq        int
	live       map[netip.Addr]*racePod // the live pods, by address
	byCID      map[string]*racePod     // every pod of the run
	freeNames  []string                // names of pods whose netns is gone
	open       map[*racePod]bool       // netns still there
	violations []string
	errs       []string
	handed     map[netip.Addr]int  // times each address was handed out
	leakedIPs  map[netip.Addr]bool // addresses of pods that never had a DEL
	leakReused int                 // ADDs that got such an address back

	adds, dels, delsKilled, delsDone, addsKilled, retriedDels atomic.Int64
	leaks, checks, storeChecks                                atomic.Int64
	kinds                                                     [len(kindNames)]atomic.Int64
	lingering                                                 sync.WaitGroup
}

func (r *race) since() time.Duration { return time.Since(r.start).Round(time.Millisecond) }

// violation records a broken promise and ends the run.
func (r *race) violation(format string, args ...any) {
	msg := fmt.Sprintf("at %s: ", r.since()) + fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.violations = append(r.violations, msg)
	r.mu.Unlock()
	r.stop()
}

// fail records an error of the run itself (an ADD or DEL that failed).
func (r *race) fail(format string, args ...any) {
	msg := fmt.Sprintf("at %s: ", r.since()) + fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.errs = append(r.errs, msg)
	r.mu.Unlock()
	r.stop()
}

// TestReconcileRace: 8 workers ADD and DEL pods for 2 minutes on a /24
// while the leak reconcile passes every second with a 2 s grace. No live
// pod ever loses its reservation, owner index entry, host route or pod
// filter elements; no address is handed out to two live pods; every leak
// is reclaimed, none but a leak; at the end nothing is left.
func TestReconcileRace(t *testing.T) {
	c := newCluster(t)
	c.grantRBAC()
	a := c.addNode("node-a", "172.30.0.1")
	c.createNode("node-a", "172.30.0.1", racePodCIDR)
	d := a.startDaemon("--reconcile-interval="+raceInterval.String(), "--reconcile-grace="+raceGrace.String())
	d.waitReady(syncT)
	a.expectState(changeT, nodestate.State{NodeName: "node-a", PodCIDRs: []string{racePodCIDR}, MTU: underlayMTU, Encap: "none"})

	conf, err := a.m.NodeConflist()
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(conf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), raceRun)
	defer stop()
	r := &race{
		t: t, n: a, prefix: c.c.Cfg.Name + "-pod-", dataDir: a.m.DataDir, list: list, stop: stop,
		// an exec of its own: libcni makes its default one lazily, racing
		// when the first calls are concurrent
		cni: libcni.NewCNIConfigWithCacheDir([]string{c.c.Cfg.BinDir}, filepath.Join(t.TempDir(), "cni-cache"),
			&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}),
		live:   map[netip.Addr]*racePod{},
		byCID:  map[string]*racePod{},
		open:   map[*racePod]bool{},
		handed: map[netip.Addr]int{}, leakedIPs: map[netip.Addr]bool{},
		start: time.Now(),
	}
	t.Cleanup(func() { // a run cut short: close what is left (the teardown removes the netns)
		r.mu.Lock()
		defer r.mu.Unlock()
		for p := range r.open {
			p.netns.Close()
		}
	})
	seed := rand.Uint64()
	t.Logf("seed %d, %d workers, %s, reconcile every %s with a grace of %s, PodCIDR %s", seed, raceWorkers, raceRun, raceInterval, raceGrace, racePodCIDR)

	checkerDone := make(chan struct{})
	checkCtx, stopChecker := context.WithCancel(context.Background())
	go func() {
		defer close(checkerDone)
		r.checker(checkCtx)
	}()
	var workers sync.WaitGroup
	for w := range raceWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for ctx.Err() == nil {
				r.cycle(ctx, rng)
			}
		}()
	}
	workers.Wait()
	r.lingering.Wait()
	stopChecker()
	<-checkerDone
	runFor := r.since()

	r.mu.Lock()
	nLive := len(r.live)
	violations, errs := slices.Clone(r.violations), slices.Clone(r.errs)
	r.mu.Unlock()
	if nLive != 0 {
		t.Errorf("%d pods still live after the run", nLive)
	}
	if len(violations) > 0 {
		// what podnet-routed did to the pod filter meanwhile: a whole
		// write that dropped a live port's address says so here
		for _, msg := range []string{"repaired", "pod filter record refused"} {
			for _, rec := range d.logLines(msg) {
				t.Logf("podnet-routed: %v", rec)
			}
		}
	}
	for i, v := range violations {
		if i == 20 {
			t.Errorf("... and %d more violations", len(violations)-20)
			break
		}
		t.Errorf("VIOLATION %s", v)
	}
	for _, e := range errs {
		t.Errorf("run error: %s", e)
	}
	if err := d.alive(); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every pod is DEL'd or leaked: after the grace and a few passes the
	// store is empty, no host veth is left, the pod filter holds nothing.
	drained := nettest.Eventually(t, raceGrace+10*raceInterval+20*time.Second, "every leak reclaimed, nothing left", func() error {
		if err := d.alive(); err != nil {
			return err
		}
		return r.leftovers()
	})
	t.Logf("run %s; store, links and pod filter empty %s after the last pod ended", runFor, drained.Round(time.Millisecond))

	// The reconcile ran and reclaimed the leaks, and nothing else.
	m, body := r.metrics(d)
	reclaimed := map[string]float64{}
	for _, k := range []string{"netns", "orphan", "runtime", "reboot"} {
		reclaimed[k] = m[fmt.Sprintf("podnet_leaks_reclaimed_total{kind=%q}", k)]
	}
	passes := m["podnet_reconcile_passes_total"]
	maxBucket := maxHistogramBucket(body, "podnet_reconcile_lock_hold_seconds")
	logged := r.checkReclaimLog(d)
	// a reclaim logs before it counts: the last one's count may come a
	// moment after the store was seen empty
	for deadline := time.Now().Add(5 * time.Second); reclaimed["netns"]+reclaimed["orphan"] < float64(logged) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		m, _ = r.metrics(d)
		for _, k := range []string{"netns", "orphan", "runtime", "reboot"} {
			reclaimed[k] = m[fmt.Sprintf("podnet_leaks_reclaimed_total{kind=%q}", k)]
		}
	}

	r.mu.Lock()
	distinct, reused := len(r.handed), 0
	for _, n := range r.handed {
		reused += n - 1
	}
	leakReused := r.leakReused
	r.mu.Unlock()
	t.Logf("ADDs %d (killed %d), DELs %d (killed %d: %d of them finished anyway; %d retried), pods by kind %s",
		r.adds.Load(), r.addsKilled.Load(), r.dels.Load(), r.delsKilled.Load(), r.delsDone.Load(), r.retriedDels.Load(), r.kindCounts())
	t.Logf("addresses: %d distinct handed out, %d handed out again, %d of them an address of a pod that never had a DEL (freed by the reconcile)", distinct, reused, leakReused)
	t.Logf("leaks: %d pods left without a completed DEL; reclaimed %v (%d 'leak reclaimed' log records); reconcile passes %v, errors %v; repairs pod-route %v pod-sysctl %v; lock hold max bucket le=%s (count %v, sum %.4fs)",
		r.leaks.Load(), reclaimed, logged, passes, m["podnet_reconcile_errors_total"], m[`podnet_repairs_total{object="pod-route"}`], m[`podnet_repairs_total{object="pod-sysctl"}`],
		maxBucket, m["podnet_reconcile_lock_hold_seconds_count"], m["podnet_reconcile_lock_hold_seconds_sum"])
	t.Logf("checker: %d rounds over the live pods, %d locked store reads", r.checks.Load(), r.storeChecks.Load())

	if n := r.adds.Load(); n < 200 {
		t.Errorf("only %d ADDs in %s, want at least 200", n, raceRun)
	}
	if n := r.dels.Load(); n < 150 {
		t.Errorf("only %d DELs in %s, want at least 150", n, raceRun)
	}
	if reused == 0 {
		t.Errorf("no address was handed out twice over the run (%d distinct): the pool was never cycled", distinct)
	}
	if passes < 100 {
		t.Errorf("podnet_reconcile_passes_total = %v, want at least 100 in %s at one a second", passes, runFor)
	}
	if reclaimed["netns"] == 0 {
		t.Errorf("podnet_leaks_reclaimed_total{kind=\"netns\"} = 0 after %d leaks", r.leaks.Load())
	}
	total := reclaimed["netns"] + reclaimed["orphan"]
	if total != float64(logged) {
		t.Errorf("podnet_leaks_reclaimed_total says %v, the log %d", total, logged)
	}
	if total > float64(r.leaks.Load()) {
		t.Errorf("%v reclaims, more than the %d pods that could leak", total, r.leaks.Load())
	}
	if reclaimed["runtime"] != 0 || reclaimed["reboot"] != 0 {
		t.Errorf("reclaims of kind runtime or reboot with no runtime and no reboot: %v", reclaimed)
	}
	if e := m["podnet_reconcile_errors_total"]; e != 0 {
		t.Errorf("podnet_reconcile_errors_total = %v\n%s", e, tailLog(d, "leak reconcile"))
	}
	// Nobody broke a live pod's host side: a repair would be a false one.
	for _, o := range []string{"pod-route", "pod-sysctl"} {
		if v := m[fmt.Sprintf("podnet_repairs_total{object=%q}", o)]; v != 0 {
			t.Errorf("podnet_repairs_total{object=%q} = %v, want 0: nothing broke a live pod's host side", o, v)
		}
	}
}

// cycle is one pod's life, from its netns to its end (which, for the
// kinds whose netns outlives their DEL or the grace, goes on in the
// background while the worker starts the next pod).
func (r *race) cycle(ctx context.Context, rng *rand.Rand) {
	kind := pickKind(rng)
	p, err := r.newPod(kind)
	if err != nil {
		r.fail("new pod: %v", err)
		return
	}
	if kind == kindKillAdd {
		kctx, cancel := context.WithTimeout(context.Background(), randDur(rng, time.Millisecond, 15*time.Millisecond))
		res, err := r.add(kctx, p)
		cancel()
		if err != nil {
			// killed: the runtime is gone too, no DEL ever comes
			p.addKilled.Store(true)
			r.addsKilled.Add(1)
			r.kinds[kind].Add(1)
			r.leaks.Add(1)
			r.linger(p, randDur(rng, 0, time.Second), false)
			return
		}
		kind = kindDel // it finished: an ordinary pod
		if !r.added(p, res) {
			return
		}
	} else {
		res, err := r.add(context.Background(), p)
		if err != nil {
			r.fail("ADD %s: %v", p, err)
			r.dropNetns(p)
			return
		}
		if !r.added(p, res) {
			return
		}
	}
	r.kinds[kind].Add(1)
	hold := randDur(rng, 0, 1500*time.Millisecond)
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	switch kind {
	case kindDel:
		r.end(p)
		if err := r.del(context.Background(), p); err != nil {
			r.fail("DEL %s: %v", p, err)
		}
		r.dropNetns(p)
	case kindLeak:
		r.leaks.Add(1)
		r.end(p)
		r.dropNetns(p)
	case kindSkipDel:
		// still live: its netns is there, so the reconcile must keep it
		// past the grace
		r.leaks.Add(1)
		r.lingering.Add(1)
		keep := raceGrace + randDur(rng, raceInterval, 3*raceInterval)
		go func() {
			defer r.lingering.Done()
			time.Sleep(keep)
			r.end(p)
			r.dropNetns(p)
		}()
	case kindKillDel:
		r.end(p)
		kctx, cancel := context.WithTimeout(context.Background(), randDur(rng, 0, 12*time.Millisecond))
		err := r.del(kctx, p)
		cancel()
		r.delsKilled.Add(1)
		if err == nil {
			r.delsDone.Add(1)
			r.dropNetns(p)
			return
		}
		retry := rng.IntN(2) == 0
		if !retry {
			r.leaks.Add(1)
		}
		r.linger(p, randDur(rng, 200*time.Millisecond, 3*time.Second), retry)
	}
}

// linger keeps p's netns for keep in the background, then DELs it again
// (retry) or not, and deletes the netns.
func (r *race) linger(p *racePod, keep time.Duration, retry bool) {
	r.lingering.Add(1)
	go func() {
		defer r.lingering.Done()
		time.Sleep(keep)
		if retry {
			r.retriedDels.Add(1)
			if err := r.del(context.Background(), p); err != nil {
				r.fail("DEL again after a killed DEL, %s: %v", p, err)
			}
		}
		r.dropNetns(p)
	}()
}

func randDur(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// newPod makes a pod netns. Three times in ten it takes the name (and so
// the netns path and the host veth name) of a pod whose netns is gone, as
// a StatefulSet's pod comes back: a record the reconcile has not freed yet
// may name the same path.
func (r *race) newPod(kind podKind) (*racePod, error) {
	r.mu.Lock()
	r.seq++
	p := &racePod{seq: r.seq, kind: kind, name: fmt.Sprintf("r%d", r.seq)}
	if len(r.freeNames) > 0 && r.seq%10 < 3 {
		i := r.seq % len(r.freeNames)
		p.name = r.freeNames[i]
		r.freeNames = slices.Delete(r.freeNames, i, i+1)
	}
	r.mu.Unlock()
	id := make([]byte, 32)
	_, _ = crand.Read(id)
	p.cid = hex.EncodeToString(id)
	netns, err := nettest.NewNamedNetNS(r.prefix + p.name)
	if err != nil {
		return nil, err
	}
	p.netns = netns
	r.mu.Lock()
	r.open[p] = true
	r.byCID[p.cid] = p
	r.mu.Unlock()
	p.rt = &libcni.RuntimeConf{
		ContainerID: p.cid, NetNS: netns.Path(), IfName: "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", "default"},
			{"K8S_POD_NAME", p.name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.cid},
		},
	}
	return p, nil
}

// add runs CNI ADD in the node netns.
func (r *race) add(ctx context.Context, p *racePod) (*current.Result, error) {
	p.addStart = time.Now()
	var res *current.Result
	err := r.n.m.NS.Do(func() error {
		out, err := r.cni.AddNetworkList(ctx, r.list, p.rt)
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(out)
		return err
	})
	return res, err
}

// del runs CNI DEL (with the cached result, as a runtime does).
func (r *race) del(ctx context.Context, p *racePod) error {
	err := r.n.m.NS.Do(func() error { return r.cni.DelNetworkList(ctx, r.list, p.rt) })
	if err == nil {
		r.dels.Add(1)
		p.delOK.Store(true)
	}
	return err
}

// added verifies a pod ADD attached (its address in its netns, its host
// veth, route and pod filter elements on the node) and makes it live,
// after checking that no live pod holds its address.
func (r *race) added(p *racePod, res *current.Result) bool {
	r.adds.Add(1)
	for _, ip := range res.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap().Is4() {
			p.ip = a.Unmap()
		}
	}
	for _, iface := range res.Interfaces {
		if iface.Sandbox == "" {
			p.host = iface.Name
		}
	}
	if !p.ip.IsValid() || !netip.MustParsePrefix(racePodCIDR).Contains(p.ip) || p.host == "" {
		r.fail("ADD %s: result %v", p, res)
		return false
	}
	if err := r.verifyAttached(p); err != nil {
		r.violation("just after ADD, %s: %v%s", p, err, r.filterState())
		return false
	}
	p.addedAt = time.Now()
	r.mu.Lock()
	other := r.live[p.ip]
	if other == nil {
		r.live[p.ip] = p
		p.live.Store(true)
	}
	if r.leakedIPs[p.ip] {
		r.leakReused++
		delete(r.leakedIPs, p.ip)
	}
	r.handed[p.ip]++
	r.mu.Unlock()
	if other != nil {
		r.violation("address handed out twice: ADD gave %s the address of live %s (live since %s)", p, other, other.addedAt.Sub(r.start).Round(time.Millisecond))
		return false
	}
	return true
}

// end takes p out of the live pods, before its DEL or its netns goes.
func (r *race) end(p *racePod) {
	if !p.live.Load() {
		return
	}
	r.mu.Lock()
	if r.live[p.ip] == p {
		delete(r.live, p.ip)
	}
	if p.kind == kindLeak || p.kind == kindSkipDel {
		r.leakedIPs[p.ip] = true // no DEL will come: only the reconcile frees it
	}
	r.mu.Unlock()
	p.live.Store(false)
}

// dropNetns deletes the pod's netns, as the runtime does after DEL (or a
// dying one without).
func (r *race) dropNetns(p *racePod) {
	r.end(p)
	p.droppedAt.Store(time.Now().UnixNano())
	p.netns.Close()
	if err := nettest.RemoveNamedNetNS(p.netns.Name); err != nil {
		r.fail("remove netns of %s: %v", p, err)
	}
	r.mu.Lock()
	delete(r.open, p)
	r.freeNames = append(r.freeNames, p.name)
	r.mu.Unlock()
}

func (r *race) kindCounts() string {
	var parts []string
	for k := range kindNames {
		parts = append(parts, fmt.Sprintf("%s=%d", podKind(k), r.kinds[k].Load()))
	}
	return strings.Join(parts, " ")
}

// ---- what a live pod has ----

// verifyAttached checks a pod just added: eth0 has its address in its
// netns, and the node has its host veth (up), host route and filter.
func (r *race) verifyAttached(p *racePod) error {
	if err := p.netns.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.Equal(p.ip.AsSlice()) {
				return nil
			}
		}
		return fmt.Errorf("eth0 in the pod has %v, not %s", addrs, p.ip)
	}); err != nil {
		return err
	}
	err := r.n.m.NS.Do(func() error {
		l, err := netlink.LinkByName(p.host)
		if err != nil {
			return fmt.Errorf("host veth: %w", err)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("host veth %s is down", p.host)
		}
		p.hostIdx = l.Attrs().Index
		return nil
	})
	if err != nil {
		return err
	}
	nodeView, err := r.readNode()
	if err != nil {
		return err
	}
	return nodeView.check(p)
}

// nodeView is what the node has for its pods: host routes by address, and
// the pod filter's ports and addresses.
type nodeView struct {
	routes map[netip.Addr]int // pod host route: destination -> link index
	ports  map[int]bool
	addrs4 map[string]bool // "index . address"
}

func (r *race) readNode() (*nodeView, error) {
	v := &nodeView{routes: map[netip.Addr]int{}, ports: map[int]bool{}, addrs4: map[string]bool{}}
	err := r.n.m.NS.Do(func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: contract.RouteProtocol, Table: mainTable},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, rt := range routes {
			if contract.IsPodHostRoute(&rt) && rt.Dst != nil {
				if ones, _ := rt.Dst.Mask.Size(); ones == 32 {
					a, _ := netip.AddrFromSlice(rt.Dst.IP)
					v.routes[a.Unmap()] = rt.LinkIndex
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("node routes: %w", err)
	}
	elems, err := nettest.ReadPodFilter(r.n.ns)
	if err != nil {
		return nil, fmt.Errorf("pod filter: %w", err)
	}
	for _, e := range elems {
		switch e.Set {
		case "ports":
			v.ports[e.Index] = true
		case "addrs4":
			v.addrs4[fmt.Sprintf("%d . %s", e.Index, e.Value)] = true
		}
	}
	return v, nil
}

func (v *nodeView) check(p *racePod) error {
	idx, ok := v.routes[p.ip]
	switch {
	case !ok:
		return fmt.Errorf("no host route to %s", p.ip)
	case idx != p.hostIdx:
		return fmt.Errorf("the host route to %s goes to link %d, not its host veth %d", p.ip, idx, p.hostIdx)
	case !v.ports[p.hostIdx]:
		return fmt.Errorf("pod filter: port %d (its host veth) is not in the ports set", p.hostIdx)
	case !v.addrs4[fmt.Sprintf("%d . %s", p.hostIdx, p.ip)]:
		return fmt.Errorf("pod filter: %d . %s is not in addrs4", p.hostIdx, p.ip)
	}
	return nil
}

// filterState is what a violation of the pod filter is read against:
// the filter's elements and the port records, read again right away (a
// whole write in between shows as a second read that differs from the
// first).
func (r *race) filterState() string {
	var b strings.Builder
	for try := range 2 {
		elems, err := nettest.PodFilterElements(r.n.ns)
		fmt.Fprintf(&b, "\n  pod filter, read %d: %q (err %v)", try+1, elems, err)
	}
	dir := filepath.Join(r.n.stateDir, "pod-filter", "routed")
	ents, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintf(&b, "\n  records: %v", err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		fmt.Fprintf(&b, "\n  record %s: %s (err %v)", e.Name(), strings.TrimSpace(string(data)), err)
	}
	return b.String()
}

// checkStore checks a live pod's reservation file (names it) and owner
// index entry (lists its address), read without the store's lock.
func (r *race) checkStore(p *racePod) error {
	dir := filepath.Join(r.dataDir, raceNetwork)
	data, err := os.ReadFile(filepath.Join(dir, "ips", p.ip.String()))
	if err != nil {
		return fmt.Errorf("reservation: %w", err)
	}
	o, err := store.ParseOwner(data)
	if err != nil {
		return err
	}
	if want := (allocator.Owner{ContainerID: p.cid, IfName: "eth0"}); o != want {
		return fmt.Errorf("reservation of %s names container %.12s/%s", p.ip, o.ContainerID, o.IfName)
	}
	data, err = os.ReadFile(filepath.Join(dir, "owners", p.cid+":eth0"))
	if err != nil {
		return fmt.Errorf("owner index entry: %w", err)
	}
	rec, err := store.ParseRecord(data)
	if err != nil {
		return err
	}
	if !slices.Contains(rec.IPs, p.ip) {
		return fmt.Errorf("owner index entry lists %v, not %s", rec.IPs, p.ip)
	}
	return nil
}

// checker looks at every live pod every raceCheckEvery until ctx ends,
// and at the whole store, under its lock, every fifth round.
func (r *race) checker(ctx context.Context) {
	tick := time.NewTicker(raceCheckEvery)
	defer tick.Stop()
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.checks.Add(1)
		r.mu.Lock()
		pods := slices.Collect(maps.Values(r.live))
		r.mu.Unlock()
		view, err := r.readNode()
		if err != nil {
			r.fail("checker: %v", err)
			return
		}
		for _, p := range pods {
			err := errors.Join(r.checkStore(p), view.check(p))
			// live before and after the look: live while looking
			if err != nil && p.live.Load() && !p.reported.Swap(true) {
				r.violation("live %s (added %s before): %v%s", p, time.Since(p.addedAt).Round(time.Millisecond), err, r.filterState())
			}
		}
		if round%5 == 4 {
			r.storeChecks.Add(1)
			if err := r.checkLockedStore(); err != nil {
				r.violation("store: %v", err)
			}
		}
	}
}

// checkLockedStore reads the whole store under its lock (so it is one
// consistent state): no address is listed by two owner index entries
// (unless all but one are the stale entry of a pod whose DEL was killed
// between its two unlinks, which the next release tolerates), every live
// pod's address is reserved to it.
func (r *race) checkLockedStore() error {
	disk, err := store.OpenDisk(r.dataDir, raceNetwork)
	if err != nil {
		return err
	}
	snap, err := store.ReadSnapshot(r.dataDir, raceNetwork)
	r.mu.Lock()
	live := slices.Collect(maps.Values(r.live))
	byCID := r.byCID
	var errs []error
	if err == nil {
		listed := map[netip.Addr][]allocator.Owner{}
		for o, rec := range snap.Records {
			for _, ip := range rec.IPs {
				listed[ip] = append(listed[ip], o)
			}
		}
		for ip, owners := range listed {
			if len(owners) < 2 {
				continue
			}
			holder := snap.Reservations[ip].Owner
			for _, o := range owners {
				if p := byCID[o.ContainerID]; o != holder && (p == nil || p.kind != kindKillDel) {
					errs = append(errs, fmt.Errorf("%s is listed by %d owner index entries (%v), reserved to %.12s", ip, len(owners), owners, holder.ContainerID))
					break
				}
			}
		}
		for _, p := range live {
			if rv, ok := snap.Reservations[p.ip]; !ok || rv.Owner.ContainerID != p.cid {
				errs = append(errs, fmt.Errorf("live %s: reservation %v", p, rv.Owner))
			}
		}
	}
	r.mu.Unlock()
	err = errors.Join(err, disk.Close())
	if err != nil {
		return err
	}
	return errors.Join(errs...)
}

// ---- the end ----

// leftovers says what the node still holds of the run's pods: store
// entries, host veths, pod filter elements, pod host routes.
func (r *race) leftovers() error {
	var left []string
	for _, sub := range []string{"ips", "owners"} {
		entries, err := os.ReadDir(filepath.Join(r.dataDir, raceNetwork, sub))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		for _, e := range entries {
			left = append(left, sub+"/"+e.Name())
		}
	}
	err := r.n.m.NS.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if contract.IsHostVeth(l.Attrs().Name) {
				left = append(left, "link "+l.Attrs().Name)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	view, err := r.readNode()
	if err != nil {
		return err
	}
	for ip := range view.routes {
		left = append(left, "route "+ip.String())
	}
	for i := range view.ports {
		left = append(left, fmt.Sprintf("pod filter port %d", i))
	}
	for e := range view.addrs4 {
		left = append(left, "pod filter addrs4 "+e)
	}
	if len(left) > 0 {
		sort.Strings(left)
		if len(left) > 12 {
			left = append(left[:12], fmt.Sprintf("... (%d in all)", len(left)))
		}
		return fmt.Errorf("left: %s", strings.Join(left, ", "))
	}
	return nil
}

// checkReclaimLog checks every "leak reclaimed" record of the daemon. It
// must name a pod of the run that no DEL released, and be written after
// the pod was dead to the reconcile: with no runtime here, after its netns
// was being deleted (kind netns), or, for the reservation of an ADD killed
// before it wrote its owner index entry (kind orphan), after the grace.
// It returns how many records there are.
func (r *race) checkReclaimLog(d *daemon) int {
	recs := d.logLines("leak reclaimed")
	for _, rec := range recs {
		cid, _ := rec["container"].(string)
		kind, _ := rec["kind"].(string)
		ts, _ := rec["time"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			r.t.Errorf("leak reclaimed record without a time: %v", rec)
			continue
		}
		r.mu.Lock()
		p := r.byCID[cid]
		r.mu.Unlock()
		switch {
		case p == nil:
			r.t.Errorf("reclaimed a container the run never made: %v", rec)
		case p.delOK.Load():
			r.t.Errorf("reclaimed %s, which a DEL had released: %v", p, rec)
		case kind == "orphan" && !p.addKilled.Load():
			r.t.Errorf("reclaimed %s as an orphan reservation, but its ADD was not killed: %v", p, rec)
		case kind == "orphan" && at.Before(p.addStart.Add(raceGrace)):
			r.t.Errorf("reclaimed %s as an orphan %s after its ADD started, within the grace of %s: %v", p, at.Sub(p.addStart), raceGrace, rec)
		case kind == "orphan":
		case p.droppedAt.Load() == 0:
			r.t.Errorf("reclaimed %s, whose netns was never deleted: %v", p, rec)
		case at.UnixNano() < p.droppedAt.Load():
			r.t.Errorf("reclaimed %s at %s, before its netns was deleted at %s: %v", p, at.Sub(r.start), time.Unix(0, p.droppedAt.Load()).Sub(r.start), rec)
		}
	}
	return len(recs)
}

// metrics scrapes the daemon's metrics, labelled series included.
func (r *race) metrics(d *daemon) (map[string]float64, string) {
	code, body, err := d.n.get(d.metricsAddr, "/metrics")
	if err != nil || code != 200 {
		r.t.Fatalf("/metrics: %d %v", code, err)
	}
	m, err := nettest.ParseMetrics(body)
	if err != nil {
		r.t.Fatal(err)
	}
	return m, body
}

// maxHistogramBucket is the upper bound of the lowest bucket of histogram
// name that holds every observation ("+Inf" when only that one does).
func maxHistogramBucket(body, name string) string {
	var count float64
	type bucket struct {
		le    float64
		label string
		n     float64
	}
	var buckets []bucket
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+"_count "); ok {
			count, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		n, _ := strconv.ParseFloat(strings.TrimSpace(val), 64)
		f, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue // +Inf parses, but be safe
		}
		buckets = append(buckets, bucket{f, le, n})
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	for _, b := range buckets {
		if b.n >= count {
			return b.label
		}
	}
	return "?"
}

// tailLog returns the daemon's log records whose msg is msg, rendered.
func tailLog(d *daemon, msg string) string {
	var out []string
	for _, rec := range d.logLines(msg) {
		out = append(out, fmt.Sprint(rec))
	}
	if len(out) > 10 {
		out = out[len(out)-10:]
	}
	return strings.Join(out, "\n")
}
