// Command report turns the Ginkgo JSON reports of an upstream e2e.test run
// (a dry run listing every selected spec, and the real run) into the
// Markdown conformance report: which specs ran, passed, failed, and which
// were skipped and why.
//
//	report -dry-run all.json -run run.json -skips skips.txt \
//	    -title "..." -meta "k=v" ... > REPORT.md
//
// skips.txt holds "regexp<TAB>reason" lines: a spec of the dry run that
// matches none of the run's specs is reported with the reason of the first
// regexp that matches its name.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// suiteReport is the part of Ginkgo's types.Report that the report needs.
type suiteReport struct {
	SuiteDescription string
	RunTime          time.Duration
	SpecReports      []specReport
}

type specReport struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	LeafNodeType            string
	State                   string
	RunTime                 time.Duration
	// the spec's log (the Netpol specs log each wrong probe there)
	CapturedGinkgoWriterOutput string
	Failure                    *struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

func (s specReport) name() string {
	parts := append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText)
	return strings.TrimSpace(strings.Join(parts, " "))
}

type skipRule struct {
	re     *regexp.Regexp
	reason string
}

func main() {
	var meta multiFlag
	dry := flag.String("dry-run", "", "Ginkgo JSON report of the dry run (every selected spec)")
	run := flag.String("run", "", "Ginkgo JSON report of the run")
	skips := flag.String("skips", "", "file of \"regexp<TAB>reason\" lines")
	check := flag.String("check", "", "output of `cluster.sh check`, shown as is")
	title := flag.String("title", "Conformance report", "report title")
	selected := flag.String("selected", "every `[sig-network]` `[Conformance]` spec of the suite", "what the run selected, for the header")
	flag.Var(&meta, "meta", "\"key=value\" line for the header (repeatable)")
	flag.Parse()
	if err := write(os.Stdout, *title, *selected, meta, *dry, *run, *skips, *check); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func write(w io.Writer, title, selected string, meta []string, dryPath, runPath, skipsPath, checkPath string) error {
	all, err := specsOf(dryPath)
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	// a dry run reports the selected specs as passed, the others as skipped
	all = slices.DeleteFunc(all, func(s specReport) bool { return s.State == "skipped" })
	ran, err := specsOf(runPath)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	rules, err := readSkips(skipsPath)
	if err != nil {
		return fmt.Errorf("skips: %w", err)
	}
	byName := map[string]specReport{}
	for _, s := range ran {
		byName[s.name()] = s
	}
	var passed, failed, other []specReport
	for _, s := range ran {
		switch s.State {
		case "passed":
			passed = append(passed, s)
		case "failed", "panicked", "timedout", "interrupted", "aborted":
			failed = append(failed, s)
		case "skipped", "pending":
			other = append(other, s)
		}
	}
	type skipped struct{ name, reason string }
	var notRun []skipped
	var unexplained []string
	for _, s := range all {
		r, ok := byName[s.name()]
		if ok && r.State != "skipped" {
			continue
		}
		reason := ""
		for _, rule := range rules {
			if rule.re.MatchString(s.name()) {
				reason = rule.reason
				break
			}
		}
		if reason == "" {
			// a selected spec that did not run, and no line of the
			// skips file says why: the run is not what it claims
			unexplained = append(unexplained, s.name())
			reason = "not run, and no reason in the skips file"
			if ok && r.Failure != nil && r.Failure.Message != "" {
				reason = "skipped at run time (" + r.Failure.Message + "), and no reason in the skips file"
			}
		}
		notRun = append(notRun, skipped{s.name(), reason})
	}
	sortSpecs := func(l []specReport) { sort.Slice(l, func(i, j int) bool { return l[i].name() < l[j].name() }) }
	sortSpecs(passed)
	sortSpecs(failed)
	sort.Slice(notRun, func(i, j int) bool { return notRun[i].name < notRun[j].name })

	var total time.Duration
	for _, s := range ran {
		total += s.RunTime
	}
	fmt.Fprintf(w, "# %s\n\n", title)
	for _, m := range meta {
		k, v, _ := strings.Cut(m, "=")
		fmt.Fprintf(w, "- **%s:** %s\n", k, v)
	}
	fmt.Fprintf(w, "- **Selected** (%s): %d\n", selected, len(all))
	fmt.Fprintf(w, "- **Ran:** %d, **passed:** %d, **failed:** %d; **skipped:** %d; time in specs %s\n\n",
		len(passed)+len(failed), len(passed), len(failed), len(notRun), total.Round(time.Second))
	if checkPath != "" {
		b, err := os.ReadFile(checkPath)
		if err != nil {
			return fmt.Errorf("check: %w", err)
		}
		fmt.Fprintf(w, "## Cluster check (`scripts/k8s/cluster.sh check`)\n\n```\n%s\n```\n\n", strings.TrimSpace(string(b)))
	}
	if len(failed) > 0 {
		fmt.Fprintf(w, "## Failed\n\n| spec | time | failure |\n|---|---|---|\n")
		for _, s := range failed {
			msg := ""
			if s.Failure != nil {
				msg = strings.Join(strings.Fields(s.Failure.Message), " ")
				if len(msg) > 300 {
					msg = msg[:300] + "…"
				}
			}
			msg += wrongProbes(s.CapturedGinkgoWriterOutput)
			fmt.Fprintf(w, "| %s | %s | %s |\n", cell(s.name()), s.RunTime.Round(time.Second), cell(msg))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "## Passed\n\n| spec | time |\n|---|---|\n")
	for _, s := range passed {
		fmt.Fprintf(w, "| %s | %s |\n", cell(s.name()), s.RunTime.Round(100*time.Millisecond))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "## Skipped\n\n")
	if len(notRun) == 0 {
		fmt.Fprintf(w, "None.\n")
	} else {
		fmt.Fprintf(w, "| spec | why |\n|---|---|\n")
		for _, s := range notRun {
			fmt.Fprintf(w, "| %s | %s |\n", cell(s.name), cell(s.reason))
		}
	}
	if len(unexplained) > 0 {
		return fmt.Errorf("%d selected specs did not run and the skips file gives no reason (the report says how each was skipped): %s", len(unexplained), strings.Join(unexplained, "; "))
	}
	return nil
}

// The Netpol specs (test/e2e/network/netpol, probe.go) log each probe of
// the reachability matrix whose outcome was not the expected one.
const (
	probeAllowed = "Expected blocked pod connection was instead ALLOWED"
	probeBlocked = "Expected allowed pod connection was instead BLOCKED"
)

// wrongProbes says, for a Netpol spec's log, how many probes (of both of
// its tries) connected where the policy should have blocked them (too
// little enforcement) and how many were blocked where they should have
// connected (too much, or a broken network): "" when there are none.
func wrongProbes(log string) string {
	allowed, blocked := strings.Count(log, probeAllowed), strings.Count(log, probeBlocked)
	if allowed+blocked == 0 {
		return ""
	}
	return fmt.Sprintf(" (wrong probes: %d allowed that should be blocked, %d blocked that should be allowed)", allowed, blocked)
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// specsOf reads a Ginkgo JSON report and returns its It specs.
func specsOf(path string) ([]specReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites []suiteReport
	if err := json.Unmarshal(b, &suites); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []specReport
	for _, su := range suites {
		for _, s := range su.SpecReports {
			if s.LeafNodeType == "It" {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

func readSkips(path string) ([]skipRule, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rules []skipRule
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		re, reason, ok := strings.Cut(line, "\t")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want \"regexp<TAB>reason\"", path, n)
		}
		c, err := regexp.Compile(re)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		rules = append(rules, skipRule{c, strings.TrimSpace(reason)})
	}
	return rules, sc.Err()
}
