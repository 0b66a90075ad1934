// Command cnibench times CNI plugins the way a container runtime runs
// them: through libcni, each plugin exec'd inside a "node" network
// namespace, each pod in a netns of its own. It is run by `make bench`
// (scripts/bench.sh), never by `make test`, and writes raw samples as JSON
// for bench/report, which computes the percentiles, ratios and plots.
//
// Workloads (issue 8 §1, §2 and the floors):
//
//   - -pods pods ADD then DEL, sequential and -workers concurrent, for every
//     config (podnet+podnet-ipam, podnet+podnet-ipam+reconcile,
//     podnet-bridge+podnet-ipam, reference ptp+host-local, reference
//     bridge+host-local), -reps repetitions; in each repetition the configs
//     take turns (the order rotates) so that a noisy neighbour hits them
//     all alike. CPU per verb is the RUSAGE_CHILDREN delta of the phase (the
//     plugin processes and the IPAM processes they reap) over its verbs.
//     After every run the leak check (leak.go) must find the node as it was
//     and no reservation left; after the ADD phase of a podnet stack every
//     pod must have its pod filter elements. podnet+podnet-ipam+reconcile
//     is podnet+podnet-ipam while podnet-routed's leak reconcile passes
//     every -reconcile-every during its phases, freeing -reconcile-dead
//     reservations of dead pods planted before each (reconcile.go).
//
//   - -occupancy pods on one node for podnet+podnet-ipam and ptp+host-local,
//     added in chunks of -chunk that alternate between the two stacks, then
//     deleted the same way: ADD latency by pod index (flatness).
//
//   - Floors: the static no-op Go binary (test/bench/noop) exec'd bare and
//     as a plugin through libcni, a netns created and deleted, a veth pair
//     created in-process with netlink (peer directly in a pod netns, or in
//     the node netns and then moved) and deleted.
//
// scripts/bench.sh runs it as
//
//	cnibench -bin bin -ref $(scripts/install-cni-tools.sh) -noop /tmp/noop/noop -out bench/results/cni.json
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// network is the CNI network name of every bench conflist.
const network = "bench"

// stack is one plugin chain under test.
type stack struct {
	Name   string `json:"name"`
	Plugin string `json:"plugin"`
	IPAM   string `json:"ipam"`
	Conf   string `json:"conflist"`
	// Reconcile describes the leak reconcile running during the stack's
	// phases ("" none; reconcile.go).
	Reconcile string `json:"reconcile,omitempty"`

	rc       *reconcileConf
	node     ns.NetNS
	dataDirs []string
	cni      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	base     nodeState
}

// runResult is one workload run of one stack.
type runResult struct {
	Stack     string    `json:"stack"`
	Mode      string    `json:"mode"` // "sequential" or "concurrent"
	Workers   int       `json:"workers"`
	Rep       int       `json:"rep"`
	Pods      int       `json:"pods"`
	AddMs     []float64 `json:"add_ms"`
	DelMs     []float64 `json:"del_ms"`
	AddWallS  float64   `json:"add_wall_s"`
	DelWallS  float64   `json:"del_wall_s"`
	AddUserMs float64   `json:"add_user_ms"` // whole phase, all plugin processes
	AddSysMs  float64   `json:"add_sys_ms"`
	DelUserMs float64   `json:"del_user_ms"`
	DelSysMs  float64   `json:"del_sys_ms"`
	Errors    []string  `json:"errors,omitempty"`
	Leak      string    `json:"leak"` // "" when the leak check passed
	// NetnsDelS is the wall time of removing the run's pod netns after DEL,
	// as a runtime does (unmount + unlink); SettleS is how long after that
	// the kernel took to tear down what the netns held, until the node was
	// back to its state before the run (a plugin that leaves the veth to
	// the netns teardown pays here, not in DEL).
	NetnsDelS float64 `json:"netns_del_s"`
	SettleS   float64 `json:"settle_s"`
	// Steps is podnet's own step trace (PODNET_TRACE) of the run, by verb;
	// empty for the reference plugins.
	Steps map[string]*verbTrace `json:"steps,omitempty"`
	// The leak reconcile's passes during the ADD and DEL phases (a stack
	// with Reconcile): how many, how long each took, how many times and
	// for how long at most they held the store's lock, how many dead
	// reservations were planted and how many they freed.
	ReconcilePasses        int       `json:"reconcile_passes,omitempty"`
	ReconcilePassMs        []float64 `json:"reconcile_pass_ms,omitempty"`
	ReconcileHolds         int       `json:"reconcile_lock_holds,omitempty"`
	ReconcileMaxLockHoldMs float64   `json:"reconcile_max_lock_hold_ms,omitempty"`
	ReconcilePlanted       int       `json:"reconcile_planted,omitempty"`
	ReconcileReclaimed     int       `json:"reconcile_reclaimed,omitempty"`
}

