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
	"time"
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
	// a process the script left behind holding stdout or stderr must not
	// hang the test
	cmd.WaitDelay = 10 * time.Second
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

// rootfs builds one of the images' roots (scripts/k8s/images.sh MODE DIR)
// into a temporary directory.
func rootfs(t *testing.T, mode string) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Fatal("needs root (chroot, network namespace)")
	}
	dir := t.TempDir()
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts/k8s/images.sh"), mode, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("images.sh %s: %v\n%s", mode, err, out)
	}
	return dir
}

// inNetns runs script with sh in a new network namespace (only lo up) and
// mount namespace, with the image's root prepared as inImage does; the
// script runs the machine's tools, and `img 'CMD'` runs CMD with the
// image's /bin/sh inside its root (in the same netns, as a container of a
// pod whose other container is the machine's tools).
func inNetns(t *testing.T, root, script string) (string, string, error) {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "--mount", "sh", "-c",
		`set -e; ip link set lo up; mkdir -p "$0/dev" "$0/proc"; mount --rbind /dev "$0/dev"; mount -t proc proc "$0/proc"
img() { PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot "$0" /bin/sh -c "$1"; }
`+script, root)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// a process the script left behind holding stdout or stderr must not
	// hang the test
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestWgetTimeout runs the specs' wget commands in the image: `wget -q -O
// - -T 1 URL` (verifyServeHostnameServiceUp: "should be able to up and
// down services", "should work after the service has been recreated", ...)
// and `wget -T 5 -qO- URL`, also under `timeout`. Debian's busybox wget,
// built without FEATURE_WGET_TIMEOUT, dies of SIGSEGV on any -T (exit
// 139, nothing fetched), and busybox's timeout applet runs busybox's
// wget whatever PATH has.
func TestWgetTimeout(t *testing.T) {
	root := toolsRootfs(t)
	stdout, stderr, err := inImage(t, root, `mkdir -p /tmp/www && echo served-by-test >/tmp/www/index.html &&
busybox httpd -p 127.0.0.1:8080 -h /tmp/www && sleep 0.2
for c in 'wget -q -O - -T 1 http://127.0.0.1:8080/' 'wget -T 5 -qO- "http://127.0.0.1:8080/"' 'timeout 3 wget -q -O - -T 1 http://127.0.0.1:8080/'; do
	sh -c "$c"; echo "rc=$?"
done
wget -q -O - -T 1 http://127.0.0.1:1/; echo "closed rc=$?"`)
	if err != nil {
		t.Fatalf("%v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	if got := strings.Count(stdout, "served-by-test\nrc=0\n"); got != 3 {
		t.Errorf("want the page and exit 0 from each of the 3 wget commands, got %d:\nstdout: %s\nstderr: %s", got, stdout, stderr)
	}
	// a closed port: an error exit, not a crash (139) and not a success
	if !strings.Contains(stdout, "closed rc=") || strings.Contains(stdout, "closed rc=0") || strings.Contains(stdout, "closed rc=139") {
		t.Errorf("wget to a closed port: want a non-zero exit other than 139 (SIGSEGV):\nstdout: %s\nstderr: %s", stdout, stderr)
	}
}

// TestAgnhostCoreDNS checks the agnhost image has upstream's /coredns and
// that it serves: the DNS specs with a custom server ("should support
// configurable pod resolv.conf") run `/coredns -conf FILE` in agnhost and
// query it.
func TestAgnhostCoreDNS(t *testing.T) {
	root := rootfs(t, "agnhost-rootfs")
	stdout, stderr, err := inImage(t, root, `/coredns -version && mkdir -p /etc/coredns && cat >/etc/coredns/Corefile <<'C'
.:1053 {
    bind 127.0.0.1
    hosts {
        10.9.8.7 probe.podnet.test
    }
}
C
/coredns -conf /etc/coredns/Corefile >/tmp/coredns.log 2>&1 &
c=$!
trap 'kill $c' EXIT
for i in $(seq 50); do a=$(dig +short +time=1 +tries=1 @127.0.0.1 -p 1053 probe.podnet.test A 2>/dev/null) && [ -n "$a" ] && break; sleep 0.2; done
echo "answer=$a"`)
	if !strings.Contains(stdout, "CoreDNS-1.12.1") {
		t.Errorf("/coredns -version: want CoreDNS-1.12.1; err %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "answer=10.9.8.7") {
		t.Errorf("/coredns -conf: want the hosts record from dig; err %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
}

// TestDistrolessIptablesTools runs in the distroless-iptables stand-in
// what KubeProxy's "should set TCP CLOSE_WAIT timeout" spec execs in it
// (on the host network): `sleep 600` as its command, `test -f
// /proc/net/nf_conntrack`, `cat /proc/net/nf_conntrack | grep -m 1 -E
// '...dst=IP.*dport=PORT'`, `which conntrack`, `conntrack -L -f ipv4 -d
// IP`, and iptables (nft), ip6tables, ipset, nft, ip as upstream's image
// has them, against a connection the conntrack of the test's own netns
// tracks.
func TestDistrolessIptablesTools(t *testing.T) {
	root := rootfs(t, "iptables-rootfs")
	stdout, stderr, err := inNetns(t, root, `
img 'sleep 0.1 && test -f /proc/net/nf_conntrack && which conntrack'
# a rule that needs conntrack turns it on in this netns
img 'iptables -A OUTPUT -p tcp -m conntrack --ctstate NEW,ESTABLISHED -m comment --comment podnet-test -j ACCEPT && ip6tables -A OUTPUT -p tcp -j ACCEPT'
# a connection that stays open (-d: nc reads no stdin) until the end
nc -d -l 127.0.0.1 11302 >/dev/null 2>&1 &
srv=$!
trap 'kill $srv $cli 2>/dev/null' EXIT
sleep 0.3
nc -d 127.0.0.1 11302 >/dev/null 2>&1 &
cli=$!
sleep 0.5
img "echo proc: \$(cat /proc/net/nf_conntrack | grep -m 1 -E 'ESTABLISHED.*dst=127.0.0.1.*dport=11302' | wc -l)"
img "echo tool: \$(conntrack -L -f ipv4 -d 127.0.0.1 2>/dev/null | grep -m 1 'ESTABLISHED.*dport=11302' | wc -l)"
img 'iptables-save | grep -c podnet-test; ip6tables-save | grep -c "OUTPUT -p tcp"'
img 'ipset create podnet-test hash:ip && ipset add podnet-test 10.1.2.3 && ipset list podnet-test | grep -c 10.1.2.3'
img 'nft list tables; ip -o link show lo | grep -c LOOPBACK'
img 'head -1 /etc/passwd' || echo "no head, as upstream"
`)
	if err != nil {
		t.Fatalf("%v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	for _, want := range []string{"/usr/sbin/conntrack\n", "proc: 1\n", "tool: 1\n", "1\n1\n1\n", "table ip filter\n", "no head, as upstream"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("want %q in stdout:\n%s\nstderr: %s", want, stdout, stderr)
		}
	}
}

// TestAgnhostNetpolProbe runs in the agnhost image what upstream's Netpol
// specs (test/e2e/network/netpol, `make netpol`) run in it: each server
// container is `/agnhost serve-hostname --tcp|--udp --http=false --port
// P` (model.go), and every probe of the 81-pair matrix is `/agnhost
// connect HOST:PORT --timeout=1s --protocol=tcp|udp` (kubemanager.go),
// whose exit status is the verdict: 0 connected, 1 not. A probe to a
// port without a server must fail (that is what a denied pair looks
// like), and one whose packets are dropped (what a policy does) must
// fail within its timeout.
func TestAgnhostNetpolProbe(t *testing.T) {
	root := rootfs(t, "agnhost-rootfs")
	stdout, stderr, err := inNetns(t, root, `
# an address whose packets are dropped, as a policy drops them
ip addr add 10.99.0.1/32 dev lo
nft add table ip podnet-test
nft add chain ip podnet-test in '{ type filter hook input priority 0; }'
nft add rule ip podnet-test in ip daddr 10.99.0.1 drop
img '/agnhost serve-hostname --tcp --http=false --port 80' >/dev/null 2>&1 &
s1=$!
img '/agnhost serve-hostname --udp --http=false --port 81' >/dev/null 2>&1 &
s2=$!
trap 'kill $s1 $s2 2>/dev/null' EXIT
sleep 0.5
probe() { if img "/agnhost connect $1 --timeout=1s --protocol=$2" 2>/tmp/err; then echo "$1/$2 ok"; else echo "$1/$2 fail $(tr -d '\n' </tmp/err)"; fi; }
probe 127.0.0.1:80 tcp
probe 127.0.0.1:81 udp
probe 127.0.0.1:81 tcp
probe 127.0.0.1:80 udp
img '/agnhost serve-hostname --tcp --http=false --port 82' >/dev/null 2>&1 &
s3=$!
trap 'kill $s1 $s2 $s3 2>/dev/null' EXIT
sleep 0.5
probe 10.99.0.1:82 tcp
probe 10.99.0.1:81 udp
`)
	if err != nil {
		t.Fatalf("%v\nstdout: %s\nstderr: %s", err, stdout, stderr)
	}
	for _, want := range []string{
		"127.0.0.1:80/tcp ok\n",
		"127.0.0.1:81/udp ok\n",
		"127.0.0.1:81/tcp fail REFUSED\n",
		"127.0.0.1:80/udp fail REFUSED",
		"10.99.0.1:82/tcp fail TIMEOUT\n",
		"10.99.0.1:81/udp fail TIMEOUT",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("want %q in stdout:\n%s\nstderr: %s", want, stdout, stderr)
		}
	}
}
