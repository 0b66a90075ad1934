package main

// The podnet+podnet-ipam+reconcile stack: the podnet stack while
// podnet-routed's leak reconcile (routed/reconcile, in-process, in the
// stack's node netns, configured as podnet-routed ships it but for the
// interval: grace 2 minutes, no runtime asked) passes back to back every
// -reconcile-every during the ADD and the DEL phase (production passes
// once a minute). Before each phase -reconcile-dead reservations of pods
// that are gone (made by podnet-ipam's own ADD with a netns path that no
// longer exists, their time moved back past the grace) are planted in the
// stack's store, so that the phase's first pass frees them, under the
// store's lock in bounded holds, while the phase's ADDs or DELs queue on
// that lock. The leak check after the run then also proves every planted
// reservation was freed.

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/reconcile"
	"github.com/podnet/podnet/test/bench/reconcilebench"
	"github.com/podnet/podnet/test/nettest"
)

const reconcileStackName = "podnet+podnet-ipam+reconcile"

// reconcileHoldNice is the reconcile's HoldNice as podnet-routed ships it
// (its --policy-nice default).
const reconcileHoldNice = -10

// reconcileConf is the reconcile of a stack that runs one.
type reconcileConf struct {
	every time.Duration
	dead  int // reservations planted before each phase
	loop  *reconcilebench.Loop
	// ipamConf is podnet-ipam's config of the stack's network (for the
	// planted reservations), goneDir where their netns paths point.
	ipamConf []byte
	goneDir  string
}

// withReconcile makes s run the reconcile during its phases.
func (s *stack) withReconcile(subnet string, every time.Duration, dead int) *stack {
	dir := filepath.Dir(s.dataDirs[0])
	loop, err := reconcilebench.NewLoop(reconcile.Config{DataDirs: s.dataDirs, Interval: time.Hour, Grace: 2 * time.Minute, CRISocket: "", HoldNice: reconcileHoldNice})
	if err != nil {
		fatalf("%s: %v", s.Name, err)
	}
	s.rc = &reconcileConf{every: every, dead: dead, loop: loop,
		ipamConf: reconcilebench.Conf(network, subnet, s.dataDirs[0], filepath.Join(dir, "state")),
		goneDir:  filepath.Join(dir, "gone-netns")}
	s.Reconcile = fmt.Sprintf("podnet-routed's leak reconcile in-process in the node netns (grace 2m, no runtime asked, the store's lock held at nice %d as podnet-routed's --policy-nice default), a pass every %s during ADD and DEL; %d dead reservations planted before each phase", reconcileHoldNice, every, dead)
	return s
}

// startReconcile plants the dead reservations of a phase and starts the
// passes.
func (s *stack) startReconcile(prefix string, r *runResult) *reconcilebench.Runner {
	if s.rc.dead > 0 {
		err := s.node.Do(func(ns.NetNS) error {
			owners, err := reconcilebench.Fill(s.rc.ipamConf, prefix, s.rc.dead, func(i int) string {
				return filepath.Join(s.rc.goneDir, fmt.Sprintf("%s-%d", prefix, i))
			})
			if err != nil {
				return err
			}
			return reconcilebench.Age(s.dataDirs[0], network, owners, time.Hour)
		})
		if err != nil {
			r.Errors = append(r.Errors, "plant dead reservations: "+err.Error())
		} else {
			r.ReconcilePlanted += s.rc.dead
		}
	}
	return reconcilebench.Start(s.node, s.rc.loop, s.rc.every)
}

// stopReconcile ends the passes and adds what they did to r.
func (s *stack) stopReconcile(run *reconcilebench.Runner, r *runResult) {
	st := run.Stop()
	r.ReconcilePasses += st.Passes
	r.ReconcileHolds += st.Holds
	r.ReconcileReclaimed += st.Reclaimed
	r.ReconcileMaxLockHoldMs = max(r.ReconcileMaxLockHoldMs, ms(st.MaxLockHold))
	for _, d := range st.PassTimes {
		r.ReconcilePassMs = append(r.ReconcilePassMs, ms(d))
	}
	for _, e := range st.Errors {
		r.Errors = append(r.Errors, "reconcile: "+e)
	}
}

// checkLivePods reports every pod attached on node (a host veth in
// service) whose elements are missing from the pod filter's ports and
// addrs4 sets: the pod's packets would be dropped. It runs after the ADD
// phase, when every pod is alive: a reconcile that freed or pruned a live
// pod shows here.
func checkLivePods(node ns.NetNS, want int) error {
	var links map[attachment.Owner][]int
	err := node.Do(func(ns.NetNS) error {
		hl, err := attachment.HostLinks(network)
		if err != nil {
			return err
		}
		links = map[attachment.Owner][]int{}
		for o, ls := range hl {
			for _, l := range ls {
				// a veth an earlier DEL detached is still dying with
				// its pod netns: not a pod attached
				if _, detached, _ := contract.ParseVethAlias(l.Attrs().Alias); !detached {
					links[o] = append(links[o], l.Attrs().Index)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	elems, err := nettest.ReadPodFilter(node)
	if err != nil {
		return err
	}
	var ports, addrs []int
	for _, e := range elems {
		switch e.Set {
		case "ports":
			ports = append(ports, e.Index)
		case "addrs4":
			addrs = append(addrs, e.Index)
		}
	}
	var lost []string
	for o, idx := range links {
		for _, i := range idx {
			if !slices.Contains(ports, i) || !slices.Contains(addrs, i) {
				lost = append(lost, o.ContainerID)
			}
		}
	}
	if len(links) != want {
		return fmt.Errorf("%d pods attached after the ADD phase, want %d", len(links), want)
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		return fmt.Errorf("%d live pods lost their pod filter elements (their packets are dropped): %v", len(lost), lost[:min(len(lost), 5)])
	}
	return nil
}
