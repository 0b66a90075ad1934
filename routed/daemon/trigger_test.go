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

// Only link changes that can take routes with them make a full apply.
func TestLinkMatters(t *testing.T) {
	upd := func(name string, msg uint16, flags, change uint32) netlink.LinkUpdate {
		u := netlink.LinkUpdate{Header: unix.NlMsghdr{Type: msg}, Link: &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: name}}}
		u.IfInfomsg.Flags, u.IfInfomsg.Change = flags, change
		return u
	}
	up := uint32(unix.IFF_UP | unix.IFF_RUNNING | unix.IFF_LOWER_UP)
	for _, c := range []struct {
		what string
		u    netlink.LinkUpdate
		want bool
	}{
		{"underlay down", upd("eth0", unix.RTM_NEWLINK, 0, unix.IFF_UP), true},
		{"underlay up", upd("eth0", unix.RTM_NEWLINK, up, unix.IFF_UP), true},
		{"underlay carrier", upd("eth0", unix.RTM_NEWLINK, unix.IFF_UP, unix.IFF_LOWER_UP|unix.IFF_RUNNING), true},
		{"underlay MTU", upd("eth0", unix.RTM_NEWLINK, up, 0), false},
		{"tunnel deleted", upd("podnet.vxlan", unix.RTM_DELLINK, 0, 0), true},
		{"tunnel created", upd("podnet.vxlan", unix.RTM_NEWLINK, 0, ^uint32(0)), false},
		{"tunnel brought up (by the apply)", upd("podnet.vxlan", unix.RTM_NEWLINK, up, unix.IFF_UP), false},
		{"tunnel put down", upd("tunl0", unix.RTM_NEWLINK, 0, unix.IFF_UP), true},
		{"pod veth", upd("pn1234", unix.RTM_DELLINK, 0, 0), false},
		{"detached pod veth", upd("pnd5678", unix.RTM_NEWLINK, 0, unix.IFF_UP), false},
		{"new link", upd("br9", unix.RTM_NEWLINK, 0, ^uint32(0)), false},
		{"other link up", upd("br9", unix.RTM_NEWLINK, up, unix.IFF_UP), true},
	} {
		if got := linkMatters(c.u); got != c.want {
			t.Errorf("%s: linkMatters = %v, want %v", c.what, got, c.want)
		}
	}
}
