package nettest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Tree describes every entry under root without following symlinks: kind,
// mode, and the content of files or the target of symlinks, keyed by the
// path relative to root. Two equal Trees mean nothing was created, removed
// or written there. A missing root is an empty Tree.
func Tree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return filepath.SkipAll
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink -> " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %v", fi.Mode())
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %v %q", fi.Mode(), data)
		default:
			out[rel] = fmt.Sprintf("special %v", fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list %s: %v", root, err)
	}
	return out
}

// TreeChanges lists, sorted, what differs between two Trees.
func TreeChanges(before, after map[string]string) []string {
	var d []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			d = append(d, fmt.Sprintf("%s: removed (was %s)", k, v))
		} else if w != v {
			d = append(d, fmt.Sprintf("%s: %s -> %s", k, v, w))
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			d = append(d, fmt.Sprintf("%s: new %s", k, v))
		}
	}
	slices.Sort(d)
	return d
}
