package cnp

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/network-policy-api/conformance/tests"
)

// moduleDir is where the go command keeps sigs.k8s.io/network-policy-api
// at the version go.mod pins.
func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api").Output()
	if err != nil {
		t.Fatalf("go list -m sigs.k8s.io/network-policy-api: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// sctpProbes reads the suite's source and returns every test (ShortName)
// and subtest ("ShortName/name") that probes SCTP: a PokeServer call with
// protocol "sctp". A test all of whose subtests probe SCTP is returned as
// the test.
func sctpProbes(t *testing.T, dir string) []string {
	files, err := filepath.Glob(filepath.Join(dir, "conformance", "tests", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("the suite's tests under %s: %v", dir, err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok || !isSel(lit.Type, "ConformanceTest") {
				return true
			}
			name, body := "", ast.Node(nil)
			for _, e := range lit.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				switch kv.Key.(*ast.Ident).Name {
				case "ShortName":
					name = strLit(kv.Value)
				case "Test":
					body = kv.Value
				}
			}
			out = append(out, testSCTPProbes(name, body)...)
			return false
		})
	}
	slices.Sort(out)
	return out
}

// testSCTPProbes: the subtests of one test (name, its Test func) that
// probe SCTP, or the test itself when all do.
func testSCTPProbes(name string, body ast.Node) []string {
	var sub []string
	all := 0
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || !isSel(call.Fun, "Run") || len(call.Args) != 2 {
			return true
		}
		all++
		if probesSCTP(call.Args[1]) {
			sub = append(sub, name+"/"+strLit(call.Args[0]))
		}
		return false
	})
	if all > 0 && len(sub) == all {
		return []string{name}
	}
	return sub
}

func probesSCTP(n ast.Node) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if ok && isSel(call.Fun, "PokeServer") {
			for _, a := range call.Args {
				found = found || strLit(a) == "sctp"
			}
		}
		return !found
	})
	return found
}

func isSel(e ast.Expr, name string) bool {
	s, ok := e.(*ast.SelectorExpr)
	return ok && s.Sel.Name == name
}

func strLit(e ast.Expr) string {
	b, ok := e.(*ast.BasicLit)
	if !ok || b.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(b.Value)
	if err != nil {
		return ""
	}
	return s
}

// TestSkipsAreTheSCTPProbes: cnp-skips.txt skips exactly the tests and
// subtests of the suite that probe SCTP (read from the suite's source at
// the version go.mod pins), each with the reason, and nothing else; and
// every test it names is in the suite.
func TestSkipsAreTheSCTPProbes(t *testing.T) {
	skips, err := ReadSkips(*skipsPath)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range skips {
		got = append(got, s.Test)
		if !strings.Contains(s.Reason, "SCTP") {
			t.Errorf("%s: reason %q does not say SCTP", s.Test, s.Reason)
		}
	}
	slices.Sort(got)
	want := sctpProbes(t, moduleDir(t))
	if len(want) == 0 {
		t.Fatal("found no SCTP probe in the suite's source: the parser is wrong")
	}
	if !slices.Equal(got, want) {
		t.Errorf("cnp-skips.txt skips\n  %s\nthe suite's SCTP probes are\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	names := map[string]bool{}
	for _, ct := range tests.ConformanceTests {
		names[ct.ShortName] = true
	}
	for _, s := range got {
		if top, _, _ := strings.Cut(s, "/"); !names[top] {
			t.Errorf("skip %s: no test %s in tests.ConformanceTests", s, top)
		}
	}
	t.Logf("%d tests in the suite; %d skips", len(tests.ConformanceTests), len(got))
	for _, s := range want {
		t.Log(s)
	}
}

// TestCNPSubset: each line of cnp-subset.txt (make test's selection) is a
// test of the suite, once, and not one that cnp-skips.txt skips whole.
func TestCNPSubset(t *testing.T) {
	data := readSubset(t)
	skips, err := ReadSkips(*skipsPath)
	if err != nil {
		t.Fatal(err)
	}
	skipped := map[string]bool{}
	for _, s := range skips {
		skipped[s.Test] = true
	}
	names := map[string]bool{}
	for _, ct := range tests.ConformanceTests {
		names[ct.ShortName] = true
	}
	seen := map[string]bool{}
	for _, l := range data {
		if !names[l] || skipped[l] || seen[l] {
			t.Errorf("cnp-subset.txt: %q is not a test of the suite, is skipped, or is listed twice", l)
		}
		seen[l] = true
	}
	if len(seen) == 0 {
		t.Fatal("cnp-subset.txt selects nothing")
	}
}

func readSubset(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(*skipsPath), "cnp-subset.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}
