package cluster

import (
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"sync"
)

// cidrAllocator carves node PodCIDRs out of the cluster CIDR the way
// kube-controller-manager's range allocator (--allocate-node-cidrs,
// --cluster-cidr, --node-cidr-mask-size) does: the lowest free block of
// the node mask size, a deleted node's block back to the pool.
type cidrAllocator struct {
	mu      sync.Mutex
	cluster netip.Prefix
	bits    int
	used    map[int]bool
}

// A comma-separated list (podnet-routed's --cluster-cidr) allocates from
// its first CIDR, which must be IPv4.
func newCIDRAllocator(clusterCIDR string, maskSize int) (*cidrAllocator, error) {
	first, _, _ := strings.Cut(clusterCIDR, ",")
	p, err := netip.ParsePrefix(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("cluster CIDR: %w", err)
	}
	if !p.Addr().Is4() || maskSize < p.Bits() || maskSize > 30 || maskSize-p.Bits() > 16 {
		return nil, fmt.Errorf("cluster CIDR %s with node mask /%d: want IPv4, a mask in [%d, 30] and at most 65536 blocks", p, maskSize, p.Bits())
	}
	return &cidrAllocator{cluster: p.Masked(), bits: maskSize, used: map[int]bool{}}, nil
}

// newCIDRAllocator6 is newCIDRAllocator for the IPv6 cluster CIDR of a
// dual-stack cluster (kube-controller-manager's --node-cidr-mask-size-ipv6).
func newCIDRAllocator6(clusterCIDR string, maskSize int) (*cidrAllocator, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(clusterCIDR))
	if err != nil {
		return nil, fmt.Errorf("IPv6 cluster CIDR: %w", err)
	}
	if !p.Addr().Is6() || p.Addr().Is4In6() || maskSize < p.Bits() || maskSize > 120 || maskSize-p.Bits() > 16 {
		return nil, fmt.Errorf("IPv6 cluster CIDR %s with node mask /%d: want IPv6, a mask in [%d, 120] and at most 65536 blocks", p, maskSize, p.Bits())
	}
	return &cidrAllocator{cluster: p.Masked(), bits: maskSize, used: map[int]bool{}}, nil
}

func (a *cidrAllocator) size() int { return 1 << (a.bits - a.cluster.Bits()) }

// block returns the i-th block: the cluster CIDR's address plus i << (the
// address length - the node mask size), in either family.
func (a *cidrAllocator) block(i int) netip.Prefix {
	base := a.cluster.Addr().AsSlice()
	v := new(big.Int).SetBytes(base)
	v.Add(v, new(big.Int).Lsh(big.NewInt(int64(i)), uint(len(base)*8-a.bits)))
	addr, _ := netip.AddrFromSlice(v.FillBytes(make([]byte, len(base))))
	return netip.PrefixFrom(addr, a.bits)
}

// allocate takes the lowest free block.
func (a *cidrAllocator) allocate() (netip.Prefix, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.size() {
		if !a.used[i] {
			a.used[i] = true
			return a.block(i), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("cluster CIDR %s is full (/%d blocks)", a.cluster, a.bits)
}

// release returns a block to the pool.
func (a *cidrAllocator) release(p netip.Prefix) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.size() {
		if a.block(i) == p {
			delete(a.used, i)
		}
	}
}
