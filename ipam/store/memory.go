// Package store keeps podnet-ipam's reservations: Disk for the plugin (one
// directory per network, crash-safe, shared by concurrent processes under a
// file lock) and Memory for unit tests. Both implement allocator.Store.
package store

import (
	"net/netip"
	"slices"

	"github.com/podnet/podnet/ipam/allocator"
)

// Memory is an in-memory allocator.Store.
type Memory struct {
	ips    map[netip.Addr]allocator.Owner
	owners map[allocator.Owner][]netip.Addr
	hints  map[string]allocator.Hint
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{
		ips:    make(map[netip.Addr]allocator.Owner),
		owners: make(map[allocator.Owner][]netip.Addr),
		hints:  make(map[string]allocator.Hint),
	}
}

// Reserve implements allocator.Store.
func (m *Memory) Reserve(ip netip.Addr, o allocator.Owner) (bool, error) {
	if _, taken := m.ips[ip]; taken {
		return false, nil
	}
	m.ips[ip] = o
	return true, nil
}

// Release implements allocator.Store.
func (m *Memory) Release(ip netip.Addr) error {
	delete(m.ips, ip)
	return nil
}

// OwnerOf implements allocator.Store.
func (m *Memory) OwnerOf(ip netip.Addr) (allocator.Owner, bool, error) {
	o, ok := m.ips[ip]
	return o, ok, nil
}

// IPsOf implements allocator.Store.
func (m *Memory) IPsOf(o allocator.Owner) ([]netip.Addr, error) {
	return slices.Clone(m.owners[o]), nil
}

// SetIPsOf implements allocator.Store.
func (m *Memory) SetIPsOf(o allocator.Owner, ips []netip.Addr) error {
	if len(ips) == 0 {
		delete(m.owners, o)
		return nil
	}
	m.owners[o] = slices.Clone(ips)
	return nil
}

// All implements allocator.Store.
func (m *Memory) All() (map[netip.Addr]allocator.Owner, error) {
	out := make(map[netip.Addr]allocator.Owner, len(m.ips))
	for k, v := range m.ips {
		out[k] = v
	}
	return out, nil
}

// Owners implements allocator.Store.
func (m *Memory) Owners() (map[allocator.Owner][]netip.Addr, error) {
	out := make(map[allocator.Owner][]netip.Addr, len(m.owners))
	for k, v := range m.owners {
		out[k] = slices.Clone(v)
	}
	return out, nil
}

// Hint implements allocator.Store.
func (m *Memory) Hint(r allocator.Range) (allocator.Hint, error) {
	key := r.String()
	if h, ok := m.hints[key]; ok {
		return h, nil
	}
	var h allocator.Hint = &allocator.SparseHint{}
	if r.Size() <= allocator.MaxBitmapSize {
		h = allocator.NewBitmap(r.Size())
	}
	m.hints[key] = h
	return h, nil
}
