package conformance

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// netpolSpecs lists the specs `make netpol` selects (scripts/k8s/
// conformance.sh SUITE=netpol: focus "[sig-network] Netpol ", label
// Feature:NetworkPolicy) from a dry run of the cached e2e.test, by their
// full names as Ginkgo's focus sees them.
func netpolSpecs(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot(t), "scripts/k8s/ensure-k8s.sh")).Output()
	if err != nil {
		t.Fatalf("ensure-k8s.sh: %v", err)
	}
	dir := t.TempDir()
	report := filepath.Join(dir, "all.json")
	cmd := exec.Command(filepath.Join(strings.TrimSpace(string(out)), "e2e.test"), "--kubeconfig=/dev/null", "--provider=skeleton",
		`--ginkgo.focus=\[sig-network\] Netpol `, "--ginkgo.label-filter=Feature:NetworkPolicy", "--ginkgo.dry-run",
		"--ginkgo.json-report="+report)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("e2e.test dry run: %v\n%s", err, b)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var suites []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
		}
	}
	if err := json.Unmarshal(b, &suites); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, su := range suites {
		for _, s := range su.SpecReports {
			if s.LeafNodeType == "It" && s.State == "passed" {
				names = append(names, strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " "))
			}
		}
	}
	return names
}

// rules reads a file of one regexp per line (the first tab-separated
// field), without comments and blank lines.
func rules(t *testing.T, name string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "test/conformance", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			continue
		}
		re, _, _ := strings.Cut(l, "\t")
		out = append(out, re)
	}
	return out
}

// TestNetpolSelection checks what `make netpol` and NETPOL=subset select
// against e2e.test v1.34.10's own spec list: the suite is 48 specs; the
// skips (netpol-skips.txt) are exactly the 3 SCTP-connectivity ones; and
// every line of netpol-subset.txt, as conformance.sh uses it (focus
// `\[sig-network\] Netpol (LINE)( \[|$)`), selects exactly one spec, none
// of them skipped: a line that went stale or matches the UDP twin of a
// TCP spec fails here instead of silently changing the subset.
func TestNetpolSelection(t *testing.T) {
	names := netpolSpecs(t)
	if len(names) != 48 {
		t.Errorf("the Netpol Feature:NetworkPolicy specs: got %d, want 48:\n%s", len(names), strings.Join(names, "\n"))
	}
	skips := rules(t, "netpol-skips.txt")
	skipped := map[string]bool{}
	for _, r := range skips {
		re := regexp.MustCompile(r)
		for _, n := range names {
			if re.MatchString(n) {
				skipped[n] = true
			}
		}
	}
	if len(skipped) != 3 {
		t.Errorf("netpol-skips.txt skips %d specs, want the 3 SCTPConnectivity ones: %v", len(skipped), skipped)
	}
	for n := range skipped {
		if !strings.Contains(n, "[Feature:SCTPConnectivity]") {
			t.Errorf("skipped but not an SCTP-connectivity spec: %s", n)
		}
	}
	subset := rules(t, "netpol-subset.txt")
	if len(subset) == 0 {
		t.Fatal("netpol-subset.txt selects nothing")
	}
	seen := map[string]bool{}
	for _, line := range subset {
		re := regexp.MustCompile(`\[sig-network\] Netpol (` + line + `)( \[|$)`)
		var got []string
		for _, n := range names {
			if re.MatchString(n) {
				got = append(got, n)
			}
		}
		if len(got) != 1 {
			t.Errorf("subset line %q selects %d specs, want 1: %v", line, len(got), got)
			continue
		}
		if skipped[got[0]] || seen[got[0]] {
			t.Errorf("subset line %q selects a skipped or already selected spec: %s", line, got[0])
		}
		seen[got[0]] = true
	}
}
