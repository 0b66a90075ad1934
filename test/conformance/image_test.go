// Package conformance holds the tests of the conformance run's own parts
// (scripts/k8s): the e2e test image and the report. The run itself is
// `make conformance` (scripts/k8s/conformance.sh).
package conformance

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// toolsRootfs builds the e2e image's tools (scripts/k8s/images.sh
// tools-rootfs) into a temporary directory.
func toolsRootfs(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("needs root (chroot, network namespace)")
	}
	dir := t.TempDir()
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts/k8s/images.sh"), "tools-rootfs", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("images.sh tools-rootfs: %v\n%s", err, out)
	}
	return dir
}

// inImage runs `sh -c script` in the image's root, as a container would:
// a new network namespace with only lo up (the machine's own is never
// used), /dev and /proc mounted (in a new mount namespace). It returns stdout and
// stderr.
func inImage(t *testing.T, root, script string) (string, string, error) {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "--mount", "sh", "-c",
		`ip link set lo up && mkdir -p "$0/dev" && mount --rbind /dev "$0/dev" && mkdir -p "$0/proc" && mount -t proc proc "$0/proc" && exec chroot "$0" /bin/sh -c "$1"`, root, script)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestServiceReachabilityCommand is the regression test of the "Services
// should serve a basic endpoint from pods" failure: the e2e framework
// checks a Service with `sh -c "echo hostName | nc -v -t -w 2 HOST PORT"`
// in the agnhost image and wants the server's answer on stdout. With
// Debian's busybox as /bin/sh, the shell ran busybox's own nc applet
// (it prefers applets to PATH), which has no -v: every check failed with
// "nc: invalid option -- 'v'" until the 2-minute timeout. The image's sh
// must run OpenBSD nc from PATH, as upstream's alpine-based image does.
func TestServiceReachabilityCommand(t *testing.T) {
	root := toolsRootfs(t)
	stdout, stderr, err := inImage(t, root,
		`(printf 'HTTP/1.1 400 Bad Request\r\n\r\n' | nc -l 127.0.0.1 8080 >/tmp/server.out &) ; sleep 0.3; echo hostName | nc -v -t -w 2 127.0.0.1 8080`)
	if err != nil {
		t.Fatalf("the spec's reachability command failed: %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "400 Bad Request") {
		t.Errorf("stdout %q: want the server's answer (the spec passes only on non-empty stdout)", stdout)
	}
	if !strings.Contains(stderr, "succeeded") {
		t.Errorf("stderr %q: want OpenBSD nc's -v \"Connection ... succeeded!\"", stderr)
	}
}

// TestImageTools checks every other tool the sig-network specs exec in the
// agnhost and jessie-dnsutils images runs from PATH, not as a busybox
// applet or not at all.
func TestImageTools(t *testing.T) {
	root := toolsRootfs(t)
	for _, c := range []struct{ script, want string }{
		{"dig -v 2>&1", "DiG 9"},
		{"curl --version", "curl 7"},
		{"nc -h 2>&1", "OpenBSD netcat"},
		{"getent --version", "getent (Debian GLIBC"},
		{"hostname >/tmp/h; seq 1 3 | awk '{s+=$1} END {print \"sum\", s}'", "sum 6"},
	} {
		stdout, stderr, err := inImage(t, root, c.script)
		if err != nil || !strings.Contains(stdout, c.want) {
			t.Errorf("%s: err %v, stdout %q, stderr %q; want %q", c.script, err, stdout, stderr, c.want)
		}
	}
}
