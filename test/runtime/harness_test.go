package runtimee2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/nettest"
	"github.com/podnet/podnet/test/runtime/criclient"
)

const (
	// sandboxImage is the name the pause image is imported under and the
	// sandbox_image of the test's containerd.
	sandboxImage = "localhost/podnet/pause:test"
	// criNamespace is the containerd namespace of the CRI plugin.
	criNamespace = "k8s.io"
	// podIfName is the CNI_IFNAME containerd passes.
	podIfName = "eth0"
	// scratchPrefix names the scratch dirs under os.TempDir(); TestMain
	// sweeps those of dead runs.
	scratchPrefix = "podnet-runtime-"
)

// Files in the scratch dir that let a later run undo this one.
const (
	ownerPIDFile  = "owner.pid"      // the go test process
	containerdPID = "containerd.pid" // the running containerd
	// the second containerd of the wrong-runtime phase (no pods)
	wrongContainerdPID = "containerd-wrong.pid"
	nodeNetnsFile      = "node-netns"    // path of the node netns
	cgroupParentFile   = "cgroup-parent" // parent cgroup of the sandboxes
	podNamespaceFile   = "pod-namespace" // K8S_POD_NAMESPACE of every pod
)

// harness is one containerd on one node netns, on scratch paths.
type harness struct {
	top  *testing.T // the test that owns the harness (cleanup logs)
	repo string
	dir  string // scratch: containerd root/state/socket, CNI dirs, IPAM data
	node *nettest.Node

	binDir  string // CNI bin_dir: links to bin/podnet* plus the reference loopback
	confDir string // CNI conf_dir: the one conflist under test
	image   string // the pause image tarball

	// podNamespace is every pod's namespace; it is unique per run, so the
	// pods' libcni cache entries (in /var/lib/cni, shared with the machine)
	// can be told apart.
	podNamespace string
	cgroupParent string

	ctrd     *exec.Cmd
	ctrdDone chan struct{}
	cri      *criclient.Client
	imported bool

	// net is the network in use (set by useNetwork).
	net *network

	notesMu sync.Mutex
	notes   []string // what the tests measured, for the report
}

// network is one shipped conflist run by containerd.
type network struct {
	pluginType string // podnet | podnet-bridge
	podCIDR    string // written to node.json, as podnet-routed would
	stateDir   string // node.json
	dataDir    string // podnet-ipam store
	conflist   string // the file shipped in conf/ that containerd loads
}

// newHarness checks the prerequisites, makes the scratch dir, the node
// netns, the CNI dirs and the pause image. Everything is undone when the
// test ends, pass or fail.
func newHarness(t *testing.T) *harness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the runtime tests need root (network namespaces, containerd)")
	}
	// runc is in /usr/sbin, which a CI environment's PATH may lack.
	t.Setenv("PATH", os.Getenv("PATH")+":/usr/sbin:/sbin")
	for _, tool := range []string{"containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install the runtime with scripts/runtime/install-deps.sh (Debian containerd + runc): %v", tool, err)
		}
	}
	tools := nettest.RefToolsDir(t)
	repo := nettest.RepoRoot(t)
	build := nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-bridge")

	dir, err := os.MkdirTemp("", scratchPrefix)
	if err != nil {
		t.Fatal(err)
	}
	suffix := randomHex(4)
	h := &harness{
		top:          t,
		repo:         repo,
		dir:          dir,
		binDir:       filepath.Join(dir, "cni-bin"),
		confDir:      filepath.Join(dir, "net.d"),
		image:        filepath.Join(dir, "pause.tar"),
		podNamespace: "podnet-rt-" + suffix,
		cgroupParent: "/podnet-rt-" + suffix,
	}
	h.writeMeta(t, ownerPIDFile, strconv.Itoa(os.Getpid()))
	h.writeMeta(t, podNamespaceFile, h.podNamespace)
	h.writeMeta(t, cgroupParentFile, h.cgroupParent)
	before := globalDirs()
	// Cleanups run last-in first-out: this one, registered first, runs
	// after containerd has stopped and the node netns is gone.
	t.Cleanup(func() {
		for _, msg := range cleanupScratch(dir) {
			t.Logf("cleanup: %s", msg)
		}
		removeNewEmptyDirs(before)
	})
	h.node = nettest.NewNode(t)
	h.writeMeta(t, nodeNetnsFile, h.node.NS.Path())
	t.Cleanup(h.shutdown)

	// bin_dir: the build (linked, so it is exactly what `make` built) and
	// the reference loopback containerd runs for every sandbox's lo.
	must(t, os.MkdirAll(h.binDir, 0o755))
	for _, b := range []string{"podnet", "podnet-ipam", "podnet-bridge"} {
		must(t, os.Symlink(filepath.Join(build, b), filepath.Join(h.binDir, b)))
	}
	must(t, copyFile(filepath.Join(tools, "loopback"), filepath.Join(h.binDir, "loopback"), 0o755))
	must(t, os.MkdirAll(h.confDir, 0o755))

	start := time.Now()
	out, err := exec.Command(filepath.Join(repo, "scripts/runtime/pause-image.sh"), h.image, sandboxImage).CombinedOutput()
	if err != nil {
		t.Fatalf("build pause image: %v\n%s", err, out)
	}
	t.Logf("pause image %s built in %v", sandboxImage, time.Since(start).Round(time.Millisecond))
	return h
}