// occResult is the one-node occupancy run of one stack.
type occResult struct {
	Stack     string    `json:"stack"`
	Pods      int       `json:"pods"`
	Chunk     int       `json:"chunk"`
	AddMs     []float64 `json:"add_ms"` // by pod index
	DelMs     []float64 `json:"del_ms"`
	AddUserMs float64   `json:"add_user_ms"`
	AddSysMs  float64   `json:"add_sys_ms"`
	DelUserMs float64   `json:"del_user_ms"`
	DelSysMs  float64   `json:"del_sys_ms"`
	Errors    []string  `json:"errors,omitempty"`
	Leak      string    `json:"leak"`
	// ControlAddMs are the ADDs on the stack's control node, which holds
	// no pod but the few it ADDs (and DELs) between the full node's ADDs
	// (see controlEvery): by chunk, what an ADD cost on this machine at
	// that moment, whatever the node holds (the drift the machine's other
	// work puts on a run of minutes).
	ControlAddMs [][]float64 `json:"control_add_ms,omitempty"`
	// InsideMs is podnet's own time of each ADD of the full node, from its
	// step trace (main to the result), by pod index; empty for the
	// reference plugins.
	InsideMs []float64 `json:"inside_ms,omitempty"`
}

// floorResult is one floor measurement (several blocks, pooled).
type floorResult struct {
	Name  string    `json:"name"`
	Ms    []float64 `json:"ms"`
	CPUMs []float64 `json:"cpu_ms,omitempty"` // per op, when it can be attributed
	Note  string    `json:"note"`
}

// output is the JSON cnibench writes.
type output struct {
	Started   time.Time      `json:"started"`
	Seconds   float64        `json:"seconds"`
	DataDir   string         `json:"data_dir"`
	DataFS    string         `json:"data_fs"`
	Stacks    []*stack       `json:"stacks"`
	Runs      []runResult    `json:"runs"`
	Occupancy []occResult    `json:"occupancy"`
	Floors    []*floorResult `json:"floors"`
	PodNetNS  float64        `json:"pod_netns_setup_s"`
}

var (
	cleanupMu sync.Mutex
	cleanups  []func()
)

func atExit(f func()) {
	cleanupMu.Lock()
	cleanups = append(cleanups, f)
	cleanupMu.Unlock()
}

func runCleanups() {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cnibench: "+format+"\n", args...)
	runCleanups()
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cnibench: "+format+"\n", args...)
}

