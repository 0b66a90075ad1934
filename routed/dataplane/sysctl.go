package dataplane

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/podnet/podnet/routed/desired"
)

// DefaultProcSys is the kernel's sysctl tree of the calling thread's netns.
const DefaultProcSys = "/proc/sys"

// Sysctl is one kernel setting: Name is its path under /proc/sys
// ("net/ipv4/ip_forward").
type Sysctl struct {
	Name, Value string
	// IPv6Only: the setting guards IPv6 and holds trivially on a kernel
	// without IPv6 (no net/ipv6 in the tree): nothing to set then.
	IPv6Only bool
}

// Sysctls are the settings the dataplane needs for encap: forwarding (IPv6
// forwarding too with v6, when an IPv6 pod CIDR is routed), loose
// reverse-path filtering on the tunnel device (packets from other nodes'
// pods arrive on it from addresses it has no route back through), and no
// router advertisement or address autoconfiguration on podnet.vxlan (an
// interface podnet creates must not let anyone add a route or an address
// to the node).
func Sysctls(encap desired.Encap, v6 bool) []Sysctl {
	s := []Sysctl{{Name: "net/ipv4/ip_forward", Value: "1"}}
	if v6 {
		s = append(s, Sysctl{Name: "net/ipv6/conf/all/forwarding", Value: "1"})
	}
	switch encap {
	case desired.IPIP:
		s = append(s, Sysctl{Name: "net/ipv4/conf/" + desired.TunnelDevice + "/rp_filter", Value: "2"})
	case desired.VXLAN:
		s = append(s,
			Sysctl{Name: "net/ipv4/conf/" + desired.VXLANDevice + "/rp_filter", Value: "2"},
			Sysctl{Name: "net/ipv6/conf/" + desired.VXLANDevice + "/accept_ra", Value: "0", IPv6Only: true},
			Sysctl{Name: "net/ipv6/conf/" + desired.VXLANDevice + "/autoconf", Value: "0", IPv6Only: true})
	}
	return s
}

// DisplayName is the sysctl's name as sysctl(8) prints it
// ("net.ipv4.ip_forward"; a device name keeps its dots).
func (c Sysctl) DisplayName() string { return strings.ReplaceAll(c.Name, "/", ".") }

// SysctlError is a sysctl that could not be set.
type SysctlError struct {
	Sysctl Sysctl
	Err    error
}

func (e SysctlError) Error() string {
	return fmt.Sprintf("set %s=%s: %v", e.Sysctl.DisplayName(), e.Sysctl.Value, e.Err) // Err names the file
}

func (e SysctlError) Unwrap() error { return e.Err }

// SysctlWriter sets sysctls through a /proc/sys tree: the netns's own
// (Root "" is DefaultProcSys), or the host's mounted elsewhere (podnet-install
// prepare-node). It reads each value first and writes only a difference, so
// settings that already hold need no write access.
type SysctlWriter struct {
	Root string
	Log  *slog.Logger // each write is logged; nil is silent
}

// Write sets every sysctl of s, going on past a failure, and returns the
// failures joined.
func (w SysctlWriter) Write(s []Sysctl) error {
	_, failed := w.Set(s)
	errs := make([]error, len(failed))
	for i, f := range failed {
		errs[i] = f
	}
	return errors.Join(errs...)
}

// Set sets every sysctl of s, going on past a failure: it returns those
// it changed (their value differed) and one error per sysctl it could not
// set.
func (w SysctlWriter) Set(s []Sysctl) (changed []Sysctl, failed []SysctlError) {
	for _, c := range s {
		wrote, err := w.set(c)
		switch {
		case err != nil:
			failed = append(failed, SysctlError{Sysctl: c, Err: err})
		case wrote:
			changed = append(changed, c)
		}
	}
	return changed, failed
}

func (w SysctlWriter) set(c Sysctl) (wrote bool, err error) {
	root := w.Root
	if root == "" {
		root = DefaultProcSys
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
