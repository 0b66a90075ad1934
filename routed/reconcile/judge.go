// Package reconcile is podnet-routed's leak reconcile: at start and every
// --reconcile-interval it reads each podnet-ipam store of the node, decides
// for every reservation whether its pod is still alive, frees the dead
// ones' addresses and host-side state (internal/attachment, as CNI GC
// does), and puts back the host routes and proxy ARP of the live ones.
// No runtime calls CNI GC, so without it every DEL that never came (a
// reboot, a runtime or plugin killed, a DEL that failed and was not
// retried) would keep its address for good.
//
// The shape is that of the routes: facts (store snapshot, runtime's
// sandboxes, netns, links) → a pure judgement (Judge) → one writer that
// re-checks under the store's lock and frees.
//
// It never frees an attachment whose host veth is in service, whatever
// the runtime or the boot ID say. In service (HostVethInService) means:
// a veth of the node's netns carries the attachment's alias
// (contract.VethOwner.Alias, not DEL's detached one), is up and has a
// carrier (so its peer, the pod end, is up too: DEL's detach sets both
// ends down), and its peer is in another network namespace that is alive
// (the kernel reports the peer's netns id, which it no longer does for a
// namespace being destroyed). A veth whose pod netns died goes with it;
// one that is detached, down or whose peer is not in a live pod netns is
// judged by the other rules. A runtime that lists none of the node's live
// pods (attachments a runtime made, past the grace, host veth in service)
// is taken for the wrong runtime (a --cri-socket of another runtime than
// the node's): its answer is refused for the pass, and the netns decides
// (Loop.Status, podnet_reconcile_runtime_mismatch).
package reconcile

import (
	"fmt"
	"time"

	"github.com/podnet/podnet/ipam/store"
)

// Kind says why an attachment was judged dead; it labels
// podnet_leaks_reclaimed_total.
type Kind string

const (
	// KindReboot: the record is of another boot: no netns survives a
	// reboot, so neither does its pod.
	KindReboot Kind = "reboot"
	// KindRuntime: the runtime does not know the pod's sandbox any more
	// (or knows it stopped, its netns gone).
	KindRuntime Kind = "runtime"
	// KindNetns: no runtime vouches for it and its netns is gone (or is
	// another netns at the same path).
	KindNetns Kind = "netns"
	// KindOrphan: a reservation no owner index entry lists (an ADD killed
	// between the two writes, which never commits).
	KindOrphan Kind = "orphan"
)

// SandboxState is a sandbox's state as the runtime reports it.
type SandboxState int

const (
	SandboxReady SandboxState = iota
	SandboxNotReady
)

// NetnsState is what a recorded netns path holds now.
type NetnsState int

const (
	// NetnsGone: nothing at the path.
	NetnsGone NetnsState = iota
	// NetnsSame: a netns, the recorded one (or no inode was recorded).
	NetnsSame
	// NetnsOther: something else is mounted at the path now.
	NetnsOther
)

// Facts are what a judgement rests on, gathered outside the store's lock.
type Facts struct {
	Now   time.Time
	Grace time.Duration
	// BootID is the current boot's ("" unknown).
	BootID string
	// Sandboxes are the runtime's sandboxes by ID; nil when no runtime
	// answered, or when its answer was refused (a runtime that lists none
	// of the node's live pods is the wrong one).
	Sandboxes map[string]SandboxState
	// Netns says what is at a recorded netns path now.
	Netns func(path string, ino uint64) NetnsState
	// HostVethInService reports whether the attachment's host veth is in
	// service (HostVethInService in facts.go: the attachment's alias,
	// up, with a carrier, its peer in another live netns): its pod end
	// then lives in the pod's netns, which therefore exists.
	HostVethInService bool
}

// Verdict is a judgement: Dead (with Kind) or alive, and why, for the log.
type Verdict struct {
	Dead   bool
	Kind   Kind
	Reason string
	// Overruled, on a live verdict, is the rule that would have judged the
	// attachment dead (KindReboot, KindRuntime) had its host veth not been
	// in service: a boot ID or a runtime that is not to be trusted for it.
	Overruled Kind
}

func alive(format string, args ...any) Verdict {
	return Verdict{Reason: fmt.Sprintf(format, args...)}
}

func dead(k Kind, format string, args ...any) Verdict {
	return Verdict{Dead: true, Kind: k, Reason: fmt.Sprintf(format, args...)}
}

