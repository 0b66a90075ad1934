package dataplane

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/desired"
)

// fakeKernel is a main routing table in memory that counts the calls route
// apply makes.
type fakeKernel struct {
	routes          map[string]netlink.Route // by destination
	links           map[string]int
	dumps, writes   int
	replaced, dels  []string
	failReplaceDsts map[string]bool
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{routes: map[string]netlink.Route{}, links: map[string]int{"tunl0": 7, "eth0": 2}}
}

func (k *fakeKernel) ListMain() ([]netlink.Route, error) {
	k.dumps++
	var out []netlink.Route
	for _, r := range k.routes {
		out = append(out, r)
	}
	return out, nil
}

func (k *fakeKernel) Replace(r *netlink.Route) error {
	k.writes++
	if k.failReplaceDsts[r.Dst.String()] {
		return fmt.Errorf("injected failure")
	}
	k.replaced = append(k.replaced, r.Dst.String())
	k.routes[r.Dst.String()] = *r
	return nil
}

func (k *fakeKernel) Add(r *netlink.Route) error {
	if _, ok := k.routes[r.Dst.String()]; ok {
		k.writes++
		return unix.EEXIST
	}
	return k.Replace(r)
}

func (k *fakeKernel) Delete(r *netlink.Route) error {
	k.writes++
	k.dels = append(k.dels, r.Dst.String())
	delete(k.routes, r.Dst.String())
	return nil
}

func (k *fakeKernel) LinkIndex(name string) (int, error) {
	if i, ok := k.links[name]; ok {
		return i, nil
	}
	return 0, netlink.LinkNotFoundError{}
}

func (k *fakeKernel) LinkName(index int) string {
	for n, i := range k.links {
		if i == index {
			return n
		}
	}
	return ""
}

// add puts a route in the table as the kernel would hold it.
func (k *fakeKernel) add(dst string, proto netlink.RouteProtocol, gw string, dev string) {
	_, n, _ := net.ParseCIDR(dst)
	r := netlink.Route{Dst: n, Protocol: proto, Table: unix.RT_TABLE_MAIN, LinkIndex: k.links[dev]}
	if gw != "" {
		r.Gw = net.ParseIP(gw)
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	k.routes[dst] = r
}

func ipipRoute(dst, gw string) desired.Route {
	return desired.Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw), Dev: "tunl0", OnLink: true}
}

func cluster(n int) []desired.Route {
	var want []desired.Route
	for i := 1; i <= n; i++ {
		want = append(want, ipipRoute(fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250), fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)))
	}
	return append(want, desired.Route{Dst: netip.MustParsePrefix("10.99.0.0/24"), Kind: desired.Blackhole})
}

func TestApplyRoutesWritesOnlyTheDelta(t *testing.T) {
	k := newFakeKernel()
	k.add("10.99.0.7/32", contract.RouteProtocol, "", "eth0") // a pod's host route: not routed's
	want := cluster(500)
	changed, programmed, err := applyRoutes(k, want, nil, true)
	if err != nil || changed != len(want) || programmed != len(want) || k.dumps != 1 || k.writes != len(want) {
		t.Fatalf("first apply: changed %d programmed %d err %v, %d dumps %d writes; want %d routes from one dump", changed, programmed, err, k.dumps, k.writes, len(want))
	}

	// a resync with nothing changed: one dump, no write
	k.dumps, k.writes = 0, 0
	changed, programmed, err = applyRoutes(k, want, nil, true)
	if err != nil || changed != 0 || programmed != len(want) || k.dumps != 1 || k.writes != 0 {
		t.Fatalf("resync, nothing changed: changed %d programmed %d err %v, %d dumps %d writes; want 0 writes", changed, programmed, err, k.dumps, k.writes)
	}

	// one Node changes, one goes, and someone deletes a route: only those
	// three are written
	k.writes, k.replaced, k.dels = 0, nil, nil
	delete(k.routes, want[10].Dst.String())
	next := append([]desired.Route{}, want[:len(want)-2]...) // drop node 500
	next[3].Gw = netip.MustParseAddr("192.168.9.9")
	next = append(next, want[len(want)-1])
	changed, _, err = applyRoutes(k, next, nil, true)
	if err != nil || changed != 3 || k.writes != 3 {
		t.Fatalf("delta apply: changed %d err %v, %d writes (replaced %v deleted %v); want 3", changed, err, k.writes, k.replaced, k.dels)
	}
	if _, ok := k.routes["10.99.0.7/32"]; !ok {
		t.Error("the pod's host route was removed")
	}
}

