package dataplane

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/podnet/podnet/routed/desired"
)

func TestSysctls(t *testing.T) {
	for _, tc := range []struct {
		encap desired.Encap
		v6    bool
		want  []Sysctl
	}{
		{desired.None, false, []Sysctl{{"net/ipv4/ip_forward", "1"}}},
		{desired.None, true, []Sysctl{{"net/ipv4/ip_forward", "1"}, {"net/ipv6/conf/all/forwarding", "1"}}},
		{desired.IPIP, false, []Sysctl{{"net/ipv4/ip_forward", "1"}, {"net/ipv4/conf/tunl0/rp_filter", "2"}}},
		{desired.VXLAN, true, []Sysctl{{"net/ipv4/ip_forward", "1"}, {"net/ipv6/conf/all/forwarding", "1"}, {"net/ipv4/conf/podnet.vxlan/rp_filter", "2"}}},
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
	if err := (SysctlWriter{Root: root}).Write([]Sysctl{{"net/ipv6/conf/all/forwarding", "1"}}); err == nil {
		t.Error("writing a sysctl that does not exist succeeded")
	}
}
