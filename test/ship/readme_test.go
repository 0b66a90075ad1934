package ship

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/podnet/podnet/test/nettest"
)

// The walk-through lives in the operator's guide, conf/README.md, which
// the front-door README.md links to.
const (
	walkthroughDoc     = "conf/README.md"
	walkthroughHeading = "## Without Kubernetes: `scripts/install.sh` and cnitool"
)

// readmeWalkthrough returns the first ```sh block after the walk-through's
// heading in conf/README.md, after checking that README.md points there.
func readmeWalkthrough(t *testing.T) string {
	t.Helper()
	if front := string(readFile(t, repo(t), "README.md")); !strings.Contains(front, "("+walkthroughDoc+"#without-kubernetes-scriptsinstallsh-and-cnitool)") {
		t.Fatalf("README.md does not link to the walk-through in %s", walkthroughDoc)
	}
	readme := string(readFile(t, repo(t), walkthroughDoc))
	i := strings.Index(readme, "\n"+walkthroughHeading+"\n")
	if i < 0 {
		t.Fatalf("%s has no %q section", walkthroughDoc, walkthroughHeading)
	}
	m := regexp.MustCompile("(?s)\n```sh\n(.*?)\n```\n").FindStringSubmatch(readme[i:])
	if m == nil {
		t.Fatal("no ```sh block after the walk-through heading")
	}
	return m[1]
}

// TestReadmeInstallWalkthrough runs the operator guide's scripts/install.sh +
// cnitool walk-through as bash, with nothing changed but the host paths
// (/opt/cni/bin, /etc/cni/net.d, /run/podnet → scratch dirs) and the
// namespace names (unique per run).
func TestReadmeInstallWalkthrough(t *testing.T) {
	nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-bridge", "podnet-install")
	nettest.RefToolsDir(t) // install-cni-tools.sh in the block uses PODNET_CNI_TOOLS
	block := readmeWalkthrough(t)
	for _, must := range []string{"scripts/install.sh", "cnitool", "--uninstall", "ip netns add demo-node", "cni add podnet"} {
		if !strings.Contains(block, must) {
			t.Fatalf("walk-through lacks %q:\n%s", must, block)
		}
	}

	dir := t.TempDir()
	nodeNS := fmt.Sprintf("ship-node-%d", os.Getpid())
	podNS := fmt.Sprintf("ship-pod-%d", os.Getpid())
	script := strings.NewReplacer(
		"/opt/cni/bin", filepath.Join(dir, "opt/cni/bin"),
		"/etc/cni/net.d", filepath.Join(dir, "etc/cni/net.d"),
		"/run/podnet", filepath.Join(dir, "run/podnet"),
		"demo-node", nodeNS,
		"demo-pod", podNS,
	).Replace(block)
	t.Cleanup(func() {
		for _, n := range []string{podNS, nodeNS} {
			_ = exec.Command("ip", "netns", "del", n).Run()
		}
	})

	cmd := exec.Command("bash", "-euxo", "pipefail", "-c", script)
	cmd.Dir = repo(t)
	out, err := cmd.CombinedOutput()
	t.Logf("walk-through output:\n%s", out)
	if err != nil {
		t.Fatalf("README walk-through failed: %v", err)
	}
	for _, want := range []string{
		`"subnet": "10.244.1.0/24"`,            // the conflist it wrote
		"done: 0 file(s) written, 4 unchanged", // the second install.sh
		`"10.244.1.2/32"`,                      // cnitool add's result
		"10.244.1.2 dev pn",                    // the host route, proto 77
		"1 packets transmitted, 1 received",    // ping
		"removed " + filepath.Join(dir, "etc/cni/net.d/10-podnet.conflist"), // --uninstall
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("walk-through output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^10\.244\.1\.2$`).Match(out) {
		t.Error("the IPAM store listing does not show 10.244.1.2")
	}
	// --uninstall left no podnet file behind; the pod's reservation was
	// released by DEL.
	for _, d := range []string{"opt/cni/bin", "etc/cni/net.d", "run/podnet/ipam/podnet/ips"} {
		if entries, err := os.ReadDir(filepath.Join(dir, d)); err != nil || len(entries) != 0 {
			t.Errorf("%s after the walk-through: %v %v", d, entries, err)
		}
	}
}
