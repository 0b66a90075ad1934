package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// spec is one Ginkgo spec report in JSON.
func spec(container, leaf, state string, runTime string) string {
	return `{"ContainerHierarchyTexts":["` + container + `"],"LeafNodeText":"` + leaf + `","LeafNodeType":"It","State":"` + state + `","RunTime":` + runTime +
		`,"Failure":{"Message":"service is not reachable | within 2m0s"}}`
}

func TestReport(t *testing.T) {
	dir := t.TempDir()
	// the dry run: three selected specs (passed) and one not selected (skipped)
	dry := writeFile(t, dir, "all.json", `[{"SuiteDescription":"Kubernetes e2e suite","SpecReports":[`+
		spec("[sig-network] Services", "should serve a basic endpoint from pods [Conformance]", "passed", "0")+","+
		spec("[sig-network] DNS", "should provide DNS for services [Conformance]", "passed", "0")+","+
		spec("[sig-network] HostPort", "validates no conflict [LinuxOnly] [Conformance]", "passed", "0")+","+
		spec("[sig-apps] Deployment", "should run [Conformance]", "skipped", "0")+","+
		`{"LeafNodeType":"BeforeSuite","State":"passed"}]}]`)
	run := writeFile(t, dir, "run.json", `[{"SuiteDescription":"Kubernetes e2e suite","SpecReports":[`+
		spec("[sig-network] Services", "should serve a basic endpoint from pods [Conformance]", "failed", "124000000000")+","+
		spec("[sig-network] DNS", "should provide DNS for services [Conformance]", "passed", "9000000000")+","+
		spec("[sig-network] HostPort", "validates no conflict [LinuxOnly] [Conformance]", "skipped", "0")+"]}]")
	skips := writeFile(t, dir, "skips.txt", "# comment\n\nHostPort\tneeds a reason\n")
	check := writeFile(t, dir, "check.txt", "check: all ✓\n")

	var b strings.Builder
	if err := write(&b, "T", "every `[sig-network]` `[Conformance]` spec of the suite", []string{"Kubernetes=v1.34.10"}, dry, run, skips, check); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"- **Kubernetes:** v1.34.10",
		"**Selected** (every `[sig-network]` `[Conformance]` spec of the suite): 3\n",
		"- **Ran:** 2, **passed:** 1, **failed:** 1; **skipped:** 1; time in specs 2m13s",
		"| [sig-network] Services should serve a basic endpoint from pods [Conformance] | 2m4s | service is not reachable \\| within 2m0s |",
		"| [sig-network] DNS should provide DNS for services [Conformance] | 9s |",
		"| [sig-network] HostPort validates no conflict [LinuxOnly] [Conformance] | needs a reason |",
		"check: all ✓",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "sig-apps") {
		t.Errorf("a spec the dry run did not select is in the report:\n%s", got)
	}
}

func TestReportBadSkips(t *testing.T) {
	dir := t.TempDir()
	empty := writeFile(t, dir, "empty.json", "[]")
	for _, line := range []string{"no tab here\n", "([\tbad regexp\n"} {
		skips := writeFile(t, dir, "skips.txt", line)
		var b strings.Builder
		if err := write(&b, "T", "x", nil, empty, empty, skips, ""); err == nil {
			t.Errorf("skips %q: no error", line)
		}
	}
	var b strings.Builder
	if err := write(&b, "T", "x", nil, filepath.Join(dir, "missing.json"), empty, "", ""); err == nil {
		t.Error("a missing dry-run report: no error")
	}
}

// TestReportNetpolProbes: a failed Netpol spec's row says how many probes
// were allowed that the policy blocks and how many blocked that it allows
// (from the spec's log), so a run tells missing enforcement from a broken
// network or harness.
func TestReportNetpolProbes(t *testing.T) {
	dir := t.TempDir()
	netpol := func(leaf, state, log string) string {
		return `{"ContainerHierarchyTexts":["[sig-network] Netpol","NetworkPolicy between server and client"],"LeafNodeText":"` + leaf +
			`","LeafNodeType":"It","State":"` + state + `","RunTime":1000000000,"CapturedGinkgoWriterOutput":` + log +
			`,"Failure":{"Message":"Had 3 wrong results in reachability matrix"}}`
	}
	allowed := "I1126 probe.go:106] " + probeAllowed + " --- run 'kubectl exec a'\\n"
	blocked := "I1126 probe.go:104] " + probeBlocked + " --- run 'kubectl exec b'\\n"
	dry := writeFile(t, dir, "all.json", `[{"SpecReports":[`+netpol("should deny", "passed", `""`)+","+netpol("should allow", "passed", `""`)+"]}]")
	run := writeFile(t, dir, "run.json", `[{"SpecReports":[`+
		netpol("should deny", "failed", `"`+allowed+allowed+"other line\\n"+allowed+`"`)+","+
		netpol("should allow", "failed", `"`+blocked+allowed+`"`)+"]}]")
	var b strings.Builder
	if err := write(&b, "T", "x", nil, dry, run, "", ""); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"should deny | 1s | Had 3 wrong results in reachability matrix (wrong probes: 3 allowed that should be blocked, 0 blocked that should be allowed) |",
		"should allow | 1s | Had 3 wrong results in reachability matrix (wrong probes: 1 allowed that should be blocked, 1 blocked that should be allowed) |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// TestReportUnexplainedSkip: a selected spec that skipped itself at run
// time (as the DualStack granular checks do when the framework does not
// know the node count) fails the report, which says how it was skipped; a
// skip the skips file explains does not.
func TestReportUnexplainedSkip(t *testing.T) {
	dir := t.TempDir()
	leaf := "should function for pod-Service: http"
	dry := writeFile(t, dir, "all.json", `[{"SpecReports":[`+spec("[sig-network] [Feature:IPv6DualStack] Granular Checks", leaf, "passed", "0")+`]}]`)
	run := writeFile(t, dir, "run.json", `[{"SpecReports":[{"ContainerHierarchyTexts":["[sig-network] [Feature:IPv6DualStack] Granular Checks"],"LeafNodeText":"`+leaf+
		`","LeafNodeType":"It","State":"skipped","RunTime":0,"Failure":{"Message":"Requires at least 2 nodes (not -1)"}}]}]`)
	var b strings.Builder
	err := write(&b, "T", "x", nil, dry, run, "", "")
	if err == nil || !strings.Contains(err.Error(), "1 selected specs did not run") {
		t.Fatalf("write: %v, want the unexplained skip refused", err)
	}
	if !strings.Contains(b.String(), "skipped at run time (Requires at least 2 nodes (not -1))") {
		t.Errorf("the report does not say how the spec was skipped:\n%s", b.String())
	}
	skips := writeFile(t, dir, "skips.txt", "Granular Checks\tneeds two nodes\n")
	b.Reset()
	if err := write(&b, "T", "x", nil, dry, run, skips, ""); err != nil {
		t.Fatalf("a skip the skips file explains: %v", err)
	}
}