func TestApplyRoutesLeavesForeignRoutes(t *testing.T) {
	k := newFakeKernel()
	k.add("10.100.2.0/24", unix.RTPROT_STATIC, "192.168.0.200", "eth0") // someone else's
	want := cluster(3)
	changed, _, err := applyRoutes(k, want, nil, true)
	if err == nil || !strings.Contains(err.Error(), "10.100.2.0/24") || !strings.Contains(err.Error(), "not podnet's") {
		t.Fatalf("err %v: want the foreign route on 10.100.2.0/24 reported", err)
	}
	if r := k.routes["10.100.2.0/24"]; r.Protocol != unix.RTPROT_STATIC || !r.Gw.Equal(net.ParseIP("192.168.0.200")) {
		t.Errorf("the foreign route was changed: %+v", r)
	}
	if changed != len(want)-1 {
		t.Errorf("changed %d, want every other route (%d) installed", changed, len(want)-1)
	}
}

func TestApplyRoutesReportsFailuresAndGoesOn(t *testing.T) {
	k := newFakeKernel()
	want := cluster(3)
	k.failReplaceDsts = map[string]bool{want[0].Dst.String(): true}
	changed, programmed, err := applyRoutes(k, want, nil, true)
	if err == nil || !strings.Contains(err.Error(), want[0].Dst.String()) || changed != len(want)-1 || programmed != len(want)-1 {
		t.Fatalf("changed %d programmed %d err %v", changed, programmed, err)
	}
	want = append(want, desired.Route{Dst: netip.MustParsePrefix("10.200.0.0/24"), Gw: netip.MustParseAddr("192.168.0.9"), Dev: "nosuchdev"})
	if _, _, err := applyRoutes(k, want, nil, true); err == nil || !strings.Contains(err.Error(), "device") {
		t.Fatalf("missing device: err %v", err)
	}
}