func main() {
	binDir := flag.String("bin", "bin", "directory of the podnet binaries")
	refDir := flag.String("ref", "", "directory of the reference plugins (scripts/install-cni-tools.sh)")
	noop := flag.String("noop", "", "the static no-op Go binary (test/bench/noop)")
	pods := flag.Int("pods", 200, "pods per workload run")
	reps := flag.Int("reps", 3, "repetitions of every workload")
	workers := flag.Int("workers", 8, "concurrent ADDs/DELs in the concurrent runs")
	warmup := flag.Int("warmup", 10, "unmeasured ADD+DEL per stack before its first run")
	occupancy := flag.Int("occupancy", 1000, "pods on one node in the occupancy run (0: skip)")
	chunk := flag.Int("chunk", 50, "pods per turn in the occupancy run")
	floorN := flag.Int("floor-n", 60, "operations per floor and repetition")
	only := flag.String("stacks", "", "comma-separated stack names to run (default all)")
	dataRoot := flag.String("dir", "/dev/shm", "where the IPAM data dirs and caches go")
	reconcileEvery := flag.Duration("reconcile-every", time.Second, "podnet+podnet-ipam+reconcile: a leak reconcile pass every this long during ADD and DEL")
	reconcileDead := flag.Int("reconcile-dead", 250, "podnet+podnet-ipam+reconcile: dead reservations planted before each phase, freed by its first pass")
	out := flag.String("out", "", "JSON file to write (default stdout)")
	flag.Parse()
	if *refDir == "" || *noop == "" {
		fatalf("-ref and -noop are required")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		logf("%v: cleaning up", s)
		runCleanups()
		os.Exit(2)
	}()
	defer runCleanups()

	res := &output{Started: time.Now().UTC()}
	root, err := os.MkdirTemp(*dataRoot, "cnibench-")
	if err != nil {
		fatalf("%v", err)
	}
	atExit(func() { _ = os.RemoveAll(root) })
	res.DataDir, res.DataFS = root, fsType(root)
	absBin, _ := filepath.Abs(*binDir)
	paths := []string{absBin, *refDir}

	all := []*stack{
		newStack(root, "podnet+podnet-ipam", "podnet", "podnet-ipam", "10.201.0.0/16", paths),
		newStack(root, reconcileStackName, "podnet", "podnet-ipam", "10.205.0.0/16", paths).withReconcile("10.205.0.0/16", *reconcileEvery, *reconcileDead),
		newStack(root, "podnet-bridge+podnet-ipam", "podnet-bridge", "podnet-ipam", "10.202.0.0/16", paths),
		newStack(root, "ptp+host-local", "ptp", "host-local", "10.203.0.0/16", paths),
		newStack(root, "bridge+host-local", "bridge", "host-local", "10.204.0.0/16", paths),
	}
	var stacks []*stack
	for _, s := range all {
		if *only == "" || containsWord(*only, s.Name) {
			stacks = append(stacks, s)
		}
	}
	if len(stacks) == 0 {
		fatalf("no stack selected by -stacks %q", *only)
	}
	res.Stacks = stacks

	// Every run gets fresh pod netns and removes them after DEL, as a
	// runtime does per sandbox (neither is measured as ADD or DEL).
	for _, s := range stacks {
		if err := s.prepare(newNode(), *warmup); err != nil {
			fatalf("%s: %v", s.Name, err)
		}
	}

	floors := newFloors(*noop, stacks[0].node, newNetNS())
	for rep := 1; rep <= *reps; rep++ {
		for _, mode := range []struct {
			name    string
			workers int
		}{{"sequential", 1}, {"concurrent", *workers}} {
			for i := range stacks {
				s := stacks[(i+rep-1)%len(stacks)]
				t0 := time.Now()
				pool := newPods(*pods)
				res.PodNetNS += time.Since(t0).Seconds()
				r := s.run(pool, mode.name, mode.workers, rep)
				extra := ""
				if s.rc != nil {
					extra = fmt.Sprintf("  reconcile: %d passes, max lock hold %.2f ms, freed %d of %d planted", r.ReconcilePasses, r.ReconcileMaxLockHoldMs, r.ReconcileReclaimed, r.ReconcilePlanted)
				}
				logf("rep %d %-10s %-29s ADD p50 %6.2f ms p99 %6.2f ms  DEL p50 %6.2f ms  cpu/ADD %5.2f ms  leak: %s  errors: %d%s",
					rep, mode.name, s.Name, median(r.AddMs), pct(r.AddMs, 99), median(r.DelMs), (r.AddUserMs+r.AddSysMs)/float64(r.Pods), orNone(r.Leak), len(r.Errors), extra)
				res.Runs = append(res.Runs, r)
			}
		}
		floors.measure(*floorN)
	}
	res.Floors = floors.results()

	if *occupancy > 0 {
		res.Occupancy = occupancyRun(root, paths, newPods(2**occupancy), *occupancy, *chunk, *warmup,
			func() { floors.measureExecMounted(3 * *floorN) })
		res.Floors = floors.results()
	}
	res.Seconds = time.Since(res.Started).Seconds()
	data, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		fatalf("%v", err)
	}
	if *out == "" {
		_, _ = os.Stdout.Write(data)
		return
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		fatalf("%v", err)
	}
	logf("wrote %s (%.0fs)", *out, res.Seconds)
}

