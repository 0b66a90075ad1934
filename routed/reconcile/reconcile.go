package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/ipam"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// Config is the reconcile's configuration.
type Config struct {
	// DataDirs are the podnet-ipam data directories of the node's
	// networks (ipam.dataDir; podnet-ipam's default is ipam.DefaultDataDir):
	// every network store under each is reconciled.
	DataDirs []string
	// Interval between passes (the first runs at start); Grace is the age
	// below which a reservation is never freed (an ADD in flight).
	Interval, Grace time.Duration
	// CRISocket is the runtime's CRI endpoint ("" asks no runtime).
	CRISocket string
	// BootIDPath is where the current boot ID is read
	// (ipam.BootIDPath).
	BootIDPath string
	// ProcSys is the sysctl tree the live pods' proxy ARP is read and
	// repaired in ("/proc/sys").
	ProcSys string
	// LockBudget is how long one hold of a store's lock may last before
	// the pass lets ADD and DEL in (they queue on the lock meanwhile).
	LockBudget time.Duration
	// HoldNice is the nice value (-20..19; 0: the process's) of the
	// thread while it waits for and holds a store's lock, that thread
	// alone (threadprio): a node starting pods keeps the CPUs busy, and
	// a hold the scheduler stretches is time every ADD and DEL queued on
	// the lock waits on top of it. A thread whose priority cannot be
	// raised holds at its own.
	HoldNice int
}

// DefaultLockBudget is how long one hold of a store's lock frees
// attachments before letting queued ADDs and DELs in.
const DefaultLockBudget = 2 * time.Millisecond

// Metrics are the reconcile's counters.
type Metrics struct {
	// Reclaimed is podnet_leaks_reclaimed_total{kind}.
	Reclaimed *prometheus.CounterVec
	// Repairs counts live pods' host state put back, by object
	// ("pod-route", "pod-sysctl"): podnet_repairs_total{object}.
	Repairs *prometheus.CounterVec
	// Passes, Errors, LockHold: podnet_reconcile_passes_total,
	// podnet_reconcile_errors_total, podnet_reconcile_lock_hold_seconds.
	Passes, Errors prometheus.Counter
	LockHold       prometheus.Histogram
	// RuntimeMismatch is podnet_reconcile_runtime_mismatch: 1 while the
	// runtime lists none of the node's live pods (its answer refused);
	// RuntimeRefused, podnet_reconcile_runtime_refused_total, counts the
	// passes that refused it.
	RuntimeMismatch prometheus.Gauge
	RuntimeRefused  prometheus.Counter
	// Overruled is podnet_reconcile_overruled{rule}: the attachments the
	// last pass kept only because their host veth is in service, while
	// their boot ID ("reboot") or the runtime ("runtime") said dead.
	Overruled *prometheus.GaugeVec
}

// NewMetrics makes the metrics and registers them in reg; repairs, when
// not nil, is the daemon's podnet_repairs_total (shared, not registered
// again).
func NewMetrics(reg prometheus.Registerer, repairs *prometheus.CounterVec) *Metrics {
	m := &Metrics{
		Reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "podnet_leaks_reclaimed_total",
			Help: "Pod attachments freed by the leak reconcile (addresses and host-side state of pods whose DEL never came), by why they were judged dead: reboot, runtime, netns, orphan."}, []string{"kind"}),
		Repairs: repairs,
		Passes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "podnet_reconcile_passes_total", Help: "Passes of the leak reconcile."}),
		Errors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "podnet_reconcile_errors_total", Help: "Leak reconcile passes that met an error (see the log)."}),
		LockHold: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "podnet_reconcile_lock_hold_seconds",
			Help: "How long the leak reconcile held an IPAM store's lock at a time.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 12)}),
		RuntimeMismatch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "podnet_reconcile_runtime_mismatch",
			Help: "1 while the runtime at --cri-socket lists none of the node's live pods: it is taken for the wrong runtime and its answer is ignored (pods are judged by their netns and host veth)."}),
		RuntimeRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "podnet_reconcile_runtime_refused_total",
			Help: "Leak reconcile passes that refused the runtime's answer: it listed none of the node's live pods."}),
		Overruled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "podnet_reconcile_overruled",
			Help: "Attachments the last leak reconcile pass kept only because their host veth is in service, while their boot ID (rule=reboot) or the runtime (rule=runtime) said their pod is dead."}, []string{"rule"}),
	}
	for _, k := range []Kind{KindReboot, KindRuntime} {
		m.Overruled.WithLabelValues(string(k))
	}
	for _, k := range []Kind{KindReboot, KindRuntime, KindNetns, KindOrphan} {
		m.Reclaimed.WithLabelValues(string(k))
	}
	if m.Repairs == nil {
		m.Repairs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "podnet_repairs_total", Help: "Objects podnet put back."}, []string{"object"})
		reg.MustRegister(m.Repairs)
	}
	reg.MustRegister(m.Reclaimed, m.Passes, m.Errors, m.LockHold, m.RuntimeMismatch, m.RuntimeRefused, m.Overruled)
	return m
}