// TestApplyRoutesCache: with a cache, a Node event's apply reads nothing
// and writes only that Node's routes; a route that appeared since the last
// dump is never overwritten (the exclusive create fails, the conflict is
// reported and the cache dropped); after Invalidate the next apply dumps.
func TestApplyRoutesCache(t *testing.T) {
	k := newFakeKernel()
	cache := &RouteCache{}
	want := cluster(200)
	if _, _, err := applyRoutes(k, want, cache, false); err != nil || k.dumps != 1 {
		t.Fatalf("first apply with an empty cache: err %v, %d dumps (want 1)", err, k.dumps)
	}
	// one Node's gateway changes: no dump, one write
	k.dumps, k.writes = 0, 0
	want[5].Gw = netip.MustParseAddr("192.168.7.7")
	changed, programmed, err := applyRoutes(k, want, cache, false)
	if err != nil || changed != 1 || programmed != len(want) || k.dumps != 0 || k.writes != 1 {
		t.Fatalf("node event: changed %d programmed %d err %v, %d dumps %d writes; want 1 write, no dump", changed, programmed, err, k.dumps, k.writes)
	}
	if got := k.routes[want[5].Dst.String()]; !got.Gw.Equal(net.ParseIP("192.168.7.7")) {
		t.Errorf("route not changed in place: %+v", got)
	}
	// a Node comes whose PodCIDR someone else routed after the last dump
	k.add("10.200.0.0/24", unix.RTPROT_STATIC, "192.168.0.250", "eth0")
	newNode := desired.Route{Dst: netip.MustParsePrefix("10.200.0.0/24"), Gw: netip.MustParseAddr("192.168.0.9"), Dev: "tunl0", OnLink: true}
	want = append(want, newNode)
	k.dumps, k.writes = 0, 0
	if _, _, err := applyRoutes(k, want, cache, false); err == nil || !strings.Contains(err.Error(), "10.200.0.0/24") || k.dumps != 0 {
		t.Fatalf("err %v (%d dumps): want the conflict on 10.200.0.0/24 reported from the exclusive create", err, k.dumps)
	}
	if r := k.routes["10.200.0.0/24"]; r.Protocol != unix.RTPROT_STATIC {
		t.Fatalf("the foreign route was overwritten: %+v", r)
	}
	// the failed apply dropped the cache: the next one dumps and knows
	k.dumps, k.writes = 0, 0
	if _, _, err := applyRoutes(k, want, cache, false); err == nil || !strings.Contains(err.Error(), "not podnet's") || k.dumps != 1 || k.writes != 0 {
		t.Fatalf("after a failed apply: err %v, %d dumps %d writes; want one dump, the foreign route named, no write", err, k.dumps, k.writes)
	}
	// someone deletes a route of ours: Invalidate (the subscription does)
	// makes the next apply dump and repair it
	want = want[:len(want)-1]
	delete(k.routes, "10.200.0.0/24")
	if _, _, err := applyRoutes(k, want, cache, true); err != nil {
		t.Fatal(err)
	}
	delete(k.routes, want[9].Dst.String())
	cache.Invalidate()
	k.dumps, k.writes = 0, 0
	if changed, _, err := applyRoutes(k, want, cache, false); err != nil || changed != 1 || k.dumps != 1 {
		t.Fatalf("repair after Invalidate: changed %d err %v, %d dumps", changed, err, k.dumps)
	}
	if _, ok := k.routes[want[9].Dst.String()]; !ok {
		t.Error("the deleted route was not put back")
	}
}

// notify is the route notification the kernel sends for a change of r.
func notify(k *fakeKernel, dst string, del bool) netlink.RouteUpdate {
	u := netlink.RouteUpdate{Type: unix.RTM_NEWROUTE, Route: k.routes[dst]}
	if del {
		u.Type = unix.RTM_DELROUTE
	}
	return u
}

