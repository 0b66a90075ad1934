// Command report writes the Markdown report of a run of upstream's
// ClusterNetworkPolicy conformance suite (test/cnp, `make cnp`) from the
// run's `go test -json` events and the skips file: every test of the suite
// and each of its subtests, passed, failed or skipped with the reason,
// totals, versions. It exits 1 when a selected test failed or did not run
// without a reason.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	cnp "github.com/podnet/podnet/test/cnp"
	"sigs.k8s.io/network-policy-api/conformance/tests"
)

// event is one line of test2json's output.
type event struct {
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// result is what the run says about one test or subtest.
type result struct {
	action  string // pass, fail, skip; "" when it did not end
	elapsed float64
	output  []string
}

type metas []string

func (m *metas) String() string     { return strings.Join(*m, "; ") }
func (m *metas) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	runPath := flag.String("run", "", "the run's go test -json events")
	skipsPath := flag.String("skips", "", "test/conformance/cnp-skips.txt")
	selected := flag.String("selected", "every test", "what the run selected, for the header")
	sel := flag.String("select", "", "the tests selected: a regexp of ShortNames (empty: all)")
	title := flag.String("title", "ClusterNetworkPolicy conformance on podnet", "the report's title")
	var meta metas
	flag.Var(&meta, "meta", "key=value line for the header (repeatable)")
	flag.Parse()
	if err := run(os.Stdout, *runPath, *skipsPath, *sel, *title, *selected, meta); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

const top = "TestClusterNetworkPolicy/"

// readRun reads the events: each test's result under the top test, by
// its name as the suite gives it (ShortName or ShortName/subtest).
func readRun(path string) (map[string]*result, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("run: %w", err)
	}
	defer f.Close()
	res := map[string]*result{}
	var topOut []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a line that is not an event (go tool's own)
		}
		if !strings.HasPrefix(e.Test, top) {
			if e.Action == "output" {
				topOut = append(topOut, strings.TrimRight(e.Output, "\n"))
			}
			continue
		}
		name := strings.TrimPrefix(e.Test, top)
		r := res[name]
		if r == nil {
			r = &result{}
			res[name] = r
		}
		switch e.Action {
		case "pass", "fail", "skip":
			r.action, r.elapsed = e.Action, e.Elapsed
		case "output":
			r.output = append(r.output, strings.TrimRight(e.Output, "\n"))
		}
	}
	return res, topOut, sc.Err()
}

var (
	allowedWrong = regexp.MustCompile(`Expected connection to fail .* but instead it successfully connected`)
	blockedWrong = regexp.MustCompile(`Expected connection to succeed .* but instead it miserably failed`)
)

// why: a failed test's reason from its output: how many probes connected
// that the policies block (missing enforcement) and how many were blocked
// that should connect (over-enforcement, the network or the harness), or
// its first error line.
func why(r *result) string {
	a, b := 0, 0
	for _, l := range r.output {
		if allowedWrong.MatchString(l) {
			a++
		}
		if blockedWrong.MatchString(l) {
			b++
		}
	}
	if a+b > 0 {
		return fmt.Sprintf("%d probe attempts connected that the policies block, %d blocked that should connect", a, b)
	}
	for _, l := range r.output {
		if strings.Contains(l, "Error") || strings.Contains(l, "error") {
			return strings.TrimSpace(l)
		}
	}
	return "failed (see the run's log)"
}

func run(w io.Writer, runPath, skipsPath, sel, title, selected string, meta []string) error {
	res, topOut, err := readRun(runPath)
	if err != nil {
		return err
	}
	skips, err := cnp.ReadSkips(skipsPath)
	if err != nil {
		return err
	}
	reason := map[string]string{}
	for _, s := range skips {
		reason[cnp.GoTestName(s.Test)] = s.Reason
	}
	selRE, err := regexp.Compile("^(" + sel + ")$")
	if err != nil {
		return fmt.Errorf("-select: %w", err)
	}
	rows, c := table(res, reason, selRE, sel == "")
	fmt.Fprintf(w, "# %s\n\n", title)
	fmt.Fprintf(w, "- **Date**: %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "- **Suite**: `sigs.k8s.io/network-policy-api/conformance` v0.3.0 (`tests.ConformanceTests`: %d tests), profile `ClusterNetworkPolicy`, every feature (standard and experimental: `ClusterNetworkPolicy`, `ClusterNetworkPolicyNamedPorts`, `ClusterNetworkPolicyEgressNodePeers`), run by `test/cnp`\n", len(tests.ConformanceTests))
	fmt.Fprintf(w, "- **Selected**: %s\n", selected)
	for _, m := range meta {
		k, v, _ := strings.Cut(m, "=")
		fmt.Fprintf(w, "- **%s**: %s\n", k, v)
	}
	fmt.Fprintf(w, "\n## Totals\n\n| | passed | failed | skipped (reason below) | not run |\n| --- | --- | --- | --- | --- |\n")
	fmt.Fprintf(w, "| tests | %d | %d | %d | %d |\n| subtests | %d | %d | %d | %d |\n\n", c[0][0], c[0][1], c[0][2], c[0][3], c[1][0], c[1][1], c[1][2], c[1][3])
	fmt.Fprintf(w, "A test is skipped whole when each of its subtests probes SCTP; a subtest is skipped when it probes SCTP (`test/conformance/cnp-skips.txt`, checked against the suite's source by `TestSkipsAreTheSCTPProbes`).\n\n")
	fmt.Fprintf(w, "## Results\n\n| test | result | time | notes |\n| --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	if res[""] == nil && len(res) == 0 {
		fmt.Fprintf(w, "\nThe suite did not start a test; its output:\n\n```\n%s\n```\n", strings.Join(lastLines(topOut, 30), "\n"))
	}
	if c[0][1]+c[1][1]+c[0][3]+c[1][3] > 0 {
		return fmt.Errorf("%d tests and %d subtests failed, %d and %d did not run", c[0][1], c[1][1], c[0][3], c[1][3])
	}
	return nil
}

func lastLines(l []string, n int) []string {
	if len(l) > n {
		return l[len(l)-n:]
	}
	return l
}
