package integration

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/test/nettest"
)

// TestStepTrace: with PODNET_TRACE=<file>, ADD and DEL each append one JSON
// line with every step's wall and CPU time; the steps add up to the total.
func TestStepTrace(t *testing.T) {
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	node := nettest.NewNode(t)
	podNS := nettest.NewNetNS(t)
	stdin := podnetIPAMConf(t, "podnet", t.TempDir(), nil)
	traceFile := filepath.Join(t.TempDir(), "trace.jsonl")
	for _, cmd := range []string{"ADD", "DEL"} {
		res := execPluginInNode(t, node, filepath.Join(bin, "podnet"), map[string]string{
			"CNI_COMMAND": cmd, "CNI_CONTAINERID": "trace-0123", "CNI_NETNS": podNS.Path(),
			"CNI_IFNAME": "eth0", "CNI_PATH": strings.Join([]string{bin, nettest.RefToolsDir(t)}, ":"),
			"PODNET_TRACE": traceFile,
		}, stdin)
		if res.exitCode != 0 {
			t.Fatalf("%s: exit %d: %s %s", cmd, res.exitCode, res.stdout, res.stderr)
		}
	}
	f, err := os.Open(traceFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type line struct {
		Verb  string
		Steps []struct {
			Step          string
			WallUs, CPUUs int64
		}
		WallUs, CPUUs int64
		Error         string
	}
	var lines []line
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("trace line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	// (a "stale-veth" step comes before "veth" only when a stale host
	// veth of the same name was replaced)
	want := map[string][]string{
		"ADD": {"config", "netns", "mtu", "ipam", "prepare", "veth", "address", "route", "guard", "host", "host-route", "policy", "result"},
		"DEL": {"config", "veth-detach", "guard", "ipam"},
	}
	if len(lines) != 2 || lines[0].Verb != "ADD" || lines[1].Verb != "DEL" {
		t.Fatalf("trace lines: %+v, want one ADD then one DEL", lines)
	}
	for _, l := range lines {
		var names []string
		var sum int64
		for _, s := range l.Steps {
			names = append(names, s.Step)
			sum += s.WallUs
			if s.WallUs < 0 || s.CPUUs < 0 {
				t.Errorf("%s %s: negative time %+v", l.Verb, s.Step, s)
			}
		}
		if !slices.Equal(names, want[l.Verb]) {
			t.Errorf("%s steps %v, want %v", l.Verb, names, want[l.Verb])
		}
		if l.WallUs <= 0 || sum > l.WallUs || l.Error != "" {
			t.Errorf("%s: total %d µs, steps sum %d µs, error %q", l.Verb, l.WallUs, sum, l.Error)
		}
	}
}