// TestApplyRouteDelta: a Node event writes its routes from the cache (no
// dump, no write for what is already right), the route subscription
// keeps the cache current (a foreign route that appears is refused
// without a write attempt; a route of ours someone deletes is reported
// lost and put back without a dump), and notifications of its own writes
// and of pods' host routes change nothing.
func TestApplyRouteDelta(t *testing.T) {
	k := newFakeKernel()
	cache := &RouteCache{}
	want := cluster(300)
	if _, _, err := applyRoutes(k, want, cache, true); err != nil || k.dumps != 1 {
		t.Fatalf("full apply: err %v, %d dumps", err, k.dumps)
	}
	for _, r := range want { // the notifications of those writes
		if cache.Observe(notify(k, r.Dst.String(), false)) {
			t.Fatalf("our own new route %s reported lost", r.Dst)
		}
	}

	// one Node moves, one goes, one is unchanged: 2 writes, no dump
	k.dumps, k.writes, k.replaced, k.dels = 0, 0, nil, nil
	moved := want[7]
	moved.Gw = netip.MustParseAddr("192.168.8.8")
	changed, programmed, err := applyRouteDelta(k, []desired.Route{moved, want[8]}, []desired.Route{want[9]}, cache)
	if err != nil || changed != 2 || programmed != len(want)-1 || k.dumps != 0 || k.writes != 2 {
		t.Fatalf("delta: changed %d programmed %d err %v, %d dumps %d writes; want 2 writes, no dump", changed, programmed, err, k.dumps, k.writes)
	}
	if !k.routes[moved.Dst.String()].Gw.Equal(net.ParseIP("192.168.8.8")) || k.routes[want[9].Dst.String()].Dst != nil {
		t.Fatalf("kernel after the delta: %v / %v", k.routes[moved.Dst.String()], k.routes[want[9].Dst.String()])
	}
	// the kernel's notification of our own deletion is not a loss
	if cache.Observe(netlink.RouteUpdate{Type: unix.RTM_DELROUTE, Route: *kernelRoute(want[9], 7)}) {
		t.Error("our own deletion was reported lost")
	}

	// an old blackhole of ours (without contract.BlackholeMetric, from an
	// earlier podnet-routed) that a write deletes is no loss, even where
	// a route of ours for the same destination is owned (u.Type is the
	// message's type; the route's is u.Route.Type)
	old := *kernelRoute(want[3], 7)
	old.Type, old.Priority, old.Gw = unix.RTN_BLACKHOLE, 0, nil
	if cache.Observe(netlink.RouteUpdate{Type: unix.RTM_DELROUTE, Route: old}) {
		t.Error("the deletion of an old blackhole was reported lost")
	}

	// someone routes a new Node's PodCIDR first: known from the
	// notification, refused without a write
	k.add("10.200.0.0/24", unix.RTPROT_STATIC, "192.168.0.250", "eth0")
	cache.Observe(notify(k, "10.200.0.0/24", false))
	k.writes = 0
	newNode := desired.Route{Dst: netip.MustParsePrefix("10.200.0.0/24"), Gw: netip.MustParseAddr("192.168.0.9"), Dev: "tunl0", OnLink: true}
	if _, _, err := applyRouteDelta(k, []desired.Route{newNode}, nil, cache); err == nil || !strings.Contains(err.Error(), "not podnet's") || k.writes != 0 || k.dumps != 0 {
		t.Fatalf("foreign route seen by the subscription: err %v, %d writes, %d dumps; want it named, nothing written", err, k.writes, k.dumps)
	}
	// the refused apply dropped the cache; the next apply dumps once and
	// the cache is whole again
	if _, _, err := applyRouteDelta(k, nil, nil, cache); err != nil || k.dumps != 1 {
		t.Fatalf("after a failed apply: err %v, %d dumps (want 1)", err, k.dumps)
	}
	// the foreign route goes: the destination is free without a dump
	u := notify(k, "10.200.0.0/24", true)
	delete(k.routes, "10.200.0.0/24")
	cache.Observe(u)
	k.dumps, k.writes = 0, 0
	if changed, _, err := applyRouteDelta(k, []desired.Route{newNode}, nil, cache); err != nil || changed != 1 || k.dumps != 0 {
		t.Fatalf("after the foreign route went: changed %d err %v, %d dumps", changed, err, k.dumps)
	}

	// someone deletes a route of ours: lost, and a full apply from the
	// cache (the daemon's repair) puts it back with one write, no dump
	victim := want[42].Dst.String()
	u = notify(k, victim, true)
	delete(k.routes, victim)
	if !cache.Observe(u) {
		t.Fatal("a deleted podnet route was not reported lost")
	}
	next := append(slices.Clone(want[:9]), want[10:]...)
	next[7] = moved
	next = append(next, newNode)
	k.dumps, k.writes = 0, 0
	if changed, _, err := applyRoutes(k, next, cache, false); err != nil || changed != 1 || k.writes != 1 || k.dumps != 0 {
		t.Fatalf("repair: changed %d err %v, %d writes %d dumps; want the one route back, no dump", changed, err, k.writes, k.dumps)
	}
	if _, ok := k.routes[victim]; !ok {
		t.Error("the deleted route was not put back")
	}

	// a pod's host route (podnet's protocol, no gateway) coming and going
	// is not routed's business
	k.add("10.99.0.9/32", contract.RouteProtocol, "", "eth0")
	if cache.Observe(notify(k, "10.99.0.9/32", false)) || cache.Observe(notify(k, "10.99.0.9/32", true)) {
		t.Error("a pod host route's notification was reported as a lost route")
	}
	// a notification from another table is ignored
	other := notify(k, victim, true)
	other.Table = 200
	if cache.Observe(other) {
		t.Error("a deletion in another table was reported lost")
	}
}

