// Package reconcilebench measures what podnet-routed's leak reconcile
// (routed/reconcile) costs the pods' ADD and DEL (issue 22, "Must show" 4:
// a reconcile of 250 reservations holds the store lock for at most 10 ms at
// a time, so ADD p99 does not move in `make bench`). Its helpers fill a
// podnet-ipam store with podnet-ipam's own ADD and run the reconcile's
// passes in a node netns; test/bench/cnibench uses them for its
// podnet+podnet-ipam+reconcile stack, and this package's tests measure one
// pass over 250 reservations, alive and dead (the bench, build tag bench,
// writes reconcile.json for bench/report; the plain test is a small smoke
// run of the same code in `make test`).
package reconcilebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/podnet/podnet/ipam"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
	"github.com/podnet/podnet/routed/reconcile"
)

// Conf is a podnet-ipam network config of network name over subnet, its
// store in dataDir (stateDir: where node.json would be; it is not read,
// the subnet is explicit).
func Conf(name, subnet, dataDir, stateDir string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"ipam":{"type":%q,"ranges":[[{"subnet":%q}]],"dataDir":%q,"stateDir":%q}}`,
		name, ipam.PluginType, subnet, dataDir, stateDir)
}

// Fill ADDs n attachments with podnet-ipam's own ADD (ipam.Add,
// in-process, in the calling thread's netns), container IDs prefix-0 to
// prefix-(n-1), each with the pod's netns path netns(i) and a Kubernetes
// pod in CNI_ARGS, so that every owner index entry carries the Meta a
// runtime's ADD leaves.
func Fill(conf []byte, prefix string, n int, netns func(i int) string) ([]allocator.Owner, error) {
	owners := make([]allocator.Owner, 0, n)
	for i := range n {
		o := allocator.Owner{ContainerID: fmt.Sprintf("%s-%d", prefix, i), IfName: "eth0"}
		args := fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=%s-%d;K8S_POD_UID=00000000-0000-0000-0000-%012d;K8S_POD_INFRA_CONTAINER_ID=%s",
			prefix, i, i, o.ContainerID)
		if _, err := ipam.Add(ipam.Request{Stdin: conf, ContainerID: o.ContainerID, IfName: o.IfName, Args: args, Netns: netns(i)}); err != nil {
			return owners, fmt.Errorf("ADD %s: %w", o.ContainerID, err)
		}
		owners = append(owners, o)
	}
	return owners, nil
}

// Age moves the recorded ADD time of owners' entries in the store of
// network under dataDir back by d, under the store's lock, keeping the
// rest of what ADD recorded: a reconcile with a grace shorter than d may
// then judge them (an attachment made before the grace began).
func Age(dataDir, network string, owners []allocator.Owner, d time.Duration) error {
	disk, err := store.OpenDisk(dataDir, network)
	if err != nil {
		return err
	}
	defer disk.Close()
	for _, o := range owners {
		r, ok, err := disk.Record(o)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("age %s: no owner index entry", o.ContainerID)
		}
		m := r.Meta
		m.Created = m.Created.Add(-d)
		disk.SetMeta(m)
		if err := disk.SetIPsOf(o, r.IPs); err != nil {
			return fmt.Errorf("age %s: %w", o.ContainerID, err)
		}
	}
	return nil
}

// Count returns how many owner index entries and reservations the store
// of network under dataDir holds (read without its lock).
func Count(dataDir, network string) (records, reservations int, err error) {
	snap, err := store.ReadSnapshot(dataDir, network)
	if err != nil {
		return 0, 0, err
	}
	return len(snap.Records), len(snap.Reservations), nil
}

// Loop is a reconcile loop with its own metrics (a registry of its own),
// its log discarded (but formatted, as podnet-routed's is).
type Loop struct {
	*reconcile.Loop
	Metrics *reconcile.Metrics
}

// NewLoop makes a loop with cfg (Interval defaults to an hour: the caller
// drives the passes).
func NewLoop(cfg reconcile.Config) (*Loop, error) {
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour
	}
	m := reconcile.NewMetrics(prometheus.NewRegistry(), nil)
	l, err := reconcile.New(cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	return &Loop{Loop: l, Metrics: m}, nil
}

// Holds returns how many times the loop has held a store's lock so far,
// and for how long in all.
func (l *Loop) Holds() (int, time.Duration) {
	var m dto.Metric
	if err := l.Metrics.LockHold.Write(&m); err != nil {
		return 0, 0
	}
	h := m.GetHistogram()
	return int(h.GetSampleCount()), time.Duration(h.GetSampleSum() * float64(time.Second))
}

// Runner runs a loop's passes back to back inside a netns (on one
// locked OS thread in it, as podnet-routed runs in the node's): a pass
// starts every Every, or right after the previous one when that took
// longer. Stop ends it after the pass in flight.
type Runner struct {
	loop  *Loop
	every time.Duration
	stop  chan struct{}
	done  chan struct{}

	mu    sync.Mutex
	stats Stats
}

// Stats is what the passes of a Runner did.
type Stats struct {
	Passes      int
	MaxLockHold time.Duration
	// Holds is how many times the passes took a store's lock.
	Holds     int
	Reclaimed int
	Repaired  int
	// PassTimes are the passes' wall times.
	PassTimes []time.Duration
	// Errors are the first few errors of the passes.
	Errors []string
}

// Start starts the passes in netns; the first runs at once.
func Start(netns ns.NetNS, loop *Loop, every time.Duration) *Runner {
	r := &Runner{loop: loop, every: every, stop: make(chan struct{}), done: make(chan struct{})}
	holds0, _ := loop.Holds()
	go func() {
		defer close(r.done)
		err := netns.Do(func(ns.NetNS) error {
			runtime.LockOSThread() // Do holds it already; the passes never leave this thread
			defer runtime.UnlockOSThread()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				start := time.Now()
				res, err := loop.Pass(context.Background())
				d := time.Since(start)
				holds, _ := loop.Holds()
				r.mu.Lock()
				r.stats.Passes++
				r.stats.PassTimes = append(r.stats.PassTimes, d)
				r.stats.MaxLockHold = max(r.stats.MaxLockHold, res.MaxLockHold)
				r.stats.Holds = holds - holds0
				for _, n := range res.Reclaimed {
					r.stats.Reclaimed += n
				}
				r.stats.Repaired += res.Repaired
				if err != nil && len(r.stats.Errors) < 5 {
					r.stats.Errors = append(r.stats.Errors, err.Error())
				}
				r.mu.Unlock()
				select {
				case <-r.stop:
					return nil
				case <-t.C:
				}
			}
		})
		if err != nil {
			r.mu.Lock()
			r.stats.Errors = append(r.stats.Errors, fmt.Sprintf("enter %s: %v", netns.Path(), err))
			r.mu.Unlock()
		}
	}()
	return r
}

// Stop ends the passes (after the one in flight: at least one pass has
// run) and returns what they did.
func (r *Runner) Stop() Stats {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Contender takes and releases a store's lock over and over, as ADDs
// and DELs queueing behind the reconcile would, and records how long
// each take waited (store.OpenDisk, lock included, to its return).
type Contender struct {
	stop chan struct{}
	done chan struct{}
	// Waits are the takes' waits, filled in by Stop.
	waits []time.Duration
	err   error
}

// StartContender starts taking the lock of network's store under dataDir
// every pause.
func StartContender(dataDir, network string, pause time.Duration) *Contender {
	c := &Contender{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			select {
			case <-c.stop:
				return
			default:
			}
			start := time.Now()
			d, err := store.OpenDisk(dataDir, network)
			if err != nil {
				c.err = err
				return
			}
			c.waits = append(c.waits, time.Since(start))
			if err := d.Close(); err != nil {
				c.err = err
				return
			}
			time.Sleep(pause)
		}
	}()
	return c
}

// Stop ends the takes and returns their waits.
func (c *Contender) Stop() ([]time.Duration, error) {
	close(c.stop)
	<-c.done
	if c.err != nil {
		return c.waits, errors.Join(errors.New("lock contender"), c.err)
	}
	return c.waits, nil
}