func containsWord(list, w string) bool {
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == w {
			return true
		}
	}
	return false
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// conflist renders the conflist of a stack: the plugins as a node would
// run them (podnet and podnet-bridge with podnet-ipam in-process, their
// default; the reference plugins without per-pod masquerade, which podnet
// leaves to podnet-routed), the IPAM store in dataDir.
func conflist(plugin, ipamType, subnet, dataDir, stateDir string) string {
	ipam := fmt.Sprintf(`{"type":%q,"ranges":[[{"subnet":%q}]],"dataDir":%q}`, ipamType, subnet, dataDir)
	var p string
	switch plugin {
	case "podnet":
		p = fmt.Sprintf(`{"type":"podnet","stateDir":%q,"ipam":%s}`, stateDir, ipam)
	case "podnet-bridge":
		p = fmt.Sprintf(`{"type":"podnet-bridge","bridge":"podnet0","isGateway":true,"hairpinMode":true,"stateDir":%q,"ipam":%s}`, stateDir, ipam)
	case "ptp":
		p = fmt.Sprintf(`{"type":"ptp","ipMasq":false,"ipam":%s}`, ipam)
	case "bridge":
		p = fmt.Sprintf(`{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,"hairpinMode":true,"ipam":%s}`, ipam)
	default:
		panic(plugin)
	}
	return fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[%s]}`, network, p)
}

func newStack(root, name, plugin, ipamType, subnet string, paths []string) *stack {
	dir := filepath.Join(root, strings.ReplaceAll(name, "+", "_"))
	dataDir := filepath.Join(dir, "ipam")
	stateDir := filepath.Join(dir, "state") // empty: MTU 1500, no node.json of the machine
	for _, d := range []string{dataDir, stateDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			fatalf("%v", err)
		}
	}
	conf := conflist(plugin, ipamType, subnet, dataDir, stateDir)
	list, err := libcni.ConfListFromBytes([]byte(conf))
	if err != nil {
		fatalf("%s conflist: %v\n%s", name, err, conf)
	}
	return &stack{
		Name: name, Plugin: plugin, IPAM: ipamType, Conf: conf,
		dataDirs: []string{dataDir},
		cni:      libcni.NewCNIConfigWithCacheDir(paths, filepath.Join(dir, "cache"), nil),
		list:     list,
	}
}

// prepare puts the stack on node, runs the unmeasured warm-up (which also
// creates a bridge stack's bridge) in pod netns of its own, removes them
// and records the leak check's baseline once the kernel has torn them down.
func (s *stack) prepare(node ns.NetNS, warmup int) error {
	s.node = node
	pods := newPods(max(warmup, 1))
	for i := 0; i < warmup; i++ {
		rt := s.rtConf(fmt.Sprintf("warm-%d", i), pods[i])
		if _, err := s.add(rt); err != nil {
			return fmt.Errorf("warm-up ADD: %w", err)
		}
		if _, err := s.del(rt); err != nil {
			return fmt.Errorf("warm-up DEL: %w", err)
		}
	}
	removePods(pods)
	var err error
	s.base, err = snapshotNode(s.node, s.dataDirs)
	if err != nil {
		return err
	}
	_, err = settle(s.node, s.base)
	return err
}

func (s *stack) rtConf(id string, pod ns.NetNS) *libcni.RuntimeConf {
	cid := strings.ReplaceAll(s.Plugin, "-", "") + "-" + id
	return &libcni.RuntimeConf{
		ContainerID: cid, NetNS: pod.Path(), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "bench"}, {"K8S_POD_NAME", id}, {"K8S_POD_INFRA_CONTAINER_ID", cid}},
	}
}

// add runs ADD inside the node netns and returns its wall time (libcni's
// whole AddNetworkList: config injection, the exec, result parsing and
// caching, as a runtime sees it).
func (s *stack) add(rt *libcni.RuntimeConf) (time.Duration, error) {
	var d time.Duration
	err := s.node.Do(func(ns.NetNS) error {
		start := time.Now()
		_, err := s.cni.AddNetworkList(context.Background(), s.list, rt)
		d = time.Since(start)
		return err
	})
	return d, err
}

func (s *stack) del(rt *libcni.RuntimeConf) (time.Duration, error) {
	var d time.Duration
	err := s.node.Do(func(ns.NetNS) error {
		start := time.Now()
		err := s.cni.DelNetworkList(context.Background(), s.list, rt)
		d = time.Since(start)
		return err
	})
	return d, err
}

// childUsage is the CPU time of the reaped children so far.
func childUsage() (user, sys time.Duration) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru); err != nil {
		fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// phase runs verb for every pod with workers goroutines and returns the
// latencies by pod index, the wall time, the children's CPU and errors.
func (s *stack) phase(verb string, rts []*libcni.RuntimeConf, workers int) (ms []float64, wall, user, sys time.Duration, errs []string) {
	ms = make([]float64, len(rts))
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	u0, s0 := childUsage()
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(rts) {
					return
				}
				var d time.Duration
				var err error
				if verb == "ADD" {
					d, err = s.add(rts[i])
				} else {
					d, err = s.del(rts[i])
				}
				ms[i] = float64(d) / 1e6
				if err != nil {
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, fmt.Sprintf("%s %s: %v", verb, rts[i].ContainerID, err))
					} else if len(errs) == 5 {
						errs = append(errs, "(more errors not shown)")
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	wall = time.Since(start)
	u1, s1 := childUsage()
	return ms, wall, u1 - u0, s1 - s0, errs
}

// run is one workload run: every pod ADDed, then every pod DELeted, then
// the leak check.
func (s *stack) run(pods []ns.NetNS, mode string, workers, rep int) runResult {
	r := runResult{Stack: s.Name, Mode: mode, Workers: workers, Rep: rep, Pods: len(pods)}
	rts := make([]*libcni.RuntimeConf, len(pods))
	for i, p := range pods {
		rts[i] = s.rtConf(fmt.Sprintf("r%d-%s-%d", rep, mode[:3], i), p)
	}
	var wall, user, sys time.Duration
	var errs []string
	// podnet's step trace (the reference plugins ignore the variable; the
	// exec'd plugins inherit this process's environment through libcni)
	trace, stop := startTrace()
	defer stop()
	// the reconcile of a stack that runs one (in this process: its CPU is
	// not in the phases' RUSAGE_CHILDREN)
	reconciling := func(phase string, f func()) {
		if s.rc == nil {
			f()
			return
		}
		run := s.startReconcile(fmt.Sprintf("dead-r%d-%s-%s", rep, mode[:3], phase), &r)
		f()
		s.stopReconcile(run, &r)
	}
	reconciling("add", func() { r.AddMs, wall, user, sys, errs = s.phase("ADD", rts, workers) })
	r.AddWallS, r.AddUserMs, r.AddSysMs = wall.Seconds(), ms(user), ms(sys)
	r.Errors = append(r.Errors, errs...)
	if s.Plugin == "podnet" && len(errs) == 0 {
		if err := checkLivePods(s.node, len(pods)); err != nil {
			r.Errors = append(r.Errors, "after ADD: "+err.Error())
		}
	}
	reconciling("del", func() { r.DelMs, wall, user, sys, errs = s.phase("DEL", rts, workers) })
	r.DelWallS, r.DelUserMs, r.DelSysMs = wall.Seconds(), ms(user), ms(sys)
	r.Errors = append(r.Errors, errs...)
	os.Unsetenv("PODNET_TRACE")
	if steps, err := readTrace(trace); err != nil {
		r.Errors = append(r.Errors, "step trace: "+err.Error())
	} else if len(steps) > 0 {
		r.Steps = steps
	}
	podLeaks := checkPodLinks(pods)
	r.NetnsDelS = removePods(pods).Seconds()
	settled, err := settle(s.node, s.base)
	r.SettleS = settled.Seconds()
	if err == nil {
		err = podLeaks
	}
	if err == nil {
		err = checkLeaks(s.base, s.node, s.dataDirs, nil)
	}
	if err != nil {
		r.Leak = err.Error()
		s.recover()
	}
	return r
}

// recover takes a new baseline after a leak, so that one leak is reported
// once, not by every later run.
func (s *stack) recover() {
	if b, err := snapshotNode(s.node, s.dataDirs); err == nil {
		s.base = b
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// startTrace turns podnet's step trace on (PODNET_TRACE: the reference
// plugins ignore it; libcni passes this process's environment on) into a
// new file, and returns it and what turns it off and removes the file.
func startTrace() (string, func()) {
	f, err := os.CreateTemp("", "cnibench-trace-*.jsonl")
	if err != nil {
		fatalf("%v", err)
	}
	_ = f.Close()
	os.Setenv("PODNET_TRACE", f.Name())
	return f.Name(), func() {
		os.Unsetenv("PODNET_TRACE")
		_ = os.Remove(f.Name())
	}
}

// verbTrace summarizes the trace lines of one verb in a run: the plugin's
// whole time inside main (Total) and each step's, in trace order.
type verbTrace struct {
	N     int         `json:"n"`
	Total stepStat    `json:"total"`
	Steps []*stepStat `json:"steps"`
}

type stepStat struct {
	Step       string  `json:"step"`
	WallP50Ms  float64 `json:"wall_p50_ms"`
	WallMeanMs float64 `json:"wall_mean_ms"`
	CPUMeanMs  float64 `json:"cpu_mean_ms"`
	wall, cpu  []float64
}

func (st *stepStat) add(wallUs, cpuUs int64) {
	st.wall = append(st.wall, float64(wallUs)/1000)
	st.cpu = append(st.cpu, float64(cpuUs)/1000)
}

func (st *stepStat) finish() {
	st.WallP50Ms, st.WallMeanMs, st.CPUMeanMs = median(st.wall), mean(st.wall), mean(st.cpu)
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// readTrace summarizes a PODNET_TRACE file (see plugins/veth/trace.go).
func readTrace(path string) (map[string]*verbTrace, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]*verbTrace{}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l struct {
			Verb  string
			Steps []struct {
				Step          string
				WallUs, CPUUs int64
			}
			WallUs, CPUUs int64
		}
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("trace line %q: %w", line, err)
		}
		vt := out[l.Verb]
		if vt == nil {
			vt = &verbTrace{Total: stepStat{Step: "total"}}
			out[l.Verb] = vt
		}
		vt.N++
		vt.Total.add(l.WallUs, l.CPUUs)
		for _, st := range l.Steps {
			i := slices.IndexFunc(vt.Steps, func(x *stepStat) bool { return x.Step == st.Step })
			if i < 0 {
				vt.Steps = append(vt.Steps, &stepStat{Step: st.Step})
				i = len(vt.Steps) - 1
			}
			vt.Steps[i].add(st.WallUs, st.CPUUs)
		}
	}
	for _, vt := range out {
		vt.Total.finish()
		for _, st := range vt.Steps {
			st.finish()
		}
	}
	return out, nil
}

// occupancyRun fills one node per stack (podnet+podnet-ipam and
// ptp+host-local) with n pods, chunk by chunk, the stacks taking turns,
// then deletes them the same way.
// newNode creates a node netns: lo up with the node address, nothing else.
func newNode() ns.NetNS {
	n := newNetNS()
	err := n.Do(func(ns.NetNS) error {
		if err := linkUp("lo"); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: nodeAddr})
	})
	if err != nil {
		fatalf("node netns: %v", err)
	}
	return n
}

func newNetNS() ns.NetNS {
	n, err := testutils.NewNS()
	if err != nil {
		fatalf("create netns: %v", err)
	}
	atExit(func() { _ = n.Close(); _ = testutils.UnmountNS(n) })
	return n
}

// removePods removes pod netns as a runtime does after DEL (close, unmount,
// unlink) and returns the wall time it took. The kernel tears down what
// they held in the background (see settle).
func removePods(pods []ns.NetNS) time.Duration {
	start := time.Now()
	for _, p := range pods {
		_ = p.Close()
		if err := testutils.UnmountNS(p); err != nil {
			logf("remove pod netns %s: %v", p.Path(), err)
		}
	}
	return time.Since(start)
}

// settle waits until every link of node that base does not have is gone
// (the kernel removes a dying netns's links, and their veth peers, in the
// background) and returns how long that took; after 30 s it gives up and
// the leak check reports what is left.
func settle(node ns.NetNS, base nodeState) (time.Duration, error) {
	start := time.Now()
	for {
		now, err := snapshotNode(node, nil)
		if err != nil {
			return time.Since(start), err
		}
		extra := 0
		for _, l := range now.Links {
			if !slices.Contains(base.Links, l) {
				extra++
			}
		}
		if extra == 0 || time.Since(start) > 30*time.Second {
			return time.Since(start), nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newPods(n int) []ns.NetNS {
	out := make([]ns.NetNS, n)
	for i := range out {
		out[i] = newNetNS()
	}
	return out
}

// ---- floors ----

type floors struct {
	noop string
	node ns.NetNS
	pod  ns.NetNS
	exec floorResult
	// execMounted is exec measured while the occupancy run's pod netns
	// are all mounted (see measureExecMounted)
	execMounted floorResult
	cni         floorResult
	cniD        floorResult
	netns       floorResult
	vethA       floorResult
	vethM       floorResult
	vethD       floorResult
	lib         *libcni.CNIConfig
	list        *libcni.NetworkConfigList
	seq         int
}

func newFloors(noop string, node, pod ns.NetNS) *floors {
	list, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.0.0","name":"noop","plugins":[{"type":"noop"}]}`))
	if err != nil {
		fatalf("%v", err)
	}
	cache, err := os.MkdirTemp("", "cnibench-noop-cache-")
	if err != nil {
		fatalf("%v", err)
	}
	atExit(func() { _ = os.RemoveAll(cache) })
	return &floors{
		noop: noop, node: node, pod: pod, list: list,
		lib:   libcni.NewCNIConfigWithCacheDir([]string{filepath.Dir(noop)}, cache, nil),
		exec:  floorResult{Name: "exec of a static no-op Go binary", Note: "fork+exec+wait from the node netns, config on stdin; CPU from the child's rusage"},
		cni:   floorResult{Name: "libcni ADD of the no-op binary as a plugin", Note: "AddNetworkList of a one-plugin conflist whose plugin only prints an empty result: the runtime-side floor of an exec'd plugin"},
		cniD:  floorResult{Name: "libcni DEL of the no-op binary as a plugin", Note: "DelNetworkList of the same"},
		netns: floorResult{Name: "netns add+del", Note: "create a named netns (unshare + bind mount) and delete it (unmount), what a runtime does per pod around the plugin; kernel teardown is asynchronous and not included"},
		vethA: floorResult{Name: "veth pair create (peer in the pod netns), in-process", Note: "one netlink RTM_NEWLINK that creates the peer directly in the pod netns (how the reference plugins do it); CPU is the calling thread's"},
		vethM: floorResult{Name: "veth pair create in the node netns, then peer moved to the pod netns, in-process", Note: "RTM_NEWLINK, then RTM_SETLINK IFLA_NET_NS_FD: moving a device between netns unregisters and re-registers it, and the kernel waits for RCU grace periods while doing so (wall time, not CPU)"},
		vethD: floorResult{Name: "veth pair delete, in-process", Note: "one netlink RTM_DELLINK; unregistering the two devices waits for RCU grace periods before it returns (wall time, not CPU)"},
	}
}