// TestRouteRepairsOnlyTampering: a route written back counts as a repair
// (TakeRepairs) only when the kernel no longer held what podnet-routed had
// written there: deleted or edited by someone else. The first apply (its
// writes, and the routes of a previous run kept in place), a plan that
// changes (a route moved, added, removed), a resync with nothing changed,
// and routes that went with their device (ForgetDevice) are not.
func TestRouteRepairsOnlyTampering(t *testing.T) {
	k := newFakeKernel()
	cache := &RouteCache{}
	want := cluster(10)
	// a previous run's route, right as it is: kept, and ours from now
	k.routes[want[3].Dst.String()] = *kernelRoute(want[3], k.links["tunl0"])
	repairs := func(step string, wantDsts ...netip.Prefix) {
		t.Helper()
		if got := cache.TakeRepairs(); !slices.Equal(got, wantDsts) {
			t.Fatalf("%s: repairs %v, want %v", step, got, wantDsts)
		}
	}
	if changed, _, err := applyRoutes(k, want, cache, true); err != nil || changed != len(want)-1 {
		t.Fatalf("first apply: changed %d, err %v", changed, err)
	}
	repairs("first apply")

	// the plan changes: one moves, one goes, one comes; then a resync
	// with nothing changed
	next := slices.Clone(want)
	next[1].Gw = netip.MustParseAddr("192.168.9.9")
	next = slices.Delete(next, 2, 3)
	next = append(next, ipipRoute("10.150.0.0/24", "192.168.7.7"))
	if changed, _, err := applyRoutes(k, next, cache, true); err != nil || changed != 3 {
		t.Fatalf("plan change: changed %d, err %v", changed, err)
	}
	repairs("plan change")
	if changed, _, err := applyRoutes(k, next, cache, true); err != nil || changed != 0 {
		t.Fatalf("resync: changed %d, err %v", changed, err)
	}
	repairs("resync with nothing changed")
	moved := next[1]
	moved.Gw = netip.MustParseAddr("192.168.9.10")
	if changed, _, err := applyRouteDelta(k, []desired.Route{moved}, nil, cache); err != nil || changed != 1 {
		t.Fatalf("Node event: changed %d, err %v", changed, err)
	}
	next[1] = moved
	repairs("Node event")

	// someone deletes one route (seen by the subscription) and edits
	// another (seen by the resync's dump): one repair each
	victim := next[4].Dst
	u := notify(k, victim.String(), true)
	delete(k.routes, victim.String())
	cache.Observe(u)
	if changed, _, err := applyRoutes(k, next, cache, false); err != nil || changed != 1 {
		t.Fatalf("repair: changed %d, err %v", changed, err)
	}
	repairs("route deleted", victim)
	edited := next[5].Dst
	er := k.routes[edited.String()]
	er.Gw = net.ParseIP("192.168.66.66")
	k.routes[edited.String()] = er
	if changed, _, err := applyRoutes(k, next, cache, true); err != nil || changed != 1 {
		t.Fatalf("edit repaired: changed %d, err %v", changed, err)
	}
	repairs("route edited", edited)
	// a deleted route that the plan moves at the same time is a repair too
	victim = next[6].Dst
	delete(k.routes, victim.String())
	next[6].Gw = netip.MustParseAddr("192.168.5.5")
	if changed, _, err := applyRoutes(k, next, cache, true); err != nil || changed != 1 {
		t.Fatalf("deleted and moved: changed %d, err %v", changed, err)
	}
	repairs("route deleted while the plan moved it", victim)

	// tunl0 goes down: the kernel drops its routes, the daemon forgets
	// them, the apply writes them back without a repair; the blackhole,
	// deleted meanwhile, is one
	for dst, r := range k.routes {
		if r.LinkIndex == k.links["tunl0"] {
			delete(k.routes, dst)
		}
	}
	bh := next[len(next)-2].Dst // the blackhole (cluster's last; then the added route)
	delete(k.routes, bh.String())
	cache.ForgetDevice("tunl0")
	if changed, _, err := applyRoutes(k, next, cache, true); err != nil || changed != len(next) {
		t.Fatalf("after the link: changed %d, err %v (want all %d)", changed, err, len(next))
	}
	repairs("routes gone with their device", bh)
}