// Loop is the reconcile loop.
type Loop struct {
	cfg     Config
	log     *slog.Logger
	m       *Metrics
	runtime *Runtime // nil: no runtime asked
	// runtimeDown: the last pass found no runtime (logged once).
	runtimeDown bool
	// runtimeMismatch: the last pass refused the runtime's answer (logged
	// once per change).
	runtimeMismatch bool
	mismatchPods    int // how many live pods it did not list
	// overruled are the attachments the last pass kept only because their
	// host veth is in service, with the rule they overruled: each is
	// logged when it enters the set, not at every pass.
	overruled map[attachment.Owner]Kind
	// status is what /readyz shows of the reconcile (Status).
	status atomic.Pointer[[]string]
	// now is time.Now (tests move it).
	now func() time.Time
	// routes are the node's pod host routes, listed once per pass.
	routes hostRoutes
	// filter is the pod filter's lasting nftables socket (under
	// filterMu): a socket closed after each pass would hold every
	// nftables writer of the node up (see podfilter.PruneOn).
	filterMu sync.Mutex
	filter   nftutil.Conn
}

// New returns the loop. A CRI socket that cannot be used is an error.
func New(cfg Config, m *Metrics, log *slog.Logger) (*Loop, error) {
	if cfg.Interval <= 0 {
		return nil, errors.New("reconcile interval must be positive")
	}
	if cfg.Grace < 0 {
		return nil, errors.New("reconcile grace must not be negative")
	}
	if cfg.BootIDPath == "" {
		cfg.BootIDPath = ipam.BootIDPath
	}
	if cfg.ProcSys == "" {
		cfg.ProcSys = "/proc/sys"
	}
	if cfg.LockBudget <= 0 {
		cfg.LockBudget = DefaultLockBudget
	}
	if cfg.HoldNice < -20 || cfg.HoldNice > 19 {
		return nil, fmt.Errorf("leak reconcile: hold nice %d out of -20..19", cfg.HoldNice)
	}
	l := &Loop{cfg: cfg, log: log, m: m, now: time.Now, filter: nftutil.Conn{Timeout: 10 * time.Second, ReceiveBuffer: podfilter.ReceiveBuffer}}
	if cfg.CRISocket != "" {
		rt, err := NewRuntime(cfg.CRISocket)
		if err != nil {
			return nil, err
		}
		l.runtime = rt
	}
	return l, nil
}

