package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// buildDemo builds this program and returns a function running it with
// its own netns prefix and work directory (so that it never meets a demo a
// user left up, nor other tests), and runEnv, the same with environment
// variables (MODE, FAMILY, NODES, KEEP: unset unless given).
func buildDemo(t *testing.T) (run func(args ...string) (string, int), name, workDir string) {
	run, _, name, workDir = buildDemoEnv(t)
	return run, name, workDir
}

func buildDemoEnv(t *testing.T) (run func(args ...string) (string, int), runEnv func(env []string, args ...string) (string, int), name, workDir string) {
	t.Helper()
	kapi.BinDir(t)
	nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed")
	root := nettest.RepoRoot(t)
	bin := filepath.Join(t.TempDir(), "podnet-demo")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build podnet-demo: %v\n%s", err, out)
	}
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	name = "pndemo-" + hex.EncodeToString(id)
	workDir = filepath.Join(t.TempDir(), "work")
	runEnv = func(env []string, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-name", name, "-workdir", workDir, "-repo", root}, args...)...)
		cmd.Env = append(append(os.Environ(), "MODE=", "KEEP=", "FAMILY=", "NODES="), env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("podnet-demo %v: %v\n%s", args, err, out.String())
		}
		t.Logf("%s podnet-demo %s: exit %d in %s", strings.Join(env, " "), strings.Join(args, " "), code, time.Since(start).Round(100*time.Millisecond))
		return out.String(), code
	}
	run = func(args ...string) (string, int) {
		t.Helper()
		return runEnv(nil, args...)
	}
	t.Cleanup(func() {
		// Whatever happened, leave nothing.
		if _, err := cluster.DownDir(workDir, name); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	})
	return run, runEnv, name, workDir
}

// processesUsing lists the processes whose command line mentions dir.
func processesUsing(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // exited, not reaped yet
		}
		out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}

