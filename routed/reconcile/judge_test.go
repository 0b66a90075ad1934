package reconcile

import (
	"testing"
	"time"

	"github.com/podnet/podnet/ipam/store"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	old := now.Add(-10 * time.Minute)
	young := now.Add(-30 * time.Second)
	const cid, boot = "c1", "boot-now"
	pod := store.Meta{Netns: "/run/netns/p", NetnsIno: 42, PodNamespace: "ns", PodName: "p", PodUID: "u", BootID: boot}
	byHand := store.Meta{Netns: "/run/netns/p", NetnsIno: 42, BootID: boot}
	legacy := store.Meta{}
	netns := func(s NetnsState) func(string, uint64) NetnsState {
		return func(string, uint64) NetnsState { return s }
	}
	ready := map[string]SandboxState{cid: SandboxReady}
	stopped := map[string]SandboxState{cid: SandboxNotReady}
	none := map[string]SandboxState{}
	for _, tc := range []struct {
		name      string
		meta      store.Meta
		created   time.Time
		sandboxes map[string]SandboxState
		netns     NetnsState
		veth      bool
		bootNow   string
		dead      bool
		kind      Kind
	}{
		{"runtime: ready", pod, old, ready, NetnsGone, false, boot, false, ""},
		{"runtime: ready wins over a gone netns path", pod, old, ready, NetnsGone, false, boot, false, ""},
		{"runtime: stopped, netns there (DEL still owed)", pod, old, stopped, NetnsSame, true, boot, false, ""},
		{"runtime: stopped, netns path gone but the host veth in service", pod, old, stopped, NetnsGone, true, boot, false, ""},
		{"runtime: stopped, netns gone", pod, old, stopped, NetnsGone, false, boot, true, KindRuntime},
		{"runtime: stopped, another netns at the path", pod, old, stopped, NetnsOther, false, boot, true, KindRuntime},
		{"runtime: unknown pod", pod, old, none, NetnsSame, true, boot, true, KindRuntime},
		{"runtime: unknown pod, but young (ADD in flight)", pod, young, none, NetnsSame, true, boot, false, ""},
		{"runtime: attachment made by hand, netns there", byHand, old, none, NetnsSame, true, boot, false, ""},
		{"runtime: attachment made by hand, netns gone", byHand, old, none, NetnsGone, false, boot, true, KindNetns},
		{"no runtime: netns there", pod, old, nil, NetnsSame, true, boot, false, ""},
		{"no runtime: netns gone", pod, old, nil, NetnsGone, false, boot, true, KindNetns},
		{"no runtime: netns path not seen, host veth in service (netns mounted where podnet-routed cannot see)", pod, old, nil, NetnsGone, true, boot, false, ""},
		{"no runtime: another netns at the path, host veth in service", pod, old, nil, NetnsOther, true, boot, false, ""},
		{"runtime: made by hand, netns path gone, host veth in service", byHand, old, none, NetnsGone, true, boot, false, ""},
		{"no runtime: netns replaced", pod, old, nil, NetnsOther, false, boot, true, KindNetns},
		{"no runtime: netns gone but young", pod, young, nil, NetnsGone, false, boot, false, ""},
		{"reboot: dead at once, even young", pod, young, nil, NetnsSame, false, "boot-later", true, KindReboot},
		{"reboot: dead although the runtime lists it", pod, young, ready, NetnsSame, false, "boot-later", true, KindReboot},
		{"boot unknown now: no reboot judgement", pod, old, nil, NetnsSame, false, "", false, ""},
		{"legacy record, no runtime: kept", legacy, old, nil, NetnsGone, false, boot, false, ""},
		{"legacy record, runtime lists it", legacy, old, ready, NetnsGone, false, boot, false, ""},
		{"legacy record, runtime does not, veth in service", legacy, old, none, NetnsGone, true, boot, false, ""},
		{"legacy record, runtime does not, no veth", legacy, old, none, NetnsGone, false, boot, true, KindRuntime},
		{"legacy record, no runtime, veth in service", legacy, old, nil, NetnsGone, true, boot, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Facts{Now: now, Grace: 2 * time.Minute, BootID: tc.bootNow, Sandboxes: tc.sandboxes, Netns: netns(tc.netns), HostVethInService: tc.veth}
			v := Judge(cid, store.Record{Meta: tc.meta}, tc.created, f)
			if v.Dead != tc.dead || v.Kind != tc.kind {
				t.Errorf("Judge = %+v, want dead=%v kind=%q", v, tc.dead, tc.kind)
			}
			if v.Reason == "" {
				t.Error("no reason given")
			}
		})
	}
}

func TestJudgeOrphan(t *testing.T) {
	now := time.Now()
	f := Facts{Now: now, Grace: time.Minute}
	if v := JudgeOrphan(now.Add(-30*time.Second), f); v.Dead {
		t.Errorf("young orphan judged dead: %+v", v)
	}
	if v := JudgeOrphan(now.Add(-2*time.Minute), f); !v.Dead || v.Kind != KindOrphan {
		t.Errorf("old orphan: %+v, want dead orphan", v)
	}
}
