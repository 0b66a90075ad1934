package dataplane

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/nftutil"
)

// TestPeerChanges: changing the tunnel filter's sets in place gives the
// same sets and the same element writes as working on copies did, with
// and without overlapping PodCIDRs (the whole-set comparison then needs
// the sets as they were, which in place they no longer are).
func TestPeerChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	addr := func() netip.Addr {
		if rng.IntN(4) == 0 {
			return netip.AddrFrom16([16]byte{0xfd, 15: byte(rng.IntN(40))})
		}
		return netip.AddrFrom4([4]byte{172, 30, 0, byte(rng.IntN(40))})
	}
	prefix := func(overlaps bool) netip.Prefix {
		bits := 24
		if overlaps && rng.IntN(3) == 0 {
			bits = 23 + rng.IntN(3) // a /23 holds two /24s, a /25 is in one
		}
		if rng.IntN(4) == 0 {
			return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, byte(rng.IntN(40))}), 64).Masked()
		}
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(40)), 0}), bits).Masked()
	}
	for round := 0; round < 2000; round++ {
		overlaps := round%2 == 1
		spec := vxlanSpec
		for i := rng.IntN(30); i > 0; i-- {
			spec.Peers = append(spec.Peers, addr())
			spec.RemotePodCIDRs = append(spec.RemotePodCIDRs, prefix(overlaps))
		}
		spec = spec.canonical()
		var addP, delP []netip.Addr
		var addC, delC []netip.Prefix
		for i := rng.IntN(4); i > 0; i-- {
			addP, delP = append(addP, addr()), append(delP, addr())
			addC, delC = append(addC, prefix(overlaps)), append(delC, prefix(overlaps))
		}
		if rng.IntN(4) == 0 && len(spec.Peers) > 0 { // one taken out and put back
			delP, addP = append(delP, spec.Peers[0]), append(addP, spec.Peers[0])
			delC, addC = append(delC, spec.RemotePodCIDRs[0]), append(addC, spec.RemotePodCIDRs[0])
		}
		addP, delP, addC, delC = sortedAddrs(addP), sortedAddrs(delP), sortedPrefixes(addC), sortedPrefixes(delC)
		isNested := nested(spec.RemotePodCIDRs)
		wantNext, wantOps := peerChangesCopying(spec, isNested, addP, addC, delP, delC)
		gotNext, gotOps := peerChanges(spec, isNested, addP, addC, delP, delC)
		if !reflect.DeepEqual(gotNext, wantNext) {
			t.Fatalf("round %d: next %+v, want %+v", round, gotNext, wantNext)
		}
		if g, w := opsString(gotOps), opsString(wantOps); !reflect.DeepEqual(g, w) {
			t.Fatalf("round %d (nested %v): ops\n%v\nwant\n%v", round, isNested, g, w)
		}
	}
}

func opsString(ops []elemOp) []any {
	var out []any
	for _, o := range ops {
		if len(o.e) == 0 {
			continue // an empty write of the whole-set comparison
		}
		out = append(out, o.s.Name, o.e, o.del)
	}
	return out
}

// peerChangesCopying is peerChanges as it was: on copies of spec's sets.
func peerChangesCopying(spec TableSpec, nested bool, addPeers []netip.Addr, addCIDRs []netip.Prefix, delPeers []netip.Addr, delCIDRs []netip.Prefix) (next TableSpec, ops []elemOp) {
	spec.Peers, spec.RemotePodCIDRs = slices.Clone(spec.Peers), slices.Clone(spec.RemotePodCIDRs)
	table := podnetTable()
	set := func(name string, v6, interval bool) *nftables.Set {
		s := addrSet(name, v6, interval)
		return s.SetOf(table)
	}
	var dels, adds []elemOp
	ok := true
	next = spec
	next.Peers, next.RemotePodCIDRs = slices.Clone(next.Peers), slices.Clone(next.RemotePodCIDRs)
	for _, a := range delPeers {
		if i, found := slices.BinarySearchFunc(next.Peers, a, netip.Addr.Compare); found {
			next.Peers = slices.Delete(next.Peers, i, i+1)
			dels = append(dels, elemOp{set(setName(setPeers, a.Is6()), a.Is6(), false), nftutil.AddrElements([]netip.Addr{a}, a.Is6()), true})
		}
	}
	for _, p := range delCIDRs {
		i, found := slices.BinarySearchFunc(next.RemotePodCIDRs, p, comparePrefixes)
		if !found {
			continue
		}
		ok = ok && !overlapsAround(next.RemotePodCIDRs, i, i+1, p)
		next.RemotePodCIDRs = slices.Delete(next.RemotePodCIDRs, i, i+1)
		v6 := p.Addr().Is6()
		dels = append(dels, elemOp{set(setName(setRemote, v6), v6, true), intervalElements([]netip.Prefix{p}, v6), true})
	}
	for _, a := range addPeers {
		if i, found := slices.BinarySearchFunc(next.Peers, a, netip.Addr.Compare); !found {
			next.Peers = slices.Insert(next.Peers, i, a)
			adds = append(adds, elemOp{set(setName(setPeers, a.Is6()), a.Is6(), false), nftutil.AddrElements([]netip.Addr{a}, a.Is6()), false})
		}
	}
	for _, p := range addCIDRs {
		i, found := slices.BinarySearchFunc(next.RemotePodCIDRs, p, comparePrefixes)
		if found {
			continue
		}
		ok = ok && !overlapsAround(next.RemotePodCIDRs, i, i, p)
		next.RemotePodCIDRs = slices.Insert(next.RemotePodCIDRs, i, p)
		v6 := p.Addr().Is6()
		adds = append(adds, elemOp{set(setName(setRemote, v6), v6, true), intervalElements([]netip.Prefix{p}, v6), false})
	}
	if ok && !nested {
		return next, append(dels, adds...)
	}
	dels, adds = nil, nil
	before, after := tunnelSets(spec), tunnelSets(next)
	for i := range after {
		del, add := nftutil.Changes(before[i].Elems, after[i].Elems)
		s := after[i].SetOf(table)
		dels, adds = append(dels, elemOp{s, del, true}), append(adds, elemOp{s, add, false})
	}
	return next, append(dels, adds...)
}
