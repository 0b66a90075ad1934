package cnp

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Skip is one line of test/conformance/cnp-skips.txt: a test of the suite
// (its ShortName) or one of its subtests ("ShortName/subtest name", as the
// test names it in t.Run), and why it does not run here.
type Skip struct {
	Test   string
	Reason string
}

// ReadSkips reads a skips file: "test<TAB>reason" lines; '#' lines and
// blank lines are comments.
func ReadSkips(path string) ([]Skip, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("skips: %w", err)
	}
	defer f.Close()
	var out []Skip
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		test, reason, ok := strings.Cut(line, "\t")
		if !ok || strings.TrimSpace(test) == "" || strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("%s:%d: want \"test<TAB>reason\", got %q", path, n, line)
		}
		out = append(out, Skip{Test: test, Reason: reason})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("skips %s: %w", path, err)
	}
	return out, nil
}

// GoTestName is the name `go test` gives a test or subtest named name:
// spaces become underscores (testing's rewrite of t.Run names).
func GoTestName(name string) string { return strings.ReplaceAll(name, " ", "_") }

// SkipPattern is the -test.skip pattern that leaves out exactly the skips
// under the top-level test top: one alternative per skip, each path
// element anchored.
func SkipPattern(top string, skips []Skip) string {
	var alts []string
	for _, s := range skips {
		elems := []string{"^" + regexp.QuoteMeta(top) + "$"}
		for _, e := range strings.Split(s.Test, "/") {
			elems = append(elems, "^"+regexp.QuoteMeta(GoTestName(e))+"$")
		}
		alts = append(alts, strings.Join(elems, "/"))
	}
	return strings.Join(alts, "|")
}
