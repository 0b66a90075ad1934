package reconcile

import (
	"bytes"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// hostVeth is a host veth as the kernel lists it: alias, up or not, with
// a carrier or not, its peer's netns id (-1: none reported).
func hostVeth(alias string, up, carrier bool, nsid int) netlink.Link {
	a := netlink.NewLinkAttrs()
	a.Name, a.Alias, a.NetNsID = "pn1234", alias, nsid
	if up {
		a.Flags |= net.FlagUp
		a.RawFlags |= unix.IFF_UP
	}
	a.OperState = netlink.OperLowerLayerDown
	if carrier {
		a.RawFlags |= unix.IFF_LOWER_UP
		a.OperState = netlink.OperUp
	}
	return &netlink.Veth{LinkAttrs: a}
}

func TestHostVethInService(t *testing.T) {
	o := attachment.Owner{Network: "podnet", ContainerID: "c1", IfName: "eth0"}
	bridge := netlink.NewLinkAttrs()
	bridge.Alias, bridge.Flags, bridge.OperState, bridge.NetNsID = o.Alias(), net.FlagUp, netlink.OperUp, 3
	for _, tc := range []struct {
		name string
		link netlink.Link
		want bool
	}{
		{"alias, up, carrier, peer in a live netns", hostVeth(o.Alias(), true, true, 3), true},
		{"peer in netns id 0", hostVeth(o.Alias(), true, true, 0), true},
		{"detached by DEL (alias podnet-detached:, down)", hostVeth(o.DetachedAlias(), false, false, 3), false},
		{"detached alias but still up (a half-done DEL)", hostVeth(o.DetachedAlias(), true, true, 3), false},
		{"set down", hostVeth(o.Alias(), false, false, 3), false},
		{"up, no carrier: the pod end is down (a half-done detach renames it pnd… and sets it down)", hostVeth(o.Alias(), true, false, 3), false},
		{"peer netns being destroyed (no id reported)", hostVeth(o.Alias(), true, true, -1), false},
		{"no podnet alias", hostVeth("", true, true, 3), false},
		{"another alias", hostVeth("someone:else", true, true, 3), false},
		{"not a veth", &netlink.Bridge{LinkAttrs: bridge}, false},
	} {
		if got := HostVethInService(tc.link); got != tc.want {
			t.Errorf("%s: HostVethInService = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRuntimeMismatch: a runtime that lists none of the node's live pods
// (a runtime's attachments past the grace with their host veth in
// service) has its answer refused, which is logged once, counted and
// shown in Status; one that lists any attachment of the node, or a node
// without such live pods, is believed.
func TestRuntimeMismatch(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	pod := func(name string, created time.Time) store.Record {
		return store.Record{Meta: store.Meta{PodNamespace: "ns", PodName: name, PodUID: "u-" + name, Netns: "/run/netns/" + name, Created: created, BootID: "b"}}
	}
	byHand := store.Record{Meta: store.Meta{Netns: "/run/netns/h", Created: now.Add(-time.Hour), BootID: "b"}}
	owner := func(cid string) allocator.Owner { return allocator.Owner{ContainerID: cid, IfName: "eth0"} }
	vo := func(cid string) attachment.Owner {
		return attachment.Owner{Network: "podnet", ContainerID: cid, IfName: "eth0"}
	}
	live := func(cid string) []netlink.Link { return []netlink.Link{hostVeth(vo(cid).Alias(), true, true, 1)} }
	old := now.Add(-time.Hour)
	snaps := []storeSnap{{dir: "/d", network: "podnet", snap: &store.Snapshot{Records: map[allocator.Owner]store.Record{
		owner("a"): pod("a", old), owner("b"): pod("b", old), owner("dead"): pod("dead", old), owner("hand"): byHand,
	}}}}
	links := map[attachment.Owner][]netlink.Link{vo("a"): live("a"), vo("b"): live("b"), vo("hand"): live("hand")}
	wrong := map[string]SandboxState{"x": SandboxReady}

	var logs bytes.Buffer
	l, err := New(Config{Interval: time.Second, CRISocket: "unix:///run/wrong.sock"}, NewMetrics(prometheus.NewRegistry(), nil), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f := Facts{Now: now, Grace: 2 * time.Minute, Sandboxes: wrong}
	for pass := range 2 {
		if got := l.checkRuntime(f, snaps, links); got != nil {
			t.Fatalf("pass %d: the answer of a runtime that lists none of 2 live pods was used: %v", pass, got)
		}
		l.publishStatus()
	}
	if v := testutil.ToFloat64(l.m.RuntimeMismatch); v != 1 {
		t.Errorf("podnet_reconcile_runtime_mismatch = %v, want 1", v)
	}
	if v := testutil.ToFloat64(l.m.RuntimeRefused); v != 2 {
		t.Errorf("podnet_reconcile_runtime_refused_total = %v, want 2", v)
	}
	if n := strings.Count(logs.String(), "lists none of the node's live pods"); n != 1 {
		t.Errorf("%d mismatch log lines over 2 passes, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `"livePods":2`) || !strings.Contains(logs.String(), "ns/a") {
		t.Errorf("the mismatch log line does not name the live pods:\n%s", logs.String())
	}
	if st := l.Status(); len(st) != 1 || !strings.Contains(st[0], "unix:///run/wrong.sock lists none of the node's 2 live pods") {
		t.Errorf("Status() = %q", st)
	}

	// The runtime lists one of them: believed again, said once.
	right := map[string]SandboxState{"a": SandboxReady}
	if got := l.checkRuntime(Facts{Now: now, Grace: 2 * time.Minute, Sandboxes: right}, snaps, links); got == nil {
		t.Error("the answer of a runtime that lists a live pod was refused")
	}
	l.publishStatus()
	if v := testutil.ToFloat64(l.m.RuntimeMismatch); v != 0 {
		t.Errorf("podnet_reconcile_runtime_mismatch = %v after the runtime lists a pod, want 0", v)
	}
	if st := l.Status(); len(st) != 0 || !strings.Contains(logs.String(), "lists the node's pods again") {
		t.Errorf("Status() = %q; log:\n%s", st, logs.String())
	}

	// Believed: no live pod (only the attachment made by hand is in
	// service, or the pods are in their grace), or it lists a dead one.
	for name, tc := range map[string]struct {
		links map[attachment.Owner][]netlink.Link
		now   time.Time
		sbs   map[string]SandboxState
	}{
		"only an attachment made by hand in service":     {map[attachment.Owner][]netlink.Link{vo("hand"): live("hand")}, now, wrong},
		"the live pods are within the grace":             {links, old.Add(time.Minute), wrong},
		"it lists the dead pod's sandbox (stopped)":      {links, now, map[string]SandboxState{"dead": SandboxNotReady}},
		"no host veth in service (down, detached, gone)": {map[attachment.Owner][]netlink.Link{vo("a"): {hostVeth(vo("a").Alias(), false, false, 1)}, vo("b"): {hostVeth(vo("b").DetachedAlias(), false, false, 1)}}, now, wrong},
	} {
		if got := l.checkRuntime(Facts{Now: tc.now, Grace: 2 * time.Minute, Sandboxes: tc.sbs}, snaps, tc.links); got == nil {
			t.Errorf("%s: the runtime's answer was refused", name)
		}
	}
	if v := testutil.ToFloat64(l.m.RuntimeRefused); v != 2 {
		t.Errorf("podnet_reconcile_runtime_refused_total = %v, want still 2", v)
	}
}

// TestHoldNice: the store's lock is taken and held at HoldNice, and the
// thread has its own nice value back after; a value out of -20..19 is
// refused.
func TestHoldNice(t *testing.T) {
	for _, bad := range []int{-21, 20} {
		if _, err := New(Config{Interval: time.Second, HoldNice: bad}, NewMetrics(prometheus.NewRegistry(), nil), slog.Default()); err == nil {
			t.Errorf("HoldNice %d: New accepted it", bad)
		}
	}
	// this goroutine's thread is the one withLock runs on
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	nice := func() int {
		raw, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
		if err != nil {
			t.Fatal(err)
		}
		return 20 - raw
	}
	before := nice()
	for _, want := range []int{0, -7} {
		l, err := New(Config{Interval: time.Second, HoldNice: want}, NewMetrics(prometheus.NewRegistry(), nil), slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		during := 99
		if err := l.withLock(t.TempDir(), "podnet", func(*store.Disk) error { during = nice(); return nil }, &res); err != nil {
			t.Fatalf("withLock: %v", err)
		}
		if want == 0 && during != before || want != 0 && during != want {
			t.Errorf("HoldNice %d: the lock was held at nice %d (thread's own %d)", want, during, before)
		}
		if after := nice(); after != before {
			t.Errorf("HoldNice %d: the thread is left at nice %d, was %d", want, after, before)
		}
	}
}
