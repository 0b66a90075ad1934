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
	// answered.
	Sandboxes map[string]SandboxState
	// Netns says what is at a recorded netns path now.
	Netns func(path string, ino uint64) NetnsState
	// HostVethInService reports whether the attachment's host veth is on
	// the node and not detached: its peer, the pod end, then lives in the
	// pod's netns, which therefore exists.
	HostVethInService bool
}

// Verdict is a judgement: Dead (with Kind) or alive, and why, for the log.
type Verdict struct {
	Dead   bool
	Kind   Kind
	Reason string
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
//     netns decides: alive while the recorded netns is at its path or the
//     attachment's host veth is in service; dead when neither holds.
//
// A host veth in service outweighs a netns path that looks gone: its peer,
// the pod end, lives in the pod's netns, which the kernel destroys (and
// the pair with it) only once nothing holds it. The path alone can lie:
// podnet-routed, in its container, may not see where the runtime mounts
// its netns (containerd's state directory, a mount that does not
// propagate), and would take every pod for gone.
func Judge(containerID string, r store.Record, created time.Time, f Facts) Verdict {
	if r.BootID != "" && f.BootID != "" && r.BootID != f.BootID {
		return dead(KindReboot, "made in boot %s, this is boot %s", r.BootID, f.BootID)
	}
	if age := f.Now.Sub(created); age < f.Grace {
		return alive("made %s ago, within the grace of %s", age.Round(time.Second), f.Grace)
	}
	netns := func() NetnsState {
		if r.Netns == "" || f.Netns == nil || f.HostVethInService {
			return NetnsSame
		}
		return f.Netns(r.Netns, r.NetnsIno)
	}
	if f.Sandboxes != nil {
		state, listed := f.Sandboxes[containerID]
		switch {
		case listed && state == SandboxReady:
			return alive("the runtime reports its sandbox ready")
		case listed && r.Netns != "" && netns() != NetnsSame:
			return dead(KindRuntime, "the runtime reports its sandbox stopped, its netns %s is gone and it has no host veth in service", r.Netns)
		case listed:
			return alive("the runtime reports its sandbox stopped; its netns is still there")
		case r.HasPod():
			return dead(KindRuntime, "the runtime has no sandbox %s (pod %s/%s)", containerID, r.PodNamespace, r.PodName)
		}
	}
	if r.Netns == "" {
		if f.HostVethInService {
			return alive("its host veth is in service")
		}
		if f.Sandboxes != nil {
			return dead(KindRuntime, "the runtime has no sandbox %s", containerID)
		}
		return alive("no netns recorded (made by an older podnet) and no runtime to ask")
	}
	if f.HostVethInService {
		return alive("its host veth is in service (its pod end lives in the pod's netns)")
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