// note logs a result and keeps it for the report.
func (h *harness) note(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Log(msg)
	h.notesMu.Lock()
	h.notes = append(h.notes, fmt.Sprintf("- `%s`: %s", t.Name(), strings.ReplaceAll(msg, "\n", " ")))
	h.notesMu.Unlock()
}

// writeReport writes the notes as Markdown to path (PODNET_RUNTIME_REPORT;
// nothing when empty).
func (h *harness) writeReport(t *testing.T, path string) {
	if path == "" {
		return
	}
	status := "pass"
	if t.Failed() {
		status = "FAIL"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# podnet under containerd %s + runc (test/runtime)\n\n", containerdVersion())
	fmt.Fprintf(&b, "%s, %s, %d CPUs, %d sandboxes created or removed at a time. Result: %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), goruntime.Version(), goruntime.NumCPU(), workers, status)
	h.notesMu.Lock()
	b.WriteString(strings.Join(h.notes, "\n") + "\n")
	h.notesMu.Unlock()
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("write report: %v", err)
	}
}

// writeMeta records name=value in the scratch dir for a later sweep.
func (h *harness) writeMeta(t testing.TB, name, value string) {
	must(t, os.WriteFile(filepath.Join(h.dir, name), []byte(value+"\n"), 0o644))
}

// useNetwork installs the shipped conflist of n (paths adjusted to the
// scratch dir) and node.json with n's PodCIDR, then (re)starts containerd
// so it loads them.
func (h *harness) useNetwork(t *testing.T, n *network) {
	t.Helper()
	h.stopContainerd(t)
	base := filepath.Join(h.dir, n.pluginType)
	n.stateDir = filepath.Join(base, "state")
	n.dataDir = filepath.Join(base, "ipam")
	must(t, nodestate.Write(n.stateDir, &nodestate.State{NodeName: "runtime-node", PodCIDRs: []string{n.podCIDR}}))

	n.conflist = shippedConflist(t, h.repo, n.pluginType, "1.0.0")
	conf := withScratchPaths(t, n.conflist, n)
	entries, err := os.ReadDir(h.confDir)
	must(t, err)
	for _, e := range entries {
		must(t, os.Remove(filepath.Join(h.confDir, e.Name())))
	}
	must(t, os.WriteFile(filepath.Join(h.confDir, filepath.Base(n.conflist)), conf, 0o644))
	h.net = n
	h.startContainerd(t)
	t.Logf("containerd uses %s (paths under %s)", relPath(h.repo, n.conflist), base)
}

// startContainerd starts containerd inside the node netns, so the CNI
// plugins it execs change that netns and never the machine's, and waits
// until CRI reports the network ready. The first start imports the pause
// image.
func (h *harness) startContainerd(t *testing.T) {
	t.Helper()
	cfg := filepath.Join(h.dir, "containerd.toml")
	tmpl, err := os.ReadFile(filepath.Join(h.repo, "scripts/runtime/containerd.toml.in"))
	must(t, err)
	rendered := strings.NewReplacer(
		"@DIR@", h.dir, "@BIN_DIR@", h.binDir, "@CONF_DIR@", h.confDir, "@SANDBOX_IMAGE@", sandboxImage,
	).Replace(string(tmpl))
	must(t, os.WriteFile(cfg, []byte(rendered), 0o644))

	logFile, err := os.OpenFile(filepath.Join(h.dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer logFile.Close()
	cmd := exec.Command("nsenter", "--net="+h.node.NS.Path(), "containerd", "--config", cfg, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	must(t, cmd.Start())
	h.ctrd = cmd
	h.ctrdDone = make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(h.ctrdDone)
	h.writeMeta(t, containerdPID, strconv.Itoa(cmd.Process.Pid))

	if h.cri == nil {
		c, err := criclient.Dial(h.socket())
		must(t, err)
		h.cri = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ready := make(chan error, 1)
	go func() { ready <- h.cri.WaitReady(ctx) }()
	select {
	case err = <-ready:
	case <-h.ctrdDone:
		err = errors.New("containerd exited")
	}
	if err != nil {
		t.Fatalf("containerd did not come up: %v\n%s", err, h.logTail())
	}
	t.Logf("containerd %s ready in %v (pid %d, netns %s)", containerdVersion(), time.Since(start).Round(time.Millisecond), cmd.Process.Pid, h.node.NS.Path())
	if !h.imported {
		start = time.Now()
		out, err := exec.Command("ctr", "--address", h.socket(), "--namespace", criNamespace, "images", "import", h.image).CombinedOutput()
		if err != nil {
			t.Fatalf("import pause image: %v\n%s", err, out)
		}
		h.imported = true
		t.Logf("pause image imported in %v", time.Since(start).Round(time.Millisecond))
	}
}

func (h *harness) socket() string { return filepath.Join(h.dir, "containerd.sock") }

// killContainerd SIGKILLs containerd, as a crash would: its shims, the
// pause processes and any plugin it was running live on.
func (h *harness) killContainerd() {
	if h.ctrd == nil {
		return
	}
	_ = h.ctrd.Process.Signal(syscall.SIGKILL)
	<-h.ctrdDone
	h.ctrd = nil
}

// stopContainerd stops containerd with SIGTERM (SIGKILL after 15 s).
func (h *harness) stopContainerd(t testing.TB) {
	if h.ctrd == nil {
		return
	}
	_ = h.ctrd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.ctrdDone:
	case <-time.After(15 * time.Second):
		t.Logf("containerd ignored SIGTERM for 15s; killing it")
		_ = h.ctrd.Process.Signal(syscall.SIGKILL)
		<-h.ctrdDone
	}
	h.ctrd = nil
}

// shutdown removes every sandbox still there through CRI (the normal path
// for the CNI plugins), then stops containerd. cleanupScratch does the rest.
func (h *harness) shutdown() {
	t := h.top
	if h.ctrd != nil && h.cri != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if pods, err := h.cri.List(ctx); err == nil {
			for _, p := range pods {
				if err := h.cri.StopAndRemove(ctx, p.Id); err != nil {
					t.Logf("shutdown: %v", err)
				}
			}
		}
		cancel()
	}
	h.stopContainerd(t)
	if h.cri != nil {
		_ = h.cri.Close()
	}
	if t.Failed() {
		t.Logf("containerd log (tail):\n%s", h.logTail())
	}
}

// logTail is the end of containerd's log.
func (h *harness) logTail() string {
	data, err := os.ReadFile(filepath.Join(h.dir, "containerd.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// pod names pod number i of a test step.
func (h *harness) pod(prefix string, i int) criclient.Pod {
	name := fmt.Sprintf("%s-%03d", prefix, i)
	return criclient.Pod{Name: name, Namespace: h.podNamespace, UID: h.podNamespace + "-" + name, CgroupParent: h.cgroupParent}
}

// waitPluginsGone waits until no CNI plugin started by this test's
// containerd runs any more: a killed containerd does not kill the plugins
// it was running, and they finish their verb on their own.
func (h *harness) waitPluginsGone(timeout time.Duration) []int {
	deadline := time.Now().Add(timeout)
	for {
		pids := processesWithEnv("CNI_PATH=" + h.binDir)
		if len(pids) == 0 || time.Now().After(deadline) {
			return pids
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gc runs CNI GC (cniVersion 1.1.0) through libcni, as a runtime does,
// with the shipped 1.1.0 conflist of the network in use and valid as the
// attachments to keep. The libcni cache is empty, so the plugins alone
// decide what is stale.
func (h *harness) gc(t *testing.T, valid []types.GCAttachment) error {
	path := shippedConflist(t, h.repo, h.net.pluginType, "1.1.0")
	list, err := libcni.ConfListFromBytes(withScratchPaths(t, path, h.net))
	must(t, err)
	cni := libcni.NewCNIConfigWithCacheDir([]string{h.binDir}, t.TempDir(), nil)
	t.Logf("GC through libcni with %s (cniVersion %s), %d valid attachments", relPath(h.repo, path), list.CNIVersion, len(valid))
	return h.node.NS.Do(func(ns.NetNS) error {
		return cni.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// shippedConflist finds the conflist in conf/ (or one directory below, e.g.
// conf/containerd-1.6/) whose cniVersion is version and whose only plugin
// is of type pluginType. Several such files must be identical. The
// dual-stack variant (conf/10-podnet-dualstack.conflist: a second IPAM
// range set) is not one of them: the conformance run uses it on a
// dual-stack cluster.
func shippedConflist(t *testing.T, repo, pluginType, version string) string {
	t.Helper()
	var matches []string
	for _, pattern := range []string{"conf/*.conflist", "conf/*/*.conflist"} {
		files, err := filepath.Glob(filepath.Join(repo, pattern))
		must(t, err)
		for _, f := range files {
			if strings.HasSuffix(f, "-dualstack.conflist") {
				continue
			}
			var c struct {
				CNIVersion string `json:"cniVersion"`
				Plugins    []struct {
					Type string `json:"type"`
				} `json:"plugins"`
			}
			data, err := os.ReadFile(f)
			must(t, err)
			if err := json.Unmarshal(data, &c); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if c.CNIVersion == version && len(c.Plugins) == 1 && c.Plugins[0].Type == pluginType {
				matches = append(matches, f)
			}
		}
	}
	if len(matches) == 0 {
		t.Fatalf("no conflist in conf/ with cniVersion %s and the single plugin %s", version, pluginType)
	}
	first, err := os.ReadFile(matches[0])
	must(t, err)
	for _, f := range matches[1:] {
		other, err := os.ReadFile(f)
		must(t, err)
		if !jsonEqual(first, other) {
			t.Fatalf("%s and %s are both the cniVersion %s %s conflist but differ", matches[0], f, version, pluginType)
		}
	}
	return matches[0]
}

// withScratchPaths returns the conflist at path with only its paths
// changed: each plugin's stateDir (node.json) and ipam.dataDir point into
// the scratch dir of network n.
func withScratchPaths(t *testing.T, path string, n *network) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	must(t, err)
	var list map[string]any
	must(t, json.Unmarshal(data, &list))
	plugins, _ := list["plugins"].([]any)
	for _, p := range plugins {
		plugin, ok := p.(map[string]any)
		if !ok {
			t.Fatalf("%s: plugin is not an object", path)
		}
		plugin["stateDir"] = n.stateDir
		if ipam, ok := plugin["ipam"].(map[string]any); ok {
			ipam["dataDir"] = n.dataDir
		}
	}
	out, err := json.MarshalIndent(list, "", "  ")
	must(t, err)
	return out
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xs, _ := json.Marshal(x)
	ys, _ := json.Marshal(y)
	return string(xs) == string(ys)
}

func containerdVersion() string {
	out, err := exec.Command("containerd", "--version").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return strings.TrimSpace(string(out))
}

func relPath(base, p string) string {
	if r, err := filepath.Rel(base, p); err == nil {
		return r
	}
	return p
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
