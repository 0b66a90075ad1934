package reconcile

import (
	"fmt"
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
		{"runtime: unknown pod, host veth in service (a runtime that did not make it)", pod, old, none, NetnsSame, true, boot, false, ""},
		{"runtime: unknown pod, no host veth in service", pod, old, none, NetnsSame, false, boot, true, KindRuntime},
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
		{"another boot, host veth in service: the boot ID is wrong", pod, old, nil, NetnsSame, true, "boot-later", false, ""},
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

// TestJudgeEveryCombination judges every combination of what the runtime
// says (ready, stopped, not listed, no answer), the boot ID (same, other),
// the host veth (in service or not: down, detached or gone look alike to
// the judge), the netns path (there, gone), the record (a runtime's pod,
// an attachment made by hand) and the age (past the grace, young), and
// checks each verdict against the decision table of Judge's comment,
// written out here rule by rule. Rule 0 first: a host veth in service is
// alive in every row, and says which rule it overruled.
func TestJudgeEveryCombination(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	const cid, boot = "c1", "boot-now"
	type runtimeSays int
	const (
		rtReady runtimeSays = iota
		rtStopped
		rtUnlisted
		rtDown
	)
	rtNames := []string{"ready", "stopped", "unlisted", "down"}
	sandboxes := func(r runtimeSays) map[string]SandboxState {
		switch r {
		case rtReady:
			return map[string]SandboxState{cid: SandboxReady, "other": SandboxReady}
		case rtStopped:
			return map[string]SandboxState{cid: SandboxNotReady, "other": SandboxReady}
		case rtUnlisted:
			return map[string]SandboxState{"other": SandboxReady}
		}
		return nil
	}
	// want is the table of Judge's comment.
	want := func(rt runtimeSays, otherBoot, veth, netnsGone, byRuntime, young bool) (bool, Kind, Kind) {
		// Rule 0: the host veth in service.
		if veth {
			switch {
			case otherBoot:
				return false, "", KindReboot
			case !young && rt == rtUnlisted && byRuntime:
				return false, "", KindRuntime
			}
			return false, "", ""
		}
		switch {
		case otherBoot: // 1
			return true, KindReboot, ""
		case young: // 2
			return false, "", ""
		case rt == rtReady: // 3
			return false, "", ""
		case rt == rtStopped && netnsGone:
			return true, KindRuntime, ""
		case rt == rtStopped:
			return false, "", ""
		case rt == rtUnlisted && byRuntime:
			return true, KindRuntime, ""
		case netnsGone: // 4
			return true, KindNetns, ""
		}
		return false, "", ""
	}
	n := 0
	for rt := rtReady; rt <= rtDown; rt++ {
		for _, otherBoot := range []bool{false, true} {
			for _, veth := range []bool{false, true} {
				for _, netnsGone := range []bool{false, true} {
					for _, byRuntime := range []bool{false, true} {
						for _, young := range []bool{false, true} {
							meta := store.Meta{Netns: "/run/netns/p", NetnsIno: 42, BootID: "boot-then"}
							if !otherBoot {
								meta.BootID = boot
							}
							if byRuntime {
								meta.PodNamespace, meta.PodName, meta.PodUID = "ns", "p", "u"
							}
							created := now.Add(-10 * time.Minute)
							if young {
								created = now.Add(-30 * time.Second)
							}
							ns := NetnsSame
							if netnsGone {
								ns = NetnsGone
							}
							name := fmt.Sprintf("runtime=%s otherBoot=%v vethInService=%v netnsGone=%v byRuntime=%v young=%v",
								rtNames[rt], otherBoot, veth, netnsGone, byRuntime, young)
							f := Facts{Now: now, Grace: 2 * time.Minute, BootID: boot, Sandboxes: sandboxes(rt),
								Netns: func(string, uint64) NetnsState { return ns }, HostVethInService: veth}
							v := Judge(cid, store.Record{Meta: meta}, created, f)
							d, k, over := want(rt, otherBoot, veth, netnsGone, byRuntime, young)
							if v.Dead != d || v.Kind != k || v.Overruled != over || v.Reason == "" {
								t.Errorf("%s: Judge = %+v, want dead=%v kind=%q overruled=%q", name, v, d, k, over)
							}
							n++
						}
					}
				}
			}
		}
	}
	if n != 128 {
		t.Fatalf("%d combinations judged, want 128", n)
	}
}
