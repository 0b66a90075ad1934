// Package attachment frees one pod attachment on the node: what its ADD
// left on the host (the host veth, in service or detached, with the host
// routes and the bridge port that go with it, and the pod filter's
// elements of that veth) and then its addresses. The CNI plugins' GC and
// podnet-routed's leak reconcile (routed/reconcile) both free through it,
// in this order: an address is free only once no route of the node sends
// it to the old pod any more.
package attachment

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/podfilter"
)

// Owner is an attachment: network, container ID, interface name.
type Owner = contract.VethOwner

// HostLinks lists the veth ends podnet created in the current netns, by
// attachment, in service or detached. network "" lists every network's.
func HostLinks(network string) (map[Owner][]netlink.Link, error) {
	links, err := CompleteLinkList()
	if err != nil {
		return nil, err
	}
	owned := make(map[Owner][]netlink.Link)
	for _, l := range links {
		if _, isVeth := l.(*netlink.Veth); !isVeth {
			continue
		}
		if o, _, ok := contract.ParseVethAlias(l.Attrs().Alias); ok && (network == "" || o.Network == network) {
			owned[o] = append(owned[o], l)
		}
	}
	return owned, nil
}

// dumpAttempts bounds the retries of a netlink dump the kernel
// interrupted (links or routes changed while it ran).
const dumpAttempts = 20

// CompleteLinkList lists the links of the current netns, retrying a dump
// the kernel interrupted, and fails rather than return a list that may
// miss links (netlinksafe hands one back after a few tries): whoever
// frees what it does not find listed must never see a partial list.
func CompleteLinkList() ([]netlink.Link, error) {
	return completeDump("links", netlink.LinkList) //nolint:forbidigo // retried there, never partial
}

// CompleteRouteList is RouteListFiltered with the same guarantee.
func CompleteRouteList(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return completeDump("routes", func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(family, filter, mask) //nolint:forbidigo // retried there, never partial
	})
}

// completeDump runs a netlink dump of what until the kernel answers it
// whole, dumpAttempts times at most.
func completeDump[T any](what string, dump func() ([]T, error)) ([]T, error) {
	for range dumpAttempts {
		out, err := dump()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", what, err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("list %s: the kernel interrupted %d dumps in a row (%s changing fast); try again later", what, dumpAttempts, what)
}

// FreeHost deletes the attachment's veth ends (as HostLinks listed them)
// and drops the pod filter's elements of each. A link is deleted only if
// the interface at its index is still the attachment's (an ADD of the same
// attachment since may have replaced it under the same name); one already
// gone counts as freed. It returns how many links it deleted.
func FreeHost(o Owner, links []netlink.Link) (int, error) {
	deleted := 0
	var errs []error
	for _, l := range links {
		index := l.Attrs().Index
		cur, err := netlink.LinkByIndex(index)
		if err == nil {
			got, _, ok := contract.ParseVethAlias(cur.Attrs().Alias)
			if !ok || got != o || cur.Attrs().Name != l.Attrs().Name {
				continue // not the link we listed any more
			}
			if err := netlink.LinkDel(cur); err != nil && !LinkGone(err) {
				errs = append(errs, fmt.Errorf("delete veth %s of container %s: %w", l.Attrs().Name, o.ContainerID, err))
				continue
			}
			deleted++
		} else if !LinkGone(err) {
			errs = append(errs, fmt.Errorf("look up veth %s (index %d): %w", l.Attrs().Name, index, err))
			continue
		}
		if err := guardOf(l).RemovePort(index); err != nil {
			errs = append(errs, fmt.Errorf("pod filter of veth %s: %w", l.Attrs().Name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// Free frees the attachment: FreeHost, then release (nil when its IPAM is
// not podnet-ipam's, which frees its addresses itself). The addresses are
// kept when the host side could not be freed.
func Free(o Owner, links []netlink.Link, release func() error) error {
	if _, err := FreeHost(o, links); err != nil {
		return err
	}
	if release == nil {
		return nil
	}
	return release()
}

// guardOf is the pod filter of the mode that made l: a bridge port's is
// podnet-bridge's.
func guardOf(l netlink.Link) podfilter.Guard {
	if l.Attrs().MasterIndex != 0 {
		return podfilter.Bridged
	}
	return podfilter.Routed
}

// LinkGone tells whether err says a link (or its namespace's object) is
// not there: the state DEL and rollbacks accept as done.
func LinkGone(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}