// TestForgetDeviceDropsTheView: when a link goes down the kernel drops
// its routes without a notification. After ForgetDevice the next apply
// reads the table again, even one that would trust the cache (a Node
// event, or a link-change apply whose dump came before the link went
// down): it writes the routes back, and neither it nor the next apply
// counts a repair.
func TestForgetDeviceDropsTheView(t *testing.T) {
	k := newFakeKernel()
	cache := &RouteCache{}
	want := cluster(6)
	if _, _, err := applyRoutes(k, want, cache, true); err != nil {
		t.Fatal(err)
	}
	for dst, r := range k.routes {
		if r.LinkIndex == k.links["tunl0"] {
			delete(k.routes, dst)
		}
	}
	cache.ForgetDevice("tunl0")
	dumps := k.dumps
	if changed, _, err := applyRoutes(k, want, cache, false); err != nil || changed != len(want)-1 {
		t.Fatalf("apply after the link went down: changed %d, err %v; want the %d routes through tunl0 written back", changed, err, len(want)-1)
	}
	if k.dumps != dumps+1 {
		t.Errorf("the apply after ForgetDevice read the table %d times, want once", k.dumps-dumps)
	}
	if len(k.routes) != len(want) {
		t.Errorf("the kernel holds %d routes, want %d", len(k.routes), len(want))
	}
	for _, dump := range []bool{false, true} {
		if changed, _, err := applyRoutes(k, want, cache, dump); err != nil || changed != 0 {
			t.Errorf("apply (dump %v) after: changed %d, err %v; want nothing", dump, changed, err)
		}
	}
	if got := cache.TakeRepairs(); len(got) != 0 {
		t.Errorf("repairs %v after routes that went with their link; want none", got)
	}
}

// TestCarries: the cache knows which devices podnet-routed's routes go
// through, as its writes, deletions and ForgetDevice leave it; blackholes
// go through none.
func TestCarries(t *testing.T) {
	k := newFakeKernel()
	cache := &RouteCache{}
	if cache.Carries("tunl0") || cache.Carries("eth0") {
		t.Fatal("an empty cache carries routes")
	}
	want := cluster(4) // IPIP routes through tunl0, and a blackhole
	if _, _, err := applyRoutes(k, want, cache, true); err != nil {
		t.Fatal(err)
	}
	if !cache.Carries("tunl0") || cache.Carries("eth0") || cache.Carries("") {
		t.Fatalf("after IPIP routes: tunl0 %v, eth0 %v, none %v; want true, false, false", cache.Carries("tunl0"), cache.Carries("eth0"), cache.Carries(""))
	}
	// every route moves to eth0 (encap none across the subnet)
	moved := slices.Clone(want)
	for i := range moved {
		if moved[i].Kind != desired.Blackhole {
			moved[i].Dev, moved[i].OnLink = "eth0", false
		}
	}
	if _, _, err := applyRoutes(k, moved, cache, true); err != nil {
		t.Fatal(err)
	}
	if cache.Carries("tunl0") || !cache.Carries("eth0") {
		t.Fatalf("after the move: tunl0 %v, eth0 %v; want false, true", cache.Carries("tunl0"), cache.Carries("eth0"))
	}
	cache.ForgetDevice("eth0")
	if cache.Carries("eth0") {
		t.Fatal("eth0 still carries routes after ForgetDevice")
	}
	if _, _, err := applyRoutes(k, moved, cache, true); err != nil || !cache.Carries("eth0") {
		t.Fatalf("written back: err %v, eth0 carries %v", err, cache.Carries("eth0"))
	}
	// the plan keeps only the blackhole: the rest are deleted
	var bh []desired.Route
	for _, r := range moved {
		if r.Kind == desired.Blackhole {
			bh = append(bh, r)
		}
	}
	if _, _, err := applyRoutes(k, bh, cache, true); err != nil {
		t.Fatal(err)
	}
	if cache.Carries("eth0") {
		t.Fatal("eth0 still carries routes after they were deleted")
	}
}
