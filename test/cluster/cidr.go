package cluster

import (
	"fmt"
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
// its first CIDR.
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

func (a *cidrAllocator) size() int { return 1 << (a.bits - a.cluster.Bits()) }

// block returns the i-th block.
func (a *cidrAllocator) block(i int) netip.Prefix {
	base := a.cluster.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(i) << (32 - a.bits)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), a.bits)
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
