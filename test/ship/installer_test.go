package ship

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/podnet/podnet/routed/install"
	"github.com/podnet/podnet/test/nettest"
)

var plugins = []string{"podnet", "podnet-ipam", "podnet-bridge"}

// installCmd runs bin/podnet-install (what the install-cni init container
// runs) with the built binaries as source.
func installCmd(t *testing.T, wantOK bool, args ...string) string {
	t.Helper()
	bin := nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-bridge", "podnet-install")
	return run(t, wantOK, filepath.Join(bin, "podnet-install"), append([]string{"--src-dir=" + bin}, args...)...)
}

type fileState struct {
	ino   uint64
	mtime time.Time
	ctime syscall.Timespec
	size  int64
}

// snapshot records inode, mtime and ctime of every entry in dirs.
func snapshot(t *testing.T, dirs ...string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			fi, err := os.Lstat(filepath.Join(d, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			out[filepath.Join(d, e.Name())] = fileState{st.Ino, fi.ModTime(), st.Ctim, fi.Size()}
		}
	}
	return out
}

func TestInstallerScratchDirs(t *testing.T) {
	binSrc := nettest.BinDir(t, plugins...)
	dir := t.TempDir()
	binDir, confDir := filepath.Join(dir, "opt/cni/bin"), filepath.Join(dir, "etc/cni/net.d")
	// A foreign conflist that sorts after podnet's is fine: podnet wins.
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	later := filepath.Join(confDir, "99-loopback.conflist")
	if err := os.WriteFile(later, []byte(`{"cniVersion":"1.0.0","name":"lo","plugins":[{"type":"loopback"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}

	out := installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir)
	t.Logf("first run:\n%s", out)
	for _, b := range plugins {
		p := filepath.Join(binDir, b)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode %v, want 0755", p, fi.Mode())
		}
		if !bytes.Equal(readFile(t, p), readFile(t, binSrc, b)) {
			t.Errorf("%s differs from bin/%s", p, b)
		}
		// It runs: the plugin answers VERSION.
		cmd := exec.Command(p)
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		if v, err := cmd.Output(); err != nil || !strings.Contains(string(v), "1.0.0") {
			t.Errorf("%s VERSION: %v %s", p, err, v)
		}
	}
	conf := filepath.Join(confDir, install.DefaultConfName)
	list, err := libcni.ConfListFromFile(conf)
	if err != nil {
		t.Fatalf("libcni cannot load %s: %v", conf, err)
	}
	if list.Name != "podnet" || list.CNIVersion != "1.0.0" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "podnet" || list.Plugins[0].Network.IPAM.Type != "podnet-ipam" {
		t.Errorf("conflist %s", list.Bytes)
	}
	// With the ConfigMap's defaults it is the shipped conflist.
	if !jsonEqual(t, readFile(t, conf), readFile(t, repo(t), "conf", "10-podnet.conflist")) {
		t.Errorf("installed conflist differs from conf/10-podnet.conflist:\n%s", readFile(t, conf))
	}
	// libcni (as the runtime does) picks podnet's conflist first.
	files, err := libcni.ConfFiles(confDir, install.ConfExtensions)
	if err != nil || len(files) != 2 || files[0] != conf {
		t.Errorf("runtime order %v (%v), want %s first", files, err, conf)
	}

	// Second run: a no-op. No file is rewritten (inode, mtime, ctime), no
	// file appears or disappears.
	before := snapshot(t, binDir, confDir)
	out = installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir)
	if !strings.Contains(out, "0 file(s) written, 4 unchanged") {
		t.Errorf("second run output:\n%s", out)
	}
	if after := snapshot(t, binDir, confDir); !mapsEqual(before, after) {
		t.Errorf("second run changed files:\nbefore %v\nafter  %v", before, after)
	}

	// A changed binary is replaced by rename (new inode); the others stay.
	ipam := filepath.Join(binDir, "podnet-ipam")
	if err := os.WriteFile(ipam, []byte("#!/bin/sh\necho old\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, binDir, confDir)
	out = installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir)
	if !strings.Contains(out, "1 file(s) written, 3 unchanged") {
		t.Errorf("update run output:\n%s", out)
	}
	after := snapshot(t, binDir, confDir)
	for p, st := range before {
		if changed := after[p] != st; changed != (p == ipam) {
			t.Errorf("%s changed=%v", p, changed)
		}
	}
	if after[ipam].ino == before[ipam].ino {
		t.Errorf("%s rewritten in place, not replaced by rename", ipam)
	}
	if !bytes.Equal(readFile(t, ipam), readFile(t, binSrc, "podnet-ipam")) {
		t.Error("podnet-ipam not updated")
	}

	// A ConfigMap value reaches the conflist.
	installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir, "--mtu=1400", "--cni-version=1.1.0")
	list, err = libcni.ConfListFromFile(conf)
	if err != nil || list.CNIVersion != "1.1.0" || !strings.Contains(string(list.Plugins[0].Bytes), `"mtu":1400`) {
		t.Errorf("conflist after --mtu=1400 --cni-version=1.1.0: %v %s", err, readFile(t, conf))
	}

	// --uninstall removes podnet's files and leaves the foreign one.
	installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir, "--uninstall")
	left := snapshot(t, binDir, confDir)
	if len(left) != 1 || left[later] == (fileState{}) {
		t.Errorf("after --uninstall: %v, want only %s", left, later)
	}
}

func mapsEqual(a, b map[string]fileState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestInstallerRendersShippedConflists: every conflist in conf/ is what the
// installer writes for the matching ConfigMap values, and libcni loads it.
func TestInstallerRendersShippedConflists(t *testing.T) {
	for file, c := range map[string]install.Conf{
		"10-podnet.conflist":         {},
		"10-podnet-1.1.conflist":     {CNIVersion: "1.1.0"},
		"10-podnet-bridge.conflist":  {CNIVersion: "1.1.0", Plugin: "podnet-bridge"},
		"10-podnet-portmap.conflist": {Portmap: true},
		"10-podnet-dualstack.conflist": {ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"),
			netip.MustParsePrefix("fd00:10:244::/56")}},
	} {
		path := filepath.Join(repo(t), "conf", file)
		if _, err := libcni.ConfListFromFile(path); err != nil {
			t.Errorf("libcni cannot load conf/%s: %v", file, err)
		}
		got, err := install.Render(c)
		if err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(t, got, readFile(t, path)) {
			t.Errorf("installer output for %+v differs from conf/%s:\n%s", c, file, got)
		}
	}
	if v := readFile(t, repo(t), "conf", "10-podnet.conflist"); !bytes.Contains(v, []byte(`"cniVersion": "1.0.0"`)) {
		t.Errorf("conf/10-podnet.conflist is not cniVersion 1.0.0")
	}
	// the families of the cluster CIDRs give the range sets: an IPv6-only
	// cluster's pods get only an IPv6 address (usePodCidr is the node's
	// IPv4 PodCIDR)
	for _, c := range []struct {
		cidrs string
		want  []string
	}{
		{"", []string{"usePodCidr"}},
		{"10.244.0.0/16", []string{"usePodCidr"}},
		{"fd00:10:244::/56", []string{"usePodCidrIPv6"}},
		{"fd00:10:244::/56,10.244.0.0/16", []string{"usePodCidr", "usePodCidrIPv6"}},
	} {
		var conf install.Conf
		for _, f := range strings.Split(c.cidrs, ",") {
			if f != "" {
				conf.ClusterCIDRs = append(conf.ClusterCIDRs, netip.MustParsePrefix(f))
			}
		}
		out, err := install.Render(conf)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Plugins []struct {
				IPAM struct {
					Ranges [][]struct{ Subnet string }
				}
			}
		}
		if err := json.Unmarshal(out, &list); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rs := range list.Plugins[0].IPAM.Ranges {
			for _, r := range rs {
				got = append(got, r.Subnet)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("cluster CIDRs %q: range sets %v, want %v", c.cidrs, got, c.want)
		}
	}
	for _, bad := range []install.Conf{{MTU: 100}, {Plugin: "flannel"}, {CNIVersion: "2.0.0"}, {Subnet: "10.1.2.3"}, {StateDir: "relative"}} {
		if _, err := install.Render(bad); err == nil {
			t.Errorf("Render(%+v) accepted", bad)
		}
	}
}

// TestInstallerRefusesForeignConflist: a config that is not podnet's and
// would take priority (sorts first), or would be overwritten, stops the
// installer with an error naming it, before anything is installed.
func TestInstallerRefusesForeignConflist(t *testing.T) {
	foreign := `{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel","delegate":{"isDefaultGateway":true}}]}`
	for _, c := range []struct {
		name, file, want string
	}{
		{"sorts first", "05-flannel.conflist", "05-flannel.conflist sorts before 10-podnet.conflist"},
		{"sorts first .conf", "00-calico.conf", "00-calico.conf sorts before 10-podnet.conflist"},
		{"same name", "10-podnet.conflist", "10-podnet.conflist exists and is not a podnet config; refusing to overwrite it"},
		{"unparseable first", "01-broken.json", "01-broken.json sorts before"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			binDir, confDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
			if err := os.MkdirAll(confDir, 0o755); err != nil {
				t.Fatal(err)
			}
			content := foreign
			if strings.HasSuffix(c.file, ".json") {
				content = "{ not json"
			}
			fp := filepath.Join(confDir, c.file)
			if err := os.WriteFile(fp, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			out := installCmd(t, false, "--bin-dir="+binDir, "--conf-dir="+confDir)
			if !strings.Contains(out, c.want) || !strings.Contains(out, "--force") {
				t.Errorf("error does not name the file and the way out:\n%s", out)
			}
			if entries, _ := os.ReadDir(binDir); len(entries) != 0 {
				t.Errorf("refused install still wrote %d file(s) into %s", len(entries), binDir)
			}
			if string(readFile(t, fp)) != content {
				t.Errorf("%s was modified", fp)
			}
			if c.file != install.DefaultConfName {
				if _, err := os.Stat(filepath.Join(confDir, install.DefaultConfName)); err == nil {
					t.Error("podnet's conflist written although refused")
				}
			}
			// --force installs, and says which file still wins.
			out = installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir, "--force")
			if !strings.Contains(out, "warning (--force)") || !strings.Contains(out, c.file) {
				t.Errorf("--force output:\n%s", out)
			}
			if !install.IsPodnetConf(filepath.Join(confDir, install.DefaultConfName)) {
				t.Error("--force did not install podnet's conflist")
			}
		})
	}
}

// failAfter is a source reader that fails after n bytes: a copy cut short.
type failAfter struct {
	r io.ReadCloser
	n int
}

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("injected read error")
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

func (f *failAfter) Close() error { return f.r.Close() }

// TestInstallerInterruptedCopy: a copy that fails half-way leaves the old
// binary in place, whole, and no temp file; and the conflist is not written
// (it comes last).
func TestInstallerInterruptedCopy(t *testing.T) {
	binSrc := nettest.BinDir(t, plugins...)
	dir := t.TempDir()
	binDir, confDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	old := []byte("#!/bin/sh\necho old podnet\n")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "podnet-ipam"), old, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := install.Options{SrcDir: binSrc, BinDir: binDir, ConfDir: confDir, Logf: t.Logf,
		Open: func(p string) (io.ReadCloser, error) {
			f, err := os.Open(p)
			if err != nil || filepath.Base(p) != "podnet-ipam" {
				return f, err
			}
			return &failAfter{r: f, n: 1 << 20}, nil
		}}
	_, err := install.Install(opts)
	if err == nil || !strings.Contains(err.Error(), "injected read error") {
		t.Fatalf("Install with a failing source: %v", err)
	}
	if got := readFile(t, binDir, "podnet-ipam"); !bytes.Equal(got, old) {
		t.Errorf("podnet-ipam is %d bytes after the failed copy, want the old %d", len(got), len(old))
	}
	entries, _ := os.ReadDir(binDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"podnet", "podnet-ipam"}) {
		t.Errorf("bin dir after failed copy: %v, want [podnet podnet-ipam] (no temp file)", names)
	}
	if _, err := os.Stat(filepath.Join(confDir, install.DefaultConfName)); err == nil {
		t.Error("conflist written although a binary failed")
	}
	opts.Open = nil
	if _, err := install.Install(opts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, binDir, "podnet-ipam"), readFile(t, binSrc, "podnet-ipam")) {
		t.Error("retry did not install podnet-ipam")
	}
}

