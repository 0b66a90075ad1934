package dataplane

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/routed/desired"
)

func TestSysctls(t *testing.T) {
	for _, tc := range []struct {
		encap desired.Encap
		v6    bool
		want  []Sysctl
	}{
		{desired.None, false, []Sysctl{{"net/ipv4/ip_forward", "1", false}}},
		{desired.None, true, []Sysctl{{"net/ipv4/ip_forward", "1", false}, {"net/ipv6/conf/all/forwarding", "1", false}}},
		{desired.IPIP, false, []Sysctl{{"net/ipv4/ip_forward", "1", false}, {"net/ipv4/conf/tunl0/rp_filter", "2", false}}},
		{desired.VXLAN, true, []Sysctl{{"net/ipv4/ip_forward", "1", false}, {"net/ipv6/conf/all/forwarding", "1", false},
			{"net/ipv4/conf/podnet.vxlan/rp_filter", "2", false},
			{"net/ipv6/conf/podnet.vxlan/accept_ra", "0", true}, {"net/ipv6/conf/podnet.vxlan/autoconf", "0", true}}},
	} {
		if got := Sysctls(tc.encap, tc.v6); !slices.Equal(got, tc.want) {
			t.Errorf("Sysctls(%s, v6 %v) = %v, want %v", tc.encap, tc.v6, got, tc.want)
		}
	}
}

// TestSysctlWriter: values are written under Root, and a value that
// already holds is not written (a read-only file is fine then).
func TestSysctlWriter(t *testing.T) {
	root := t.TempDir()
	for name, value := range map[string]string{"net/ipv4/ip_forward": "0\n", "net/ipv4/conf/tunl0/rp_filter": "2\n"} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel refuses writes to a read-only /proc/sys; a read-only
	// file stands in for it (for anyone but root).
	if err := os.Chmod(filepath.Join(root, "net/ipv4/conf/tunl0/rp_filter"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := (SysctlWriter{Root: root}).Write(Sysctls(desired.IPIP, false)); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "net/ipv4/ip_forward")); err != nil || string(b) != "1" {
		t.Errorf("ip_forward = %q (%v), want 1", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "net/ipv4/conf/tunl0/rp_filter")); err != nil || string(b) != "2\n" {
		t.Errorf("rp_filter = %q (%v), want it untouched", b, err)
	}
	if err := (SysctlWriter{Root: root}).Write([]Sysctl{{Name: "net/ipv6/conf/all/forwarding", Value: "1"}}); err == nil {
		t.Error("writing a sysctl that does not exist succeeded")
	}
}

// TestSysctlWriterGoesOn: a sysctl that cannot be set is reported and the
// ones after it are still set; an IPv6-only one holds on a tree without
// net/ipv6 (a kernel without IPv6).
func TestSysctlWriterGoesOn(t *testing.T) {
	root := t.TempDir()
	for name, value := range map[string]string{"net/ipv4/ip_forward": "0\n", "net/ipv4/conf/podnet.vxlan/rp_filter": "0\n"} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := []Sysctl{
		{Name: "net/ipv4/conf/missing/rp_filter", Value: "2"}, // fails: no such file
		{Name: "net/ipv4/ip_forward", Value: "1"},
		{Name: "net/ipv6/conf/podnet.vxlan/accept_ra", Value: "0", IPv6Only: true},
		{Name: "net/ipv4/conf/podnet.vxlan/rp_filter", Value: "2"},
	}
	changed, failed := SysctlWriter{Root: root}.Set(s)
	if len(failed) != 1 || failed[0].Sysctl != s[0] || !strings.Contains(failed[0].Error(), "net.ipv4.conf.missing.rp_filter=2") {
		t.Errorf("failed = %v, want only %s", failed, s[0].Name)
	}
	if !slices.Equal(changed, []Sysctl{s[1], s[3]}) {
		t.Errorf("changed = %v, want %v", changed, []Sysctl{s[1], s[3]})
	}
	for _, name := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/podnet.vxlan/rp_filter"} {
		if b, _ := os.ReadFile(filepath.Join(root, name)); len(b) != 1 {
			t.Errorf("%s = %q, not written", name, b)
		}
	}
	// with net/ipv6 present, the missing IPv6 sysctl is an error
	if err := os.MkdirAll(filepath.Join(root, "net/ipv6"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, failed := (SysctlWriter{Root: root}).Set(s[2:3]); len(failed) != 1 {
		t.Errorf("an IPv6 sysctl missing on a kernel with IPv6: failed = %v, want it reported", failed)
	}
	if err := (SysctlWriter{Root: root}).Write(s); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Write = %v, want the failures joined", err)
	}
}

func TestDeviceOf(t *testing.T) {
	for name, want := range map[string]string{
		"net/ipv4/ip_forward":                  "",
		"net/ipv6/conf/all/forwarding":         "",
		"net/ipv4/conf/default/rp_filter":      "",
		"net/ipv4/conf/podnet.vxlan/rp_filter": "podnet.vxlan",
		"net/ipv6/conf/podnet.vxlan/accept_ra": "podnet.vxlan",
		"net/ipv4/conf/tunl0/rp_filter":        "tunl0",
	} {
		if got := deviceOf(Sysctl{Name: name}); got != want {
			t.Errorf("deviceOf(%s) = %q, want %q", name, got, want)
		}
	}
}
