// Facts about an attachment the judgement reads from the node: when its
// entry was made, whether its netns is still there, whether its host veth
// is in service.

package reconcile

import (
	"errors"
	"net"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// createdAt is when the entry was made: r.Created, or for an entry of an
// older podnet (no time recorded) reservedAt.
func createdAt(snap *store.Snapshot, o allocator.Owner, r store.Record) time.Time {
	if !r.Created.IsZero() {
		return r.Created
	}
	return reservedAt(snap, o, r)
}

// reservedAt is when an entry without a recorded time (older podnet) was
// made: its earliest reservation's ctime (now when it has none).
func reservedAt(snap *store.Snapshot, o allocator.Owner, r store.Record) time.Time {
	var t time.Time
	for _, ip := range r.IPs {
		if rv, ok := snap.Reservations[ip]; ok && rv.Owner == o && (t.IsZero() || rv.Changed.Before(t)) {
			t = rv.Changed
		}
	}
	if t.IsZero() {
		return time.Now()
	}
	return t
}

// netnsState looks at a recorded netns path. Only a path that is gone, or
// holds another network namespace than the one recorded, counts against
// the pod: a plain file there may be a netns mount this process cannot
// see (a container without mount propagation from the host's
// /run/netns), and a path that cannot be looked at tells nothing.
func netnsState(path string, ino uint64) NetnsState {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return NetnsGone
		}
		return NetnsSame
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil || fs.Type != unix.NSFS_MAGIC {
		return NetnsSame
	}
	if ino != 0 && st.Ino != ino {
		return NetnsOther
	}
	return NetnsSame
}

// inService reports whether one of links is a host veth in service
// (HostVethInService).
func inService(links []netlink.Link) bool {
	return slices.ContainsFunc(links, HostVethInService)
}

// HostVethInService reports whether l, a link of the node's netns, is an
// attachment's host veth in service: a veth with the attachment's alias
// (not the one DEL gives the host end it detaches), up, with a carrier
// (a veth has one only while its peer is up too: DEL's detach sets both
// ends down, a half-done one at least the pod end), and its peer in
// another network namespace that is alive. The kernel reports the peer's
// netns as an id of this netns (IFLA_LINK_NETNSID); it reports none when
// the peer is in this netns (not a pod's veth) and NETNSA_NSID_NOT_ASSIGNED
// for a namespace being destroyed, whose veths are about to go. Such a
// veth carries the pod's traffic now: its pod is alive whatever a runtime
// or a boot ID say.
func HostVethInService(l netlink.Link) bool {
	if _, ok := l.(*netlink.Veth); !ok {
		return false
	}
	a := l.Attrs()
	if _, ok := attachmentInService(l); !ok {
		return false
	}
	up := a.Flags&net.FlagUp != 0 && (a.OperState == netlink.OperUp || a.RawFlags&unix.IFF_LOWER_UP != 0)
	return up && a.NetNsID >= 0
}
