package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/routed/desired"
)

// The reasons log as they always have: a "trigger" string.
func TestReasonLogs(t *testing.T) {
	want := map[reason]string{reasonNode: "node", reasonServiceCIDRs: "service cidrs", reasonRepair: "repair",
		reasonLinkChange: "link change", reasonResync: "periodic resync", reasonInitialSync: "initial sync"}
	for r, name := range want {
		var b bytes.Buffer
		slog.New(slog.NewJSONHandler(&b, nil)).Info("x", "trigger", r)
		if !strings.Contains(b.String(), `"trigger":"`+name+`"`) || r.String() != name {
			t.Errorf("reason %d logs %s, String %q; want %q", uint8(r), b.String(), r.String(), name)
		}
	}
}

// One wake-up can stand for several reasons; the strongest wins, so that a
// repair or a link change is never swallowed by a pending Node event (a
// Node event alone applies only the changed Nodes, which would not put a
// deleted route back).
func TestTriggersCoalesce(t *testing.T) {
	d := &Daemon{kick: make(chan struct{}, 1)}
	d.nodeChanged(&desired.Record{Node: desired.Node{Name: "b"}})
	d.trigger(reasonRepair)
	d.nodeChanged(cache.DeletedFinalStateUnknown{Key: "c"})
	if len(d.kick) != 1 {
		t.Fatalf("%d wake-ups pending, want 1", len(d.kick))
	}
	if why := d.takePending(); why != reasonRepair {
		t.Fatalf("node + repair: took %v, want repair", why)
	}
	if why := d.takePending(); why != reasonNone {
		t.Fatalf("nothing left: took %v", why)
	}
	names := d.takeDirty()
	if _, ok := names["b"]; !ok || len(names) != 2 {
		t.Fatalf("dirty Nodes %v, want b and c (a full apply takes them)", names)
	}
	if _, ok := names["c"]; !ok {
		t.Fatalf("dirty Nodes %v: the deleted Node's tombstone is missing", names)
	}

	d.trigger(reasonNode)
	d.trigger(reasonLinkChange)
	d.trigger(reasonRepair)
	if why := d.takePending(); why != reasonLinkChange {
		t.Fatalf("took %v, want link change (it dumps the table)", why)
	}
	d.trigger(reasonNode)
	if why := d.takePending(); why != reasonNode {
		t.Fatalf("took %v, want node", why)
	}
}

// Only link changes that can take podnet-routed's routes with them, or
// let unwritten ones be written, make a full apply.
func TestLinkMatters(t *testing.T) {
	upd := func(name string, index int32, msg uint16, flags, change uint32) netlink.LinkUpdate {
		u := netlink.LinkUpdate{Header: unix.NlMsghdr{Type: msg}, Link: &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: name, Index: int(index)}}}
		u.IfInfomsg.Index = index
		u.IfInfomsg.Flags, u.IfInfomsg.Change = flags, change
		return u
	}
	up := uint32(unix.IFF_UP | unix.IFF_RUNNING | unix.IFF_LOWER_UP)
	carrying := map[string]bool{"eth0": true}
	retry := false
	w := linkWatch{carries: func(name string) bool { return carrying[name] }, retry: func() bool { return retry }}
	type step struct {
		what          string
		u             netlink.LinkUpdate
		matters, lost bool
		before, after func()
	}
	for _, c := range []step{
		{what: "underlay MTU", u: upd("eth0", 2, unix.RTM_NEWLINK, up, 0)},
		{what: "underlay carrier lost", u: upd("eth0", 2, unix.RTM_NEWLINK, unix.IFF_UP, unix.IFF_LOWER_UP|unix.IFF_RUNNING), matters: true},
		{what: "underlay down", u: upd("eth0", 2, unix.RTM_NEWLINK, 0, unix.IFF_UP), matters: true, lost: true,
			after: func() { carrying["eth0"] = false }}, // ForgetDevice
		{what: "underlay up: its routes went with its down", u: upd("eth0", 2, unix.RTM_NEWLINK, up, unix.IFF_UP), matters: true},
		{what: "underlay up again: nothing to put back", u: upd("eth0", 2, unix.RTM_NEWLINK, up, unix.IFF_UP)},
		{what: "tunnel deleted", u: upd("podnet.vxlan", 7, unix.RTM_DELLINK, 0, 0), matters: true, lost: true},
		{what: "tunnel created", u: upd("podnet.vxlan", 8, unix.RTM_NEWLINK, 0, ^uint32(0))},
		{what: "tunnel brought up (by the apply)", u: upd("podnet.vxlan", 8, unix.RTM_NEWLINK, up, unix.IFF_UP)},
		{what: "tunnel put down", u: upd("tunl0", 3, unix.RTM_NEWLINK, 0, unix.IFF_UP), matters: true, lost: true},
		{what: "pod veth deleted", u: upd("pn1234", 9, unix.RTM_DELLINK, 0, 0)},
		{what: "detached pod veth down", u: upd("pnd5678", 10, unix.RTM_NEWLINK, 0, unix.IFF_UP)},
		{what: "new link", u: upd("br9", 11, unix.RTM_NEWLINK, 0, ^uint32(0))},
		{what: "other link up", u: upd("br9", 11, unix.RTM_NEWLINK, up, unix.IFF_UP)},
		{what: "other link down", u: upd("br9", 11, unix.RTM_NEWLINK, 0, unix.IFF_UP)},
		{what: "other link deleted", u: upd("br9", 11, unix.RTM_DELLINK, 0, 0)},
		{what: "other link up while a route waits to be written", u: upd("veth3", 12, unix.RTM_NEWLINK, up, unix.IFF_UP), matters: true,
			before: func() { retry = true }, after: func() { retry = false }},
		{what: "second uplink deleted while carrying routes", u: upd("eth1", 4, unix.RTM_DELLINK, 0, 0), matters: true, lost: true,
			before: func() { carrying["eth1"] = true }, after: func() { carrying["eth1"] = false }},
		{what: "a new link with a deleted one's name", u: upd("eth1", 13, unix.RTM_NEWLINK, up, unix.IFF_UP)},
	} {
		if c.before != nil {
			c.before()
		}
		matters, lost := w.matters(c.u)
		if matters != c.matters || (matters && lost != c.lost) {
			t.Errorf("%s: matters, lost = %v, %v; want %v, %v", c.what, matters, lost, c.matters, c.lost)
		}
		if c.after != nil {
			c.after()
		}
	}
	if len(w.tookRoutes) != 0 {
		t.Errorf("links remembered after their routes were back or the links gone: %v", w.tookRoutes)
	}
}