// measureExec runs the no-op binary n times into r.
func (f *floors) measureExec(n int, r *floorResult) {
	conf := []byte(`{"cniVersion":"1.0.0","name":"noop","type":"noop"}`)
	for i := 0; i < n; i++ {
		err := f.node.Do(func(ns.NetNS) error {
			cmd := exec.Command(f.noop)
			cmd.Stdin = bytes.NewReader(conf)
			cmd.Env = []string{"CNI_COMMAND=VERSION"}
			start := time.Now()
			if err := cmd.Run(); err != nil {
				return err
			}
			r.Ms = append(r.Ms, ms(time.Since(start)))
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			r.CPUMs = append(r.CPUMs, ms(time.Duration(ru.Utime.Nano()+ru.Stime.Nano())))
			return nil
		})
		if err != nil {
			fatalf("floor exec: %v", err)
		}
	}
}

// measureExecMounted is the exec floor while the occupancy run's pod
// netns are mounted: at its start the Go runtime (1.25 and later) reads
// the whole of /proc/self/mountinfo to find its cgroup (cgroup-aware
// GOMAXPROCS), and a runtime pins each pod's netns with a bind mount, so
// every Go plugin's exec costs more with every pod on the machine.
func (f *floors) measureExecMounted(n int) {
	mounts := 0
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		mounts = bytes.Count(data, []byte("\n"))
	}
	f.execMounted = floorResult{
		Name: "exec of a static no-op Go binary, the occupancy run's pod netns mounted",
		Note: fmt.Sprintf("as the first row, measured while the occupancy run's pods are all there (%d mounts on the machine, one bind mount per pod netns): the Go runtime reads /proc/self/mountinfo whole at every start (to find its cgroup), so each exec of a Go plugin costs more with every pod netns a runtime has pinned", mounts),
	}
	f.measureExec(n, &f.execMounted)
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs every floor n times.
func (f *floors) measure(n int) {
	f.measureExec(n, &f.exec)
	for i := 0; i < n; i++ {
		f.seq++
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("noop-%d", f.seq), NetNS: f.pod.Path(), IfName: "eth0"}
		err := f.node.Do(func(ns.NetNS) error {
			start := time.Now()
			if _, err := f.lib.AddNetworkList(context.Background(), f.list, rt); err != nil {
				return err
			}
			f.cni.Ms = append(f.cni.Ms, ms(time.Since(start)))
			start = time.Now()
			if err := f.lib.DelNetworkList(context.Background(), f.list, rt); err != nil {
				return err
			}
			f.cniD.Ms = append(f.cniD.Ms, ms(time.Since(start)))
			return nil
		})
		if err != nil {
			fatalf("floor libcni no-op: %v", err)
		}
	}
	for i := 0; i < n/2; i++ {
		start := time.Now()
		netns, err := testutils.NewNS()
		if err != nil {
			fatalf("floor netns: %v", err)
		}
		_ = netns.Close()
		if err := testutils.UnmountNS(netns); err != nil {
			fatalf("floor netns: %v", err)
		}
		f.netns.Ms = append(f.netns.Ms, ms(time.Since(start)))
	}
	for i := 0; i < n; i++ {
		err := f.node.Do(func(ns.NetNS) error {
			runtime.LockOSThread() // already locked by Do; RUSAGE_THREAD needs it
			defer runtime.UnlockOSThread()
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bfloor0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(f.pod.Fd()))}
			c0, start := threadCPU(), time.Now()
			if err := netlink.LinkAdd(veth); err != nil {
				return err
			}
			f.vethA.Ms = append(f.vethA.Ms, ms(time.Since(start)))
			f.vethA.CPUMs = append(f.vethA.CPUMs, ms(threadCPU()-c0))
			l, err := netlink.LinkByName("bfloor0")
			if err != nil {
				return err
			}
			c0, start = threadCPU(), time.Now()
			if err := netlink.LinkDel(l); err != nil {
				return err
			}
			f.vethD.Ms = append(f.vethD.Ms, ms(time.Since(start)))
			f.vethD.CPUMs = append(f.vethD.CPUMs, ms(threadCPU()-c0))

			veth = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bfloor1"}, PeerName: "bfloor1p"}
			c0, start = threadCPU(), time.Now()
			if err := netlink.LinkAdd(veth); err != nil {
				return err
			}
			peer, err := netlink.LinkByName("bfloor1p")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetNsFd(peer, int(f.pod.Fd())); err != nil {
				return err
			}
			f.vethM.Ms = append(f.vethM.Ms, ms(time.Since(start)))
			f.vethM.CPUMs = append(f.vethM.CPUMs, ms(threadCPU()-c0))
			if l, err = netlink.LinkByName("bfloor1"); err != nil {
				return err
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			fatalf("floor veth: %v", err)
		}
	}
}

func (f *floors) results() []*floorResult {
	out := []*floorResult{&f.exec}
	if len(f.execMounted.Ms) > 0 {
		out = append(out, &f.execMounted)
	}
	return append(out, &f.cni, &f.cniD, &f.netns, &f.vethA, &f.vethM, &f.vethD)
}

// ---- small helpers ----

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	slices.Sort(s)
	return s[len(s)/2]
}

// pct is the nearest-rank percentile p of xs (0 when empty).
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}
