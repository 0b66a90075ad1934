package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// outsideState records every entry of dir (not following symlinks): mode,
// inode, mtime and content, so any create, write or chmod shows.
func outsideState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v ino %d mtime %v ctime %v", fi.Mode(), st.Ino, fi.ModTime().UnixNano(), st.Ctim)
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %q", data)
		}
		out[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInstallSymlinkedTargets plants symlinks pointing outside the target
// directories at the binaries' and the conflist's names (to a file with
// the very content the installer would write, to a different file, and
// dangling) and at names of the installer's temp files. Install must
// leave a regular file of its own at every target name and write, create
// or change nothing outside.
func TestInstallSymlinkedTargets(t *testing.T) {
	for _, target := range []string{"identical", "different", "dangling"} {
		t.Run(target, func(t *testing.T) {
			root := t.TempDir()
			src, binDir, confDir, outside := filepath.Join(root, "src"), filepath.Join(root, "bin"), filepath.Join(root, "net.d"), filepath.Join(root, "outside")
			for _, d := range []string{src, binDir, confDir, outside} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			want := map[string][]byte{}
			for _, b := range Binaries {
				want[filepath.Join(binDir, b)] = []byte("#!/bin/true " + b + "\n")
				if err := os.WriteFile(filepath.Join(src, b), want[filepath.Join(binDir, b)], 0o755); err != nil {
					t.Fatal(err)
				}
			}
			conf, err := Render(Conf{})
			if err != nil {
				t.Fatal(err)
			}
			want[filepath.Join(confDir, DefaultConfName)] = conf
			for dst, content := range want {
				victim := filepath.Join(outside, filepath.Base(dst))
				switch target {
				case "identical":
					mode := os.FileMode(0o755)
					if dst == filepath.Join(confDir, DefaultConfName) {
						mode = 0o644
					}
					if err := os.WriteFile(victim, content, mode); err != nil {
						t.Fatal(err)
					}
				case "different":
					if err := os.WriteFile(victim, []byte("precious\n"), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Symlink(victim, dst); err != nil {
					t.Fatal(err)
				}
				// Temp-file names a killed run could have left.
				tmp := filepath.Join(filepath.Dir(dst), tempPrefix+filepath.Base(dst)+"-1"+tempSuffix)
				if err := os.Symlink(victim+".tmp", tmp); err != nil {
					t.Fatal(err)
				}
			}
			before := outsideState(t, outside)

			opts := Options{SrcDir: src, BinDir: binDir, ConfDir: confDir}
			if target != "identical" {
				// A conflist name that does not lead to a podnet config is
				// a foreign config: refused, unless forced.
				if _, err := Install(opts); !errors.Is(err, ErrForeignConf) {
					t.Fatalf("Install over a symlink to a foreign conflist: %v, want ErrForeignConf", err)
				}
				opts.Force = true
			}
			if _, err := Install(opts); err != nil {
				t.Fatal(err)
			}
			for dst, content := range want {
				fi, err := os.Lstat(dst)
				if err != nil || !fi.Mode().IsRegular() {
					t.Errorf("%s after Install: %v, %v; want a regular file", dst, fi, err)
					continue
				}
				if got, _ := os.ReadFile(dst); !bytes.Equal(got, content) {
					t.Errorf("%s: content %q, want %q", dst, got, content)
				}
			}
			after := outsideState(t, outside)
			for p, s := range after {
				if before[p] != s {
					t.Errorf("Install changed %s outside the target directories: %s -> %s", p, before[p], s)
				}
			}
			for p := range before {
				if _, ok := after[p]; !ok {
					t.Errorf("Install removed %s outside the target directories", p)
				}
			}
			// A second run finds everything in place and writes nothing.
			res, err := Install(Options{SrcDir: src, BinDir: binDir, ConfDir: confDir})
			if err != nil || len(res.Changed) != 0 {
				t.Errorf("second Install: changed %v, %v; want nothing changed", res.Changed, err)
			}
		})
	}
}
