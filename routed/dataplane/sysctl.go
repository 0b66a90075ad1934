package dataplane

import (
	"fmt"
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
}

// Sysctls are the settings the dataplane needs for encap: forwarding (IPv6
// forwarding too with v6, when an IPv6 pod CIDR is routed) and loose
// reverse-path filtering on the tunnel device (packets from other nodes'
// pods arrive on it from addresses it has no route back through).
func Sysctls(encap desired.Encap, v6 bool) []Sysctl {
	s := []Sysctl{{"net/ipv4/ip_forward", "1"}}
	if v6 {
		s = append(s, Sysctl{"net/ipv6/conf/all/forwarding", "1"})
	}
	switch encap {
	case desired.IPIP:
		s = append(s, Sysctl{"net/ipv4/conf/" + desired.TunnelDevice + "/rp_filter", "2"})
	case desired.VXLAN:
		s = append(s, Sysctl{"net/ipv4/conf/" + desired.VXLANDevice + "/rp_filter", "2"})
	}
	return s
}

// SysctlWriter sets sysctls through a /proc/sys tree: the netns's own
// (Root "" is DefaultProcSys), or the host's mounted elsewhere (podnet-install
// prepare-node). It reads each value first and writes only a difference, so
// settings that already hold need no write access.
type SysctlWriter struct {
	Root string
	Log  *slog.Logger // each write is logged; nil is silent
}

// Write sets every sysctl of s, stopping at the first failure.
func (w SysctlWriter) Write(s []Sysctl) error {
	for _, c := range s {
		if err := w.set(c); err != nil {
			return err
		}
	}
	return nil
}

func (w SysctlWriter) set(c Sysctl) error {
	root := w.Root
	if root == "" {
		root = DefaultProcSys
	}
	p := filepath.Join(root, c.Name)
	cur, err := os.ReadFile(p)
	if err == nil && strings.TrimSpace(string(cur)) == c.Value {
		return nil
	}
	name := strings.ReplaceAll(c.Name, "/", ".")
	if err := os.WriteFile(p, []byte(c.Value), 0o644); err != nil {
		return fmt.Errorf("set %s=%s: %w", name, c.Value, err) // err names the file
	}
	if w.Log != nil {
		w.Log.Info("sysctl set", "name", name, "value", c.Value)
	}
	return nil
}
