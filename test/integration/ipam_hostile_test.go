package integration

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/podnet/podnet/test/nettest"
	"golang.org/x/sys/unix"
)

// Hostile and broken input to bin/podnet-ipam's store (issue 16): symlinks
// planted in the data directory, a full file system, a relative dataDir.

// hintName is the name of the one hint file of n's network.
func (n *ipamNet) hintName() string {
	n.t.Helper()
	hints, err := os.ReadDir(filepath.Join(n.dataDir, n.name, "hints"))
	if err != nil || len(hints) != 1 {
		n.t.Fatalf("hints of %s: %v, %v; want one file", n.name, hints, err)
	}
	return hints[0].Name()
}

// TestIPAMSymlinkInStore plants a symlink pointing outside the data
// directory at each entry of a network's store, dangling (so a create
// through it would make the target) or at an existing directory or file
// (so a write through it would land there), and runs a verb: it must fail
// with code 5 naming the entry as a symbolic link, create or change
// nothing outside, and leave the store as it was.
func TestIPAMSymlinkInStore(t *testing.T) {
	const subnet = "10.201.40.0/24"
	type tc struct {
		entry  string // under <dataDir>/<network>; "" is the network directory, HINT the hint file
		target string // "dir", "file" (a copy of the entry, or junk) or "dangling"
		call   ipamCall
	}
	addSecond := ipamCall{cmd: "ADD", cid: "second"} // would get 10.201.40.3
	var cases []tc
	for _, target := range []string{"dir", "dangling"} {
		for _, entry := range []string{"", "ips", "owners", "hints"} {
			cases = append(cases, tc{entry, target, addSecond})
		}
	}
	for _, target := range []string{"file", "dangling"} {
		cases = append(cases,
			tc{"lock", target, addSecond},
			tc{"ips/10.201.40.3", target, addSecond},
			tc{"owners/second:eth0", target, addSecond},
			tc{"hints/HINT", target, addSecond},
			tc{"owners/first:eth0", target, ipamCall{cmd: "DEL", cid: "first"}},
			tc{"owners/first:eth0", target, ipamCall{cmd: "CHECK", cid: "first"}},
			tc{"ips/10.201.40.2", target, ipamCall{cmd: "CHECK", cid: "first"}},
			tc{"ips/10.201.40.2", target, ipamCall{cmd: "GC", extra: map[string]any{"cni.dev/valid-attachments": []types.GCAttachment{}}}},
		)
	}
	for _, c := range cases {
		name := c.entry
		if name == "" {
			name = "netdir"
		}
		t.Run(c.call.cmd+"/"+strings.ReplaceAll(name, "/", "_")+"/"+c.target, func(t *testing.T) {
			n := newIPAMNet(t, "hostile", rangesOf(subnet))
			if got := n.add(ipamCall{cid: "first"}).IPs[0].Address.IP.String(); got != "10.201.40.2" {
				t.Fatalf("first ADD got %s", got)
			}
			entry := strings.ReplaceAll(c.entry, "HINT", n.hintName())
			p := filepath.Join(n.dataDir, n.name, entry)
			outside := t.TempDir()
			victim := filepath.Join(outside, "victim")
			switch c.target {
			case "dir":
				if err := os.Mkdir(victim, 0o700); err != nil {
					t.Fatal(err)
				}
			case "file":
				data, err := os.ReadFile(p)
				if err != nil {
					data = []byte("10.201.40.7\n")
				}
				if err := os.WriteFile(victim, data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, p); err != nil {
				t.Fatal(err)
			}
			storeBefore, outsideBefore := nettest.Tree(t, n.dataDir), nettest.Tree(t, outside)

			res := n.run(c.call)
			if d := nettest.TreeChanges(outsideBefore, nettest.Tree(t, outside)); len(d) > 0 {
				t.Errorf("%s wrote outside the data directory: %v", c.call.cmd, d)
			}
			if d := nettest.TreeChanges(storeBefore, nettest.Tree(t, n.dataDir)); len(d) > 0 {
				t.Errorf("%s changed the store: %v", c.call.cmd, d)
			}
			e, err := ipamError(res)
			if err != nil {
				t.Fatalf("%s: %v", c.call.cmd, err)
			}
			if e.Code != types.ErrIOFailure || !strings.Contains(e.Msg, p+" is a symbolic link") || e.Details == "" {
				t.Errorf("%s: code %d %q (details %q); want code %d naming %s as a symbolic link, with details", c.call.cmd, e.Code, e.Msg, e.Details, types.ErrIOFailure, p)
			}
		})
	}
}

// TestIPAMHintTempSymlink: older versions rewrote a hint file through the
// fixed name hints/<hash>.new; a symlink planted there is not written
// through when the hint is rebuilt, and GC removes the link (not its
// target).
func TestIPAMHintTempSymlink(t *testing.T) {
	n := newIPAMNet(t, "hinttemp", rangesOf("10.201.43.0/24"))
	n.add(ipamCall{cid: "first"})
	hint := filepath.Join(n.dataDir, n.name, "hints", n.hintName())
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(hint); err != nil { // the next ADD writes a whole new one
		t.Fatal(err)
	}
	if err := os.Symlink(victim, hint+".new"); err != nil {
		t.Fatal(err)
	}
	before := nettest.Tree(t, outside)
	if got := n.add(ipamCall{cid: "second"}).IPs[0].Address.IP.String(); got != "10.201.43.3" {
		t.Errorf("second ADD got %s, want 10.201.43.3", got)
	}
	n.gc([]types.GCAttachment{{ContainerID: "first", IfName: "eth0"}, {ContainerID: "second", IfName: "eth0"}})
	if d := nettest.TreeChanges(before, nettest.Tree(t, outside)); len(d) > 0 {
		t.Errorf("written outside the data directory: %v", d)
	}
	if _, err := os.Lstat(hint + ".new"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s.new after GC: %v, want it removed", hint, err)
	}
	if fi, err := os.Lstat(hint); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("hint after ADD: %v, %v; want a regular file", fi, err)
	}
	if err := readIPAMStore(t, n.dataDir, n.name).consistent(); err != nil {
		t.Error(err)
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory and
// unmounts it when the test ends.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(size)+",mode=0700"); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillUp writes page-sized files into dir until the file system is full
// and returns them.
func fillUp(t *testing.T, dir string) []string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, os.Getpagesize())
	var files []string
	for i := 0; ; i++ {
		p := filepath.Join(dir, strconv.Itoa(i))
		err := os.WriteFile(p, page, 0o600)
		if errors.Is(err, syscall.ENOSPC) {
			os.Remove(p)
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
		if i > 100000 {
			t.Fatal("the file system does not fill up")
		}
	}
}

// TestIPAMDiskFull runs ADD with the data directory's file system full,
// then with one more page free at a time until it succeeds. Every failed
// ADD must be a code 5 error and leave the store byte for byte as it was:
// no reservation, owner entry or temp file, and the range's cursor not
// moved, so the ADD that finally succeeds gets the address the failed ones
// would have had. With one page free the reservation fits and the owner
// entry does not: that ADD must undo its reservation. A network whose
// store is created on the full file system fails just as cleanly.
func TestIPAMDiskFull(t *testing.T) {
	mnt := mountTmpfs(t, 256<<10)
	dataDir := filepath.Join(mnt, "ipam")
	onTmpfs := func(n *ipamNet) *ipamNet {
		n.dataDir = dataDir
		n.ipam["dataDir"] = dataDir
		return n
	}
	n := onTmpfs(newIPAMNet(t, "full", rangesOf("10.201.41.0/24")))
	if got := n.add(ipamCall{cid: "first"}).IPs[0].Address.IP.String(); got != "10.201.41.2" {
		t.Fatalf("first ADD got %s", got)
	}
	fillers := fillUp(t, filepath.Join(mnt, "fill"))
	t.Logf("%d pages to fill the file system", len(fillers))

	// A new network on the full file system: its directories and lock need
	// no space, its hint file does.
	fresh := onTmpfs(newIPAMNet(t, "fresh", rangesOf("10.201.42.0/24")))
	e := fresh.fails(ipamCall{cmd: "ADD", cid: "a"}, types.ErrIOFailure, "no space left on device")
	if e.Details == "" {
		t.Errorf("ENOSPC error without details: %q", e.Msg)
	}
	want := map[string]string{".": "dir drwx------", "ips": "dir drwx------", "owners": "dir drwx------", "hints": "dir drwx------", "lock": "file -rw------- \"\""}
	if got := nettest.Tree(t, filepath.Join(dataDir, fresh.name)); !maps.Equal(got, want) {
		t.Errorf("store of a network whose first ADD failed on a full disk: %v, want only %v", got, want)
	}

	failures := 0
	var got string
	for free := 0; free <= 8; free++ {
		if free > 0 {
			if err := os.Remove(fillers[len(fillers)-1]); err != nil {
				t.Fatal(err)
			}
			fillers = fillers[:len(fillers)-1]
		}
		before := nettest.Tree(t, filepath.Join(dataDir, n.name))
		res := n.run(ipamCall{cmd: "ADD", cid: "second"})
		if res.exitCode == 0 {
			r, err := parseIPAMResult(res)
			if err != nil {
				t.Fatal(err)
			}
			got = r.IPs[0].Address.IP.String()
			if free == 0 {
				t.Errorf("ADD succeeded on a full file system (got %s): what did it write? %s", got, readIPAMStore(t, dataDir, n.name))
			}
			t.Logf("ADD failed with %d free pages or fewer, succeeded with %d", free-1, free)
			break
		}
		failures++
		e, err := ipamError(res)
		if err != nil {
			t.Fatalf("ADD with %d free pages: %v", free, err)
		}
		if e.Code != types.ErrIOFailure || !strings.Contains(e.Msg, "no space left on device") {
			t.Errorf("ADD with %d free pages: code %d %q, want %d, no space left on device", free, e.Code, e.Msg, types.ErrIOFailure)
		}
		if d := nettest.TreeChanges(before, nettest.Tree(t, filepath.Join(dataDir, n.name))); len(d) > 0 {
			t.Errorf("ADD that failed with %d free pages left: %v", free, d)
		}
	}
	if failures < 2 {
		// 0 free pages fails at the reservation, 1 at the owner entry.
		t.Errorf("ADD failed with %d free page counts, want at least 2 (full, and room for the reservation only)", failures)
	}
	if got != "10.201.41.3" {
		t.Errorf("ADD after space was freed got %q, want 10.201.41.3, the address of the failed ADDs", got)
	}
	if err := readIPAMStore(t, dataDir, n.name).consistent(); err != nil {
		t.Error(err)
	}

	for _, f := range fillers {
		os.Remove(f)
	}
	if got := fresh.add(ipamCall{cid: "a"}).IPs[0].Address.IP.String(); got != "10.201.42.2" {
		t.Errorf("fresh network after space was freed: %s, want 10.201.42.2", got)
	}
	if err := readIPAMStore(t, dataDir, fresh.name).consistent(); err != nil {
		t.Error(err)
	}
}

// TestIPAMDataDirTraversal: a relative dataDir (it would depend on the
// runtime's working directory) and network names that are not a single
// plain path component are config errors, and nothing is created anywhere.
func TestIPAMDataDirTraversal(t *testing.T) {
	n := newIPAMNet(t, "trav", rangesOf("10.201.44.0/24"))
	relative := []string{"relative/ipam", "../ipam", "."}
	cwds := make([]string, len(relative))
	for i := range cwds {
		cwds[i] = t.TempDir()
	}
	// The test's temp directories, n.dataDir and the cwds among them.
	parent := filepath.Dir(n.dataDir)
	parentBefore := nettest.Tree(t, parent)
	for i, dataDir := range relative {
		n.ipam["dataDir"] = dataDir
		cwd := cwds[i]
		cmd := n.command(ipamCall{cmd: "ADD", cid: "c1", ifName: "eth0"})
		cmd.Dir = cwd
		e, err := ipamError(outcome(cmd, cmd.Run()))
		if err != nil {
			t.Fatalf("dataDir %q: %v", dataDir, err)
		}
		if e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "absolute") {
			t.Errorf("dataDir %q: code %d %q, want %d asking for an absolute path", dataDir, e.Code, e.Msg, types.ErrInvalidNetworkConfig)
		}
		if entries, _ := os.ReadDir(cwd); len(entries) > 0 {
			t.Errorf("dataDir %q created %v in the working directory", dataDir, entries)
		}
	}
	n.ipam["dataDir"] = n.dataDir
	for _, name := range []string{"../escape", "a/b", "..", "/abs"} {
		n.name = name
		n.fails(ipamCall{cmd: "ADD", cid: "c1"}, types.ErrInvalidNetworkConfig)
	}
	if d := nettest.TreeChanges(parentBefore, nettest.Tree(t, parent)); len(d) > 0 {
		t.Errorf("rejected configs changed %s: %v", parent, d)
	}
}
