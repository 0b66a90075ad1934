package integration

// Issue 22, item 1 and 6: ADD records with each owner index entry what
// podnet-routed's leak reconcile judges it by (netns and its inode, pod,
// time, boot ID), and a DEL while node.json is missing still releases
// the address (by the owner index: it needs no PodCIDR) instead of
// answering success and keeping it.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/test/nettest"
)

func TestIPAMMetaAndDelWithoutNodeState(t *testing.T) {
	const podCIDR = "10.201.13.0/24"
	stateDir, dataDir := t.TempDir(), t.TempDir()
	nodeJSON := filepath.Join(stateDir, "node.json")
	b, _ := json.Marshal(map[string]any{"podCIDRs": []string{podCIDR}})
	if err := os.WriteFile(nodeJSON, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ipamConf := fmt.Sprintf(`{"type":"podnet-ipam","dataDir":%q,"ranges":[[{"subnet":"usePodCidr"}]]}`, dataDir)
	conflist := podnetList("1.1.0", ipamConf, map[string]any{"stateDir": stateDir})
	node := nettest.NewNode(t)
	rt := nettest.NewRuntime(t, node, conflist, nettest.BinDir(t, "podnet", "podnet-ipam"))

	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	type pod struct {
		cid  string
		args [][2]string
		want map[string]string // Meta lines besides netns, netns-ino, created, boot-id
	}
	pods := []pod{
		{"meta-k8s", [][2]string{{"K8S_POD_NAMESPACE", "team-a"}, {"K8S_POD_NAME", "web-0"}, {"K8S_POD_UID", "6f1c2a3e-0b5d-4c8e-9a7f-1d2e3f4a5b6c"}},
			map[string]string{"pod-namespace": strconv.Quote("team-a"), "pod-name": strconv.Quote("web-0"), "pod-uid": strconv.Quote("6f1c2a3e-0b5d-4c8e-9a7f-1d2e3f4a5b6c")}},
		{"meta-cnitool", nil, map[string]string{}}, // a cnitool user passes no pod
	}
	var confs []*nettest.Pod
	for _, p := range pods {
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf(p.cid, podNS, "eth0", p.args...)
		before := time.Now()
		res, err := rt.Add(conf)
		if err != nil {
			t.Fatalf("ADD %s: %v", p.cid, err)
		}
		after := time.Now()
		confs = append(confs, &nettest.Pod{NS: podNS, RT: conf, Result: res})

		s := readIPAMStore(t, dataDir, "podnet")
		if err := s.consistent(); err != nil {
			t.Fatalf("store after ADD %s: %v\n%s", p.cid, err, s)
		}
		meta := s.meta[p.cid+":eth0"]
		var st unix.Stat_t
		if err := unix.Stat(podNS.Path(), &st); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"netns":     strconv.Quote(podNS.Path()),
			"netns-ino": strconv.FormatUint(st.Ino, 10),
			"boot-id":   strconv.Quote(strings.TrimSpace(string(bootID))),
		}
		for k, v := range p.want {
			want[k] = v
		}
		for k, v := range want {
			if meta[k] != v {
				t.Errorf("owners/%s:eth0 %s=%s, want %s", p.cid, k, meta[k], v)
			}
		}
		created, err := time.Parse(time.RFC3339Nano, meta["created"])
		if err != nil || created.Before(before.Add(-time.Second)) || created.After(after.Add(time.Second)) {
			t.Errorf("owners/%s:eth0 created=%q (%v), want a time between %s and %s", p.cid, meta["created"], err, before.UTC().Format(time.RFC3339Nano), after.UTC().Format(time.RFC3339Nano))
		}
		if len(meta) != len(want)+1 {
			t.Errorf("owners/%s:eth0 Meta lines %v, want exactly %v and created", p.cid, meta, want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if s := readIPAMStore(t, dataDir, "podnet"); len(s.ips) != 2 {
		t.Fatalf("store after two ADDs: %s", s)
	}

	// node.json goes away (a node being re-set up, podnet-routed not
	// started yet): DEL must still release, by the owner index.
	if err := os.Remove(nodeJSON); err != nil {
		t.Fatal(err)
	}
	if err := rt.Del(confs[0].RT); err != nil {
		t.Fatalf("DEL %s without node.json: %v", confs[0].RT.ContainerID, err)
	}
	s := readIPAMStore(t, dataDir, "podnet")
	if err := s.consistent(); err != nil {
		t.Fatalf("store after DEL: %v\n%s", err, s)
	}
	if ip := confs[0].Result.IPs[0].Address.IP.String(); s.ips[ip] != "" || s.owners["meta-k8s:eth0"] != nil || len(s.ips) != 1 {
		t.Fatalf("DEL without node.json answered success but kept the reservation of %s: %s", ip, s)
	}
	// DEL again (a runtime retrying) and DEL of the other pod, also
	// without the cached result: the store ends empty, the node bare.
	if err := rt.Del(confs[0].RT); err != nil {
		t.Fatalf("second DEL %s: %v", confs[0].RT.ContainerID, err)
	}
	rt.ForgetCache(t)
	if err := rt.Del(confs[1].RT); err != nil {
		t.Fatalf("DEL %s without node.json nor cached result: %v", confs[1].RT.ContainerID, err)
	}
	assertStoreEmpty(t, dataDir, "podnet")
	if links := node.Links(); len(links) > 0 {
		t.Fatalf("links left on the node: %v", links)
	}
}
