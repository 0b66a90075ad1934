package runtimee2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// shimSocketDir is where containerd 1.6 puts its shims' sockets.
const shimSocketDir = "/run/containerd/s"

// libcniCacheDir is where containerd 1.6 (libcni's default) caches CNI
// results; it has no setting for it.
const libcniCacheDir = "/var/lib/cni"

// cleanupScratch undoes everything a run with scratch dir dir started,
// whether containerd stopped cleanly or not: containers and shims, mounts
// (rootfs, shm, pod netns), sandbox cgroups, the run's libcni cache
// entries, the node netns and the dir itself. It only touches what the
// dir records. It returns what it had to clean (nothing after a clean run).
func cleanupScratch(dir string) []string {
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }

	for _, f := range []string{containerdPID, wrongContainerdPID} {
		if pid := readPID(filepath.Join(dir, f)); pid > 0 && alive(pid) && processMentions(pid, dir) {
			note("containerd pid %d still running: killed", pid)
			killAndWait(pid)
		}
	}
	// Containers first (runc kills the pause processes and removes their
	// cgroups), then the shims that watched them.
	runcRoot := filepath.Join(dir, "runc", criNamespace)
	if ids := runcContainers(runcRoot); len(ids) > 0 {
		note("%d runc containers left: deleted", len(ids))
		for _, id := range ids {
			_ = exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
		}
	}
	if shims := shimPIDs(dir); len(shims) > 0 {
		note("containerd shims %v still running: killed", shims)
		for _, pid := range shims {
			killShim(pid)
		}
	}
	for _, pid := range processesWithEnv("CNI_PATH=" + filepath.Join(dir, "cni-bin")) {
		note("CNI plugin pid %d still running: killed", pid)
		killAndWait(pid)
	}
	if mounts := mountsUnder(dir); len(mounts) > 0 {
		netns := 0
		for _, m := range mounts {
			if m.fsType == "nsfs" {
				netns++
			}
			if err := unix.Unmount(m.point, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				note("unmount %s: %v", m.point, err)
			}
		}
		note("%d mounts left (%d netns): unmounted", len(mounts), netns)
	}
	if parent := readLine(filepath.Join(dir, cgroupParentFile)); parent != "" {
		if n := removeCgroups(parent); n > 0 {
			note("%d sandbox cgroups left: removed", n)
		}
	}
	if ns := readLine(filepath.Join(dir, podNamespaceFile)); ns != "" {
		if n := removeCacheEntries(ns); n > 0 {
			note("%d libcni cache entries of the run's pods left in %s: removed", n, libcniCacheDir)
		}
	}
	if node := readLine(filepath.Join(dir, nodeNetnsFile)); node != "" {
		if _, err := os.Stat(node); err == nil {
			_ = unix.Unmount(node, unix.MNT_DETACH)
			_ = os.Remove(node)
			note("node netns %s left: removed", node)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		note("remove %s: %v", dir, err)
	}
	return notes
}

// sweepStaleRuns cleans the scratch dirs of earlier runs whose test
// process is gone.
func sweepStaleRuns() []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), scratchPrefix+"*"))
	var notes []string
	for _, d := range dirs {
		owner := readPID(filepath.Join(d, ownerPIDFile))
		if owner > 0 && syscall.Kill(owner, 0) == nil {
			continue // a run in progress
		}
		for _, n := range cleanupScratch(d) {
			notes = append(notes, d+": "+n)
		}
		notes = append(notes, d+": removed")
	}
	return notes
}

// globalDirs are the machine-wide directories containerd 1.6 and libcni
// create even with scratch root/state: its shim sockets live in
// /run/containerd/s, libcni's cache in /var/lib/cni.
func globalDirs() map[string]bool {
	existed := map[string]bool{}
	for _, d := range []string{shimSocketDir, "/run/containerd", libcniCacheDir + "/results", libcniCacheDir} {
		_, err := os.Stat(d)
		existed[d] = err == nil
	}
	return existed
}

// removeNewEmptyDirs removes those of the global dirs that did not exist
// before the run and are empty now (in that order: children first).
func removeNewEmptyDirs(existed map[string]bool) {
	for _, d := range []string{shimSocketDir, "/run/containerd", libcniCacheDir + "/results", libcniCacheDir} {
		if !existed[d] {
			_ = unix.Rmdir(d)
		}
	}
}

type mount struct{ point, fsType string }

