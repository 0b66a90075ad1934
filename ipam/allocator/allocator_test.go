package allocator_test

import (
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// The tests live in package allocator_test because the in-memory store
// (package store) imports allocator.

var noAddr netip.Addr

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func mustRange(t testing.TB, subnet, start, end, gw string) allocator.Range {
	t.Helper()
	var a [3]netip.Addr
	for i, s := range []string{start, end, gw} {
		if s != "" {
			a[i] = addr(s)
		}
	}
	r, err := allocator.NewRange(pfx(subnet), a[0], a[1], a[2])
	if err != nil {
		t.Fatalf("NewRange(%s, %q, %q, %q): %v", subnet, start, end, gw, err)
	}
	return r
}

func owner(i int) allocator.Owner {
	return allocator.Owner{ContainerID: fmt.Sprintf("c%02d", i), IfName: "eth0"}
}

func newAlloc(exclude []netip.Prefix, sets ...allocator.RangeSet) *allocator.Allocator {
	return &allocator.Allocator{Sets: sets, Exclude: exclude, Store: store.NewMemory()}
}

func addrs(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}

func TestNewRangeDefaults(t *testing.T) {
	for _, tc := range []struct {
		subnet, start, end, gw string
		size                   uint64
	}{
		{"10.0.0.0/24", "10.0.0.1", "10.0.0.254", "10.0.0.1", 254},
		{"10.0.0.7/24", "10.0.0.1", "10.0.0.254", "10.0.0.1", 254}, // unmasked subnet
		{"10.0.0.0/29", "10.0.0.1", "10.0.0.6", "10.0.0.1", 6},
		{"10.0.0.0/30", "10.0.0.1", "10.0.0.2", "10.0.0.1", 2},
		{"fd00::/120", "fd00::1", "fd00::ff", "fd00::1", 255}, // no IPv6 broadcast
		{"fd00::/126", "fd00::1", "fd00::3", "fd00::1", 3},
	} {
		r, err := allocator.NewRange(pfx(tc.subnet), noAddr, noAddr, noAddr)
		if err != nil {
			t.Errorf("NewRange(%s): %v", tc.subnet, err)
			continue
		}
		if r.Subnet != pfx(tc.subnet).Masked() || r.Start != addr(tc.start) || r.End != addr(tc.end) || r.Gateway != addr(tc.gw) {
			t.Errorf("NewRange(%s) = %+v, want subnet %s start %s end %s gateway %s", tc.subnet, r, pfx(tc.subnet).Masked(), tc.start, tc.end, tc.gw)
		}
		if r.Size() != tc.size {
			t.Errorf("NewRange(%s).Size() = %d, want %d", tc.subnet, r.Size(), tc.size)
		}
		if r.Contains(r.Subnet.Addr()) {
			t.Errorf("NewRange(%s) contains the network address", tc.subnet)
		}
		if r.At(0) != r.Start || r.Offset(r.End) != r.Size()-1 {
			t.Errorf("NewRange(%s): At/Offset inconsistent", tc.subnet)
		}
	}
	// IPv4 broadcast is never a candidate, even when asked for explicitly.
	r := mustRange(t, "10.0.0.0/24", "10.0.0.200", "10.0.0.255", "")
	if r.End != addr("10.0.0.254") || r.Contains(addr("10.0.0.255")) {
		t.Errorf("rangeEnd at the broadcast address: got end %s", r.End)
	}
	// Nor is the network address.
	r = mustRange(t, "10.0.0.0/24", "10.0.0.0", "10.0.0.9", "10.0.0.254")
	if r.Start != addr("10.0.0.1") || r.Gateway != addr("10.0.0.254") {
		t.Errorf("rangeStart at the network address: got %+v", r)
	}
	// Explicit values are kept.
	r = mustRange(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.20", "10.0.0.15")
	if r.Start != addr("10.0.0.10") || r.End != addr("10.0.0.20") || r.Gateway != addr("10.0.0.15") || r.Size() != 11 {
		t.Errorf("explicit range: got %+v", r)
	}
	// Huge IPv6 ranges are capped at 2^63 addresses.
	r = mustRange(t, "fd00::/64", "", "", "")
	if r.Size() != 1<<63 || !r.Subnet.Contains(r.End) {
		t.Errorf("fd00::/64: size %d end %s", r.Size(), r.End)
	}
}

func TestNewRangeErrors(t *testing.T) {
	for _, tc := range []struct {
		subnet, start, end, gw string
		want                   string
	}{
		{"10.0.0.0/24", "10.0.0.20", "10.0.0.10", "", "after rangeEnd"},
		{"10.0.0.0/30", "10.0.0.2", "10.0.0.1", "", "after rangeEnd"},
		{"10.0.0.0/30", "10.0.0.3", "", "", "after rangeEnd"}, // start at the broadcast address
		{"10.0.0.0/24", "", "", "10.0.1.1", "gateway 10.0.1.1 is outside"},
		{"10.0.0.0/24", "", "", "fd00::1", "gateway fd00::1 is outside"},
		{"10.0.0.0/24", "10.0.1.5", "", "", "rangeStart 10.0.1.5 is outside"},
		{"10.0.0.0/24", "9.255.255.255", "", "", "rangeStart 9.255.255.255 is outside"},
		{"10.0.0.0/24", "", "10.0.1.5", "", "rangeEnd 10.0.1.5 is outside"},
		{"10.0.0.0/24", "fd00::1", "", "", "rangeStart fd00::1 is outside"},
		{"fd00::/64", "10.0.0.1", "", "", "rangeStart 10.0.0.1 is outside"},
		{"10.0.0.0/31", "", "", "", "too small"},
		{"10.0.0.0/32", "", "", "", "too small"},
		{"fd00::/127", "", "", "", "too small"},
		{"fd00::/128", "", "", "", "too small"},
	} {
		var a [3]netip.Addr
		for i, s := range []string{tc.start, tc.end, tc.gw} {
			if s != "" {
				a[i] = addr(s)
			}
		}
		r, err := allocator.NewRange(pfx(tc.subnet), a[0], a[1], a[2])
		if err == nil {
			t.Errorf("NewRange(%s, %q, %q, %q) = %+v, want error containing %q", tc.subnet, tc.start, tc.end, tc.gw, r, tc.want)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRange(%s, %q, %q, %q): error %q, want it to contain %q", tc.subnet, tc.start, tc.end, tc.gw, err, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	v4a := mustRange(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.20", "")
	v4b := mustRange(t, "10.0.0.0/24", "10.0.0.21", "10.0.0.30", "")
	v4overlap := mustRange(t, "10.0.0.0/24", "10.0.0.20", "10.0.0.25", "")
	v4wide := mustRange(t, "10.0.0.0/16", "", "", "")
	v4other := mustRange(t, "10.1.0.0/24", "", "", "")
	v6 := mustRange(t, "fd00::/120", "", "", "")
	v6b := mustRange(t, "fd00::/112", "", "", "")
	for _, tc := range []struct {
		name string
		sets []allocator.RangeSet
		want string // "" = valid
	}{
		{"one range", []allocator.RangeSet{{v4a}}, ""},
		{"adjacent ranges in a set", []allocator.RangeSet{{v4a, v4b}}, ""},
		{"dual stack", []allocator.RangeSet{{v4a, v4b}, {v6}}, ""},
		{"two IPv4 sets", []allocator.RangeSet{{v4a}, {v4other}}, ""},
		{"no sets", nil, "no ranges"},
		{"empty set", []allocator.RangeSet{{v4a}, {}}, "empty"},
		{"overlap in a set", []allocator.RangeSet{{v4a, v4overlap}}, "overlap"},
		{"same range twice", []allocator.RangeSet{{v4a, v4a}}, "overlap"},
		{"containing subnet", []allocator.RangeSet{{v4a}, {v4wide}}, "overlap"},
		{"overlap across sets", []allocator.RangeSet{{v4a}, {v4overlap}}, "overlap"},
		{"IPv6 overlap across sets", []allocator.RangeSet{{v4a}, {v6}, {v6b}}, "overlap"},
		{"mixed families", []allocator.RangeSet{{v4a, v6}}, "mixes IPv4 and IPv6"},
		{"mixed families v6 first", []allocator.RangeSet{{v6, v4a}}, "mixes IPv4 and IPv6"},
	} {
		err := allocator.Validate(tc.sets)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate: %v", tc.name, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: Validate accepted %v", tc.name, tc.sets)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: Validate: %q, want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestAllocateSkipsForbiddenAndExhausts(t *testing.T) {
	// /29: network .0, gateway .1 (default), broadcast .7; .4 excluded;
	// so .2 .3 .5 .6 are the only addresses to hand out.
	r := mustRange(t, "10.0.0.0/29", "", "", "")
	a := newAlloc([]netip.Prefix{pfx("10.0.0.4/32")}, allocator.RangeSet{r})
	var got []netip.Addr
	for i := 0; ; i++ {
		ps, err := a.Allocate(owner(i), nil)
		if err != nil {
			if !errors.Is(err, allocator.ErrExhausted) {
				t.Fatalf("allocation %d: %v, want an error wrapping ErrExhausted", i, err)
			}
			if !strings.Contains(err.Error(), "10.0.0.0/29") {
				t.Errorf("exhaustion error %q does not name the range", err)
			}
			break
		}
		if len(ps) != 1 || ps[0].Bits() != 29 {
			t.Fatalf("allocation %d: %v, want one /29 address", i, ps)
		}
		got = append(got, ps[0].Addr())
		if i > 10 {
			t.Fatalf("more than 10 allocations from a /29: %v", got)
		}
	}
	want := []netip.Addr{addr("10.0.0.2"), addr("10.0.0.3"), addr("10.0.0.5"), addr("10.0.0.6")}
	if !slices.Equal(got, want) {
		t.Errorf("allocated %v, want %v", got, want)
	}
	if err := a.Usable(); !errors.Is(err, allocator.ErrExhausted) {
		t.Errorf("Usable on a full range = %v, want ErrExhausted", err)
	}
	// A failed ADD leaves nothing behind.
	if ips, _ := a.Store.IPsOf(owner(len(want))); len(ips) != 0 {
		t.Errorf("failed ADD left an owner entry: %v", ips)
	}
	if err := a.Release(owner(1)); err != nil {
		t.Fatal(err)
	}
	if err := a.Usable(); err != nil {
		t.Errorf("Usable after a Release = %v, want nil", err)
	}
	ps, err := a.Allocate(owner(99), nil)
	if err != nil || ps[0].Addr() != addr("10.0.0.3") {
		t.Errorf("ADD after a Release on a full range = %v, %v; want 10.0.0.3", ps, err)
	}
}

func TestAllocateExplicitGatewayAndRange(t *testing.T) {
	r := mustRange(t, "10.0.0.0/24", "10.0.0.250", "", "10.0.0.252")
	a := newAlloc([]netip.Prefix{pfx("10.0.0.248/30")}, allocator.RangeSet{r}) // excludes .250 .251
	var got []netip.Addr
	for i := 0; i < 3; i++ {
		ps, err := a.Allocate(owner(i), nil)
		if err != nil {
			got = append(got, noAddr)
			if !errors.Is(err, allocator.ErrExhausted) {
				t.Fatalf("ADD %d: %v", i, err)
			}
			continue
		}
		got = append(got, ps[0].Addr())
	}
	want := []netip.Addr{addr("10.0.0.253"), addr("10.0.0.254"), noAddr}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if gw := a.GatewayOf(addr("10.0.0.253")); gw != addr("10.0.0.252") {
		t.Errorf("GatewayOf = %s", gw)
	}
}

func TestAllocateIdempotent(t *testing.T) {
	a := newAlloc(nil, allocator.RangeSet{mustRange(t, "10.0.0.0/24", "", "", "")}, allocator.RangeSet{mustRange(t, "fd00::/120", "", "", "")})
	first, err := a.Allocate(owner(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		again, err := a.Allocate(owner(1), nil)
		if err != nil || !slices.Equal(again, first) {
			t.Fatalf("repeated ADD = %v, %v; want %v", again, err, first)
		}
	}
	// Even with a requested address: what is held wins.
	again, err := a.Allocate(owner(1), []netip.Addr{addr("10.0.0.77")})
	if err != nil || !slices.Equal(again, first) {
		t.Fatalf("repeated ADD with IP= = %v, %v; want %v", again, err, first)
	}
	// Another interface of the same container is another owner.
	other, err := a.Allocate(allocator.Owner{ContainerID: "c01", IfName: "net1"}, nil)
	if err != nil || slices.Equal(other, first) {
		t.Fatalf("ADD for another interface = %v, %v", other, err)
	}
	all, _ := a.Store.All()
	if len(all) != 4 {
		t.Errorf("store holds %d reservations, want 4: %v", len(all), all)
	}
}

func TestAllocateDualStack(t *testing.T) {
	a := newAlloc(nil, allocator.RangeSet{mustRange(t, "10.0.0.0/24", "", "", "")}, allocator.RangeSet{mustRange(t, "fd00::/64", "", "", "")})
	ps, err := a.Allocate(owner(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{pfx("10.0.0.2/24"), pfx("fd00::2/64")}
	if !slices.Equal(ps, want) {
		t.Errorf("dual-stack ADD = %v, want %v", ps, want)
	}
	ips, _ := a.Store.IPsOf(owner(1))
	if !slices.Equal(ips, addrs(want)) {
		t.Errorf("owner index = %v", ips)
	}
	if !a.Contains(addr("fd00::1234")) || a.Contains(addr("fd01::1")) || a.Contains(addr("10.0.0.0")) {
		t.Error("Contains is wrong")
	}
}

func TestAllocateRequested(t *testing.T) {
	v4 := allocator.RangeSet{mustRange(t, "10.0.0.0/24", "10.0.0.10", "10.0.0.50", "")}
	v6 := allocator.RangeSet{mustRange(t, "fd00::/120", "", "", "")}
	a := newAlloc([]netip.Prefix{pfx("10.0.0.40/30")}, v4, v6)

	ps, err := a.Allocate(owner(1), []netip.Addr{addr("10.0.0.20")})
	if err != nil || !slices.Equal(ps, []netip.Prefix{pfx("10.0.0.20/24"), pfx("fd00::2/120")}) {
		t.Fatalf("ADD IP=10.0.0.20 = %v, %v", ps, err)
	}
	ps, err = a.Allocate(owner(2), []netip.Addr{addr("fd00::99"), addr("10.0.0.21")})
	if err != nil || !slices.Equal(ps, []netip.Prefix{pfx("10.0.0.21/24"), pfx("fd00::99/120")}) {
		t.Fatalf("ADD IP=fd00::99,10.0.0.21 = %v, %v", ps, err)
	}

	for _, tc := range []struct {
		req  []string
		want string
	}{
		{[]string{"10.0.0.20"}, "already reserved by container c01 (eth0)"},
		{[]string{"fd00::99"}, "already reserved by container c02 (eth0)"},
		{[]string{"10.0.0.9"}, "outside the configured ranges"}, // in the subnet, not the range
		{[]string{"10.0.1.20"}, "outside the configured ranges"},
		{[]string{"10.0.0.255"}, "outside the configured ranges"},
		{[]string{"10.0.0.42"}, "excluded"},
		{[]string{"10.0.0.30", "10.0.0.31"}, "both requested from range set 0"},
	} {
		var req []netip.Addr
		for _, s := range tc.req {
			req = append(req, addr(s))
		}
		before, _ := a.Store.All()
		ps, err := a.Allocate(owner(9), req)
		if err == nil {
			t.Errorf("ADD IP=%v = %v, want an error", tc.req, ps)
			continue
		}
		if !errors.Is(err, allocator.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ADD IP=%v: %q, want ErrUnavailable containing %q", tc.req, err, tc.want)
		}
		after, _ := a.Store.All()
		if len(after) != len(before) {
			t.Errorf("failed ADD IP=%v changed the store: %v -> %v", tc.req, before, after)
		}
	}
	// The gateway is not allocatable either.
	r := mustRange(t, "10.1.0.0/24", "", "", "10.1.0.9")
	b := newAlloc(nil, allocator.RangeSet{r})
	if _, err := b.Allocate(owner(1), []netip.Addr{addr("10.1.0.9")}); !errors.Is(err, allocator.ErrUnavailable) || !strings.Contains(err.Error(), "gateway") {
		t.Errorf("requesting the gateway: %v", err)
	}
	// .1 is an ordinary address when the gateway is elsewhere.
	if _, err := b.Allocate(owner(1), []netip.Addr{addr("10.1.0.1")}); err != nil {
		t.Errorf("requesting .1 (not the gateway here): %v", err)
	}
}

func TestReleaseRoundRobin(t *testing.T) {
	r := mustRange(t, "10.0.0.0/29", "", "", "") // .2-.6 allocatable
	a := newAlloc(nil, allocator.RangeSet{r})
	get := func(i int) netip.Addr {
		t.Helper()
		ps, err := a.Allocate(owner(i), nil)
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		return ps[0].Addr()
	}
	if ip := get(1); ip != addr("10.0.0.2") {
		t.Fatalf("first = %s", ip)
	}
	if ip := get(2); ip != addr("10.0.0.3") {
		t.Fatalf("second = %s", ip)
	}
	if err := a.Release(owner(1)); err != nil {
		t.Fatal(err)
	}
	if ips, _ := a.Store.IPsOf(owner(1)); len(ips) != 0 {
		t.Errorf("owner index kept after Release: %v", ips)
	}
	if _, held, _ := a.Store.OwnerOf(addr("10.0.0.2")); held {
		t.Error("10.0.0.2 still reserved after Release")
	}
	// .2 was freed but the cursor is after .3: .4 .5 .6 come first, then
	// the search wraps to .2.
	var got []netip.Addr
	for i := 3; i <= 6; i++ {
		got = append(got, get(i))
	}
	want := []netip.Addr{addr("10.0.0.4"), addr("10.0.0.5"), addr("10.0.0.6"), addr("10.0.0.2")}
	if !slices.Equal(got, want) {
		t.Errorf("after Release: %v, want %v", got, want)
	}
	// Releasing twice, or an owner that never had anything, is fine.
	if err := a.Release(owner(1)); err != nil {
		t.Error(err)
	}
	if err := a.Release(owner(42)); err != nil {
		t.Error(err)
	}
}

func TestReleaseDoesNotFreeReusedAddress(t *testing.T) {
	r := mustRange(t, "10.0.0.0/29", "", "", "")
	a := newAlloc(nil, allocator.RangeSet{r})
	if _, err := a.Allocate(owner(1), nil); err != nil {
		t.Fatal(err)
	}
	// A stale owner index entry (e.g. GC released the address and it was
	// reused) must not free someone else's reservation.
	if _, err := a.GC(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(owner(2), []netip.Addr{addr("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Store.SetIPsOf(owner(1), []netip.Addr{addr("10.0.0.2")}); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(owner(1)); err != nil {
		t.Fatal(err)
	}
	if o, held, _ := a.Store.OwnerOf(addr("10.0.0.2")); !held || o != owner(2) {
		t.Errorf("Release of a stale owner freed 10.0.0.2 of %v", o)
	}
}

func TestGC(t *testing.T) {
	a := newAlloc(nil, allocator.RangeSet{mustRange(t, "10.0.0.0/28", "", "", "")}, allocator.RangeSet{mustRange(t, "fd00::/124", "", "", "")})
	for i := 0; i < 5; i++ {
		if _, err := a.Allocate(owner(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	held3, _ := a.Store.IPsOf(owner(3))
	// A reservation without index entry (crash between Reserve and
	// SetIPsOf) of a valid owner gets its entry back; an index entry
	// pointing nowhere is dropped.
	if err := a.Store.SetIPsOf(owner(3), nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Store.SetIPsOf(owner(7), []netip.Addr{addr("10.0.0.13")}); err != nil {
		t.Fatal(err)
	}
	released, err := a.GC([]allocator.Owner{owner(1), owner(3), owner(7)})
	if err != nil {
		t.Fatal(err)
	}
	if len(released) != 6 || !slices.IsSortedFunc(released, netip.Addr.Compare) {
		t.Errorf("GC released %v, want the 6 addresses of owners 0, 2 and 4, sorted", released)
	}
	owners, _ := a.Store.Owners()
	if len(owners) != 2 || len(owners[owner(1)]) != 2 || !slices.Equal(sortAddrs(owners[owner(3)]), sortAddrs(held3)) {
		t.Errorf("owner index after GC: %v", owners)
	}
	all, _ := a.Store.All()
	if len(all) != 4 {
		t.Errorf("reservations after GC: %v", all)
	}
	// Released addresses are allocatable again.
	for i := 10; i < 10+13-2; i++ {
		if _, err := a.Allocate(owner(i), nil); err != nil {
			t.Fatalf("ADD %d after GC: %v", i, err)
		}
	}
	if _, err := a.Allocate(owner(30), nil); !errors.Is(err, allocator.ErrExhausted) {
		t.Errorf("ADD on a full range after GC: %v", err)
	}
}

// TestStaleHints: hints may be wrong in both directions; Reserve is the
// truth.
func TestStaleHints(t *testing.T) {
	r := mustRange(t, "10.0.0.0/29", "", "", "") // .2-.6
	a := newAlloc(nil, allocator.RangeSet{r})
	h, _ := a.Store.Hint(r)
	// Everything marked taken although nothing is: ADD rebuilds.
	for off := uint64(0); off < r.Size(); off++ {
		_ = h.Mark(off, true)
	}
	if err := a.Usable(); err != nil {
		t.Errorf("Usable with an all-taken stale hint on an empty range: %v", err)
	}
	for off := uint64(0); off < r.Size(); off++ {
		_ = h.Mark(off, true)
	}
	ps, err := a.Allocate(owner(1), nil)
	if err != nil {
		t.Fatalf("ADD with an all-taken stale hint: %v", err)
	}
	// Everything marked free although .2 is taken: ADD skips it.
	for off := uint64(0); off < r.Size(); off++ {
		_ = h.Mark(off, false)
	}
	_ = h.SetCursor(r.Offset(ps[0].Addr()))
	ps2, err := a.Allocate(owner(2), nil)
	if err != nil || ps2[0] == ps[0] {
		t.Fatalf("ADD with an all-free stale hint = %v, %v (first got %v)", ps2, err, ps)
	}
	// A wild cursor is tolerated.
	_ = h.SetCursor(1<<64 - 1)
	if _, err := a.Allocate(owner(3), nil); err != nil {
		t.Fatalf("ADD with a wild cursor: %v", err)
	}
}

// TestUsableAfterFailedDualStackAdd: an ADD that reserved in the first set
// and then failed in the second must leave the first set's hint as it
// found it, or STATUS reports a free range as full.
func TestUsableAfterFailedDualStackAdd(t *testing.T) {
	v4 := mustRange(t, "10.0.0.0/29", "", "", "") // 5 addresses: .2-.6
	v6 := mustRange(t, "fd00::/124", "", "", "")  // 14 addresses: ::2-::f
	a := newAlloc(nil, allocator.RangeSet{v4}, allocator.RangeSet{v6})
	for i := 0; i < 4; i++ {
		if _, err := a.Allocate(owner(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	// One IPv4 address (.6) is left; this ADD takes it, then fails on the
	// requested IPv6 address, and gives it back.
	if _, err := a.Allocate(owner(9), []netip.Addr{addr("fd00::2")}); !errors.Is(err, allocator.ErrUnavailable) {
		t.Fatalf("ADD of a taken IPv6 address: %v", err)
	}
	if _, held, _ := a.Store.OwnerOf(addr("10.0.0.6")); held {
		t.Fatal("failed ADD kept its IPv4 reservation")
	}
	if err := a.Usable(); err != nil {
		t.Errorf("Usable with 10.0.0.6 free: %v", err)
	}
	if ps, err := a.Allocate(owner(10), nil); err != nil || ps[0].Addr() != addr("10.0.0.6") {
		t.Errorf("ADD = %v, %v; want 10.0.0.6", ps, err)
	}
}

func sortAddrs(ips []netip.Addr) []netip.Addr {
	c := slices.Clone(ips)
	slices.SortFunc(c, netip.Addr.Compare)
	return c
}

// ---- property test ----

// propConfig is one random configuration of the property test.
type propConfig struct {
	sets    []allocator.RangeSet
	exclude []netip.Prefix
	allowed []map[netip.Addr]bool // per set: the addresses that may be handed out
}

// allowedIn computes, independently of the allocator, which addresses of
// a set may be handed out: inside a range, not the network or IPv4
// broadcast address of the subnet, not the gateway, not excluded.
func allowedIn(set allocator.RangeSet, exclude []netip.Prefix) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool)
	for _, r := range set {
		for ip := r.Start; ip.IsValid() && ip.Compare(r.End) <= 0; ip = ip.Next() {
			if forbidden(r, ip, exclude) {
				continue
			}
			out[ip] = true
		}
	}
	return out
}

func forbidden(r allocator.Range, ip netip.Addr, exclude []netip.Prefix) bool {
	if ip == r.Subnet.Addr() || ip == r.Gateway {
		return true
	}
	if ip.Is4() && ip == broadcast(r.Subnet) {
		return true
	}
	for _, p := range exclude {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func broadcast(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func randomConfig(t testing.TB, rng *rand.Rand) propConfig {
	var c propConfig
	var v4 allocator.RangeSet
	switch rng.Intn(5) {
	case 0, 1: // the whole /28 (13 addresses with the gateway)
		v4 = allocator.RangeSet{mustRange(t, "10.0.0.0/28", "", "", "")}
	case 2: // a random sub-range, random gateway anywhere in the subnet
		lo, hi := 1+rng.Intn(14), 1+rng.Intn(14)
		if lo > hi {
			lo, hi = hi, lo
		}
		gw := fmt.Sprintf("10.0.0.%d", rng.Intn(16))
		v4 = allocator.RangeSet{mustRange(t, "10.0.0.0/28", fmt.Sprintf("10.0.0.%d", lo), fmt.Sprintf("10.0.0.%d", hi), gw)}
	case 3: // the /28 split in two ranges of one set
		v4 = allocator.RangeSet{
			mustRange(t, "10.0.0.0/28", "10.0.0.1", "10.0.0.7", ""),
			mustRange(t, "10.0.0.0/28", "10.0.0.8", "10.0.0.14", "10.0.0.14"),
		}
	case 4: // a /29 and a /30 of other subnets in one set
		v4 = allocator.RangeSet{mustRange(t, "10.0.1.0/29", "", "", ""), mustRange(t, "10.0.2.0/30", "", "", "10.0.2.2")}
	}
	c.sets = append(c.sets, v4)
	if rng.Intn(2) == 0 {
		v6 := allocator.RangeSet{mustRange(t, "fd00::/124", "", "", "")}
		if rng.Intn(3) == 0 {
			v6 = allocator.RangeSet{mustRange(t, "fd00::/124", "fd00::4", "fd00::b", "fd00::5")}
		}
		c.sets = append(c.sets, v6)
	}
	if rng.Intn(3) == 0 { // a dual-stack config with the IPv6 set first
		slices.Reverse(c.sets)
	}
	if err := allocator.Validate(c.sets); err != nil {
		t.Fatalf("random config invalid: %v", err)
	}
	for n := rng.Intn(4); n > 0; n-- {
		var p netip.Prefix
		switch rng.Intn(4) {
		case 0, 1:
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(rng.Intn(3)), byte(rng.Intn(16))}), 32)
		case 2:
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.Intn(16))}), 30).Masked()
		case 3:
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(rng.Intn(16))}), 126+rng.Intn(3)).Masked()
		}
		c.exclude = append(c.exclude, p)
	}
	for _, set := range c.sets {
		c.allowed = append(c.allowed, allowedIn(set, c.exclude))
	}
	return c
}

// propRun is one random sequence against one allocator and its model.
type propRun struct {
	t      *testing.T
	rng    *rand.Rand
	cfg    propConfig
	a      *allocator.Allocator
	mem    *store.Memory
	model  map[allocator.Owner][]netip.Addr // per owner: one address per set, in set order
	pool   []allocator.Owner
	step   int
	log    []string
	staleF bool // a hint was corrupted to "free" for a taken address since the last GC
	stats  *propStats
}

type propStats struct {
	seqs, ops, adds, addOK, exhausted, unavailable, dels, gcs, corrupt int
}

func (p *propRun) fail(format string, args ...any) {
	p.t.Helper()
	tail := p.log
	if len(tail) > 30 {
		tail = tail[len(tail)-30:]
	}
	p.t.Fatalf("step %d: %s\nconfig: sets %v exclude %v\nlast ops:\n  %s", p.step, fmt.Sprintf(format, args...), p.cfg.sets, p.cfg.exclude, strings.Join(tail, "\n  "))
}

// free returns the allowed addresses of set i that the model says are
// not held.
func (p *propRun) free(i int) []netip.Addr {
	held := make(map[netip.Addr]bool)
	for _, ips := range p.model {
		held[ips[i]] = true
	}
	var out []netip.Addr
	for ip := range p.cfg.allowed[i] {
		if !held[ip] {
			out = append(out, ip)
		}
	}
	return out
}

func (p *propRun) holder(ip netip.Addr) (allocator.Owner, bool) {
	for o, ips := range p.model {
		if slices.Contains(ips, ip) {
			return o, true
		}
	}
	return allocator.Owner{}, false
}

// randomRequest picks requested addresses: mostly none, sometimes one per
// set (free, taken, forbidden), sometimes junk.
func (p *propRun) randomRequest() []netip.Addr {
	if p.rng.Intn(5) != 0 {
		return nil
	}
	var req []netip.Addr
	for i, set := range p.cfg.sets {
		if p.rng.Intn(2) == 0 {
			continue
		}
		r := set[p.rng.Intn(len(set))]
		switch p.rng.Intn(4) {
		case 0: // anything in the subnet, network and broadcast included
			n := 1 << (r.Subnet.Addr().BitLen() - r.Subnet.Bits())
			ip := r.Subnet.Addr()
			for k := p.rng.Intn(n); k > 0; k-- {
				ip = ip.Next()
			}
			req = append(req, ip)
		default: // a free address when there is one
			if f := p.free(i); len(f) > 0 {
				slices.SortFunc(f, netip.Addr.Compare)
				req = append(req, f[p.rng.Intn(len(f))])
			}
		}
	}
	switch p.rng.Intn(10) {
	case 0:
		req = append(req, addr("192.168.1.1"))
	case 1:
		if len(req) > 0 {
			req = append(req, req[0]) // two in one set
		}
	}
	p.rng.Shuffle(len(req), func(i, j int) { req[i], req[j] = req[j], req[i] })
	return req
}

// expectAdd predicts the outcome of a new owner's ADD: nil, ErrExhausted
// or ErrUnavailable, in the allocator's order (requested addresses are
// checked first, then the sets in order).
func (p *propRun) expectAdd(req []netip.Addr) (error, []netip.Addr) {
	want := make([]netip.Addr, len(p.cfg.sets))
	for _, ip := range req {
		set := -1
		for i, s := range p.cfg.sets {
			for _, r := range s {
				if r.Contains(ip) {
					set = i
				}
			}
		}
		if set < 0 || want[set].IsValid() {
			return allocator.ErrUnavailable, nil
		}
		want[set] = ip
	}
	for i := range p.cfg.sets {
		if want[i].IsValid() {
			if _, taken := p.holder(want[i]); taken || !p.cfg.allowed[i][want[i]] {
				return allocator.ErrUnavailable, nil
			}
		} else if len(p.free(i)) == 0 {
			return allocator.ErrExhausted, nil
		}
	}
	return nil, want
}

func (p *propRun) add(o allocator.Owner) {
	p.stats.adds++
	req := p.randomRequest()
	got, err := p.a.Allocate(o, req)
	p.log = append(p.log, fmt.Sprintf("ADD %s req %v -> %v, %v", o.ContainerID, req, got, err))
	if held, ok := p.model[o]; ok {
		if err != nil || !slices.Equal(addrs(got), held) {
			p.fail("repeated ADD of %v = %v, %v; want %v", o, got, err, held)
		}
		p.stats.addOK++
		return
	}
	wantErr, wantIPs := p.expectAdd(req)
	if wantErr != nil {
		if !errors.Is(err, wantErr) {
			p.fail("ADD of %v req %v = %v, %v; model says %v (free per set: %v)", o, req, got, err, wantErr, p.freeCounts())
		}
		if errors.Is(wantErr, allocator.ErrExhausted) {
			p.stats.exhausted++
		} else {
			p.stats.unavailable++
		}
		return
	}
	if err != nil {
		p.fail("ADD of %v req %v failed: %v; model says it fits (free per set: %v)", o, req, err, p.freeCounts())
	}
	if len(got) != len(p.cfg.sets) {
		p.fail("ADD of %v = %v: want one address per set", o, got)
	}
	for i, pr := range got {
		ip := pr.Addr()
		if !p.cfg.allowed[i][ip] {
			p.fail("ADD of %v handed out %v from set %d: not an allowed address of the set", o, pr, i)
		}
		if h, taken := p.holder(ip); taken {
			p.fail("ADD of %v handed out %v, held by %v", o, ip, h)
		}
		if wantIPs[i].IsValid() && ip != wantIPs[i] {
			p.fail("ADD of %v req %v = %v, want %v in set %d", o, req, got, wantIPs[i], i)
		}
		var r allocator.Range
		for _, rr := range p.cfg.sets[i] {
			if rr.Contains(ip) {
				r = rr
			}
		}
		if pr.Bits() != r.Subnet.Bits() {
			p.fail("ADD handed out %v, want prefix length of %s", pr, r.Subnet)
		}
	}
	p.model[o] = addrs(got)
	p.stats.addOK++
}

func (p *propRun) freeCounts() []int {
	var n []int
	for i := range p.cfg.sets {
		n = append(n, len(p.free(i)))
	}
	return n
}

func (p *propRun) del(o allocator.Owner) {
	p.stats.dels++
	err := p.a.Release(o)
	p.log = append(p.log, fmt.Sprintf("DEL %s -> %v", o.ContainerID, err))
	if err != nil {
		p.fail("DEL of %v: %v", o, err)
	}
	delete(p.model, o)
}

func (p *propRun) gc() {
	p.stats.gcs++
	var valid []allocator.Owner
	for _, o := range p.pool {
		if p.rng.Intn(3) != 0 {
			valid = append(valid, o)
		}
	}
	var wantReleased []netip.Addr
	for o, ips := range p.model {
		if !slices.Contains(valid, o) {
			wantReleased = append(wantReleased, ips...)
			delete(p.model, o)
		}
	}
	released, err := p.a.GC(valid)
	p.log = append(p.log, fmt.Sprintf("GC valid=%d -> released %v, %v", len(valid), released, err))
	if err != nil {
		p.fail("GC: %v", err)
	}
	if !slices.Equal(released, sortAddrs(wantReleased)) {
		p.fail("GC released %v, want %v", released, sortAddrs(wantReleased))
	}
	p.staleF = false // GC rebuilds every hint from the store
}

// corrupt makes a hint lie: a random offset of a random range marked
// taken or free, sometimes a random cursor.
func (p *propRun) corrupt() {
	p.stats.corrupt++
	set := p.cfg.sets[p.rng.Intn(len(p.cfg.sets))]
	r := set[p.rng.Intn(len(set))]
	h, err := p.mem.Hint(r)
	if err != nil {
		p.fail("Hint: %v", err)
	}
	off := uint64(p.rng.Int63n(int64(r.Size()) + 2)) // out of range now and then
	taken := p.rng.Intn(2) == 0
	_ = h.Mark(off, taken)
	if !taken && off < r.Size() {
		if _, held := p.holder(r.At(off)); held {
			p.staleF = true
		}
	}
	msg := fmt.Sprintf("CORRUPT %s offset %d taken=%v", r, off, taken)
	if p.rng.Intn(4) == 0 {
		c := p.rng.Uint64()
		_ = h.SetCursor(c)
		msg += fmt.Sprintf(" cursor=%d", c)
	}
	p.log = append(p.log, msg)
}

// check compares the store with the model after every op.
func (p *propRun) check() {
	all, err := p.mem.All()
	if err != nil {
		p.fail("All: %v", err)
	}
	owners, err := p.mem.Owners()
	if err != nil {
		p.fail("Owners: %v", err)
	}
	seen := make(map[netip.Addr]allocator.Owner)
	for o, ips := range p.model {
		got, err := p.mem.IPsOf(o)
		if err != nil || !slices.Equal(sortAddrs(got), sortAddrs(ips)) {
			p.fail("IPsOf(%v) = %v, %v; model %v", o, got, err, ips)
		}
		if !slices.Equal(sortAddrs(owners[o]), sortAddrs(ips)) {
			p.fail("Owners()[%v] = %v; model %v", o, owners[o], ips)
		}
		for i, ip := range ips {
			if prev, dup := seen[ip]; dup {
				p.fail("%s held by both %v and %v", ip, prev, o)
			}
			seen[ip] = o
			if holder, ok, err := p.mem.OwnerOf(ip); err != nil || !ok || holder != o {
				p.fail("OwnerOf(%s) = %v, %v, %v; model says %v", ip, holder, ok, err, o)
			}
			if !p.cfg.allowed[i][ip] {
				p.fail("%v holds %s, not allowed in set %d", o, ip, i)
			}
		}
	}
	for ip, o := range all {
		if seen[ip] != o {
			p.fail("store reserves %s for %v; model: %v (leak)", ip, o, seen[ip])
		}
	}
	if len(all) != len(seen) {
		p.fail("store has %d reservations, model %d", len(all), len(seen))
	}
	for o := range owners {
		if _, ok := p.model[o]; !ok {
			p.fail("owner index has %v, which the model says holds nothing", o)
		}
	}
	// STATUS: never "exhausted" while every set has room (hints are
	// rebuilt when they look full); and "exhausted" when a set is full,
	// unless a hint was made to call a taken address free.
	full := false
	for i := range p.cfg.sets {
		if len(p.free(i)) == 0 {
			full = true
		}
	}
	err = p.a.Usable()
	if err != nil && !errors.Is(err, allocator.ErrExhausted) {
		p.fail("Usable: %v", err)
	}
	if !full && err != nil {
		p.fail("Usable = %v with free addresses %v", err, p.freeCounts())
	}
	if full && err == nil && !p.staleF {
		p.fail("Usable = nil with a full set (free %v)", p.freeCounts())
	}
}

func TestAllocatorProperties(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("PODNET_PROP_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("PODNET_PROP_SEED: %v", err)
		}
	}
	sequences := 2000
	if testing.Short() {
		sequences = 200
	}
	t.Logf("seed %d (replay with PODNET_PROP_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	stats := &propStats{}
	for s := 0; s < sequences; s++ {
		cfg := randomConfig(t, rng)
		mem := store.NewMemory()
		p := &propRun{
			t: t, rng: rng, cfg: cfg, mem: mem, stats: stats,
			a:     &allocator.Allocator{Sets: cfg.sets, Exclude: cfg.exclude, Store: mem},
			model: make(map[allocator.Owner][]netip.Addr),
		}
		for i := 0; i < 20; i++ {
			p.pool = append(p.pool, owner(i))
		}
		// Pre-made stale hints.
		for n := rng.Intn(6); n > 0; n-- {
			p.corrupt()
		}
		ops := 50 + rng.Intn(151)
		for p.step = 0; p.step < ops; p.step++ {
			o := p.pool[rng.Intn(len(p.pool))]
			switch k := rng.Intn(100); {
			case k < 55:
				p.add(o)
			case k < 85:
				p.del(o)
			case k < 92:
				p.gc()
			default:
				p.corrupt()
			}
			p.check()
			stats.ops++
		}
		stats.seqs++
	}
	t.Logf("%d sequences, %d ops: %d ADD (%d ok, %d exhausted, %d unavailable), %d DEL, %d GC, %d hint corruptions",
		stats.seqs, stats.ops, stats.adds, stats.addOK, stats.exhausted, stats.unavailable, stats.dels, stats.gcs, stats.corrupt)
	if stats.exhausted == 0 || stats.unavailable == 0 {
		t.Errorf("the random sequences never hit exhaustion (%d) or an unavailable request (%d): weak test", stats.exhausted, stats.unavailable)
	}
}

// A large exclude inside a huge (sparse-hint) range is jumped over, not
// walked address by address.
func TestHugeExcludeIsSkipped(t *testing.T) {
	r, err := allocator.NewRange(netip.MustParsePrefix("fd00::/64"), netip.Addr{}, netip.Addr{}, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	a := &allocator.Allocator{
		Sets:    []allocator.RangeSet{{r}},
		Exclude: []netip.Prefix{netip.MustParsePrefix("fd00::/96")},
		Store:   store.NewMemory(),
	}
	got, err := a.Allocate(allocator.Owner{ContainerID: "c1", IfName: "eth0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddr("fd00::1:0:0"); got[0].Addr() != want {
		t.Fatalf("got %s, want %s (first address after the excluded /96)", got[0], want)
	}
}