// Judge decides whether the attachment of containerID with record r (made
// at created: r.Created, or for an entry of an older podnet its
// reservation's time) is dead. It errs towards alive: a live pod must
// never lose its address, a leak only waits for the next pass.
//
//  0. A host veth in service is alive, whatever the other rules say: it
//     is what the pod's traffic goes through now, the surest fact there
//     is. Its pod end lives in the pod's netns, which the kernel destroys
//     (and the pair with it) only once nothing holds it. A boot ID or a
//     runtime that calls it dead is wrong about it (a record whose boot ID
//     was rewritten or copied, a --cri-socket of another runtime than the
//     one that made the pod): the verdict says which (Overruled).
//  1. A record of another boot is dead at once: its netns died with the
//     boot (after a reboot no grace is needed: no ADD of that boot can be
//     in flight).
//  2. A record younger than the grace is alive: its ADD may still be in
//     flight (a runtime lists a sandbox only once its ADD has returned).
//  3. The runtime's answer wins: a sandbox it reports ready is alive; one
//     it reports stopped is alive while its netns is there (the runtime
//     still owes it a DEL). A pod the runtime made (the record names a
//     pod) that the runtime no longer lists is dead.
//  4. Otherwise (no runtime answered, or an attachment made by hand) the
//     netns decides: alive while the recorded netns is at its path, dead
//     when it is gone or another netns is there.
//
// The netns path alone can lie, which is why rule 0 comes first:
// podnet-routed, in its container, may not see where the runtime mounts
// its netns (containerd's state directory, a mount that does not
// propagate), and would take every pod for gone.
func Judge(containerID string, r store.Record, created time.Time, f Facts) Verdict {
	if f.HostVethInService {
		// What the other rules would say, the netns path left out (where
		// podnet-routed cannot see it, it would be every pod's answer):
		// only a boot ID or a runtime overruled is worth reporting.
		rest := f
		rest.Netns = nil
		if v := judgeByRecord(containerID, r, created, rest); v.Dead {
			return Verdict{Overruled: v.Kind, Reason: "its host veth is in service, although " + v.Reason}
		}
		return alive("its host veth is in service (its pod end lives in the pod's netns)")
	}
	return judgeByRecord(containerID, r, created, f)
}

// judgeByRecord is rules 1 to 4 of Judge: the attachment has no host veth
// in service.
func judgeByRecord(containerID string, r store.Record, created time.Time, f Facts) Verdict {
	if r.BootID != "" && f.BootID != "" && r.BootID != f.BootID {
		return dead(KindReboot, "made in boot %s, this is boot %s", r.BootID, f.BootID)
	}
	if age := f.Now.Sub(created); age < f.Grace {
		return alive("made %s ago, within the grace of %s", age.Round(time.Second), f.Grace)
	}
	netns := func() NetnsState {
		if r.Netns == "" || f.Netns == nil {
			return NetnsSame
		}
		return f.Netns(r.Netns, r.NetnsIno)
	}
	if f.Sandboxes != nil {
		state, listed := f.Sandboxes[containerID]
		switch {
		case listed && state == SandboxReady:
			return alive("the runtime reports its sandbox ready")
		case listed && netns() != NetnsSame:
			return dead(KindRuntime, "the runtime reports its sandbox stopped, its netns %s is gone and it has no host veth in service", r.Netns)
		case listed:
			return alive("the runtime reports its sandbox stopped; its netns is still there")
		case r.HasPod():
			return dead(KindRuntime, "the runtime has no sandbox %s (pod %s/%s)", containerID, r.PodNamespace, r.PodName)
		}
	}
	if r.Netns == "" {
		if f.Sandboxes != nil {
			return dead(KindRuntime, "the runtime has no sandbox %s and it has no host veth in service", containerID)
		}
		return alive("no netns recorded (made by an older podnet) and no runtime to ask")
	}
	switch netns() {
	case NetnsGone:
		return dead(KindNetns, "its netns %s is gone and it has no host veth in service", r.Netns)
	case NetnsOther:
		return dead(KindNetns, "its netns %s is another network namespace now and it has no host veth in service", r.Netns)
	}
	return alive("its netns %s is there", r.Netns)
}

// JudgeOrphan decides whether a reservation that no owner index entry
// lists, made at changed, is dead: once older than the grace it is, since
// its ADD was killed before committing (a retried ADD reserves anew).
func JudgeOrphan(changed time.Time, f Facts) Verdict {
	if age := f.Now.Sub(changed); age < f.Grace {
		return alive("reservation without owner index entry, made %s ago, within the grace", age.Round(time.Second))
	}
	return dead(KindOrphan, "reservation without owner index entry for %s: its ADD never committed", f.Now.Sub(changed).Round(time.Second))
}
