package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheckCatchesWhatIsBuilt: in a throwaway git repository, each kind of
// breach is reported (a tracked ELF binary, an untracked one about to be
// added, a PE binary, a 1 MB + 1 file, an executable that is no script, a
// product file over 600 lines, a function over 80) and what is allowed is
// not (a script, a test file of any length, a long function whose length
// is a data table, a file of exactly 1 MB).
func TestCheckCatchesWhatIsBuilt(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write := func(name string, b []byte, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
	}
	lines := func(n int, line string) string { return strings.Repeat(line+"\n", n) }
	goFunc := func(name string, body int) string {
		return "func " + name + "() {\n" + lines(body, "\t_ = 1") + "}\n"
	}
	table := "func table() []int {\n\treturn []int{\n" + lines(200, "\t\t1,") + "\t}\n}\n"
	git("init", "-q")
	write("policy.test", append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 100)...), 0o755)
	write("tool.exe", []byte("MZ\x90\x00"), 0o644)
	write("bench/results/huge.json", make([]byte, MaxFileBytes+1), 0o644)
	write("bench/results/edge.json", make([]byte, MaxFileBytes), 0o644)
	write("scripts/run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755)
	write("scripts/lib.sh", []byte("# sourced\nx=1\n"), 0o755)
	write("routed/big.go", []byte("package routed\n\n"+lines(MaxFileLines, "// a line")), 0o644)
	write("routed/long.go", []byte("package routed\n\n"+goFunc("long", MaxFuncLines-1)+goFunc("fits", MaxFuncLines-2)+table), 0o644)
	write("routed/long_test.go", []byte("package routed\n\n"+goFunc("longTest", 500)), 0o644)
	git("add", ".")
	git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
	write("bench/report/report", []byte("\x7fELF\x02\x01\x01\x00"), 0o755) // built, not yet added
	files, err := trackedFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := Check(dir, files, false); len(got) != 5 {
		t.Errorf("nothing-built rules alone: %d breaches, want 5:\n%s", len(got), strings.Join(got, "\n"))
	}
	got := Check(dir, files, true)
	want := []string{
		"bench/report/report: an ELF binary",
		"bench/results/huge.json: 1048577 bytes",
		"policy.test: an ELF binary",
		"routed/big.go: 602 lines",
		"routed/long.go:3: func long: 81 lines",
		"scripts/lib.sh: executable and not a script",
		"tool.exe: a PE binary",
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
			t.Errorf("not reported: %q", w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("reported %d breaches, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
}
