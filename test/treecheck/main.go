// Command treecheck keeps the repository's house rules, which `make lint`
// (and so `make test`) runs:
//
//   - nothing built is tracked: no executable binary (ELF, Mach-O, PE, an
//     ar archive, or a file with the executable bit that is no script) and
//     no file over 1 MB;
//   - product code (plugins/, ipam/, routed/, internal/; not tests) has no
//     file over 600 lines and no function over 80 lines, data tables
//     (composite literals of several lines) not counted.
//
// Usage: go run ./test/treecheck [-built-only] [repository root, default
// "."] (-built-only: the first rule alone). It reads
// the files git tracks (plus untracked ones git does not ignore), prints
// each breach on a line and exits 1 when there is any.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Limits of the house rules.
const (
	MaxFileBytes = 1 << 20
	MaxFileLines = 600
	MaxFuncLines = 80
	// a composite literal of at least this many lines is a data table
	tableLines = 3
)

// productDirs hold the product code the length rules apply to.
var productDirs = []string{"plugins/", "ipam/", "routed/", "internal/"}

func main() {
	builtOnly := flag.Bool("built-only", false, "check only that nothing built is tracked")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	files, err := trackedFiles(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "treecheck:", err)
		os.Exit(2)
	}
	problems := Check(root, files, !*builtOnly)
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Printf("treecheck: %d breach(es) of the house rules (see test/treecheck)\n", len(problems))
		os.Exit(1)
	}
}

// trackedFiles lists what git tracks below root, and the untracked files
// it does not ignore (a file about to be added counts too).
func trackedFiles(root string) ([]string, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", root, err)
	}
	var files []string
	for f := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files, nil
}

// Check returns every breach among files (paths relative to root); the
// length rules only with lengths.
func Check(root string, files []string, lengths bool) []string {
	var out []string
	for _, f := range files {
		path := filepath.Join(root, f)
		st, err := os.Lstat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the working tree, a symlink
		}
		if st.Size() > MaxFileBytes {
			out = append(out, fmt.Sprintf("%s: %d bytes: no tracked file over 1 MB (nothing generated is committed)", f, st.Size()))
		}
		if why := binaryKind(path, st.Mode()); why != "" {
			out = append(out, fmt.Sprintf("%s: %s: nothing built is tracked", f, why))
		}
		if lengths && isProductGo(f) {
			out = append(out, lengthBreaches(f, path)...)
		}
	}
	return out
}

func isProductGo(f string) bool {
	if !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") {
		return false
	}
	for _, d := range productDirs {
		if strings.HasPrefix(f, d) {
			return true
		}
	}
	return false
}

// binaryKind says what kind of executable binary path is ("" if none).
func binaryKind(path string, mode fs.FileMode) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	head := make([]byte, 8)
	n, _ := f.Read(head)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return "an ELF binary"
	case bytes.HasPrefix(head, []byte{0xcf, 0xfa, 0xed, 0xfe}), bytes.HasPrefix(head, []byte{0xce, 0xfa, 0xed, 0xfe}),
		bytes.HasPrefix(head, []byte{0xca, 0xfe, 0xba, 0xbe}):
		return "a Mach-O binary"
	case bytes.HasPrefix(head, []byte("MZ")):
		return "a PE binary"
	case bytes.HasPrefix(head, []byte("!<arch>\n")):
		return "an ar archive"
	case mode&0o111 != 0 && !bytes.HasPrefix(head, []byte("#!")):
		return "executable and not a script"
	}
	return ""
}

// lengthBreaches checks one product Go file's length and its functions'.
func lengthBreaches(name, path string) []string {
	src, err := os.ReadFile(path)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", name, err)}
	}
	var out []string
	if n := bytes.Count(src, []byte("\n")); n > MaxFileLines {
		out = append(out, fmt.Sprintf("%s: %d lines: no product file over %d", name, n, MaxFileLines))
	}
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		return append(out, fmt.Sprintf("%s: %v", name, err))
	}
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		if n := FuncLines(fset, fn); n > MaxFuncLines {
			out = append(out, fmt.Sprintf("%s:%d: func %s: %d lines: no function over %d (data tables not counted)",
				name, fset.Position(fn.Pos()).Line, funcName(fn), n, MaxFuncLines))
		}
	}
	return out
}

// FuncLines counts fn's lines, from its signature to its closing brace,
// without the lines of the data tables in it (composite literals of
// tableLines lines or more).
func FuncLines(fset *token.FileSet, fn *ast.FuncDecl) int {
	first, last := fset.Position(fn.Pos()).Line, fset.Position(fn.End()).Line
	table := map[int]bool{}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		cl, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		a, b := fset.Position(cl.Lbrace).Line, fset.Position(cl.Rbrace).Line
		if b-a+1 >= tableLines {
			// the lines between the braces; the opening and closing
			// lines carry code too
			for l := a + 1; l < b; l++ {
				table[l] = true
			}
		}
		return false
	})
	return last - first + 1 - len(table)
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return "(" + id.Name + ")." + fn.Name.Name
	}
	return fn.Name.Name
}