// Run passes at start and every interval until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	if l.runtime != nil {
		defer l.runtime.Close()
	}
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := l.Pass(ctx); err != nil && ctx.Err() == nil {
			l.log.Error("leak reconcile", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Result is what one pass did.
type Result struct {
	Reclaimed map[Kind]int
	Repaired  int
	// MaxLockHold is the longest single hold of a store's lock.
	MaxLockHold time.Duration
}

// storeSnap is one network store's snapshot.
type storeSnap struct {
	dir, network string
	snap         *store.Snapshot
}

// Pass reconciles every store once.
func (l *Loop) Pass(ctx context.Context) (Result, error) {
	res := Result{Reclaimed: map[Kind]int{}}
	l.m.Passes.Inc()
	facts := Facts{Now: l.now(), Grace: l.cfg.Grace, BootID: ipam.ReadBootID(l.cfg.BootIDPath), Netns: netnsState}
	facts.Sandboxes = l.sandboxes(ctx)
	links, err := attachment.HostLinks("")
	if err != nil {
		l.m.Errors.Inc()
		return res, err
	}
	var errs []error
	if l.routes, err = listHostRoutes(); err != nil {
		errs = append(errs, err) // no repair this pass; reclaiming goes on
	}
	var snaps []storeSnap
	for _, dir := range l.cfg.DataDirs {
		networks, err := store.Networks(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no pod was ever added with this data directory
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, network := range networks {
			snap, err := store.ReadSnapshot(dir, network)
			if err != nil {
				errs = append(errs, fmt.Errorf("network %s in %s: %w", network, dir, err))
				continue
			}
			snaps = append(snaps, storeSnap{dir: dir, network: network, snap: snap})
		}
	}
	facts.Sandboxes = l.checkRuntime(facts, snaps, links)
	overruled := map[attachment.Owner]Kind{}
	for _, s := range snaps {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		if err := l.network(s, facts, links, overruled, &res); err != nil {
			errs = append(errs, fmt.Errorf("network %s in %s: %w", s.network, s.dir, err))
		}
	}
	l.noteOverruled(overruled)
	l.publishStatus()
	// Elements of veths that are gone (freed now, or died with their
	// netns) leave the pod filter.
	l.filterMu.Lock()
	defer l.filterMu.Unlock()
	for _, g := range []podfilter.Guard{podfilter.Routed, podfilter.Bridged} {
		c, err := l.filter.Open()
		if err == nil {
			if err = podfilter.PruneOn(g, c, l.filter.Netlink()); err != nil {
				l.filter.Close() // whatever it was in the middle of
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("prune pod filter %s: %w", g, err))
		}
	}
	err = errors.Join(errs...)
	if err != nil {
		l.m.Errors.Inc()
	}
	return res, err
}

// checkRuntime returns the runtime's sandboxes when its answer may be
// used, nil when it may not: a runtime that lists none of the node's live
// pods (attachments a runtime made, past the grace, with their host veth
// in service) is not the runtime that made them (a --cri-socket of
// another runtime: a containerd with CRI enabled on a CRI-O node), and
// its "no such sandbox" would be every pod's death sentence. Pods made by
// hand (no pod recorded) and those in their grace prove nothing either
// way. The refusal is logged when it starts and ends, counted and shown
// in /readyz.
func (l *Loop) checkRuntime(f Facts, snaps []storeSnap, links map[attachment.Owner][]netlink.Link) map[string]SandboxState {
	if f.Sandboxes == nil { // no answer to refuse ("does not answer" is logged)
		l.runtimeMismatch, l.mismatchPods = false, 0
		l.m.RuntimeMismatch.Set(0)
		return nil
	}
	var live []string // "namespace/name" of the live pods
	for _, s := range snaps {
		for o, r := range s.snap.Records {
			if _, listed := f.Sandboxes[o.ContainerID]; listed {
				l.setMismatch(false, nil)
				return f.Sandboxes
			}
			vo := attachment.Owner{Network: s.network, ContainerID: o.ContainerID, IfName: o.IfName}
			if r.HasPod() && f.Now.Sub(createdAt(s.snap, o, r)) >= f.Grace && inService(links[vo]) {
				live = append(live, r.PodNamespace+"/"+r.PodName)
			}
		}
	}
	if len(live) == 0 {
		l.setMismatch(false, nil)
		return f.Sandboxes
	}
	sort.Strings(live)
	l.setMismatch(true, live)
	return nil
}

// MsgRuntimeMismatch is the log message of a runtime whose answer is
// refused (logged when the refusal starts).
const MsgRuntimeMismatch = "leak reconcile: the runtime lists none of the node's live pods; taken for the wrong runtime, its answer is ignored"

// setMismatch records whether the runtime's answer is refused this pass
// (live: the live pods it does not list).
func (l *Loop) setMismatch(on bool, live []string) {
	if on {
		l.m.RuntimeRefused.Inc()
		l.m.RuntimeMismatch.Set(1)
		if !l.runtimeMismatch {
			l.log.Warn(MsgRuntimeMismatch, "socket", l.cfg.CRISocket, "livePods", len(live), "examples", live[:min(len(live), 5)],
				"hint", "it is not the runtime that made them (check --cri-socket): pods are judged by their netns and host veth until it lists them")
		}
	} else {
		l.m.RuntimeMismatch.Set(0)
		if l.runtimeMismatch {
			l.log.Info("leak reconcile: the runtime lists the node's pods again; its answer is used", "socket", l.cfg.CRISocket)
		}
	}
	l.runtimeMismatch = on
	l.mismatchPods = len(live)
}

// noteOverruled publishes the attachments this pass kept only because
// their host veth is in service, and logs those that were not so kept in
// the pass before.
func (l *Loop) noteOverruled(now map[attachment.Owner]Kind) {
	counts := map[Kind]int{}
	for o, k := range now {
		counts[k]++
		if l.overruled[o] != k {
			l.log.Warn("leak reconcile: kept an attachment whose "+overruledWhat(k)+" says its pod is dead: its host veth is in service",
				"network", o.Network, "container", o.ContainerID, "ifname", o.IfName, "rule", k)
		}
	}
	for o, k := range l.overruled {
		if _, still := now[o]; !still {
			l.log.Info("leak reconcile: an attachment kept against its "+overruledWhat(k)+" is no longer in that state",
				"network", o.Network, "container", o.ContainerID, "ifname", o.IfName, "rule", k)
		}
	}
	for _, k := range []Kind{KindReboot, KindRuntime} {
		l.m.Overruled.WithLabelValues(string(k)).Set(float64(counts[k]))
	}
	l.overruled = now
}

func overruledWhat(k Kind) string {
	if k == KindReboot {
		return "boot ID (of another boot)"
	}
	return "runtime"
}

// publishStatus sets what Status reports.
func (l *Loop) publishStatus() {
	var out []string
	if l.runtimeMismatch {
		out = append(out, fmt.Sprintf("leak reconcile: the runtime at %s lists none of the node's %d live pods: taken for the wrong runtime (check --cri-socket), its answer is ignored",
			l.cfg.CRISocket, l.mismatchPods))
	}
	if l.runtimeDown {
		out = append(out, fmt.Sprintf("leak reconcile: the runtime at %s does not answer: pods are judged by their netns and host veth", l.cfg.CRISocket))
	}
	counts := map[Kind]int{}
	for _, k := range l.overruled {
		counts[k]++
	}
	if n := counts[KindReboot]; n > 0 {
		out = append(out, fmt.Sprintf("leak reconcile: %d attachments recorded in another boot have their host veth in service: kept, their boot ID is not trusted", n))
	}
	if n := counts[KindRuntime]; n > 0 {
		out = append(out, fmt.Sprintf("leak reconcile: %d attachments the runtime does not know have their host veth in service: kept", n))
	}
	l.status.Store(&out)
}

// Status says what an operator should know about the reconcile (the
// runtime refused or down, attachments kept against their boot ID or the
// runtime), one line each; nil when all is well. /readyz shows it. Safe
// to call from any goroutine.
func (l *Loop) Status() []string {
	if p := l.status.Load(); p != nil {
		return *p
	}
	return nil
}

// sandboxes asks the runtime (nil when none is configured or answers).
func (l *Loop) sandboxes(ctx context.Context) map[string]SandboxState {
	if l.runtime == nil {
		return nil
	}
	sbs, err := l.runtime.Sandboxes(ctx, 10*time.Second)
	if err != nil {
		if !l.runtimeDown {
			l.log.Warn("leak reconcile: the runtime does not answer; judging pods by their netns alone until it does", "err", err)
		}
		l.runtimeDown = true
		return nil
	}
	if l.runtimeDown {
		l.log.Info("leak reconcile: the runtime answers again", "socket", l.cfg.CRISocket)
	}
	l.runtimeDown = false
	return sbs
}

// network reconciles one store: judge from a snapshot, free the dead
// (host side first, then the addresses under the lock), repair the live.
// Attachments kept only because their host veth is in service are added
// to overruled.
func (l *Loop) network(s storeSnap, facts Facts, links map[attachment.Owner][]netlink.Link, overruled map[attachment.Owner]Kind, res *Result) error {
	dead, repairs := l.judgeStore(s, facts, links, overruled, res)
	// Entries that could not be read are left alone and reported (each
	// pass, until someone removes them); the rest of the store goes on.
	errs := slices.Clone(s.snap.Skipped)
	if err := l.repairLive(s.dir, s.network, repairs, res); err != nil {
		errs = append(errs, err)
	}
	if len(dead) == 0 {
		return errors.Join(errs...)
	}
	free, ferrs := freeHostSides(s.network, dead)
	errs = append(errs, ferrs...)
	if err := l.release(s.dir, s.network, free, res); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// judgeStore judges every attachment and orphan reservation of the
// snapshot: it returns the dead, and the live ones whose host routes need
// a repair under the lock (their sysctls it repairs right away).
func (l *Loop) judgeStore(s storeSnap, facts Facts, links map[attachment.Owner][]netlink.Link, overruled map[attachment.Owner]Kind, res *Result) ([]candidate, []*liveRepair) {
	network, snap := s.network, s.snap
	var dead []candidate
	var repairs []*liveRepair
	indexed := map[netip.Addr]bool{}
	for o, r := range snap.Records {
		for _, ip := range r.IPs {
			indexed[ip] = true
		}
		vo := attachment.Owner{Network: network, ContainerID: o.ContainerID, IfName: o.IfName}
		f := facts
		f.HostVethInService = inService(links[vo])
		created := createdAt(snap, o, r)
		v := Judge(o.ContainerID, r, created, f)
		if v.Overruled != "" {
			overruled[vo] = v.Overruled
		}
		if !v.Dead {
			if facts.Now.Sub(created) >= facts.Grace { // an ADD in flight is not finished yet
				if lr := l.needsRepair(o, r, links[vo]); lr != nil {
					res.Repaired += l.repairSysctls(network, lr)
					if len(lr.routes) > 0 {
						repairs = append(repairs, lr)
					}
				}
			}
			continue
		}
		dead = append(dead, candidate{owner: o, record: r, verdict: v, links: links[vo]})
	}
	for _, o := range snap.Corrupt {
		l.log.Warn("leak reconcile: owner index entry does not parse; CNI GC rewrites it from the reservations", "network", network, "container", o.ContainerID, "ifname", o.IfName)
	}
	return append(dead, deadOrphans(snap, indexed, facts)...), repairs
}

// deadOrphans judges the reservations no owner index entry lists
// (indexed), but for those of an entry that does not parse or cannot be
// read.
func deadOrphans(snap *store.Snapshot, indexed map[netip.Addr]bool, facts Facts) []candidate {
	var dead []candidate
	for ip, rv := range snap.Reservations {
		if indexed[ip] || (rv.Owner != allocator.Owner{} && (slices.Contains(snap.Corrupt, rv.Owner) || slices.Contains(snap.Unreadable, rv.Owner))) {
			continue
		}
		if v := JudgeOrphan(rv.Changed, facts); v.Dead {
			dead = append(dead, candidate{owner: rv.Owner, orphan: ip, changed: rv.Changed, verdict: v})
		}
	}
	return dead
}
