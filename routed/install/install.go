package install

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Binaries are the CNI plugins the installer puts into the plugin dir.
var Binaries = []string{"podnet", "podnet-ipam", "podnet-bridge"}

// DefaultConfName sorts early in /etc/cni/net.d, as CNI configs do.
const DefaultConfName = "10-podnet.conflist"

// tempPrefix and tempSuffix name the installer's temp files: the suffix
// keeps them out of the runtime's view (it only loads .conf, .conflist and
// .json) and lets a later run remove what a killed run left.
const (
	tempPrefix = ".podnet-install-"
	tempSuffix = ".tmp"
)

// Options tell Install where to copy from and to.
type Options struct {
	SrcDir   string   // where the built binaries are
	BinDir   string   // e.g. /opt/cni/bin
	ConfDir  string   // e.g. /etc/cni/net.d
	ConfName string   // default DefaultConfName
	Binaries []string // default Binaries
	Conf     Conf
	// Force overwrites a foreign config of the same name and installs even
	// when another config sorts first (the runtime keeps using that one).
	Force bool
	// Logf reports each step; nil is silent.
	Logf func(format string, args ...any)
	// Open opens a source binary; nil is os.Open. Tests inject failures here.
	Open func(path string) (io.ReadCloser, error)
}

// Result says what Install changed.
type Result struct {
	Changed   []string // files written
	Unchanged []string // files already identical
}

func (o *Options) defaults() {
	if o.ConfName == "" {
		o.ConfName = DefaultConfName
	}
	if o.Binaries == nil {
		o.Binaries = Binaries
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Open == nil {
		o.Open = func(p string) (io.ReadCloser, error) { return os.Open(p) }
	}
}

// Install copies the binaries and then writes the conflist. Every file is
// written to a temp file in its destination directory, fsynced, given its
// mode and renamed over the old one, so a reader (the runtime exec'ing a
// plugin) sees the old file or the new one, never a partial one. A file
// whose content is already right is not touched. The conflist comes last:
// the runtime considers the network ready once it appears, and by then
// every binary it names is in place.
func Install(o Options) (Result, error) {
	o.defaults()
	var res Result
	if strings.ContainsAny(o.ConfName, "/\\") || filepath.Ext(o.ConfName) != ".conflist" {
		return res, fmt.Errorf("conf name %q: want a file name ending in .conflist", o.ConfName)
	}
	conf, err := Render(o.Conf)
	if err != nil {
		return res, err
	}
	for _, d := range []string{o.BinDir, o.ConfDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return res, err
		}
		removeStaleTemps(d, o.Logf)
	}
	if err := checkConfDir(o.ConfDir, o.ConfName); err != nil {
		if !o.Force {
			return res, err
		}
		o.Logf("warning (--force): %v", err)
	}
	for _, b := range o.Binaries {
		dst := filepath.Join(o.BinDir, b)
		changed, err := installBinary(filepath.Join(o.SrcDir, b), dst, o.Open)
		if err != nil {
			return res, fmt.Errorf("install %s: %w", dst, err)
		}
		res.record(dst, changed, o.Logf)
	}
	dst := filepath.Join(o.ConfDir, o.ConfName)
	changed := false
	if !isRegular(dst) || !sameContent(dst, conf) {
		if err := writeAtomic(dst, bytes.NewReader(conf), 0o644, nil); err != nil {
			return res, fmt.Errorf("write %s: %w", dst, err)
		}
		changed = true
	}
	res.record(dst, changed, o.Logf)
	return res, nil
}

func (r *Result) record(path string, changed bool, logf func(string, ...any)) {
	if changed {
		r.Changed = append(r.Changed, path)
		logf("installed %s", path)
	} else {
		r.Unchanged = append(r.Unchanged, path)
		logf("unchanged %s", path)
	}
}