// TestInstallerKilledMidCopy: podnet-install is SIGKILLed while it copies
// a binary (its source is a pipe the test feeds half-way). The old binary
// is still whole, the leftover temp file has a name no runtime loads, the
// conflist is not there; the next run cleans up and installs.
func TestInstallerKilledMidCopy(t *testing.T) {
	bin := nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-bridge", "podnet-install")
	dir := t.TempDir()
	src, binDir, confDir := filepath.Join(dir, "src"), filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	for _, d := range []string{src, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fifo := filepath.Join(src, "podnet")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"podnet-ipam", "podnet-bridge"} {
		if err := os.Symlink(filepath.Join(bin, b), filepath.Join(src, b)); err != nil {
			t.Fatal(err)
		}
	}
	old := []byte("#!/bin/sh\necho old podnet\n")
	if err := os.WriteFile(filepath.Join(binDir, "podnet"), old, 0o755); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(filepath.Join(bin, "podnet-install"), "--src-dir="+src, "--bin-dir="+binDir, "--conf-dir="+confDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	opened := make(chan *os.File, 1)
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0) // blocks until the installer reads
		if err != nil {
			t.Error(err)
			w = nil
		}
		opened <- w
	}()
	var w *os.File
	select {
	case w = <-opened:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("installer never opened its source:\n%s", stderr.String())
	}
	if w == nil {
		t.FailNow()
	}
	half := readFile(t, bin, "podnet")
	half = half[:len(half)/2]
	if _, err := w.Write(half); err != nil {
		t.Fatal(err)
	}
	// Wait until the temp file holds everything written so far: the
	// installer is in the middle of the copy.
	var tmp string
	deadline := time.Now().Add(20 * time.Second)
	for tmp == "" {
		entries, _ := os.ReadDir(binDir)
		for _, e := range entries {
			if fi, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), ".podnet-install-podnet-") && fi.Size() == int64(len(half)) {
				tmp = e.Name()
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("no temp file with %d bytes in %s: %v", len(half), binDir, entries)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	w.Close()

	if got := readFile(t, binDir, "podnet"); !bytes.Equal(got, old) {
		t.Fatalf("after SIGKILL mid-copy %s/podnet is %d bytes, want the old whole %d", binDir, len(got), len(old))
	}
	if _, err := os.Stat(filepath.Join(confDir, install.DefaultConfName)); err == nil {
		t.Error("conflist present although the installer was killed before it")
	}
	if ext := filepath.Ext(tmp); slices.Contains(install.ConfExtensions, ext) || !strings.HasPrefix(tmp, ".") {
		t.Errorf("leftover temp file %q could be picked up", tmp)
	}
	t.Logf("killed mid-copy; leftover %s (%d bytes), podnet still the old %d bytes", tmp, len(half), len(old))

	out := installCmd(t, true, "--bin-dir="+binDir, "--conf-dir="+confDir)
	if !strings.Contains(out, "removed leftover temp file") {
		t.Errorf("next run did not clean up %s:\n%s", tmp, out)
	}
	entries, _ := os.ReadDir(binDir)
	if len(entries) != 3 {
		t.Errorf("bin dir after the next run: %v", entries)
	}
	if !bytes.Equal(readFile(t, binDir, "podnet"), readFile(t, bin, "podnet")) {
		t.Error("next run did not install podnet")
	}
	if _, err := libcni.ConfListFromFile(filepath.Join(confDir, install.DefaultConfName)); err != nil {
		t.Error(err)
	}
}
