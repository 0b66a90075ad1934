// Freeing the dead: host sides first, outside the store's lock, then the
// addresses under it, each candidate re-read there, in holds of about
// LockBudget.

package reconcile

import (
	"errors"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/internal/threadprio"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// candidate is an attachment (or an orphan reservation) judged dead.
type candidate struct {
	owner   allocator.Owner
	record  store.Record // the snapshot's (orphan: zero)
	orphan  netip.Addr   // valid for an orphan reservation
	changed time.Time    // orphan: the reservation's ctime
	verdict Verdict
	links   []netlink.Link
}

// freeHostSides sorts dead oldest first (a pass cut short frees the
// longest-leaked) and frees their host side, outside the lock (deleting a
// veth takes ~20 ms): no route of the node may send an address to the old
// pod once it is free. It returns those whose addresses may go now.
func freeHostSides(network string, dead []candidate) ([]candidate, []error) {
	sort.Slice(dead, func(i, j int) bool { return dead[i].record.Created.Before(dead[j].record.Created) })
	var errs []error
	free := dead[:0]
	for _, c := range dead {
		if c.orphan.IsValid() || len(c.links) == 0 {
			free = append(free, c)
			continue
		}
		vo := attachment.Owner{Network: network, ContainerID: c.owner.ContainerID, IfName: c.owner.IfName}
		if _, err := attachment.FreeHost(vo, c.links); err != nil {
			errs = append(errs, err)
			continue
		}
		free = append(free, c)
	}
	return free, errs
}

// release frees the candidates' addresses, holding the store's lock for at
// most about LockBudget at a time. Under the lock each candidate is
// re-read: one that changed since the snapshot (an ADD of the same
// attachment again) is left for the next pass.
func (l *Loop) release(dir, network string, cands []candidate, res *Result) error {
	return l.inHolds(dir, network, len(cands), res, func(d *store.Disk, i int) error {
		c := cands[i]
		freed, err := l.releaseOne(d, &allocator.Allocator{Store: d}, c)
		if err != nil {
			return err
		}
		if freed {
			res.Reclaimed[c.verdict.Kind]++
			l.m.Reclaimed.WithLabelValues(string(c.verdict.Kind)).Inc()
			l.logReclaim(network, c)
		}
		return nil
	})
}

// inHolds calls step for items 0 to count-1 in the locked store of
// network, holding the lock for at most about LockBudget at a time (at
// least one item per hold). A hold whose steps failed ends the calls
// there: its errors are returned.
func (l *Loop) inHolds(dir, network string, count int, res *Result, step func(d *store.Disk, i int) error) error {
	for done := 0; done < count; {
		err := l.withLock(dir, network, func(d *store.Disk) error {
			start := time.Now()
			var errs []error
			for n := 0; done < count && (n == 0 || time.Since(start) < l.cfg.LockBudget); n++ {
				done++
				if err := step(d, done-1); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}, res)
		if err != nil {
			return err
		}
	}
	return nil
}

// releaseOne frees one candidate in the locked store d if it is still what
// the snapshot saw.
func (l *Loop) releaseOne(d *store.Disk, alloc *allocator.Allocator, c candidate) (bool, error) {
	if c.orphan.IsValid() {
		rv, ok, err := d.Reservation(c.orphan)
		if err != nil || !ok || rv.Owner != c.owner || !rv.Changed.Equal(c.changed) {
			return false, err
		}
		if c.owner != (allocator.Owner{}) {
			if r, ok, err := d.Record(c.owner); err != nil || (ok && slices.Contains(r.IPs, c.orphan)) {
				return false, err // committed meanwhile
			}
		}
		return true, d.Release(c.orphan)
	}
	r, ok, err := d.Record(c.owner)
	if err != nil || !ok || !sameRecord(r, c.record) {
		return false, err
	}
	return true, alloc.Release(c.owner)
}

// sameRecord reports whether two owner index entries are the same.
func sameRecord(a, b store.Record) bool {
	return a.Meta == b.Meta && slices.Equal(a.IPs, b.IPs)
}

// logReclaim logs a freed candidate.
func (l *Loop) logReclaim(network string, c candidate) {
	if c.orphan.IsValid() {
		l.log.Info("leak reclaimed", "network", network, "kind", c.verdict.Kind, "addrs", []netip.Addr{c.orphan}, "container", c.owner.ContainerID, "why", c.verdict.Reason)
		return
	}
	pod := ""
	if c.record.HasPod() {
		pod = c.record.PodNamespace + "/" + c.record.PodName
	}
	l.log.Info("leak reclaimed", "network", network, "kind", c.verdict.Kind, "addrs", c.record.IPs,
		"container", c.owner.ContainerID, "ifname", c.owner.IfName, "pod", pod, "podUID", c.record.PodUID,
		"netns", c.record.Netns, "hostLinks", len(c.links), "why", c.verdict.Reason)
}

// withLock runs f in the locked store of network, and records how long
// the lock was held.
func (l *Loop) withLock(dir, network string, f func(*store.Disk) error, res *Result) (err error) {
	threadprio.Do(l.cfg.HoldNice, func() {
		var d *store.Disk
		if d, err = store.OpenDisk(dir, network); err != nil {
			return
		}
		start := time.Now()
		err = f(d)
		hold := time.Since(start)
		err = errors.Join(err, d.Close())
		l.m.LockHold.Observe(hold.Seconds())
		res.MaxLockHold = max(res.MaxLockHold, hold)
	})
	return err
}
