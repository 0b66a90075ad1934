// Package sysctl sets kernel settings through a /proc/sys tree, writing
// only those whose value differs: podnet-routed's dataplane and policy
// engine, and podnet-install's node preparation, share it.
package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// DefaultRoot is the kernel's sysctl tree of the calling thread's netns.
const DefaultRoot = "/proc/sys"

// Setting is one kernel setting: Name is its path under /proc/sys
// ("net/ipv4/ip_forward").
type Setting struct {
	Name, Value string
	// IPv6Only: the setting guards IPv6 and holds trivially on a kernel
	// without IPv6 (no net/ipv6 in the tree): nothing to set then.
	IPv6Only bool
}

// DisplayName is the setting's name as sysctl(8) prints it
// ("net.ipv4.ip_forward"; a device name keeps its dots).
func (s Setting) DisplayName() string { return strings.ReplaceAll(s.Name, "/", ".") }

// Error is a setting that could not be set.
type Error struct {
	Setting Setting
	Err     error
}

func (e Error) Error() string {
	return fmt.Sprintf("set %s=%s: %v", e.Setting.DisplayName(), e.Setting.Value, e.Err) // Err names the file
}

func (e Error) Unwrap() error { return e.Err }

// Writer sets sysctls through a /proc/sys tree: the netns's own (Root ""
// is DefaultRoot), or the host's mounted elsewhere (podnet-install
// prepare-node). It reads each value first and writes only a difference,
// so settings that already hold need no write access.
type Writer struct {
	Root string
	Log  *slog.Logger // each write is logged; nil is silent
}

// Write sets every setting of s, going on past a failure, and returns the
// failures joined.
func (w Writer) Write(s []Setting) error {
	_, failed := w.Set(s)
	errs := make([]error, len(failed))
	for i, f := range failed {
		errs[i] = f
	}
	return errors.Join(errs...)
}

// Set sets every setting of s, going on past a failure: it returns those
// it changed (their value differed) and one error per setting it could
// not set.
func (w Writer) Set(s []Setting) (changed []Setting, failed []Error) {
	for _, c := range s {
		wrote, err := w.set(c)
		switch {
		case err != nil:
			failed = append(failed, Error{Setting: c, Err: err})
		case wrote:
			changed = append(changed, c)
		}
	}
	return changed, failed
}

func (w Writer) set(c Setting) (wrote bool, err error) {
	root := w.Root
	if root == "" {
		root = DefaultRoot
	}
	p := filepath.Join(root, c.Name)
	cur, err := os.ReadFile(p)
	if err == nil && strings.TrimSpace(string(cur)) == c.Value {
		return false, nil
	}
	if c.IPv6Only && errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(root, "net/ipv6")); errors.Is(err, fs.ErrNotExist) {
			return false, nil // no IPv6 in this kernel
		}
	}
	if err := os.WriteFile(p, []byte(c.Value), 0o644); err != nil {
		return false, err // names the file
	}
	if w.Log != nil {
		w.Log.Info("sysctl set", "name", c.DisplayName(), "value", c.Value)
	}
	return true, nil
}