// mountsUnder lists the mounts at or below dir, deepest first.
func mountsUnder(dir string) []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		point := unescapeMountPath(fields[4])
		if point != dir && !strings.HasPrefix(point, dir+"/") {
			continue
		}
		fsType := ""
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) {
				fsType = fields[i+1]
				break
			}
		}
		out = append(out, mount{point: point, fsType: fsType})
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].point) > len(out[j].point) })
	return out
}

// unescapeMountPath undoes the octal escapes (\040 for a space) of
// /proc/self/mountinfo.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// runcContainers lists the containers runc keeps state for under root.
func runcContainers(root string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// removeCgroups removes the (empty) cgroup tree parent in every cgroup v1
// hierarchy and the unified one, children first. It returns how many
// sandbox cgroups (children of parent) there were.
func removeCgroups(parent string) int {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	children := map[string]bool{}
	for _, root := range roots {
		top := filepath.Join(root, parent)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if filepath.Dir(dirs[i]) == top {
				children[filepath.Base(dirs[i])] = true
			}
			for try := 0; try < 50; try++ {
				if err := unix.Rmdir(dirs[i]); err == nil || !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return len(children)
}

// cacheEntry is the part of a libcni cache file that names the pod.
type cacheEntry struct {
	ContainerID string      `json:"containerId"`
	NetworkName string      `json:"networkName"`
	IfName      string      `json:"ifName"`
	CNIArgs     [][2]string `json:"cniArgs"`
}

// cacheEntries returns the libcni cache files of pods in namespace podNS.
func cacheEntries(podNS string) map[string]cacheEntry {
	files, _ := filepath.Glob(filepath.Join(libcniCacheDir, "results", "*"))
	out := map[string]cacheEntry{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var e cacheEntry
		if json.Unmarshal(data, &e) != nil {
			continue
		}
		for _, kv := range e.CNIArgs {
			if kv[0] == "K8S_POD_NAMESPACE" && kv[1] == podNS {
				out[f] = e
			}
		}
	}
	return out
}

func removeCacheEntries(podNS string) int {
	entries := cacheEntries(podNS)
	for f := range entries {
		_ = os.Remove(f)
	}
	return len(entries)
}

// processesWithEnv lists the processes whose environment has the exact
// entry kv (e.g. the CNI_PATH of this run's containerd).
func processesWithEnv(kv string) []int {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	var pids []int
	needle := []byte(kv)
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, e := range bytes.Split(data, []byte{0}) {
			if bytes.Equal(e, needle) {
				if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
					pids = append(pids, pid)
				}
				break
			}
		}
	}
	return pids
}

// shimPIDs lists the containerd shims started by the containerd of scratch
// dir dir: a shim's command line names its containerd's socket. A shim
// outlives a killed containerd, and one whose sandbox the restarted
// containerd does not know is never stopped by it.
func shimPIDs(dir string) []int {
	socket := []byte("-address\x00" + filepath.Join(dir, "containerd.sock") + "\x00")
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(data, []byte("containerd-shim")) || !bytes.Contains(data, socket) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && alive(pid) {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

// shimArg returns the value of flag (e.g. "-id") on shim pid's command line.
func shimArg(pid int, flag string) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(string(data), "\x00")
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// killShim SIGKILLs a shim and removes its socket, which only a shim that
// is shut down properly removes. containerd 1.6 puts shim sockets in
// /run/containerd/s whatever its state dir, named by the hash of its own
// socket path, the namespace and the sandbox ID.
func killShim(pid int) {
	address, id := shimArg(pid, "-address"), shimArg(pid, "-id")
	killAndWait(pid)
	if address != "" && id != "" {
		sum := sha256.Sum256([]byte(filepath.Join(address, criNamespace, id)))
		_ = os.Remove(filepath.Join(shimSocketDir, hex.EncodeToString(sum[:])))
	}
}

// processMentions reports whether pid is alive and its command line
// contains s (guards against a recycled PID).
func processMentions(pid int, s string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(data, []byte(s))
}

// killAndWait SIGKILLs pid and waits (up to 5 s) until it is gone.
func killAndWait(pid int) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 250; i++ {
		// Reap it if it is our child; harmless otherwise.
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if !alive(pid) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, the state follows the last ')'.
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] != 'Z'
}

func readLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

func readPID(path string) int {
	pid, err := strconv.Atoi(readLine(path))
	if err != nil {
		return 0
	}
	return pid
}

// unmount detaches the mount at path.
func unmount(path string) error { return unix.Unmount(path, unix.MNT_DETACH) }