// Uninstall removes the conflist (first, so the runtime stops using the
// network before its binaries go) and the binaries. A foreign file under
// the conflist's name is left alone unless Force.
func Uninstall(o Options) error {
	o.defaults()
	conf := filepath.Join(o.ConfDir, o.ConfName)
	if _, err := os.Stat(conf); err == nil {
		if !IsPodnetConf(conf) && !o.Force {
			return fmt.Errorf("%w: %s is not a podnet config; not removing it (pass --force to remove it)", ErrForeignConf, conf)
		}
		if err := os.Remove(conf); err != nil {
			return err
		}
		o.Logf("removed %s", conf)
	}
	for _, b := range o.Binaries {
		p := filepath.Join(o.BinDir, b)
		if err := os.Remove(p); err == nil {
			o.Logf("removed %s", p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	removeStaleTemps(o.BinDir, o.Logf)
	removeStaleTemps(o.ConfDir, o.Logf)
	return nil
}

// installBinary copies src to dst unless dst already has src's content and
// mode 0755. It reports whether it wrote dst.
func installBinary(src, dst string, open func(string) (io.ReadCloser, error)) (bool, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return false, err
	}
	if fi.IsDir() {
		return false, fmt.Errorf("source %s is a directory", src)
	}
	var want []byte
	if fi.Mode().IsRegular() {
		// A regular file can be read twice: hash it first so an identical
		// destination is left alone without writing anything.
		if want, err = hashFile(src, open); err != nil {
			return false, err
		}
		if ok, _ := sameBinary(dst, want); ok {
			return false, nil
		}
	}
	// A stream (a pipe) is read once: copy it to the temp file and drop the
	// temp file when the destination turns out to be identical.
	r, err := open(src)
	if err != nil {
		return false, err
	}
	defer r.Close()
	identical := false
	err = writeAtomic(dst, r, 0o755, func(got []byte) error {
		if want != nil && !bytes.Equal(got, want) {
			return fmt.Errorf("source %s changed while it was copied", src)
		}
		if want == nil {
			if ok, _ := sameBinary(dst, got); ok {
				identical = true
				return errSkip
			}
		}
		return nil
	})
	if errors.Is(err, errSkip) {
		return false, nil
	}
	return !identical && err == nil, err
}

var errSkip = errors.New("destination already identical")

// sameBinary reports whether path is a regular file (not a symlink to
// one: the installed binary must not depend on a file elsewhere) with mode
// 0755 and SHA-256 sum.
func sameBinary(path string, sum []byte) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o755 {
		return false, err
	}
	got, err := hashFile(path, nil)
	if err != nil {
		return false, err
	}
	return bytes.Equal(got, sum), nil
}

func hashFile(path string, open func(string) (io.ReadCloser, error)) ([]byte, error) {
	if open == nil {
		open = func(p string) (io.ReadCloser, error) { return os.Open(p) }
	}
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return h.Sum(nil), nil
}

// isRegular reports whether path is a regular file itself, not a symlink.
func isRegular(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().IsRegular()
}

// writeAtomic writes r to a temp file next to dst, fsyncs it, sets mode,
// lets check veto it by the content's SHA-256, renames it to dst and
// fsyncs the directory. On any failure the temp file is removed and dst is
// untouched. Nothing is written through a symlink: the temp file is
// created exclusively (O_EXCL, a new random name each time) and rename
// replaces a symlink at dst instead of following it.
func writeAtomic(dst string, r io.Reader, mode os.FileMode, check func(sum []byte) error) (err error) {
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, tempPrefix+filepath.Base(dst)+"-*"+tempSuffix)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err = io.Copy(io.MultiWriter(tmp, h), r); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if check != nil {
		if err = check(h.Sum(nil)); err != nil {
			return err
		}
	}
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeStaleTemps deletes temp files a killed installer left in dir.
func removeStaleTemps(dir string, logf func(string, ...any)) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasPrefix(n, tempPrefix) && strings.HasSuffix(n, tempSuffix) {
			if os.Remove(filepath.Join(dir, n)) == nil {
				logf("removed leftover temp file %s", filepath.Join(dir, n))
			}
		}
	}
}
