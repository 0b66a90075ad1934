package ipam

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// DEL never answers success while it keeps the reservation: with node.json
// gone (the PodCIDR unknown) it releases by the owner index; GC too.
func TestDelWithoutNodeStateReleases(t *testing.T) {
	e := newCfgtEnv(t)
	stdin := e.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`)
	e.writeNode(`{"podCIDRs":["10.9.0.0/24"]}`)
	a := Request{Stdin: stdin, ContainerID: "a", IfName: "eth0"}
	b := Request{Stdin: stdin, ContainerID: "b", IfName: "eth0"}
	for _, r := range []Request{a, b} {
		if _, err := Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(e.stateDir, "node.json")); err != nil {
		t.Fatal(err)
	}
	if err := Del(a); err != nil {
		t.Fatalf("DEL without node.json: %v", err)
	}
	ips := func() []string {
		entries, _ := os.ReadDir(filepath.Join(e.dataDir, "podnet", "ips"))
		var out []string
		for _, en := range entries {
			out = append(out, en.Name())
		}
		return out
	}
	if got := ips(); len(got) != 1 || got[0] != "10.9.0.3" {
		t.Errorf("after DEL of a: reservations %v, want only b's 10.9.0.3", got)
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "podnet", "owners", "a:eth0")); !os.IsNotExist(err) {
		t.Errorf("owner index entry of a: %v, want gone", err)
	}
	// GC without node.json releases what is not valid, too.
	gc := e.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`, `"cni.dev/valid-attachments":[]`)
	if err := GC(Request{Stdin: gc}); err != nil {
		t.Fatalf("GC without node.json: %v", err)
	}
	if got := ips(); len(got) != 0 {
		t.Errorf("after GC: reservations %v, want none", got)
	}
	// A network that never had a store: DEL succeeds and creates none.
	other := newCfgtEnv(t)
	if err := Del(Request{Stdin: other.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`), ContainerID: "x", IfName: "eth0"}); err != nil {
		t.Errorf("DEL, no store: %v", err)
	}
	if _, err := os.Stat(other.dataDir); !os.IsNotExist(err) {
		t.Errorf("DEL created the data directory: %v", err)
	}
}

// ADD records what the leak reconcile judges by.
func TestAddRecordsMeta(t *testing.T) {
	e := newCfgtEnv(t)
	e.writeNode(`{"podCIDRs":["10.9.0.0/24"]}`)
	netns := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(netns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	req := Request{Stdin: e.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`), ContainerID: "c1", IfName: "eth0", Netns: netns,
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=6c8e;K8S_POD_INFRA_CONTAINER_ID=c1"}
	if _, err := Add(req); err != nil {
		t.Fatal(err)
	}
	record := func(cid string) (store.Record, bool, error) {
		d, err := store.OpenDisk(e.dataDir, "podnet")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		return d.Record(allocator.Owner{ContainerID: cid, IfName: "eth0"})
	}
	r, ok, err := record("c1")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	st, _ := os.Stat(netns)
	wantBoot := ReadBootID(BootIDPath)
	if r.Netns != netns || r.NetnsIno == 0 || r.PodNamespace != "default" || r.PodName != "web-0" || r.PodUID != "6c8e" ||
		r.Created.Before(before.Add(-time.Second)) || r.Created.After(time.Now()) || r.BootID != wantBoot || wantBoot == "" {
		t.Errorf("record %+v (netns stat %v), boot %q", r, st, wantBoot)
	}
	// Too long to record: the field is dropped, ADD succeeds.
	req2 := req
	req2.ContainerID = "c2"
	req2.Args = "K8S_POD_NAME=" + strings.Repeat("x", 5000)
	if _, err := Add(req2); err != nil {
		t.Fatal(err)
	}
	r2, _, err := record("c2")
	if err != nil || r2.PodName != "" || r2.Created.IsZero() {
		t.Errorf("record with an over-long pod name: %+v, %v", r2, err)
	}
}