func hostState(t *testing.T) cluster.HostState {
	t.Helper()
	h, err := cluster.TakeHostState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestDemoLeavesNothingBehind runs the demo as `make demo` does: every
// check ✓, and afterwards this machine's `ip netns` (the demo's names;
// other tests run at the same time), `ip link` and nft ruleset are as
// before, and none of its processes runs.
func TestDemoLeavesNothingBehind(t *testing.T) {
	run, name, workDir := buildDemo(t)
	before := hostState(t)
	out, code := run("-mode", "vxlan")
	t.Logf("demo output:\n%s", out)
	if code != 0 {
		t.Errorf("podnet-demo exited %d, want 0", code)
	}
	for _, want := range []string{"NODES", "PODS", "ROUTES", "CONNECTIVITY", "✓ 30/30 pod pairs answer ICMP", "every check passed", "this machine is as before"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if strings.Contains(out, "✗") {
		t.Errorf("demo output has a ✗")
	}
	if d := before.Diff(hostState(t), name+"-"); d != "" {
		t.Errorf("the machine's netns changed (- before, + after):\n%s", d)
	}
	if ps := processesUsing(workDir); len(ps) > 0 {
		t.Errorf("processes left running:\n%s", strings.Join(ps, "\n"))
	}
	if _, err := os.Stat(workDir); err == nil {
		t.Errorf("%s left", workDir)
	}
}

// TestDemoKeepAndDown: KEEP=1 leaves the cluster up (netns, processes,
// state file); -down (`make demo-down`) removes all of it.
func TestDemoKeepAndDown(t *testing.T) {
	run, name, workDir := buildDemo(t)
	before := hostState(t)
	out, code := run("-mode", "none", "-nodes", "2", "-pods", "1", "-keep")
	if code != 0 {
		t.Fatalf("podnet-demo -keep exited %d:\n%s", code, out)
	}
	if !strings.Contains(out, "LEFT UP") {
		t.Errorf("no LEFT UP section in:\n%s", out)
	}
	data, err := os.ReadFile(filepath.Join(workDir, cluster.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		NetNS []string `json:"netns"`
		Procs []struct {
			Pid  int    `json:"pid"`
			Comm string `json:"comm"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	left, _ := cluster.NetNSNames(name + "-")
	if len(left) != len(st.NetNS) || len(left) < 7 {
		t.Errorf("netns up: %v; state file: %v", left, st.NetNS)
	}
	if len(st.Procs) != 4 { // etcd, kube-apiserver, 2 podnet-routed
		t.Errorf("processes in the state file: %+v, want 4", st.Procs)
	}
	if ps := processesUsing(workDir); len(ps) != 4 {
		t.Errorf("processes running: %q, want 4", ps)
	}
	// The kept cluster still works without the demo process: a pod pings
	// the other node's pod.
	pod := name + "-pod-node1-a"
	if out, err := exec.Command("ip", "netns", "exec", pod, "ping", "-c1", "-W2", "10.244.1.2").CombinedOutput(); err != nil {
		t.Errorf("ping in the kept cluster: %v\n%s", err, out)
	}

	out, code = run("-down")
	t.Logf("demo -down:\n%s", out)
	if code != 0 {
		t.Errorf("podnet-demo -down exited %d", code)
	}
	if d := before.Diff(hostState(t), name+"-"); d != "" {
		t.Errorf("the machine's netns changed (- before, + after):\n%s", d)
	}
	if ps := processesUsing(workDir); len(ps) > 0 {
		t.Errorf("processes left running:\n%s", strings.Join(ps, "\n"))
	}
	if out, code := run("-down"); code != 0 || !strings.Contains(out, "no demo cluster up") {
		t.Errorf("second -down: exit %d\n%s", code, out)
	}
}

// TestDemoIPIPPointsToTheVM: without the ipip module, MODE=ipip says to
// use the VM (and the Makefile runs it on exit code 3); on a kernel with
// ipip it runs in the box, every check passing.
func TestDemoIPIPPointsToTheVM(t *testing.T) {
	run, _, _ := buildDemo(t)
	out, code := run("-mode", "ipip")
	if ipipLoaded() {
		if code != 0 || !strings.Contains(out, "every check passed") {
			t.Errorf("MODE=ipip on a kernel with ipip: exit %d, want 0 and every check passed:\n%s", code, out)
		}
		return
	}
	if code != exitNoIPIP || !strings.Contains(out, "make ipipvm") {
		t.Errorf("MODE=ipip: exit %d, want %d with a pointer to `make ipipvm`:\n%s", code, exitNoIPIP, out)
	}
}

// TestDemoIPv6: `make demo FAMILY=ipv6` (NODES=2) is IPv6 only — Nodes,
// pods and the API server on IPv6 addresses, no IPv4 one — and every pod
// pair answers over IPv6 in the matrix, with every check passed and the
// machine as before; FAMILY=dual checks both families, each pair
// answering over IPv4 and over IPv6 (and the outside host over IPv6,
// masqueraded); -cross-subnet is refused with either.
func TestDemoIPv6(t *testing.T) {
	_, runEnv, name, _ := buildDemoEnv(t)
	before := hostState(t)
	for _, tc := range []struct {
		env      []string
		args     []string
		families []string
	}{
		{[]string{"FAMILY=ipv6", "NODES=2"}, nil, []string{"IPv6"}},
		{[]string{"FAMILY=dual"}, []string{"-nodes", "2", "-pods", "1", "-mode", "none"}, []string{"IPv4", "IPv6"}},
	} {
		out, code := runEnv(tc.env, tc.args...)
		t.Logf("demo output:\n%s", out)
		if code != 0 {
			t.Errorf("%v podnet-demo exited %d, want 0", tc.env, code)
		}
		pods := 4
		if len(tc.args) > 0 {
			pods = 2
		}
		for _, fam := range tc.families {
			cells := matrixCells(t, out, fam)
			if len(cells) != pods*(pods-1) || slices.ContainsFunc(cells, func(c string) bool { return !strings.HasPrefix(c, "✓") }) {
				t.Errorf("%v: the %s matrix's cells are %q, want %d ✓", tc.env, fam, cells, pods*(pods-1))
			}
			if want := fmt.Sprintf("✓ %d/%d pod pairs answer ICMP over %s", pods*(pods-1), pods*(pods-1), fam); !strings.Contains(out, want) {
				t.Errorf("%v: output lacks %q", tc.env, want)
			}
		}
		for _, want := range []string{"pod → outside (fd00:172:30::c8", "every check passed", "this machine is as before"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: output lacks %q", tc.env, want)
			}
		}
		if strings.Contains(out, "✗") {
			t.Errorf("%v: output has a ✗", tc.env)
		}
		if tc.families[0] == "IPv6" {
			// IPv6 only: no IPv4 address anywhere in the picture
			if v4 := regexp.MustCompile(`\b(172\.30|10\.244)\.\d+\.\d+`).FindString(out); v4 != "" {
				t.Errorf("FAMILY=ipv6 shows the IPv4 address %s", v4)
			}
			for _, want := range []string{"[fd00:172:30::fa]:6443", "node2  fd00:172:30::2  fd00:10:244:1::/64  1430"} {
				if !strings.Contains(out, want) {
					t.Errorf("FAMILY=ipv6: output lacks %q", want)
				}
			}
		}
	}
	if d := before.Diff(hostState(t), name+"-"); d != "" {
		t.Errorf("the machine's netns changed (- before, + after):\n%s", d)
	}
	out, code := runEnv([]string{"FAMILY=ipv6"}, "-cross-subnet")
	if code != 2 || !strings.Contains(out, "-cross-subnet is IPv4 only") {
		t.Errorf("FAMILY=ipv6 -cross-subnet: exit %d, want 2 and a refusal:\n%s", code, out)
	}
}

// matrixCells are the cells off the diagonal of the output's ping matrix
// over family (IPv4, IPv6).
func matrixCells(t *testing.T, out, family string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(out, "CONNECTIVITY over "+family+" ")
	if !ok {
		t.Errorf("no CONNECTIVITY over %s section", family)
		return nil
	}
	lines := strings.Split(rest, "\n")
	var cells []string
	for _, l := range lines[2:] { // after the title's end and the header
		f := strings.Fields(l)
		if len(f) < 2 || !strings.Contains(f[0], "-") {
			break
		}
		for i := 1; i < len(f); i++ {
			switch {
			case f[i] == "·":
			case f[i] == "✓" && i+1 < len(f):
				cells = append(cells, "✓ "+f[i+1])
				i++
			default:
				cells = append(cells, f[i])
			}
		}
	}
	return cells
}
