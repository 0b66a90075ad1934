package cluster

import (
	"net/netip"
	"testing"
)

// TestCIDRAllocator: blocks in order from the start of the cluster CIDR,
// the lowest free one reused after a release, an error when full — what
// kube-controller-manager's range allocator hands out.
func TestCIDRAllocator(t *testing.T) {
	a, err := newCIDRAllocator("10.244.0.0/16", 24)
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for range 3 {
		p, err := a.allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24"), netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.2.0/24")}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d = %s, want %s", i, got[i], want[i])
		}
	}
	a.release(want[1])
	if p, _ := a.allocate(); p != want[1] {
		t.Errorf("after releasing %s got %s", want[1], p)
	}
	if p, _ := a.allocate(); p != netip.MustParsePrefix("10.244.3.0/24") {
		t.Errorf("next block %s, want 10.244.3.0/24", p)
	}

	small, err := newCIDRAllocator("10.0.0.0/23", 24)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = small.allocate()
	_, _ = small.allocate()
	if p, err := small.allocate(); err == nil {
		t.Errorf("a full /23 handed out %s", p)
	}
	// a list (podnet-routed's --cluster-cidr): blocks from its first CIDR
	list, err := newCIDRAllocator("10.244.0.0/16, 10.96.0.0/16", 24)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := list.allocate(); p != want[0] {
		t.Errorf("first block of a list: %s, want %s", p, want[0])
	}
	for _, bad := range [][2]any{{"10.0.0.0/16", 8}, {"fd00::/48", 64}, {"nonsense", 24}} {
		if _, err := newCIDRAllocator(bad[0].(string), bad[1].(int)); err == nil {
			t.Errorf("newCIDRAllocator(%v, %v) accepted", bad[0], bad[1])
		}
	}
}

// TestCIDRAllocator6: the IPv6 blocks of a dual-stack cluster, in order.
func TestCIDRAllocator6(t *testing.T) {
	a, err := newCIDRAllocator6("fd00:10:244::/56", 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fd00:10:244::/64", "fd00:10:244:1::/64", "fd00:10:244:2::/64"} {
		if p, err := a.allocate(); err != nil || p != netip.MustParsePrefix(want) {
			t.Errorf("block %s (%v), want %s", p, err, want)
		}
	}
	b, err := newCIDRAllocator6("fd00:10:244:ff00::/56", 60)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = b.allocate()
	if p, _ := b.allocate(); p != netip.MustParsePrefix("fd00:10:244:ff10::/60") {
		t.Errorf("second /60: %s", p)
	}
	for _, bad := range [][2]any{{"10.0.0.0/16", 24}, {"fd00::/32", 64}, {"fd00::/64", 56}} {
		if _, err := newCIDRAllocator6(bad[0].(string), bad[1].(int)); err == nil {
			t.Errorf("newCIDRAllocator6(%v, %v) accepted", bad[0], bad[1])
		}
	}
}
